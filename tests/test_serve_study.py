"""The serving study's parts: each case's capacity, one simulated point, and the tables and plot drawn
from a result (the whole study runs for minutes: `specblock study serving`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.paths import PAPER_PROFILE
from experiments.serving.report import study_body
from experiments.tuning.serving_study import CASES, capacity, serve_markdown, serve_plot, serve_point
from experiments.tuning.tune import Traffic, make_setting
from policies.serving import NEVER
from simulator.spec_serve import ServeTraffic


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.profile.stem)
def test_capacity_is_what_vanilla_serves_at_a_full_batch(case) -> None:
    rate = capacity(case)
    assert 0 < rate < 1e4
    smaller = type(case)(case.label, case.profile, case.drafter, case.traces,
                         ServeTraffic(max_batch=1, prompt_tokens=case.traffic.prompt_tokens,
                                      output_tokens=case.traffic.output_tokens))
    assert capacity(smaller) < rate  # batching raises what vanilla serves


def test_a_point_reports_throughput_and_latencies() -> None:
    setting = make_setting("serving", PAPER_PROFILE, queries=6, chunks=1, seed=3, traffic=Traffic(),
                           drafter="eagle", serve=ServeTraffic(5.0, 3, (64, 128), (16, 32)))
    vanilla = serve_point(setting, "batch-table", dict(NEVER), episodes=2)
    table = serve_point(setting, "batch-table", {"l1": 3, "l2": 3, "l3": 3}, episodes=2)
    for point in (vanilla, table):
        assert point["tokens_per_second"] > 0 and 0 < point["tpot_ms_p50"] <= point["tpot_ms_p99"]
    assert vanilla != table  # speculating changes the served times


def synthetic() -> dict:
    point = {"tokens_per_second": 100.0, "tpot_ms_p50": 5.0, "tpot_ms_p99": 9.0, "ttft_ms_p50": 30.0,
             "over_vanilla": 1.0}
    faster = {**point, "tokens_per_second": 110.0, "over_vanilla": 1.1, "tpot_ms_p99": 8.0}
    return {"rows": [{"case": "a case (simulated)", "profile": "p.json", "drafter": "eagle",
                      "traffic": {"max_batch": 2, "prompt_tokens": [96, 96], "output_tokens": [32, 32]},
                      "capacity": 4.0, "rates": {"0.5": 2.0, "1": 4.0},
                      "policies": {"vanilla": {"0.5": point, "1": point},
                                   "goodput (tuned)": {"0.5": faster, "1": point}},
                      "tuned": {"batch-table": {"l1": 3, "l2": 0}, "goodput": {"max_length": 4}}}]}


def test_tables_and_plot_read_the_result(tmp_path: Path) -> None:
    result = synthetic()
    config = {"samples": 4, "requests": 8, "tune_episodes": 1, "episodes": 1}
    text = serve_markdown(result, config)
    assert "| goodput (tuned) | 110.0 (1.100) / 8.00 | 100.0 (1.000) / 9.00 |" in text
    assert "length by batch size: 1: 3, 2: 0." in text
    body = "\n".join(study_body({"results": result, "config": {"study": "serve", **config}}))
    assert "| 0.5 | 2.00 | 100.0 | 9.00 | goodput (tuned) | 1.100 | 8.00 |" in body
    serve_plot(result, tmp_path / "study.png")
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
