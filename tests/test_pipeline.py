"""`specblock pipeline --smoke` end to end on the shipped models (every step, at the smallest sizes), its
resume, and its bad input."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from time_limits import limit

from core.paths import REPO
from experiments.pipeline.run import STEPS

pytestmark = pytest.mark.slow


def specblock(*args: str) -> subprocess.CompletedProcess:
    """The command line, in this interpreter (however the project was installed)."""
    return subprocess.run(
        [sys.executable, "-m", "experiments.cli", *args],
        capture_output=True,
        text=True,
        timeout=limit(300),
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("pipeline") / "run"
    proc = specblock("pipeline", "--smoke", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_smoke_pipeline_writes_every_step_and_the_summary(smoke_run: tuple[Path, dict]) -> None:
    out, summary = smoke_run
    assert summary["run_dir"] == str(out.resolve())
    assert summary["model"] == "toy-16m"  # the model it ran, named as --model takes it
    assert set(summary["steps"]) == set(STEPS)
    for name in (
        "models.json",
        "cost_profile.json",
        "traces.parquet",
        "held_out_traces.parquet",
        "simulate.json",
        "deploy.json",
        "deploy_profile.json",
        "calibration.json",
        "report.md",
        "report.png",
        "lp.json",
    ):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in (out / "policies").glob("*.json"))  # tuned policy files exported
    policies = summary["policies"]
    assert "vanilla" in policies and any(name.startswith("tuned-") for name in policies)
    for row in policies.values():
        assert row["measured_tokens_per_second"] > 0 and row["predicted_tokens_per_second"] > 0
        for key in ("measured", "predicted"):  # a 95% interval around each figure
            low, high = row[f"{key}_ci"]
            assert 0 < low <= high
    assert "libraspec-calibrated" in policies and "libraspec" in policies
    low, high = summary["fidelity_error_ci"]
    assert 0 <= low <= high
    replayed = [abs(row["replay_error"]) for row in policies.values()]  # the held-out prompts' own traces
    assert summary["replay_error"] == pytest.approx(statistics.median(replayed))
    assert "On the held-out prompts' own text" in (out / "report.md").read_text()
    agreement = summary["rank_agreement"]
    assert -1 <= agreement["kendall_tau"] <= 1
    assert {agreement["predicted_best"], agreement["measured_best"]} <= set(policies)
    assert isinstance(agreement["predicted_best_within_interval"], bool)
    assert set(agreement["predicted_ties"]) <= set(policies) - {agreement["predicted_best"]}
    assert agreement["measured_best_tied"] == (
        agreement["measured_best"] in {agreement["predicted_best"], *agreement["predicted_ties"]})
    assert set(summary["against_best_fixed"]["policies"]) == {
        name for name in policies if name.startswith(("tuned-libraspec", "tuned-threshold", "tuned-heuristic",
                                                      "libraspec"))}
    tuned = json.loads((out / "policies" / "tuned-libraspec.json").read_text())
    assert tuned["calibration"] == json.loads((out / "calibration.json").read_text())
    errors = sorted(abs(r["error"]) for r in policies.values())
    assert summary["fidelity_error"] == pytest.approx(
        errors[len(errors) // 2]
        if len(errors) % 2
        else (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2
    )
    report = (out / "report.md").read_text()
    assert "Fidelity error" in report and "Kendall's tau" in report and "LP bound" in report
    assert "**Ties**: the simulator" in report  # whether the simulator can tell its best from the rest
    assert "| never |" in report  # the adaptation table keeps the row it is measured against
    assert report.splitlines()[2].startswith("Model `toy-16m` (target ")  # whose run it reports
    tuned = [line for line in report.splitlines() if line.startswith("- `tuned-")]
    assert tuned and all('"params"' in line and '"calibration"' not in line for line in tuned)  # no knots


def test_resume_skips_finished_steps(smoke_run: tuple[Path, dict]) -> None:
    out, summary = smoke_run
    before = json.loads((out / "run.json").read_text())
    proc = specblock("pipeline", "--smoke", "--out", str(out), "--resume", "--json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert again["policies"] == summary["policies"]
    assert json.loads((out / "run.json").read_text()) == before  # nothing re-ran


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, smoke_run: tuple[Path, dict],
                                          refused: Callable[[list[str]], str]) -> None:
    out, _ = smoke_run
    cases = [
        (["pipeline", "--smoke", "--out", str(out)], "--resume"),  # a finished run, not empty
        (["pipeline", "--out", str(out), "--resume"], "another plan"),  # full plan on a smoke run
        (["pipeline", "--quick", "--out", str(out), "--resume"], "another plan"),  # quick plan on it
        (["pipeline", "--smoke", "--out", str(tmp_path / "new"), "--resume"], "drop --resume"),
        (["pipeline", "--smoke", "--out", str(tmp_path / "x"), "--model", str(tmp_path)], "specblock train"),
        (["pipeline", "--quick", "--smoke", "--out", str(tmp_path / "y")], "give one of them"),
    ]
    for args, fix in cases:
        assert fix in refused(args), args
