"""`specblock benchmark adapt_breakeven`: the bandit's gain over never on AdaptStream, paired by seed, is
exactly 1 when the bandit never updates; it stops updating after its cold start when updates cost too
much; the break-even is read where the gain falls through 1; `--quick --json` prints one object."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from benchmarks.adapt_breakeven import (
    FACTORS,
    LENGTHS,
    break_even,
    cell,
    live_runs,
    live_world,
    profile_name,
    serve,
    stream_for,
)
from core.errors import InputError
from core.paths import CPU_PROFILE, PAPER_PROFILE, PROFILES, RESULTS
from experiments.cli import main
from experiments.results.doc import family, render
from policies.adaptation import BanditParams
from simulator.adaptation import AdaptationDynamics
from simulator.parametric import paper_acceptance, synthetic_traces
from simulator.traces import save_traces


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


def live_record(folder, slowdown: dict) -> object:
    """A live overlapped run's record, as `specblock adapt-live --overlap` lays it out (traces apart)."""
    dynamics = dataclasses.asdict(AdaptationDynamics(headroom=0.5, transfer=1.0, head_capacity=64,
                                                     full_capacity=256))
    drafted = {"blocks": 1.7, "starts": 2.1, "draft_ms": 4.5}
    record = {"config": {"plan": {"min_new_tokens": 48, "max_new_tokens": 64}, "profile": str(CPU_PROFILE)},
              "results": {"fit": {"dynamics": dynamics}, "overlap": {"slowdown": slowdown},
                          "policies": {"never": {"drafted": drafted}}}}
    path = folder / "live.json"
    path.write_text(json.dumps(record))
    return path


def test_the_live_world_takes_the_runs_acceptance_dynamics_and_slowdowns(tmp_path) -> None:
    path = live_record(tmp_path, {"head": 1.3, "full": 1.1})
    assert live_world(path, CPU_PROFILE) is None  # no traces beside it: no live world
    save_traces(synthetic_traces(paper_acceptance(), queries=40, iterations=12, seed=1),
                tmp_path / "live_traces.parquet")
    assert live_world(path, PAPER_PROFILE) is None  # simulated on another profile
    stream = live_world(path, CPU_PROFILE)
    assert not stream.simulated and stream.overlap == {"head": 1.3, "full": 1.1}
    assert stream.dynamics["transfer"] == 1.0 and (stream.head_capacity, stream.full_capacity) == (64, 256)
    assert stream.tokens_per_query == 56 and stream.draft_shape == {"blocks": 1.7, "starts": 2.1}
    never = serve(stream, 60, 1.0, 2, ("never",))["never"]
    point = cell(never, serve(stream, 60, 1.0, 2, ("bandit", "always")))
    assert point["bandit_updates"] > 0 and point["always_gain"] > 0
    # training beside decoding: a slower trainer's neighbour runs slower, so always gains less
    slower = dataclasses.replace(stream, overlap={"head": 3.0, "full": 3.0})
    assert cell(never, serve(slower, 60, 1.0, 2, ("bandit", "always")))["always_gain"] < point["always_gain"]
    path.write_text(json.dumps({"results": {}}))
    with pytest.raises(InputError, match="not laid out"):
        live_world(path, CPU_PROFILE)


def test_break_even_is_where_the_mean_gain_falls_through_one() -> None:
    def cells(gains: list[float], low: float = 0.0) -> list[dict]:
        return [{"factor": 2.0**k, "gain": g, "gain_ci": [g - low, g + 0.01]} for k, g in enumerate(gains)]

    crossing = break_even(cells([1.1, 1.05, 0.95, 0.9], low=0.02))
    assert crossing["status"] == "crossing"
    assert crossing["factor"] == pytest.approx(2.0 * math.sqrt(2.0))  # halfway in log factor from 2 to 4
    assert crossing["shown_up_to"] == 2.0  # 1.05 - 0.02 > 1, 0.95 - 0.02 is not
    assert break_even(cells([0.99, 1.2, 0.5])) == {"factor": None, "status": "below", "shown_up_to": None}
    assert break_even(cells([1.2, 1.1]))["status"] == "above"


def test_a_models_map_places_its_own_live_runs_only(tmp_path) -> None:
    for name, model in (("adapt_live_mine", "toy-16m"), ("adapt_live_theirs", "smollm2-135m")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {"model": model}, "results": {}}))
    runs = live_runs(tmp_path, stream_for(CPU_PROFILE), FACTORS, LENGTHS, "toy-16m")
    assert [r["name"] for r in runs] == ["adapt_live_mine"] and "not laid out" in runs[0]["note"]
    assert [r["name"] for r in live_runs(tmp_path, stream_for(CPU_PROFILE), FACTORS, LENGTHS,
                                         "smollm2-135m")] == ["adapt_live_theirs"]
    assert profile_name(CPU_PROFILE) == "cpu_shipped" and profile_name(tmp_path / "mine.json") == "mine"
    assert profile_name(PROFILES / "smollm2-135m" / "cpu.json") == "smollm2-135m/cpu"


@pytest.mark.parametrize(("model", "message"), [
    ("no-such-model", "is neither a model name nor a checkpoint folder"),
    ("{tmp}/checkpoint", "has no measured cost profile: measure one with `specblock profile --model"),
])
def test_a_model_without_a_profile_is_one_line_and_exit_2(tmp_path, capsys, model: str, message: str) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "adapt_breakeven", "--quick", "--model", model.format(tmp=tmp_path),
              "--out", str(tmp_path / "results")])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    assert message in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()  # nothing written


def test_grid_spans_the_asked_ranges() -> None:
    assert min(FACTORS) <= 1 / 64 and max(FACTORS) >= 8 and 1.0 in FACTORS
    assert min(LENGTHS) <= 50 and max(LENGTHS) >= 4000
    assert stream_for(PAPER_PROFILE).simulated and not stream_for(CPU_PROFILE).simulated


@pytest.mark.slow
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
    live = (RESULTS / "adapt_live_overlap_traces.parquet").is_file()  # committed with its results
    assert [m["simulated"] for m in maps] == ([False, False, True] if live else [False, True])
    for m in maps:
        assert len(m["cells"]) == len(config["factors"]) * len(config["lengths"])
        assert [e["length"] for e in m["break_even"]] == config["lengths"]
        for c in m["cells"]:
            assert c["gain_ci"][0] <= c["gain"] <= c["gain_ci"][1]
            assert len(c["gain_per_seed"]) == config["seeds"]
    assert "live" in maps[0] and "live" not in maps[-1]
    if live:  # each live run sits on the map of its mode: overlapped runs on the live world's
        assert maps[1]["stream"]["overlap"] is not None and maps[0]["stream"]["overlap"] is None
        assert {r["name"] for r in maps[1]["live"]} == {"adapt_live_overlap", "adapt_live_quick_overlap"}
        assert not {r["name"] for r in maps[0]["live"]} & {r["name"] for r in maps[1]["live"]}
    assert all("note" in run for run in maps[0]["live"] if not run["placed"])
    assert family("adapt_breakeven_quick") == "adapt_breakeven"
    page = render(tmp_path, "results")
    assert "Command: `specblock benchmark adapt_breakeven --quick`" in page
    assert "| stream length | break-even factor | shown up to |" in page
