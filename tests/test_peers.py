"""The peers benchmark's own rows (``benchmarks.peers.ours``): vanilla, n-gram and each drafter trained
for the model at its deployed shape, greedy and so equal to vanilla; a drafter not trained is noted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import peers
from benchmarks.peers import ours, rival_engine, summarize
from core.models import folder_spec
from real_engine.decode import make_drafter
from real_engine.tokenizer import Tokenizer


def test_our_rows_run_the_models_trained_drafters_and_note_the_others(
        llama_dir: Path, draft_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "model"
    shutil.copytree(llama_dir, folder)
    shutil.copytree(draft_dir, folder / "drafters" / "draft")
    spec = folder_spec(folder)
    notes: list[str] = []
    built = []
    monkeypatch.setattr(peers, "make_drafter", lambda *a, **k: built.append(a[0]) or make_drafter(*a, **k))
    engines = ours(spec, "float32", Tokenizer.load(folder), 12, ("draft-model", "eagle"), notes)
    assert built == ["none", "ngram", "draft-model"]  # each drafter built once, before any timed call
    assert [e.name for e in engines] == ["specblock vanilla", "specblock n-gram", "specblock draft-model"]
    assert len(notes) == 1 and notes[0].startswith("eagle:") and "specblock train eagle" in notes[0]
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    vanilla = engines[0].run(prompt)
    assert len(vanilla) > 0 and all(e.run(prompt) == vanilla for e in engines[1:])
    assert all(e.run(prompt) == vanilla for e in engines) and len(built) == 3  # reused: no build per call
    # in int4, under their own names: the drafter not trained is noted once
    quantized = ours(spec, "int4", Tokenizer.load(folder), 12, ("draft-model", "eagle"), notes,
                     "specblock int4")
    assert [e.name for e in quantized] == ["specblock int4 vanilla", "specblock int4 n-gram",
                                           "specblock int4 draft-model"] and len(notes) == 1
    assert "int4" in quantized[0].kind and len(quantized[0].run(prompt)) > 0


def test_each_engine_has_its_own_vanilla() -> None:
    names = ["specblock vanilla", "specblock n-gram", "specblock int4 vanilla", "specblock int4 n-gram",
             "llama.cpp Q4_1 vanilla", "llama.cpp Q4_1 prompt lookup", "transformers prompt lookup"]
    assert [peers.own_vanilla(n, names) for n in names] == [
        "specblock vanilla", "specblock vanilla", "specblock int4 vanilla", "specblock int4 vanilla",
        "llama.cpp Q4_1 vanilla", "llama.cpp Q4_1 vanilla", "specblock vanilla"]  # no transformers vanilla


def test_summary_sets_each_engine_against_our_vanilla_and_the_rival_prompt_by_prompt() -> None:
    def engine(tps: float, tokens: list[int]) -> dict[str, object]:
        return {"tokens_per_second": tps, "tokens": tokens, "new_tokens": len(tokens)}

    records = [{"category": c, "engines": {"specblock vanilla": engine(v, [1, 2]), "ours": engine(o, [1, 2]),
                                           "llama.cpp Q4_1 vanilla": engine(r, [1, 3])}}
               for c, v, o, r in (("chat", 10.0, 20.0, 40.0), ("code", 20.0, 30.0, 10.0))]
    names = ["specblock vanilla", "ours", "llama.cpp Q4_1 vanilla"]
    assert rival_engine(names) == "llama.cpp Q4_1 vanilla" and rival_engine(names[:2]) is None
    rows = {(r["engine"], r["category"]): r for r in summarize(names, records, 0, rival_engine(names))}
    pooled = rows[("ours", "pooled")]
    assert pooled["over_vanilla"] == (2.0 + 1.5) / 2 and pooled["over_rival"] == (0.5 + 3.0) / 2
    assert pooled["over_rival_ci"][0] <= pooled["over_rival"] <= pooled["over_rival_ci"][1]
    assert rows[("ours", "chat")]["over_rival"] == 0.5 and rows[("ours", "chat")]["prompts"] == 1
    assert rows[("llama.cpp Q4_1 vanilla", "pooled")]["same_tokens_as_vanilla"] == 0.0
    assert rows[("llama.cpp Q4_1 vanilla", "pooled")]["same_tokens_as_own_vanilla"] == 1.0
    assert "over_rival" not in summarize(names, records, 0)[0]
