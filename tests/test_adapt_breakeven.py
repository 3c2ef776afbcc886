"""`specblock benchmark adapt_breakeven`: the bandit's gain over never on AdaptStream, paired by seed, is
exactly 1 when the bandit never updates; it stops updating after its cold start when updates cost too
much; the break-even is read where the gain falls through 1; `--quick --json` prints one object."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.adapt_breakeven import FACTORS, LENGTHS, break_even, cell, serve, stream_for
from core.paths import CPU_PROFILE, PAPER_PROFILE
from experiments.cli import main
from experiments.results_doc import family, render
from policies.adaptation import BanditParams


def gain_of(length: int, factor: float, seeds: int = 3) -> dict:
    """One grid point of the CPU map: never, then the bandit and always on the same seeds."""
    stream = stream_for(CPU_PROFILE)
    never = serve(stream, length, 1.0, seeds, ("never",))["never"]
    return cell(never, serve(stream, length, factor, seeds, ("bandit", "always")))


def test_gain_is_exactly_one_when_the_bandit_never_updates() -> None:
    # within its warm-up the bandit skips every query: with common random numbers its streams are never's
    point = gain_of(BanditParams().warmup, 1.0)
    assert point["bandit_updates_per_seed"] == [0, 0, 0]
    assert point["gain_per_seed"] == pytest.approx([1.0, 1.0, 1.0], abs=1e-12)
    assert point["gain_ci"] == pytest.approx([1.0, 1.0], abs=1e-12)
    assert point["always_gain"] < 1.0  # always does update, and pays for it


def test_at_a_huge_update_cost_the_bandit_stops_after_its_cold_start() -> None:
    point = gain_of(200, 1e4, seeds=2)
    assert point["bandit_updates_per_seed"] == [BanditParams().cold_start_events] * 2
    # both pay for their updates; which pays more depends on the profile's head and full update costs
    assert point["gain"] < 0.1 and point["always_gain"] < 0.1


def test_cheaper_updates_pay_more() -> None:
    gains = [gain_of(200, factor, seeds=2)["gain"] for factor in (1 / 256, 1.0)]
    assert gains[0] > gains[1]


def test_break_even_is_where_the_mean_gain_falls_through_one() -> None:
    def cells(gains: list[float], low: float = 0.0) -> list[dict]:
        return [{"factor": 2.0**k, "gain": g, "gain_ci": [g - low, g + 0.01]} for k, g in enumerate(gains)]

    crossing = break_even(cells([1.1, 1.05, 0.95, 0.9], low=0.02))
    assert crossing["status"] == "crossing"
    assert crossing["factor"] == pytest.approx(2.0 * math.sqrt(2.0))  # halfway in log factor from 2 to 4
    assert crossing["shown_up_to"] == 2.0  # 1.05 - 0.02 > 1, 0.95 - 0.02 is not
    assert break_even(cells([0.99, 1.2, 0.5])) == {"factor": None, "status": "below", "shown_up_to": None}
    assert break_even(cells([1.2, 1.1]))["status"] == "above"


def test_grid_spans_the_asked_ranges() -> None:
    assert min(FACTORS) <= 1 / 64 and max(FACTORS) >= 8 and 1.0 in FACTORS
    assert min(LENGTHS) <= 50 and max(LENGTHS) >= 4000
    assert stream_for(PAPER_PROFILE).simulated and not stream_for(CPU_PROFILE).simulated


def test_quick_json_is_one_object_with_the_maps(tmp_path, capsys) -> None:
    try:
        main(["benchmark", "adapt_breakeven", "--quick", "--json", "--out", str(tmp_path)])
    except SystemExit as exc:
        assert not exc.code
    out = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert set(out) == {"results", "files", "rows"}
    assert {p.rsplit("/", 1)[1] for p in out["files"]} == {f"adapt_breakeven_quick.{ext}"
                                                            for ext in ("json", "md", "png")}
    saved = json.loads((tmp_path / "adapt_breakeven_quick.json").read_text())
    assert saved["results"] == out["rows"]
    config, maps = saved["config"], out["rows"]["maps"]
    assert [m["simulated"] for m in maps] == [False, True]
    for m in maps:
        assert len(m["cells"]) == len(config["factors"]) * len(config["lengths"])
        assert [e["length"] for e in m["break_even"]] == config["lengths"]
        for c in m["cells"]:
            assert c["gain_ci"][0] <= c["gain"] <= c["gain_ci"][1]
            assert len(c["gain_per_seed"]) == config["seeds"]
    assert "live" in maps[0] and "live" not in maps[1]
    assert all("note" in run for run in maps[0]["live"] if not run["placed"])
    assert family("adapt_breakeven_quick") == "adapt_breakeven"
    page = render(tmp_path, "results")
    assert "Command: `specblock benchmark adapt_breakeven --quick`" in page
    assert "| stream length | break-even factor | shown up to |" in page
