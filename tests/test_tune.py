"""Ray Tune studies: results and policy files, common random numbers, the best row, resume, bad input."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from core.errors import InputError
from core.paths import PAPER_PROFILE, SERVE_PROFILE, TRACES
from experiments.cli import main
from experiments.tuning.tune import (
    Traffic,
    TuneResult,
    best_rows,
    configurations,
    default_params,
    evaluate,
    make_setting,
    tune_policies,
)
from policies.adaptation import BanditParams
from policies.base import load_policy
from simulator.spec_serve import ServeTraffic

SETTING = make_setting("length", PAPER_PROFILE, queries=24, chunks=2, traffic=Traffic())


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", *argv])
        sys.exit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture(scope="module")
def study(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> TuneResult:
    """A 4-sample study of the threshold policy on the simulator."""
    return tune_policies(SETTING, ("threshold",), samples=4, out=tmp_path_factory.mktemp("study"))


def test_study_writes_results_and_a_loadable_best_policy(study: TuneResult):
    table = pd.read_parquet(study.out / "results.parquet")
    assert len(table) == 4 and table["complete"].all() and (table["chunks"] == SETTING.chunks).all()
    pd.testing.assert_frame_equal(table, study.table)
    assert len(pd.read_csv(study.out / "results.csv")) == 4
    policy = load_policy(study.out / "best_policy.json")
    assert policy.kind == "threshold"
    assert dataclasses.asdict(policy.params) == study.best["params"]
    assert load_policy(study.out / "best_threshold.json").params == policy.params


def test_best_row_is_the_argmax_of_the_table(study: TuneResult):
    table = study.table
    top = table.loc[table["tokens_per_second"].idxmax()]
    assert study.best["tokens_per_second"] == top["tokens_per_second"]
    assert study.best["params"] == {"threshold": top["params/threshold"],
                                    "max_length": top["params/max_length"]}
    assert table["tokens_per_second"].nunique() > 1  # configurations differ, so the argmax means something


def test_best_rows_prefer_trials_that_ran_every_chunk():
    table = pd.DataFrame({  # as ASHA leaves it: fixed trial b stopped early, epsilon-greedy entirely
        "kind": ["fixed", "fixed", "fixed", "epsilon-greedy", "epsilon-greedy"],
        "trial_id": ["a", "b", "c", "d", "e"],
        "tokens_per_second": [80.0, 95.0, 70.0, 90.0, 60.0],
        "chunks": [4, 1, 4, 1, 2],
        "complete": [True, False, True, False, False],
        "error": [None] * 5,
    })
    best = best_rows(table)
    assert list(best["trial_id"]) == ["a", "e"]  # complete first; a stopped kind keeps its deepest trial


def test_common_random_numbers(study: TuneResult):
    params = study.best["params"]
    first, again = evaluate(SETTING, "threshold", params), evaluate(SETTING, "threshold", params)
    assert first == again
    # the Ray trial (another process) simulated exactly the same queries
    assert first.tokens_per_second == pytest.approx(study.best["tokens_per_second"], rel=1e-12)
    other = evaluate(dataclasses.replace(SETTING, seed=1), "threshold", params)
    assert other.tokens_per_second != first.tokens_per_second


def test_resume_continues_and_a_second_study_is_refused(study: TuneResult):
    with pytest.raises(InputError, match="--resume"):
        tune_policies(SETTING, ("threshold",), samples=4, out=study.out)
    resumed = tune_policies(SETTING, ("threshold",), samples=4, out=study.out, resume=True)
    pd.testing.assert_frame_equal(resumed.table, study.table)
    with pytest.raises(InputError, match="another configuration"):
        tune_policies(SETTING, ("threshold",), samples=5, out=study.out, resume=True)


def test_configurations_start_at_the_defaults_and_respect_the_ranges():
    bandit = configurations("cost-aware-bandit", "random", 12, seed=3)
    assert bandit[0] == default_params("cost-aware-bandit") and len(bandit) == 12
    for name, (low, high) in BanditParams.SEARCH.items():
        assert all(low <= params[name] <= high for params in bandit)
    assert configurations("cost-aware-bandit", "random", 12, seed=3) == bandit
    for params in configurations("heuristic", "random", 30, seed=0):
        assert params["min_length"] <= params["initial"] <= params["max_length"]
    assert [p["length"] for p in configurations("fixed", "grid", 5)] == [0, 4, 8, 12, 16]
    with pytest.raises(InputError, match="--search random"):
        configurations("cost-aware-bandit", "grid", 4)


@pytest.mark.parametrize("argv", [
    ["bogus"],
    ["length", "--samples", "0"],
    ["adapt", "--policy-kind", "nope"],
    ["length", "--policy-kind", "never"],
    ["adaptation", "--search", "grid", "--policy-kind", "cost-aware-bandit"],
    ["length", "--queries", "2", "--chunks", "3"],
    ["length", "--rate", "3"],
    ["serving", "--policy-kind", "libraspec"],
    ["serving", "--rate", "0"],
    ["serving", "--max-batch", "0"],
    ["serving", "--output-tokens", "64"],
    ["serving", "--prompt-tokens", "96,32"],
    ["length", "--output-tokens", "32,32"],
    ["serving", "--calibrate"],
    ["adapt", "--calibrate", "--traces", "data/traces/default.parquet"],
])
def test_bad_input_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith("specblock: error:") and len(err.strip().splitlines()) == 1


def test_cli_json(ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = run(["adaptation", "--policy-kind", "epsilon-greedy", "--samples", "2", "--queries",
                          "30", "--chunks", "1", "--profile", str(PAPER_PROFILE), "--out", str(tmp_path),
                          "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)  # exactly one JSON object on stdout
    assert {"kind", "samples", "best", "out", "seconds", "trials_per_minute"} <= set(data)
    assert (data["kind"], data["samples"], data["trials"]) == ("adaptation", 2, 2)
    assert set(data["best"]) == {"kind", "params", "tokens_per_second"}
    assert data["best"]["kind"] == "epsilon-greedy" and data["trials_per_minute"] > 0
    assert load_policy(Path(data["out"]) / "best_policy.json").kind == "epsilon-greedy"


def test_cli_serve_tunes_serving_policies_on_specserve(ray_session: None, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]):
    """`specblock tune serve` (the older name of `serving`): trials serve SpecServe episodes; the exported
    best is a serving policy, and the objective is the episodes' tokens/s as ``evaluate`` computes it."""
    code, out, err = run(["serve", "--policy-kind", "batch-table,libraspec-batch", "--samples", "2",
                          "--queries", "8", "--chunks", "1", "--rate", "6", "--max-batch", "3", "--profile",
                          str(PAPER_PROFILE), "--out", str(tmp_path), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["kind"] == "serving" and data["trials"] == 4
    assert data["setting"]["serve"]["rate"] == 6.0 and data["setting"]["serve"]["max_batch"] == 3
    best = load_policy(Path(data["out"]) / "best_policy.json")
    assert best.kind in ("batch-table", "libraspec-batch")
    setting = make_setting("serving", PAPER_PROFILE, queries=8, chunks=1, serve=ServeTraffic(6.0, 3))
    again = evaluate(setting, best.kind, dataclasses.asdict(best.params))
    assert again.tokens_per_second == pytest.approx(data["best"]["tokens_per_second"])


def test_cli_serve_calibrates_the_confidence_readers(ray_session: None, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]):
    """`--calibrate`: the calibration fitted from the traces lands in the study folder and in the exported
    file of every kind that reads confidences, so the policy the engine loads maps them the same way."""
    code, out, err = run(["serving", "--policy-kind", "libraspec-batch", "--samples", "1", "--queries", "4",
                          "--chunks", "1", "--profile", str(SERVE_PROFILE), "--traces", str(TRACES),
                          "--calibrate", "--prompt-tokens", "96,96", "--output-tokens", "8,8", "--out",
                          str(tmp_path), "--json"], capsys)
    assert code == 0, err
    fitted = json.loads((tmp_path / "calibration.json").read_text())
    exported = json.loads((tmp_path / "best_libraspec-batch.json").read_text())
    assert exported["calibration"] == fitted and json.loads(out)["setting"]["calibration"]
