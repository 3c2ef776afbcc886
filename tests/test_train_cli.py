"""`specblock train specblock|eagle|medusa`: one-line input errors, and a two-step run of each drafter's
recipe on a tiny target whose output `make_drafter` loads and decodes with losslessly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from experiments.cli import main
from experiments.commands.train import command
from real_engine.decode import generate, make_drafter
from real_engine.model import ModelArgs, Transformer, load_model, save_model
from real_engine.training.target import TARGET, TARGETS

VOCAB = 40
STREAM = "real_engine.training.windows.token_stream"  # every corpus window is read through it


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["train", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                  max_position_embeddings=512, eos_token_id=0))
    return save_model(model, tmp_path_factory.mktemp("target"), dtype=torch.float32)


@pytest.mark.parametrize(("args", "needle"), [
    (["specblock", "--model", "{tmp}/nowhere"], "neither a model name nor a checkpoint folder"),
    (["eagle", "--sequences", "0"], "--sequences"),
    (["target", "--sequences", "8"], "--sequences"),
    (["tokenizer", "--init", "{target}"], "--init starts a model from trained weights"),
    (["medusa", "--init", "{tmp}/nowhere"], "no model in"),
    (["eagle", "--init", "{target}"], "no valid EAGLE config.json"),  # a target is no EAGLE drafter
    (["specblock", "--init", "{target}"], "is not a specblock-v2 drafter config"),
    (["specblock", "--steps", "0"], "--steps"),
    (["eagle", "--lr", "2"], "--lr"),
    (["draft-model", "--size", "16m"], "--size chooses the target's shape"),
    (["draft-model", "--on-policy", "1.5"], "--on-policy 1.5: give a share in [0, 1]"),
    (["target", "--on-policy", "0.5"], "for the draft model or a drafter"),
    (["eagle", "--on-policy", "-0.1"], "--on-policy -0.1: give a share in [0, 1]"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], needle: str, target_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(tmp=tmp_path, target=target_dir) for a in args]
    if "--model" not in args:
        args += ["--model", str(target_dir)]
    args += ["--data-dir", str(tmp_path / "data")]
    code, out, err = run([*args, "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run")], capsys)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not any((tmp_path / name).exists() for name in ("out", "run", "data"))  # nothing computed


@pytest.mark.parametrize("kind", ["specblock", "eagle", "medusa"])
def test_two_steps_train_a_drafter_that_decodes_losslessly(kind: str, target_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    def stream(domain: str, split: str, tokenizer: object = None) -> np.ndarray:
        """A synthetic corpus in place of the tokenized one."""
        rng = np.random.default_rng([len(domain), len(split)])
        return rng.integers(1, VOCAB, 4096).astype(np.uint16)

    monkeypatch.setattr(STREAM, stream)
    out, data = tmp_path / "out", tmp_path / "data"
    code, stdout, err = run([kind, "--model", str(target_dir), "--out", str(out), "--run-dir",
                             str(tmp_path / "run"), "--data-dir", str(data), "--steps", "2",
                             "--sequences", "8", "--threads", "1", "--json"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    assert result["out"] == str(out) and result["train"]["steps"] == 2 and result["data"]["sequences"] == 8
    assert (tmp_path / "run" / "state.json").exists()
    # Medusa calibrates its tree, SpecBlock its rank head's bucket offsets, on held-out rows; EAGLE-style
    # and Medusa-style record how they fare there
    cached = {p.name.endswith("-heldout") for p in data.iterdir()}
    assert cached == {False, True}
    assert ("generalization" in result) == (kind != "specblock")
    if kind == "specblock":
        calibration = result["rank_calibration"]
        assert len(calibration["bucket_bias"]) == 4 and calibration["rows"]["report"] > 0
        assert json.loads((out / "config.json").read_text())["bucket_bias"] == calibration["bucket_bias"]
    target = load_model(target_dir)
    prompt = [5, 9, 2, 5, 9]
    expected = generate(target, prompt, max_new_tokens=10).tokens
    drafter = make_drafter(kind, target, folder=out)
    assert generate(target, prompt, drafter=drafter, max_new_tokens=10).tokens == expected

    # --init warm-starts from a saved drafter: shift its weights, train at a negligible rate, and the
    # result keeps the shift (a fresh start would not have it).
    shifted = tmp_path / "shifted"
    shutil.copytree(out, shifted)
    with safe_open(str(out / "model.safetensors"), "pt") as saved:
        state, metadata = {k: saved.get_tensor(k) for k in saved.keys()}, saved.metadata()  # noqa: SIM118
    save_file({k: v + 0.25 if v.is_floating_point() else v for k, v in state.items()},
              str(shifted / "model.safetensors"), metadata=metadata)
    code, stdout, err = run([kind, "--model", str(target_dir), "--out", str(tmp_path / "warm"), "--run-dir",
                             str(tmp_path / "run2"), "--data-dir", str(data), "--steps", "1", "--lr", "1e-9",
                             "--sequences", "8", "--threads", "1", "--init", str(shifted), "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["init_from"] == str(shifted)
    warm = load_file(str(tmp_path / "warm" / "model.safetensors"))
    for name, value in state.items():
        if value.is_floating_point() and name in warm:
            assert torch.allclose(warm[name].float(), value.float() + 0.25, atol=0.02), name


def test_the_size_choices_are_the_target_recipes() -> None:

    size = next(p for p in command.params if p.name == "size")
    assert tuple(size.type.choices) == tuple(TARGETS) and size.default is None
    assert TARGETS[size.type.choices[0]] is TARGET  # the first choice names the default recipe



def test_on_policy_drafter_data_is_cached_apart(target_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--on-policy 0.5` reaches the drafter's data recipe: its rows live in their own folder."""
    monkeypatch.setattr(STREAM, lambda domain, split, tokenizer=None:
                        np.random.default_rng(len(domain)).integers(1, VOCAB, 4096))
    data = tmp_path / "data"
    code, stdout, err = run(["eagle", "--model", str(target_dir), "--out", str(tmp_path / "out"),
                             "--run-dir", str(tmp_path / "run"), "--data-dir", str(data), "--steps", "1",
                             "--sequences", "4", "--on-policy", "0.5", "--threads", "1", "--json"], capsys)
    assert code == 0, err
    assert sorted(p.name.split("-", 1)[1] for p in data.iterdir()) == ["heldout", "onpolicy0.5"]
    assert json.loads(stdout)["data"]["on_policy"] == 0.5
