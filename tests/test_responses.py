"""Self-distillation responses (``real_engine.training.responses``, `specblock responses`): greedy rows are
the target's own greedy decoding, the sampled share is the seeded one, a run killed mid-batch resumes to
exactly the rows of an uninterrupted run, folders of another plan or state are refused, and the feature
drafters train on windows packed from them (`specblock train KIND --responses DIR`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from core.errors import InputError
from real_engine.decode import generate, make_drafter
from real_engine.model import Transformer, load_model, save_model
from real_engine.prompts import PromptRow
from real_engine.training.responses import (
    RESPONSES,
    STATE,
    ResponsePlan,
    respond,
    response_windows,
    sampled_rows,
)

PROMPTS = [PromptRow(f"p{i}", "chat", "abcdefgh"[i:] + "ab" * i) for i in range(5)]
PLAN = ResponsePlan(max_new_tokens=6, sampled=0.4, batch=2, seed=3)


def encode(row: PromptRow) -> list[int]:
    return [3 + ord(c) % 50 for c in row.text]


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / RESPONSES).read_text().splitlines()]


class Killed(Exception):
    """Raised by the log after the first batch: a run killed once its state was written."""


def test_greedy_rows_are_the_targets_own_decoding(target: Transformer, tmp_path: Path) -> None:
    state = respond(target, PROMPTS, encode, tmp_path, PLAN)
    written = rows(tmp_path)
    assert state["done"] == len(PROMPTS) and [r["id"] for r in written] == [p.name for p in PROMPTS]
    assert [r["sampled"] for r in written] == sampled_rows(len(PROMPTS), PLAN)
    assert 0 < sum(r["sampled"] for r in written) < len(PROMPTS)  # both kinds at this seed
    for row, prompt in zip(written, PROMPTS, strict=True):
        assert row["prompt"] == encode(prompt) and len(row["response"]) == PLAN.max_new_tokens
        if not row["sampled"]:
            assert row["response"] == list(generate(target, encode(prompt), max_new_tokens=6).tokens)


def test_a_killed_run_resumes_to_the_uninterrupted_rows(target: Transformer, tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    respond(target, PROMPTS, encode, whole, PLAN)

    def kill(_: str) -> None:
        raise Killed

    with pytest.raises(Killed):
        respond(target, PROMPTS, encode, cut, PLAN, log=kill)
    assert json.loads((cut / STATE).read_text())["done"] == PLAN.batch
    with (cut / RESPONSES).open("a") as file:
        file.write('{"id": "p2", "resp')  # a batch cut short mid-line
    with pytest.raises(InputError, match="add --resume"):
        respond(target, PROMPTS, encode, cut, PLAN)
    respond(target, PROMPTS, encode, cut, PLAN, resume=True)
    assert rows(cut) == rows(whole)
    again = respond(target, PROMPTS, encode, cut, PLAN, resume=True)  # finished: nothing more to do
    assert again["done"] == len(PROMPTS) and rows(cut) == rows(whole)


@pytest.mark.parametrize(("change", "match"), [
    (lambda folder: None, "another plan"),
    (lambda folder: (folder / STATE).unlink(), "without state.json"),
    (lambda folder: (folder / STATE).write_text('{"format": 1}'), "another plan"),
])
def test_a_folder_of_another_plan_or_state_is_refused(target: Transformer, tmp_path: Path,
                                                      change: Callable[[Path], None], match: str) -> None:
    respond(target, PROMPTS[:2], encode, tmp_path, PLAN)
    change(tmp_path)
    with pytest.raises(InputError, match=match):
        respond(target, PROMPTS[:2], encode, tmp_path, ResponsePlan(max_new_tokens=5, batch=2))
    with pytest.raises(InputError, match="no responses run to resume"):
        respond(target, PROMPTS[:2], encode, tmp_path / "new", PLAN, resume=True)
    with pytest.raises(InputError, match="sampled share"):
        ResponsePlan(sampled=1.5)


def test_the_command_answers_a_models_training_prompts(llama_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, cli, refused) -> None:
    monkeypatch.setenv("SPECBLOCK_HOME", str(tmp_path / "home"))
    err = refused(["responses", "--model", str(llama_dir), "--out", str(tmp_path / "none")])
    assert "no training prompts" in err
    training = tmp_path / "home" / "prompts" / "training"
    training.mkdir(parents=True)
    (training / "chat.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": f"the cat {i}"}) + "\n"
                                                 for i in range(3)))
    out = tmp_path / "out"
    code, shown, err = cli(["responses", "--model", str(llama_dir), "--out", str(out), "--prompts", "2",
                            "--max-new-tokens", "4", "--batch", "2", "--threads", "1", "--json"])
    assert code == 0, err
    summary = json.loads(shown)
    assert (summary["done"], summary["prompts"]) == (2, 2) and [r["id"] for r in rows(out)] == ["t0", "t1"]


def test_windows_pack_the_complete_rows_end_to_end(target: Transformer, tmp_path: Path) -> None:
    respond(target, PROMPTS, encode, tmp_path, PLAN)
    stream = [t for r in rows(tmp_path) for t in r["prompt"] + r["response"]]
    vocab = target.args.vocab_size
    windows = response_windows(tmp_path, 8, 3, vocab, skip=1)
    assert windows.tolist() == [stream[8 * i:8 * i + 8] for i in (1, 2, 3)]
    with pytest.raises(InputError, match="fewer than the"):
        response_windows(tmp_path, 8, len(stream), vocab)
    with pytest.raises(InputError, match="beyond the target's vocabulary"):
        response_windows(tmp_path, 8, 3, 40)
    (tmp_path / RESPONSES).write_text('{"prompt": [1]}\n' * len(PROMPTS))
    with pytest.raises(InputError, match="line 1: not a responses row"):
        response_windows(tmp_path, 8, 1, vocab)
    with pytest.raises(InputError, match="no `specblock responses` run"):
        (tmp_path / STATE).write_text("{}")
        response_windows(tmp_path, 8, 1, vocab)


def test_a_feature_drafter_trains_on_the_responses(target: Transformer, llama_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, cli, refused) -> None:
    from real_engine.training import recipes

    answers = tmp_path / "answers"
    respond(target, PROMPTS, encode, answers, PLAN)
    monkeypatch.setattr(recipes.TrainRequest, "data",
                        lambda self, sequences=None: recipes.DataRecipe(sequences=4, seq_len=12, top_k=8,
                                                                        heldout=1, code_share=0.0))
    out = tmp_path / "eagle"
    code, shown, err = cli(["train", "eagle", "--model", str(llama_dir), "--responses", str(answers),
                            "--steps", "1", "--out", str(out), "--run-dir", str(tmp_path / "run"),
                            "--data-dir", str(tmp_path / "data"), "--threads", "1", "--json"])
    assert code == 0, err
    assert json.loads(shown)["out"] == str(out) and (out / "config.json").is_file()
    cached = [p.name for p in (tmp_path / "data").iterdir()]
    # the target's rows for the trained response windows and for the held-out ones it is scored on
    assert len(cached) == 2 and all("-responses-" in name for name in cached)
    assert set(json.loads((out / "training.json").read_text())["generalization"]) == {"train", "heldout"}
    assert "drop it for target" in refused(["train", "target", "--responses", str(answers)])
    assert "drop it with --responses" in refused(["train", "eagle", "--responses", str(answers),
                                                  "--on-policy", "0.5"])



def test_a_requests_sequences_win_over_a_recipes_own_count() -> None:
    from real_engine.training.recipes import DataRecipe, TrainRequest

    assert TrainRequest().data().sequences == DataRecipe().sequences  # the feature drafters' default
    assert TrainRequest().data(500).sequences == 500  # a recipe's own, e.g. the cut draft model's
    assert TrainRequest(sequences=7).data(500).sequences == 7  # --sequences given


def test_a_model_trains_on_the_responses_it_ships_by_default(build, tmp_path: Path) -> None:
    from core.models import folder_spec
    from experiments.commands.train import _responses

    spec = folder_spec(build(tmp_path / "model", "llama"))
    assert _responses("eagle", spec, None, None) is None  # nothing shipped, no run: the corpus
    spec.responses.mkdir(parents=True)
    (spec.responses / STATE).write_text("{}")
    assert _responses("eagle", spec, None, None) == spec.responses
    assert _responses("eagle", spec, tmp_path / "mine", None) == tmp_path / "mine"  # a folder given wins


def _code(domain: str, split: str, tokenizer: Path) -> np.ndarray:
    """A synthetic tokenized corpus: each split its own stream, ids that grow with the tokenizer's name."""
    first = 1000 if split == "train" else 2000
    return (np.arange(first, first + 64) % 40 + len(str(tokenizer))).astype(np.uint16)


def test_code_from_the_corpus_is_a_second_domain(target: Transformer, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``code_share`` of the windows is the corpus's code tokenized with the target's tokenizer (its train
    split drawn, its held-out split in order), and the held-out responses follow the trained ones."""
    from real_engine.training.recipes import DataRecipe, response_data_windows

    monkeypatch.setattr("real_engine.training.windows.token_stream", _code)
    respond(target, PROMPTS, encode, tmp_path, PLAN)
    vocab, recipe = target.args.vocab_size, DataRecipe(sequences=4, seq_len=8, heldout=2, code_share=0.5)
    tok = Path("tok.json")
    train = response_data_windows(tmp_path, recipe, vocab, tok, "train", seed=0)
    heldout = response_data_windows(tmp_path, recipe, vocab, tok, "heldout", seed=0)
    chat = response_windows(tmp_path, 8, 3, vocab)
    assert torch.equal(train[:2], chat[:2]) and torch.equal(heldout[:1], chat[2:3])
    code_train = torch.from_numpy(_code("code", "train", tok).astype(np.int64)).view(-1, 8)
    assert all(any(torch.equal(row, w) for w in code_train) for row in train[2:])
    assert heldout[1].tolist() == _code("code", "heldout", tok)[:8].tolist()
    with pytest.raises(InputError, match="give the target's own tokenizer"):
        response_data_windows(tmp_path, recipe, vocab, Path("a" * (vocab - 39)), "train", seed=0)


def test_a_draft_model_cut_from_the_target_ships_its_layers_only(
        target: Transformer, llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, refused
) -> None:
    """`train draft-model --responses`: the target's first layers distilled on its rows; the shipped
    folder holds no embeddings (it reads the target's, checked by SHA-256), drafts losslessly, and a target
    whose embeddings differ is refused."""
    from real_engine.training import recipes

    answers = tmp_path / "answers"
    respond(target, PROMPTS, encode, answers, PLAN)
    asked = []
    monkeypatch.setattr(recipes.TrainRequest, "data",
                        lambda self, sequences=None: asked.append(sequences) or recipes.DataRecipe(
                            sequences=4, seq_len=12, top_k=8, heldout=1, code_share=0.0))
    monkeypatch.setattr(recipes, "CUT_LAYERS", 1)
    monkeypatch.setattr(recipes, "DRAFT_VOCAB", 16)
    copy = tmp_path / "target"
    shutil.copytree(llama_dir, copy)
    out = tmp_path / "draft"
    code, shown, err = cli(["train", "draft-model", "--model", str(copy), "--responses", str(answers),
                            "--steps", "2", "--out", str(out), "--run-dir", str(tmp_path / "run"),
                            "--data-dir", str(tmp_path / "data"), "--threads", "1", "--json"])
    assert code == 0, err
    assert json.loads(shown)["steps_done"] == 2
    assert asked == [recipes.CUT_SEQUENCES] * 2  # its own data size, training and held-out rows
    with safe_open(str(out / "model.safetensors"), "pt") as saved:
        names = set(saved.keys())
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    assert any(n.startswith("model.layers.0.") for n in names)
    draft = load_model(out)
    assert draft.args.num_hidden_layers == 1
    assert torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    prompt = encode(PROMPTS[1])
    vanilla = generate(target, prompt, max_new_tokens=12).tokens
    drafter = make_drafter("draft-model", target, draft, folder=out)  # its deployed 16-token vocabulary
    assert drafter.vocab is not None and drafter.vocab.numel() == 16
    assert generate(target, prompt, drafter=drafter, max_new_tokens=12).tokens == vanilla
    moved = load_model(copy)
    with torch.no_grad():
        moved.model.embed_tokens.weight[3] += 1.0
    save_model(moved, copy, dtype=torch.float32)
    with pytest.raises(InputError, match="not the one the draft"):
        load_model(out)
    assert "starts from its layers" in refused(["train", "draft-model", "--model", str(copy), "--responses",
                                                str(answers), "--init", str(out)])
