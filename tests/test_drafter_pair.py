"""`specblock benchmark drafter_pair`: SpecBlock against EAGLE-style at equal vocabulary, depth and budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import drafter_pair as dp
from core.names import DOMAINS
from core.paths import MODELS
from experiments.cli import main


def run(seconds: float, draft: float, iterations: int, new: int = 8) -> dict:
    return {"tokens": [1] * new, "new": new, "seconds": seconds, "iterations": iterations,
            "draft_seconds": draft, "calls": iterations, "accepted": [], "depths": []}


def test_relative_figures_are_paired_by_prompt() -> None:
    """Speedup ratio: mean speedup over mean speedup; drafting-time ratio: drafting seconds per iteration
    over the other's; a replicate that keeps every prompt reproduces the point estimate."""
    base = [run(1.0, 0.0, 8), run(2.0, 0.0, 8)]
    ours = [run(0.5, 0.1, 4), run(1.0, 0.2, 4)]  # twice vanilla's speed on both prompts
    theirs = [run(1.0, 0.4, 2), run(2.0, 0.8, 4)]  # vanilla's speed
    whole = np.array([[0, 1]])
    got = dp.relative(ours, theirs, base, whole)
    assert got["speedup_ratio"] == pytest.approx(2.0) and got["speedup_ratio_ci"] == pytest.approx([2.0, 2.0])
    assert got["draft_time_ratio"] == pytest.approx((0.3 / 8) / (1.2 / 6))
    row = dp.summarize(ours, base, whole)
    assert row["speedup"] == pytest.approx(2.0) and row["draft_ms"] == pytest.approx(1e3 * 0.3 / 8)
    assert row["tau"] == pytest.approx(16 / 8) and row["greedy_identical"]


@pytest.mark.slow
def test_the_benchmark_runs_both_drafters_at_both_vocabularies(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "drafters"
    for name in dp.DRAFTERS:  # the shipped pair, with a token order for the reduced vocabulary
        shutil.copytree(MODELS / name, folder / name)
        (folder / name / "draft_vocab.json").write_text(json.dumps({"ids": list(range(8192))}))
    argv = ["benchmark", "drafter_pair", "--prompts", "1", "--tokens", "4", "--drafters-dir", str(folder),
            "--out", str(tmp_path), "--json"]
    try:
        main(argv)
    except SystemExit as exc:  # click exits only on an error here
        assert not exc.code
    data = json.loads(capsys.readouterr().out)
    rows, pairs = data["rows"]["settings"], data["rows"]["relative"]
    shapes = {"depth4", "depth8", "deployed"}
    assert {(r["drafter"], r["vocab"], r["shape"], r["temperature"]) for r in rows} == {
        (d, v, s, t) for d in dp.DRAFTERS for v in ("reduced", "full") for s in shapes for t in (0.0, 1.0)}
    assert all(r["greedy_identical"] is (True if r["temperature"] == 0 else None) for r in rows)
    for r in rows:
        assert r["speedup_ci"][0] <= r["speedup"] <= r["speedup_ci"][1] and r["draft_calls"] > 0
    assert len(pairs) == 12 and all(p["draft_time_ratio"] > 0 for p in pairs)
    assert all(set(p["categories"]) == set(DOMAINS) for p in pairs)  # each ratio per category too
    chains = data["rows"]["chains"]
    assert set(chains) == set(dp.DRAFTERS) and all(len(c["alpha"]) <= 2 * dp.BLOCK for c in chains.values())
    branching = data["rows"]["branching"]
    assert set(branching) == set(dp.BUCKETS) and all(b["tau"] >= 1 for b in branching.values())
    assert all(1 <= b["nodes"] <= dp.BUDGET + 1 for b in branching.values())
    assert data["rows"]["rank_head"] is None  # the shipped drafter's record has no calibration
    assert (tmp_path / "drafter_pair.md").read_text().startswith("# SpecBlock against EAGLE-style")


def test_a_folder_without_the_pair_is_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["benchmark", "drafter_pair", "--prompts", "1", "--drafters-dir", str(tmp_path),
              "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "specblock train" in err[0]


def test_its_command_line_names_a_model_and_keeps_the_toy_familys_defaults() -> None:
    toy = {"prompts_per_domain": 16, "tokens": 64, "drafters_dir": "data/models/fair", "threads": 1}
    assert dp._drafter_pair_command("drafter_pair", toy) == "specblock benchmark drafter_pair"
    real = {**toy, "model": "smollm2-135m", "drafters_dir": "data/models/smollm2-135m",
            "default_drafters_dir": "data/models/smollm2-135m", "threads": 2}
    assert dp._drafter_pair_command("drafter_pair_smollm2-135m", real) == (
        "specblock benchmark drafter_pair --model smollm2-135m --threads 2")
