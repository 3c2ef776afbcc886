"""`specblock benchmark pipeline_runs` keeps its series in a folder until the results are written: a series
cut off continues with ``--resume`` (finished runs kept, the unfinished one resumed by the pipeline's own
``--resume``), and a leftover series, a missing one or one of another plan is refused with its fix."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from benchmarks import pipeline_runs


def summary(error: float, seconds: float = 100.0) -> dict:
    """A pipeline's ``--json`` summary as the series reads it."""
    speeds = {"fixed-1": 30.0, "libraspec": 31.0}
    policies = {n: {"measured_tokens_per_second": v, "measured_ci": [v - 1, v + 1], "error": error,
                    "predicted_tokens_per_second": v * (1 + error), "predicted_ci": [v - 1, v + 1]}
                for n, v in speeds.items()}
    return {"fidelity_error": error, "fidelity_error_ci": [error / 2, error * 2], "policies": policies,
            "rank_agreement": {"kendall_tau": 1.0, "predicted_best": "libraspec",
                               "measured_best": "libraspec", "predicted_best_within_interval": True},
            "against_best_fixed": {"best_fixed": "fixed-1",
                                   "policies": {"libraspec": {"ratio": 1.03, "ratio_ci": [1.0, 1.06]}}},
            "seconds": seconds, "steps": {"profile": 40.0, "deploy": 50.0}}


@pytest.fixture
def series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list, set]:
    """The series folder, the pipeline runs called (folder name, resume), and the runs to cut off: a cut
    run leaves a run record behind, as a pipeline stopped after its first step does."""
    work = tmp_path / "series"
    monkeypatch.setattr(pipeline_runs, "PIPELINE_SERIES", work)
    calls: list[tuple[str, bool]] = []
    cut: set[str] = set()

    def fake(out: Path, full: bool, model: str, resume: bool = False) -> dict:
        calls.append((out.name, resume))
        if out.name in cut:
            out.mkdir(parents=True, exist_ok=True)
            (out / "run.json").write_text("{}")
            raise click.ClickException("pipeline run failed (-9): killed")
        return summary(0.01 * (len(calls)), seconds=999.0)

    monkeypatch.setattr(pipeline_runs, "run_once", fake)
    return work, calls, cut


def test_a_series_cut_off_resumes_keeping_its_finished_runs(
        series: tuple[Path, list, set], cli: Callable, tmp_path: Path) -> None:
    work, calls, cut = series
    argv = ["benchmark", "pipeline_runs", "--runs", "3", "--tag", "t", "--out", str(tmp_path / "results")]
    cut.add("run1")
    code, _, err = cli(argv)
    assert code == 1 and "killed" in err
    assert calls == [("run0", False), ("run1", False)]
    assert (work / "t" / "run0.json").is_file() and not (tmp_path / "results" / "t.json").exists()

    code, _, err = cli(argv)  # started again without --resume: the cut series is not thrown away
    assert code == 2 and "--resume" in err and (work / "t" / "run0.json").is_file()

    cut.clear()
    calls.clear()
    code, _, err = cli([*argv, "--resume"])
    assert code == 0, err
    assert calls == [("run1", True), ("run2", False)]  # run0 kept, run1 resumed where it stopped
    rows = json.loads((tmp_path / "results" / "t.json").read_text())["results"]
    assert [r["fidelity_error"] for r in rows] == [0.01, 0.01, 0.02]  # run0 from the first try
    assert [r["resumed"] for r in rows] == [False, True, False]
    assert [r["seconds"] for r in rows] == [999.0, 90.0, 999.0]  # a resumed run: its steps' seconds
    assert "| 90 (resumed) |" in (tmp_path / "results" / "t.md").read_text()
    assert not (work / "t").exists()  # the series is in its results now


def test_a_run_folder_with_no_finished_step_starts_afresh(series: tuple[Path, list, set], cli: Callable,
                                                          tmp_path: Path) -> None:
    work, calls, _ = series
    (work / "t" / "run0").mkdir(parents=True)
    (work / "t" / "run0" / "partial.parquet").write_bytes(b"x")
    (work / "t" / "plan.json").write_text(json.dumps({"full": False, "model": "toy-16m"}))
    code, _, err = cli(["benchmark", "pipeline_runs", "--runs", "1", "--tag", "t", "--resume",
                        "--out", str(tmp_path / "results")])
    assert (code, calls) == (0, [("run0", False)]), err


def test_resuming_nothing_another_plan_or_a_bad_tag_is_refused(
        series: tuple[Path, list, set], refused: Callable, tmp_path: Path) -> None:
    work, calls, _ = series
    out = ["--out", str(tmp_path / "results")]
    assert "no series to resume" in refused(["benchmark", "pipeline_runs", "--tag", "t", "--resume", *out])
    (work / "t").mkdir(parents=True)
    (work / "t" / "plan.json").write_text(json.dumps({"full": False, "model": "toy-16m"}))
    err = refused(["benchmark", "pipeline_runs", "--full", "--tag", "t", "--resume", *out])
    assert "another plan" in err and "--full" in err
    assert "--tag" in refused(["benchmark", "pipeline_runs", "--tag", "../escape", *out])
    assert calls == [] and not (tmp_path / "results").exists()
