"""A real model's main job against its goals on docs/results.md: each goal read from its results file as
met, missed or unsettled, over every run it covers, and the loop's answers (where speculation switches
off under load, whether online updates pay)."""

from __future__ import annotations

import json
from pathlib import Path

from test_results_doc import PIPELINE_COMMIT, pipeline_run, record

from experiments.results.doc import render
from experiments.results.loop import answer_rows, counted, fidelity_rows, loop_goals, simulator_rows

MODEL = "smollm2-135m"


def pipelines(*errors: float, command: str = f"specblock pipeline --quick --model {MODEL}") -> dict:
    return record({"command": command, "runs": len(errors), "model": MODEL},
                  [pipeline_run(e) for e in errors], PIPELINE_COMMIT)


def serve_file(over_none: dict[str, list[float]]) -> dict:
    """Not drafting and one speculating setting, whose tokens/s over not drafting's is ``over_none`` per
    rate ([ratio, low, high])."""
    rates = {rate: {} for rate in over_none}
    ratios = {rate: {"ratio": v[0], "ratio_ci": v[1:]} for rate, v in over_none.items()}
    goodput = {"rates": rates, "over_none": ratios}
    results = {"policies": {"none": {"rates": rates}, "goodput": goodput}, "fidelity_error": 0.12,
               "tpot_fidelity_error": 0.05}
    return record({"model": MODEL}, results, PIPELINE_COMMIT)


def breakeven_file(gain: float, ci: list[float]) -> dict:
    cells = [{"length": n, "factor": f, "gain": gain, "gain_ci": ci} for n in (50, 4000) for f in (0.5, 1.0)]
    maps = [{"simulated": False, "cells": cells, "break_even": [{"length": 50, "factor": 0.1},
                                                                {"length": 4000, "factor": 0.5}]},
            {"simulated": True, "cells": [], "break_even": []}]
    return record({"model": MODEL}, {"maps": maps}, PIPELINE_COMMIT)


def test_a_goal_over_runs_says_in_how_many_each_verdict_held():
    assert counted(["met", "met", "met"]) == "met in all 3 runs"
    assert counted(["met"]) == "met in the 1 run"
    assert counted(["met", "missed", "unsettled (the interval straddles it)"]) == (
        "met in 1 of 3; missed in 1 of 3; unsettled in 1 of 3")


def test_a_quick_run_misses_when_its_median_or_its_worst_policy_is_past_the_goal():
    worst = pipeline_run(0.05)
    worst["worst_error"] = -0.25  # the median within 10%, the worst policy past 20%
    worst["resumed"] = True  # its seconds are its steps' sum
    runs = [pipeline_run(0.1), pipeline_run(0.11), worst]
    quick = record({"command": "specblock pipeline --quick", "runs": 3}, runs, PIPELINE_COMMIT)
    full = pipelines(0.051, command=f"specblock pipeline --model {MODEL}")
    rows = {row[0]: row for row in fidelity_rows(quick, full)}
    assert rows["simulator's fidelity error, each quick pipeline"][3] == "met in 1 of 3; missed in 2 of 3"
    assert "(worst 25.0%)" in rows["simulator's fidelity error, each quick pipeline"][2]
    assert rows["simulator's fidelity error, each full pipeline"][3] == "missed in the 1 run"
    tuned = rows["tuned LibraSpec or threshold, live, over the best fixed length"]
    assert tuned[2].startswith("quick 1: tuned-libraspec 0.951 [0.903, 1.002]; ") and "full 1:" in tuned[2]
    assert tuned[3] == "unsettled in all 4 runs"
    assert rows["the quick pipeline's wall time"][2:] == ["120, 120, 120 (resumed) s (Test CPU)",
                                                          "met in all 3 runs"]


def test_the_simulators_fidelity_is_read_against_ten_percent():
    rows = simulator_rows(serve_file({"1": [1.0, 0.99, 1.01]}), None)
    assert rows == [["serving simulator's fidelity error (tokens/s, over settings and rates)", "at most 10%",
                     "12.0%", "missed"]]


def test_speculation_switches_off_at_the_lowest_rate_where_no_drafting_wins_by_its_whole_interval():
    serve = serve_file({"32": [0.7, 0.6, 0.8], "1": [1.1, 1.05, 1.2], "4": [0.97, 0.9, 1.02],
                        "16": [0.8, 0.7, 0.9]})  # in the file's order, not by rate
    assert answer_rows(serve, None)[0][2:] == [
        "16 requests/s (best speculating: goodput, 0.80 [0.70, 0.90]x)", "answered"]
    never = answer_rows(serve_file({"1": [1.1, 1.05, 1.2], "4": [0.97, 0.9, 1.02]}), None)
    assert never[0][2:] == ["not within the rates measured", "not reached"]


def test_online_updates_pay_only_when_the_longest_streams_gain_clears_one():
    assert answer_rows(None, breakeven_file(1.05, [1.02, 1.08]))[0][2:] == [
        "1.050 [1.020, 1.080] over 4,000 queries; break-even at 0.5x the update cost", "pays"]
    assert answer_rows(None, breakeven_file(0.98, [0.97, 0.99]))[0][3] == "does not pay"
    assert answer_rows(None, breakeven_file(1.0, [0.99, 1.01]))[0][3] == "unsettled"


def test_missing_files_or_another_layout_leave_their_rows_out(tmp_path: Path):
    assert loop_goals(MODEL, {}) == []
    assert loop_goals(MODEL, {f"serve_bench_{MODEL}": record({}, {"policies": {}}, PIPELINE_COMMIT)}) == []
    for name, content in ((f"pipeline_quick_{MODEL}", pipelines(0.04, 0.06)),
                          (f"adapt_breakeven_{MODEL}", breakeven_file(0.98, [0.97, 0.99]))):
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    page = render(tmp_path, "results")
    heading = page.index("### The main job against its goals")
    assert page.index(f"## `{MODEL}`") < heading < page.index("#### ")
    assert "| met in all 2 runs |" in page and "| does not pay |" in page and "serving simulator" not in page
