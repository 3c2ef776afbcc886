"""The cost profiler: a quick profile of tiny random models loads as a cost profile; the CLI contract."""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from core.cost_profile import load_profile
from core.errors import InputError
from core.names import registry
from core.paths import PAPER_PROFILE
from experiments.cli import main
from real_engine import profile as prof
from real_engine.model import ModelArgs, Transformer, load_model
from real_engine.timing import Bench, frozen_heap, make_timer
from real_engine.update_profile import specblock_update_samples

TINY = dataclasses.replace(prof.QUICK, repeats=2, warmup=0)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["profile", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def measured(llama_dir: Path, draft_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    target, draft = load_model(llama_dir), load_model(draft_dir)
    return prof.measure(target, target_name=prof.model_name(target, llama_dir), draft=draft,
                        draft_name=prof.model_name(draft, draft_dir), grid=TINY,
                        models_dir=tmp_path_factory.mktemp("no_drafters"))


def test_profile_loads_with_every_series(measured: dict, tmp_path: Path) -> None:
    path = prof.save(measured, tmp_path / "profile.json")
    profile = load_profile(path)
    assert profile.device.startswith("CPU") and profile.dtype == "float32"
    assert set(profile.drafters) == set(registry)  # n-gram, draft model and the three feature drafters
    verify = {(row["nodes"], row["context"]) for row in measured["samples"]["verify"]}
    assert verify == {(n, c) for n in TINY.nodes for c in TINY.contexts}
    assert all(len(row["seconds"]) == TINY.repeats for row in measured["samples"]["verify"])
    assert [row["tokens"] for row in measured["samples"]["draft"]["draft-model"]] == list(TINY.draft_tokens)
    tree = {(r["depth"], r["width"]) for r in measured["samples"]["draft_trees"]["draft-model"]}
    assert tree == {(d, w) for d in TINY.tree_depths for w in TINY.tree_widths}
    assert profile.draft_seconds("draft-model", depth=TINY.tree_depths[-1], width=TINY.tree_widths[0]) > 0
    assert profile.draft_shapes["draft-model"]["tree_budget"] == TINY.tree_budget
    assert set(profile.draft_shapes) == {"draft-model", "eagle", "specblock"}
    specblock = {(r["starts"], r["blocks"]) for r in measured["samples"]["draft"]["specblock"]}
    assert specblock == {(s, m) for s in TINY.specblock_starts for m in TINY.specblock_blocks}
    assert profile.block_size == 4
    # SpecBlock's online update as the engine runs it: the full one trains everything on 4x the buffer.
    assert 0 < profile.update_seconds("head") < profile.update_seconds("full")
    assert "update_drafter" in measured["measurement"]["update_model"]
    assert set(profile.update_single) == {"head", "full"}  # a one-window buffer beside the full one
    assert profile.fits["update_single"]["full"] < profile.update_seconds("full")
    assert [row["tokens"] for row in measured["samples"]["prefill"]] == list(TINY.prefill_tokens)
    # Each prompt length costs the median of its own samples. Not ordered by length: two sub-millisecond
    # medians of 2 samples (16 and 64 tokens, 1.4-2x apart here) are too close for timing noise.
    for row in measured["samples"]["prefill"]:
        median = float(np.median(row["seconds"]))
        assert median > 0 and profile.prefill_cost(row["tokens"]) == pytest.approx(median)
    for kind in ("specblock", "eagle", "medusa"):  # no weights in models_dir: timed with random ones
        assert "random weights" in profile.drafters[kind]
    assert measured["measurement"]["grid"]["repeats"] == TINY.repeats
    batch = {(r["requests"], r["nodes"], r["context"]) for r in measured["samples"]["batch_verify"]}
    assert batch == {(r, n, c) for r in TINY.batch_requests for n in TINY.batch_nodes for c in TINY.contexts}
    assert profile.batch_verify_seconds(max(TINY.batch_requests), 1, TINY.contexts[0]) > 0
    backlog = [row["tokens"] for row in measured["samples"]["draft_backlog"]]
    assert backlog == [1, *TINY.prefill_tokens]  # a chain's first proposal after prompts of these lengths
    # The saved fits are the medians of the samples (load_profile refits and compares).
    assert json.loads(path.read_text())["fits"]["verify"]["nodes"] == list(TINY.nodes)


def test_save_rejects_a_broken_profile(measured: dict, tmp_path: Path) -> None:
    broken = {**measured, "samples": {**measured["samples"], "update": {"head": [0.1]}}}
    with pytest.raises(ValueError, match="update"):
        prof.save(broken, tmp_path / "broken.json")
    assert not (tmp_path / "broken.json").exists()


def test_cli_quick_json(llama_dir: Path, draft_dir: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(draft_dir), "--out", str(out),
                             "--quick", "--repeats", "1", "--no-feature-drafters", "--json"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    assert result["out"] == str(out) and result["quick"] is True
    assert set(result["drafters"]) == {"ngram", "draft-model"}
    assert {"vanilla", "verify_2", "verify_17", "update_head", "update_full"} <= result["milliseconds"].keys()
    assert set(load_profile(out).drafters) == {"ngram", "draft-model"}
    assert result["draft_vocab"] is None  # a draft model without a deployed vocabulary drafts every token


def test_cli_times_the_draft_model_over_its_deployed_vocabulary(
        llama_dir: Path, draft_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A draft model deployed drafting its most frequent tokens (``drafting.json``) is profiled drafting
    them, as ``generate`` and ``bench`` deploy it, and the profile says how many."""
    folder = shutil.copytree(draft_dir, tmp_path / "draft")
    (folder / "drafting.json").write_text(json.dumps({"shape": {"depth": 3, "vocab": 8}}))
    (folder / "draft_vocab.json").write_text(json.dumps({"ids": list(range(95, -1, -1))}))
    out = tmp_path / "p.json"
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(folder), "--out", str(out),
                             "--quick", "--repeats", "1", "--no-feature-drafters", "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["draft_vocab"] == 8
    assert json.loads(out.read_text())["measurement"]["draft_vocab"] == 8


@pytest.mark.parametrize("args", [["--model", "{missing}"], ["--draft-model", "{missing}"],
                                  ["--repeats", "0"], ["--threads", "0"]])
def test_cli_bad_input_exits_2(args: list[str], llama_dir: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(missing=tmp_path / "nowhere") for a in args]
    base = [] if "--model" in args else ["--model", str(llama_dir)]
    code, stdout, err = run([*base, *args, "--out", str(tmp_path / "p.json"), "--quick", "--json"], capsys)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("specblock: error:")
    assert not (tmp_path / "p.json").exists()


def test_update_samples_on_recorded_feedback_hold_what_the_buffers_would(llama_dir: Path) -> None:
    import torch

    from core.errors import InputError
    from real_engine.drafters.specblock import SpecBlock
    from real_engine.feedback import Feedback

    target = load_model(llama_dir)
    net = SpecBlock.for_target(target, seed=0)
    tokens = torch.randint(1, target.args.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = target(tokens[None])
    top = out.logits[0].float().log_softmax(-1).topk(8, dim=-1)

    def query(full: tuple[int, ...], head: tuple[int, ...]) -> Feedback:
        states = torch.randn(len(head), net.config.hidden_size)
        return Feedback("code", tokens, out.features[0].bfloat16(), top.values, top.indices,
                        tuple(range(20, 39)), tuple(sorted(full + head)), full, head, states)

    # 8 queries of 10 cut-short drafts, each a full and a head signal: the head buffer (64 signals)
    # holds the newest 7 of them (the oldest of those in part), the full one (256) all 8.
    feedback = [query(tuple(range(21, 31)), tuple(range(21, 31))) for _ in range(8)]
    bench = Bench(make_timer(torch.device("cpu")), 1, 0)
    full, single, windows = specblock_update_samples(target, net, TINY.update_batch, bench, 0, feedback)
    assert windows == {"head": 7, "full": 8}
    bench.run()
    assert all(len(v) == 1 and v[0] > 0 for v in (*full.values(), *single.values()))
    for signals in [((), ()), ((21, 22), ()), ((), (21, 22))]:  # an update with nothing to train on
        with pytest.raises(InputError, match="no rejected position"):
            specblock_update_samples(target, net, TINY.update_batch, bench, 0, [query(*signals)])


def test_specblock_drafting_timed_while_recording_feedback_runs_the_recorder(
        llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from real_engine import feedback as recorder
    from real_engine.drafters.specblock import SpecBlock

    target = load_model(llama_dir)
    net = SpecBlock.for_target(target, seed=0)
    kept: list[int] = []
    keep = recorder.FeedbackDrafter._keep
    monkeypatch.setattr(recorder.FeedbackDrafter, "_keep",
                        lambda self, out: (kept.append(1), keep(self, out))[1])
    grid = dataclasses.replace(prof.QUICK, specblock_starts=(1,), specblock_blocks=(1,), repeats=2, warmup=0)
    for recording in (False, True):
        bench = Bench(make_timer(target.lm_head.weight.device, "cpu"), grid.repeats, 0)
        series = prof.draft_samples(target, {"specblock": net}, grid, bench, 0, recording=recording)
        bench.run()
        assert len(series["specblock"].rows[0]["seconds"]) == 2
        assert bool(kept) == recording  # each recorded step keeps the target's rows


def test_bench_divides_a_run_of_steps_and_times_vanilla_in_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(100))
    bench = Bench(lambda: float(next(ticks)), repeats=2, warmup=1)
    calls: list[str] = []
    single = bench.add(lambda: calls.append("one"))
    run = bench.add(lambda: calls.append("four"), per=4)
    bench.run()
    assert calls == ["one", "four"] * 3 and single == [1.0, 1.0] and run == [0.25, 0.25]
    steps: list[int] = []
    monkeypatch.setattr(prof, "vanilla_step", lambda *args: steps.append(1))
    grid = dataclasses.replace(prof.QUICK, nodes=(1,), contexts=(4,))
    timed = Bench(make_timer(torch.device("cpu")), 1, 0)
    args = ModelArgs(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    _, vanilla = prof.verify_samples(Transformer(args).eval(), grid, timed)
    timed.run()
    assert len(steps) == prof.VANILLA_RUN and len(vanilla[0]["seconds"]) == 1  # one sample of a run


def test_only_updates_re_times_the_updates_and_keeps_the_rest(measured: dict, llama_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    again = prof.remeasure_updates(measured, load_model(llama_dir), grid=TINY, models_dir=tmp_path)
    updated = ("update", "update_single")
    assert all(again["samples"][k] == v for k, v in measured["samples"].items() if k not in updated)
    assert all(len(again["samples"][k][kind]) == len(measured["samples"][k][kind])
               for k in updated for kind in ("head", "full"))
    assert again["samples"]["update"] != measured["samples"]["update"]  # timed again: no two timings tie
    assert again["update_windows"] == measured["update_windows"]
    assert {**again["measurement"], "updates": None} == {**measured["measurement"], "updates": None}
    assert again["measurement"]["updates"]["date"] >= measured["measurement"]["date"]
    paper = tmp_path / "paper.json"
    paper.write_text(PAPER_PROFILE.read_text())  # derived from a paper: nothing measured to re-time
    code, stdout, err = run(["--model", str(llama_dir), "--out", str(paper), "--only-updates", "--quick"],
                            capsys)
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1 and "--only-updates" in err
    assert paper.read_text() == PAPER_PROFILE.read_text()


def test_the_thread_clock_counts_the_calling_threads_work_alone() -> None:
    """While another thread works, the process's CPU clock counts both and the thread clock one."""
    device = torch.device("cpu")
    thread, process = make_timer(device, "thread"), make_timer(device, "cpu")
    done = threading.Event()

    def spin() -> None:
        x = torch.randn(256, 256)
        while not done.is_set():
            x = (x @ x).tanh()

    worker = threading.Thread(target=spin, daemon=True)
    t0, p0 = thread(), process()
    worker.start()
    x = torch.randn(256, 256)
    for _ in range(200):
        x = (x @ x).tanh()
    t1, p1 = thread(), process()
    done.set()
    worker.join()
    assert 0 < t1 - t0 < p1 - p0  # the process clock also counted the spinning thread
    with pytest.raises(InputError, match="thread clock"):
        make_timer(torch.device("meta"), "thread")


def test_frozen_heap_keeps_set_up_objects_out_of_collections_until_the_outermost_exits() -> None:
    before = gc.get_freeze_count()
    assert before == 0
    with frozen_heap():
        outer = gc.get_freeze_count()
        assert outer > 0
        kept = [[i] for i in range(1000)]  # allocated inside: scanned until the next freeze
        with frozen_heap():
            assert gc.get_freeze_count() >= outer + len(kept)
        assert gc.get_freeze_count() > 0  # the inner one left everything frozen
    assert gc.get_freeze_count() == 0


def test_the_draft_model_is_timed_drafting_the_vocabulary_it_is_given(
        llama_dir: Path, draft_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from real_engine import drafter_profiles

    target, draft = load_model(llama_dir), load_model(draft_dir)
    ids = torch.arange(16)
    made: dict[str, list[torch.Tensor | None]] = {"series": [], "batch": []}
    for module, key in ((drafter_profiles, "series"), (prof, "batch")):  # every draft-model timing
        class Spy(module.DraftModelDrafter):  # the class itself: the batched engine calls its classmethod
            def __init__(self, *args: object, key: str = key, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)
                made[key].append(self.vocab)

        monkeypatch.setattr(module, "DraftModelDrafter", Spy)
    grid = dataclasses.replace(TINY, draft_tokens=(2,), tree_depths=(2,), tree_widths=(2,),
                               batch_requests=(1, 2), prefill_tokens=(8,))
    for vocab in (None, ids):
        for kept in made.values():
            kept.clear()
        data = prof.measure(target, target_name="t", draft=draft, grid=grid, feature=False, clock_kind="cpu",
                            draft_vocab=vocab)
        assert [r["tokens"] for r in data["samples"]["draft"]["draft-model"]] == [2]
        assert len(made["series"]) == 2  # the chain and the tree
        assert len(made["batch"]) == 3 + 2  # lockstep chains of 1 and 2 requests, backlog of 1 and 8 tokens
        every = made["series"] + made["batch"]
        assert all((v is None) if vocab is None else torch.equal(v, ids) for v in every)
