"""When does online adaptation pay? The cost-aware bandit's tokens/s over never updating, mapped on
AdaptStream against the update cost and the stream length, with the live runs marked.

Each profile's head and full update seconds (its full-buffer and one-window samples alike) are scaled
by each factor of a log-spaced grid; streams of each length (a quarter from one domain, then an equal
mix of all the acceptance's domains: ``default_phases``) are served by ``never``, ``cost-aware-bandit``
and ``always`` (head), default parameters, with seed k for stream k of every policy and grid point
(common random numbers: a stream's queries are the same until a policy's first update). Gain: the
bandit's tokens/s, update seconds charged, over never's on the same stream; mean over seeds with a 95% t
interval. Break-even: the factor at which the mean gain falls through 1 (log-interpolated between grid
points).

A measured profile (the CPU one of ``--model``, the shipped toy family's by default; ``--profile`` picks
another) serves queries shaped as the live stream's (``specblock adapt-live``: the middle of its
new-token range, its prompt lengths, the engine's buffer sizes); a profile derived from a paper (the
A100 one, labelled simulated) the paper's 512-token queries, as its update cost was derived. Both take
the paper's acceptance (``paper_acceptance``: the shipped traces are the draft model's, not
SpecBlock's) and adaptation dynamics (``AdaptationDynamics``), updates waited for. The measured profile
gets a second map, the live world: the acceptance the engine's SpecBlock drafter showed on the model's
overlapped 2,000-query live stream (``adapt_live_overlap``, another model's ``adapt_live_<model>_overlap``:
``experiments.adapt.plan.result_name``; its ``never`` stream's iterations, replayed at its mean tree
shape), the adaptation dynamics fitted there, and updates trained beside decoding, each slowing queries
by its kind's measured factor, as ``specblock adapt-live --overlap`` runs them. The model's live runs
(``benchmarks/results/adapt_live*.json`` that name it) sit on the map of their mode (overlapped or
waited) at their re-timed update cost over the profile's and their stream length, and again where an
update costs as many of the map's queries as of theirs.
Writes ``adapt_breakeven.json`` (``adapt_breakeven_<model>`` for a model other than the toy family;
``_quick`` with ``--quick``), ``.md`` and ``.png``.

    specblock benchmark adapt_breakeven [--quick] [--model NAME|DIR] [--profile FILE] [--out DIR] [--json]
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import textwrap
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Any

import click
import numpy as np
from scipy import stats
from scipy.interpolate import RegularGridInterpolator

from benchmarks.output import finish, table
from core.cost_profile import CostProfile, load_profile
from core.errors import InputError
from core.files import MAX_RECORD_BYTES, atomic_write, read_json, write_text
from core.models import TOY, ModelSpec
from core.paths import PAPER_PROFILE, PROFILES, RESULTS, repo_relative
from experiments.adapt.live import MAX_PROMPT
from experiments.adapt.plan import DEFAULT_PLAN, result_name
from experiments.cli import OUT_FOLDER, model_option, model_profile, model_result
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag
from experiments.report_format import table as md_table
from policies.base import make_policy
from real_engine.adapt import AdaptConfig
from simulator.acceptance import AcceptanceModel
from simulator.adapt_stream import AdaptStreamEnv, default_phases
from simulator.adaptation import AdaptationDynamics
from simulator.env_base import DEFAULT_PROMPT, DEFAULT_TOKENS
from simulator.parametric import paper_acceptance
from simulator.replay import TraceReplay
from simulator.rollout import run_adapt
from simulator.traces import load_traces

NAME = "adapt_breakeven"
FACTORS = tuple(2.0**k for k in range(-10, 9))  # update cost over the profile's: 1/1024 .. 256, octaves
LENGTHS = (50, 100, 200, 500, 1000, 2000, 4000)  # queries per stream
SEEDS = 6
QUICK = {"factors": (2.0**-6, 2.0**-3, 1.0, 8.0, 64.0), "lengths": (50, 400), "seeds": 2}
POLICIES = {"never": ("never", {}), "bandit": ("cost-aware-bandit", {}),
            "always": ("always", {"update": "head"})}
"""The policies run: never (the baseline), the cost-aware bandit and always (head, for reference)."""
LIVE_PROMPT = (64, MAX_PROMPT)  # the live stream's prompts: held-out prompts' last MAX_PROMPT tokens (>= 64)


@dataclasses.dataclass(frozen=True)
class Stream:
    """One map: a cost profile and the queries its streams serve (plain data, sent to the workers)."""

    label: str
    profile: str
    simulated: bool  # the profile was derived from a paper, not measured: no live run can sit on its map
    tokens_per_query: int
    prompt_tokens: tuple[int, int]
    head_capacity: int
    full_capacity: int
    world: str = "the paper's acceptance and adaptation dynamics, updates waited for"
    acceptance: str | None = None  # a trace file replayed (the live world); None: ``paper_acceptance()``
    dynamics: dict[str, Any] | None = None  # ``AdaptationDynamics`` fields; None: the paper's
    overlap: dict[str, float] | None = None  # per-kind slowdown beside training; None: updates waited for
    draft_length: int = 8
    draft_shape: dict[str, float] | None = None  # SpecBlock's mean tree shape; None: a chain


def profile_name(path: Path) -> str:
    """How a map names its profile: its path under ``data/profiles`` without the suffix (``cpu_shipped``,
    ``smollm2-135m/cpu``), else its file's stem."""
    path, home = Path(path).resolve(), PROFILES.resolve()
    return path.relative_to(home).with_suffix("").as_posix() if path.is_relative_to(home) else path.stem


def stream_for(path: Path) -> Stream:
    """The map of profile ``path``: live-shaped queries for a measured profile, the paper's for a derived
    one."""
    derived = load_profile(path).derived_from is not None
    if derived:
        dynamics = AdaptationDynamics()
        return Stream(f"{profile_name(path)} (simulated: paper-derived profile, {DEFAULT_TOKENS}-token "
                      "queries)", str(path), True, DEFAULT_TOKENS, DEFAULT_PROMPT, dynamics.head_capacity,
                      dynamics.full_capacity)
    engine = AdaptConfig()
    tokens = mean_tokens(dataclasses.asdict(DEFAULT_PLAN))
    return Stream(f"{profile_name(path)} (measured profile, live-stream queries of {tokens} tokens)",
                  str(path), False, tokens, LIVE_PROMPT, engine.head_capacity, engine.full_capacity)


def live_world(path: Path, profile: Path) -> Stream | None:
    """The live-world map of the overlapped live run ``path`` (the model's) on ``profile``: its queries,
    replayed acceptance (``<name>_traces.parquet``), fitted dynamics, per-kind slowdown and the mean tree
    shape its ``never`` stream drafted; None when the run or its traces are missing, or the run was
    simulated on another profile (by file name: a clone records its own folder)."""
    traces = path.with_name(f"{path.stem}_traces.parquet")
    if not (path.is_file() and traces.is_file()):
        return None
    record = read_json(path, MAX_RECORD_BYTES, "live adaptation results", "regenerate it with "
                       "`specblock adapt-live --overlap`")
    try:
        results, plan = record["results"], record["config"]["plan"]
        dynamics, slowdown = results["fit"]["dynamics"], results["overlap"]["slowdown"]
        drafted = results["policies"]["never"]["drafted"]
        recorded = Path(record["config"]["profile"]).name
    except (KeyError, TypeError) as error:
        raise InputError(f"{path} is not laid out as `specblock adapt-live --overlap` writes it (no "
                         f"{error}): regenerate it") from None
    if recorded != profile.name:
        return None
    tokens = mean_tokens(plan)
    return Stream(f"{profile_name(profile)}, live world ({path.stem}: the engine's acceptance, fitted "
                  f"dynamics, training beside decoding; {tokens}-token queries)", str(profile), False, tokens,
                  LIVE_PROMPT, int(dynamics["head_capacity"]), int(dynamics["full_capacity"]),
                  f"the engine's SpecBlock acceptance replayed from {traces.name}, the adaptation dynamics "
                  f"fitted on {path.stem}, updates trained beside decoding",
                  str(traces), dict(dynamics), dict(slowdown), world(str(profile), str(traces))[1].cap,
                  {k: float(drafted[k]) for k in ("blocks", "starts")})


def mean_tokens(plan: dict[str, Any]) -> int:
    """New tokens per query of a live stream plan: the middle of its range (all of them in a plan with
    one length)."""
    return round((plan.get("min_new_tokens", plan["max_new_tokens"]) + plan["max_new_tokens"]) / 2)


def scaled(profile: CostProfile, factor: float) -> CostProfile:
    """``profile`` with every update sample (full buffer and one window) times ``factor``."""
    def times(samples: Any) -> MappingProxyType:
        return MappingProxyType({kind: tuple(factor * s for s in values) for kind, values in samples.items()})

    return dataclasses.replace(profile, update=times(profile.update),
                               update_single=times(profile.update_single))


@functools.lru_cache(maxsize=4)
def world(path: str, acceptance: str | None = None) -> tuple[CostProfile, AcceptanceModel]:
    """A profile and an acceptance model (the traces ``acceptance`` replayed, or the paper's), built once
    per worker process."""
    model = paper_acceptance() if acceptance is None else TraceReplay.from_traces(load_traces(acceptance))
    return load_profile(path), model


class CountedStream(AdaptStreamEnv):
    """AdaptStream that counts the updates run in its current stream (``run_adapt`` drives it as is)."""

    updates = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Start a stream with no update counted."""
        self.updates = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: int) -> Any:
        """One query; counts the update that ran before it."""
        out = super().step(action)
        self.updates += int(out[4]["updated"])
        return out


def serve(stream: Stream, length: int, factor: float, seeds: int, kinds: Sequence[str]) -> dict[str, Any]:
    """Tokens/s per seed (and updates per seed) of each policy in ``kinds`` on ``seeds`` streams of
    ``length`` queries at update cost ``factor``."""
    profile, model = world(stream.profile, stream.acceptance)
    dynamics = AdaptationDynamics(**(stream.dynamics or {"head_capacity": stream.head_capacity,
                                                         "full_capacity": stream.full_capacity}))
    env = CountedStream(scaled(profile, factor), model, "specblock", draft_length=stream.draft_length,
                        tokens_per_query=stream.tokens_per_query, prompt_tokens=stream.prompt_tokens,
                        phases=default_phases(model.domains, length), dynamics=dynamics,
                        draft_shape=stream.draft_shape, overlap=stream.overlap is not None,
                        overlap_slowdown=stream.overlap or 1.0)
    out: dict[str, Any] = {"length": length, "factor": factor}
    for name in kinds:
        kind, params = POLICIES[name]
        tps, updates = [], []
        for seed in range(seeds):
            tps.append(run_adapt(make_policy(kind, params), env, seed).tokens_per_second)
            updates.append(env.updates)
        out[name] = {"tokens_per_second": tps, "updates": updates}
    return out


def ratio_ci(values: np.ndarray) -> tuple[float, list[float]]:
    """Mean and 95% t interval over seeds."""
    mean = float(values.mean())
    half = float(stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return mean, [mean - half, mean + half]


def cell(never: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One grid point's figures: gains over never (paired by seed) and the bandit's updates."""
    base = np.array(never["tokens_per_second"])
    bandit = np.array(run["bandit"]["tokens_per_second"])
    gain, gain_ci = ratio_ci(bandit / base)
    always, always_ci = ratio_ci(np.array(run["always"]["tokens_per_second"]) / base)
    return {"length": run["length"], "factor": run["factor"], "gain": gain, "gain_ci": gain_ci,
            "gain_per_seed": (bandit / base).tolist(), "always_gain": always, "always_gain_ci": always_ci,
            "bandit_updates": float(np.mean(run["bandit"]["updates"])),
            "bandit_updates_per_seed": run["bandit"]["updates"],
            "never_tokens_per_second": float(base.mean()), "bandit_tokens_per_second": float(bandit.mean())}


def break_even(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Where the mean gain of one stream length (cells by rising factor) falls through 1, and the largest
    factor up to which every interval lies above 1 (adaptation shown to pay)."""
    f = [c["factor"] for c in cells]
    g = [c["gain"] for c in cells]
    shown = None
    for c in cells:
        if c["gain_ci"][0] <= 1.0:
            break
        shown = c["factor"]
    if g[0] < 1.0:
        return {"factor": None, "status": "below", "shown_up_to": shown}
    for i in range(len(g) - 1):
        if g[i + 1] < 1.0:
            t = (g[i] - 1.0) / (g[i] - g[i + 1])
            return {"factor": f[i] * (f[i + 1] / f[i]) ** t, "status": "crossing", "shown_up_to": shown}
    return {"factor": None, "status": "above", "shown_up_to": shown}


def live_runs(folder: Path, stream: Stream, factors: Sequence[float], lengths: Sequence[int],
              model: str) -> list[dict[str, Any]]:
    """Each live adaptation run in ``folder`` of ``model`` (a run that names another model is left out)
    and of the map's mode (updates trained beside decoding or waited for): its stream length, measured
    gain and update cost over the map's profile (``live_factor``), or why it cannot be placed on the
    map."""
    profile = load_profile(stream.profile)
    runs = []
    for path in sorted(folder.glob("adapt_live*.json")):
        entry: dict[str, Any] = {"name": path.stem, "placed": False}
        try:
            record = read_json(path, MAX_RECORD_BYTES, "live adaptation results",
                               "regenerate it with `specblock adapt-live`")
        except InputError as error:
            runs.append({**entry, "note": str(error)})
            continue
        results = record.get("results") if isinstance(record, dict) else None
        config = record.get("config") if isinstance(record, dict) else None
        if isinstance(config, dict) and config.get("model", model) != model:
            continue  # another model's run: its own map places it
        if (isinstance(results, dict) and results.get("overlap") is not None) != (stream.overlap is not None):
            continue  # the other mode's map places it
        runs.append(entry)
        try:
            results = record["results"]
            entry["tokens_per_query"] = mean_tokens(record["config"]["plan"])
            entry["stream_length"] = len(results["stream"])
            measured = {k: v["measured"]["tokens_per_second"] for k, v in results["policies"].items()}
            entry["never_tokens_per_second"] = measured["never"]
            entry["measured_gain"] = measured["cost_aware_bandit"] / measured["never"]
            retimed = results["simulator_profile"].get("retimed")
        except (KeyError, TypeError, ZeroDivisionError, AttributeError):
            entry["note"] = "not laid out as `specblock adapt-live` writes it"
            continue
        if not retimed:
            entry["note"] = ("it records no re-timed update samples (results.simulator_profile.retimed), so "
                             "its update cost is unknown")
            continue
        if not (profile.update_single and profile.update_windows):
            entry["note"] = "the profile has no one-window update samples to compare its updates with"
            continue
        entry["factor_by_kind"] = {kind: live_factor(profile, retimed.values(), kind)
                                   for kind in ("head", "full")}
        entry["factor"] = math.sqrt(entry["factor_by_kind"]["head"] * entry["factor_by_kind"]["full"])
        if not (min(factors) <= entry["factor"] <= max(factors)
                and min(lengths) <= entry["stream_length"] <= max(lengths)):
            entry["note"] = f"{entry['stream_length']} queries at {entry['factor']:.2f}x lie outside the map"
        else:
            entry["placed"] = True
    return runs


def live_factor(profile: CostProfile, retimed: Any, kind: str) -> float:
    """Geometric mean over a live run's policies of its ``kind`` update time over ``profile``'s, on one
    window and on the profile's full buffer (each live figure at the profile's window count)."""
    windows = profile.update_windows[kind]
    logs = []
    for timing in retimed:
        live = dataclasses.replace(profile, update={**profile.update, kind: (timing[kind],)},
                                   update_single={**profile.update_single, kind: (timing[f"{kind}_single"],)},
                                   update_windows={**profile.update_windows, kind: timing["windows"][kind]})
        logs += [math.log(float(live.update_cost(kind, 1.0, w)) / float(profile.update_cost(kind, 1.0, w)))
                 for w in (1, windows)]
    return math.exp(float(np.mean(logs)))


def run_maps(streams: Sequence[Stream], factors: Sequence[float], lengths: Sequence[int], seeds: int,
             workers: int, show: Any) -> list[dict[str, Any]]:
    """Every map: never per length, bandit and always per (length, factor), spread over ``workers``."""
    jobs = {(s.label, n): (s, n, 1.0, seeds, ("never",)) for s in streams for n in lengths}
    jobs |= {(s.label, n, f): (s, n, f, seeds, ("bandit", "always")) for s in streams for n in lengths
             for f in factors}
    keys = sorted(jobs, key=lambda key: -key[1])  # longest streams first: the workers end together
    with ProcessPoolExecutor(workers) as pool:
        found = dict(zip(keys, pool.map(serve, *zip(*(jobs[k] for k in keys), strict=True)), strict=True))
    maps = []
    for s in streams:
        profile = load_profile(s.profile)
        cells, edges = [], []
        for n in lengths:
            row = [cell(found[(s.label, n)]["never"], found[(s.label, n, f)]) for f in factors]
            cells += row
            edges.append({"length": n, **break_even(row)})
            edge = edges[-1]
            shown = "-" if edge["shown_up_to"] is None else f"{edge['shown_up_to']:.3g}x"
            show(f"{profile_name(Path(s.profile)):24s} {n:5d} queries: break-even "
                 f"{factor_text(edge['factor'], edge['status'])}, shown to pay up to {shown}")
        recorded = {"profile": repo_relative(s.profile),
                    "acceptance": None if s.acceptance is None else repo_relative(s.acceptance)}
        maps.append({"label": s.label, "profile": recorded["profile"], "simulated": s.simulated,
                     "stream": {**dataclasses.asdict(s), **recorded},
                     "update_seconds": {k: profile.update_seconds(k) for k in ("head", "full")},
                     "update_single": dict(profile.fits.get("update_single", {})),
                     "update_windows": dict(profile.update_windows),
                     "cells": cells, "break_even": edges})
    return maps


def gain_grid(m: dict[str, Any], factors: Sequence[float], lengths: Sequence[int]) -> np.ndarray:
    """The map's mean gains as a (lengths, factors) array."""
    return np.array([c["gain"] for c in m["cells"]]).reshape(len(lengths), len(factors))


def place_live(m: dict[str, Any], stream: Stream, factors: Sequence[float], lengths: Sequence[int],
               model: str) -> None:
    """Add ``model``'s live runs to a measured map: where each sits, the map's gain there, and where it
    sits by update time over query time (an update costs as many of the map's queries as of the live
    ones at ``query_factor``: the live queries ran slower)."""
    m["live"] = live_runs(RESULTS, stream, factors, lengths, model)
    grid = (np.log(lengths), np.log(factors))
    gain = RegularGridInterpolator(grid, gain_grid(m, factors, lengths))
    never = [m["cells"][i * len(factors)]["never_tokens_per_second"] for i in range(len(lengths))]
    for run in m["live"]:
        if not run["placed"]:
            continue
        at = math.log(run["stream_length"])
        run["map_gain"] = float(gain([at, math.log(run["factor"])])[0])
        run["query_seconds"] = run["tokens_per_query"] / run["never_tokens_per_second"]
        run["map_query_seconds"] = stream.tokens_per_query / float(np.interp(at, grid[0], never))
        run["query_factor"] = run["factor"] * run["map_query_seconds"] / run["query_seconds"]
        inside = min(factors) <= run["query_factor"] <= max(factors)
        run["query_map_gain"] = float(gain([at, math.log(run["query_factor"])])[0]) if inside else None


def caption(m: dict[str, Any]) -> str:
    """What a map's markers show, and the live runs it could not place (and why)."""
    if m["simulated"]:
        return f"{m['label']}: simulated only, no live run was measured on this profile's device."
    placed = [r for r in m["live"] if r["placed"]]
    text = [f"{m['label']}:"]
    if placed:
        text.append("filled stars: live runs (benchmarks/results/adapt_live*.json) at their update cost, "
                    "re-timed before each stream, over the profile's and their stream length (live gain: "
                    "measured; map gain: simulated there); hollow stars: the same runs where an update costs "
                    "as many of the map's queries as it cost live queries (a live query took "
                    + ", ".join(f"{r['query_seconds']:.2f}" for r in placed)
                    + f" s under never, the map's {placed[0]['map_query_seconds']:.2f} s).")
    else:
        text.append("no live run could be placed.")
    text += [f"Not placed: {r['name']}: {r['note']}." for r in m["live"] if not r["placed"]]
    return " ".join(text)


def plot(maps: Sequence[dict[str, Any]], factors: Sequence[float], lengths: Sequence[int],
         path: Path) -> None:
    """One heatmap per map: the gain over never against update-cost factor and stream length, the gain = 1
    contour, the live runs as stars, and the captions below."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    fig, axes = plt.subplots(1, len(maps), figsize=(7.5 * len(maps), 5.4), squeeze=False)
    x, y = np.log2(factors), np.log2(lengths)
    for ax, m in zip(axes.flat, maps, strict=True):
        g = gain_grid(m, factors, lengths)
        norm = TwoSlopeNorm(1.0, min(g.min(), 0.99), max(g.max(), 1.01))
        mesh = ax.pcolormesh(x, y, g, cmap="RdBu", norm=norm, shading="nearest")
        fig.colorbar(mesh, ax=ax, label="bandit tokens/s over never (blue: adaptation pays)")
        if g.min() < 1.0 < g.max():
            ax.contour(x, y, g, levels=[1.0], colors="k", linewidths=1.8)
        for i, j in np.ndindex(g.shape):
            dark = abs(norm(g[i, j]) - 0.5) > 0.35  # white figures on the darkest cells
            ax.text(x[j], y[i], f"{g[i, j]:.2f}", ha="center", va="center", fontsize=5,
                    color="w" if dark else "k")
        for k, run in enumerate(r for r in m.get("live", []) if r["placed"]):
            at = math.log2(run["stream_length"]) + 0.12 * k  # runs of one length side by side, not hidden
            ax.plot(math.log2(run["factor"]), at, "*", ms=15, mfc="gold", mec="k",
                    label=f"{run['name']}: live {run['measured_gain']:.2f}, map {run['map_gain']:.2f}")
            if run["query_map_gain"] is not None:
                ax.plot(math.log2(run["query_factor"]), at, "*", ms=15, mfc="none", mec="k",
                        label=f"{run['name']} by update/query time: map {run['query_map_gain']:.2f}")
        if m.get("live") and any(r["placed"] for r in m["live"]):
            ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
        ax.set_xticks(x, [f"{f:g}" if f >= 1 else f"1/{1 / f:g}" for f in factors], fontsize=6)
        ax.set_yticks(y, [str(n) for n in lengths], fontsize=7)
        ax.set_xlabel(f"update cost over the profile's (1: head {m['update_seconds']['head']:.3g} s, full "
                      f"{m['update_seconds']['full']:.3g} s on a full buffer)", fontsize=8)
        ax.set_ylabel("stream length (queries)", fontsize=8)
        ax.set_title(f"{m['label']}\nblack line: break-even (gain 1)", fontsize=8)
    text = "\n".join(textwrap.fill(caption(m), 110 * len(maps)) for m in maps)
    fig.text(0.01, 0.0, text, fontsize=6.5, va="top")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(fig)


def factor_text(value: float | None, status: str) -> str:
    """A break-even factor as the tables write it."""
    if value is None:
        return {"below": "never pays on the grid", "above": "pays on the whole grid"}.get(status, "-")
    return f"{value:.3g}x"


def markdown(result: dict[str, Any], config: dict[str, Any]) -> str:
    """The break-even table of each map (per stream length) and where the live runs sit."""
    factors = config["factors"]
    one = factors.index(1.0) if 1.0 in factors else None
    lines = ["# When does adaptation pay? (AdaptStream)", "",
             f"The cost-aware bandit (default parameters) against never updating, {config['seeds']} streams "
             "per grid point with common random numbers. Gain: mean over streams of the bandit's tokens/s "
             "(update seconds charged) over never's on the same stream [95% t interval]. Break-even: the "
             "update-cost factor (over the profile's head and full update seconds) at which the mean gain "
             "falls through 1, log-interpolated between grid points; shown up to: the largest factor up to "
             "which every interval lies above 1. Every stream spends a quarter on one domain, then mixes "
             "four; each map says whose acceptance and adaptation dynamics it takes.", ""]
    for m in result["maps"]:
        s, cost = m["stream"], m["update_seconds"]
        lines += [f"## {m['label']}", "",
                  f"{s['world'][0].upper()}{s['world'][1:]}. "
                  f"{s['tokens_per_query']} tokens per query, prompts of {s['prompt_tokens'][0]}.."
                  f"{s['prompt_tokens'][1]} tokens, buffers of {s['head_capacity']} (head) and "
                  f"{s['full_capacity']} (full) rejected positions. At factor 1 an update on a full buffer "
                  f"costs {cost['head']:.3g} s (head) and {cost['full']:.3g} s (full).", ""]
        header = ["stream length", "break-even factor", "head / full s at break-even", "shown up to"]
        if one is not None:
            header += ["bandit gain at 1x", "always gain at 1x", "bandit updates at 1x"]
        rows = []
        for i, edge in enumerate(m["break_even"]):
            f = edge["factor"]
            row = [edge["length"], factor_text(f, edge["status"]),
                   "-" if f is None else f"{f * cost['head']:.3g} / {f * cost['full']:.3g}",
                   "-" if edge["shown_up_to"] is None else f"{edge['shown_up_to']:.3g}x"]
            if one is not None:
                c = m["cells"][i * len(factors) + one]
                row += [f"{c['gain']:.3f} [{c['gain_ci'][0]:.3f}, {c['gain_ci'][1]:.3f}]",
                        f"{c['always_gain']:.3f}", f"{c['bandit_updates']:.1f}"]
            rows.append(row)
        lines += [*md_table(header, rows), ""]
        if m.get("live"):
            lines += ["Live runs: measured gain is the bandit's tokens/s over never's on the live stream; "
                      "map gain is this map's where the run sits, and (by update/query time) where an update "
                      "costs as many of the map's queries as it cost live queries.", ""]
            rows = [[r["name"], r.get("stream_length", "-"),
                     f"{r['factor']:.2f}x ({r['factor_by_kind']['head']:.2f} / "
                     f"{r['factor_by_kind']['full']:.2f})" if "factor" in r else "-",
                     f"{r['measured_gain']:.3f}" if "measured_gain" in r else "-",
                     f"{r['map_gain']:.3f}" if r["placed"] else "-",
                     f"{r['query_factor']:.2f}x: {r['query_map_gain']:.3f}"
                     if r["placed"] and r["query_map_gain"] is not None else "-",
                     "yes" if r["placed"] else f"no: {r['note']}"] for r in m["live"]]
            lines += [*md_table(["run", "stream length", "update cost factor (head / full)", "measured gain",
                                 "map gain", "by update/query time", "placed"], rows), ""]
        lines += [caption(m), ""]
    return "\n".join(lines)


@click.command(NAME)
@click.option("--quick", is_flag=True, help="A small grid, two seeds: a smoke run of well under a minute.")
@model_option("The model whose CPU cost profile is mapped and whose live runs sit on the map.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Map this cost profile only [default: the model's CPU profile and the A100 paper one].")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results",
              help="Folder for adapt_breakeven.{json,md,png} (adapt_breakeven_<model> for a model other than "
                   "the toy family).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(quick: bool, model: ModelSpec, profile_path: Path | None, out: Path, as_json: bool) -> None:
    """When adaptation pays: the bandit's gain over never against update cost and stream length."""
    start = time.perf_counter()
    grid = QUICK if quick else {"factors": FACTORS, "lengths": LENGTHS, "seeds": SEEDS}
    factors, lengths, seeds = list(grid["factors"]), list(grid["lengths"]), int(grid["seeds"])
    paths = [profile_path] if profile_path is not None else [model_profile(model), PAPER_PROFILE]
    world_run = RESULTS / f"{result_name(model.name, quick=False, overlap=True)}.json"
    streams = []
    for path in paths:
        streams.append(stream_for(path))
        live = None if streams[-1].simulated else live_world(world_run, path)
        if live is not None:
            streams.append(live)
    workers = len(os.sched_getaffinity(0))
    show = table(as_json)
    maps = run_maps(streams, factors, lengths, seeds, workers, show)
    for m, stream in zip(maps, streams, strict=True):
        if not stream.simulated:
            place_live(m, stream, factors, lengths, model.name)
    result = {"maps": maps, "seconds": time.perf_counter() - start}
    config = {"quick": quick, "model": model.name,
              "profile": None if profile_path is None else repo_relative(profile_path),
              "factors": factors, "lengths": lengths, "seeds": seeds, "workers": workers,
              "policies": {name: {"kind": kind, "params": params}
                           for name, (kind, params) in POLICIES.items()},
              "paper_dynamics": dataclasses.asdict(AdaptationDynamics())}
    name = f"{model_result(NAME, model.name)}{'_quick' if quick else ''}"  # another model's beside the toy's
    saved = save_result(name, result, config, 0, out)
    report = write_text(out / f"{name}.md", markdown(result, config))
    plot(maps, factors, lengths, out / f"{name}.png")
    finish(as_json, result, saved, report, out / f"{name}.png")


# --- its section of docs/results.md ----------------------------------------------------------------


def _breakeven_command(name: str, config: Record) -> str:
    return (f"{benchmark('adapt_breakeven')}{' --quick' if config['quick'] else ''}"
            f"{flag('--model', config.get('model', TOY.name), TOY.name)}"
            f"{flag('--profile', config['profile'])}")


def _breakeven_factor(edge: Record, seconds: Record) -> str:
    if edge["factor"] is None:
        return {"below": "never pays on the grid", "above": "pays on the whole grid"}[edge["status"]]
    return (f"{edge['factor']:.3g}x (head {edge['factor'] * seconds['head']:.3g} s, full "
            f"{edge['factor'] * seconds['full']:.3g} s)")


def _breakeven_body(record: Record) -> Lines:
    config = record["config"]
    lines = [f"AdaptStream, {config['seeds']} streams per point (common random numbers): the cost-aware "
             "bandit's tokens/s over never's against the profile's update seconds scaled by a factor; "
             "break-even: the factor where the mean gain falls through 1 (head and full seconds on a full "
             "buffer there); shown up to: every 95% interval above 1 up to that factor."]
    for m in record["results"]["maps"]:
        lines += ["", f"{m['label']}:", "", *md_table(
            ["stream length", "break-even factor", "shown up to"],
            [[e["length"], _breakeven_factor(e, m["update_seconds"]),
              "-" if e["shown_up_to"] is None else f"{e['shown_up_to']:.3g}x"] for e in m["break_even"]])]
        live = [f"- live `{r['name']}`: {r['stream_length']} queries at {r['factor']:.2f}x the profile's "
                f"update cost: measured gain {r['measured_gain']:.3f}, map {r['map_gain']:.3f}"
                for r in m.get("live", []) if r["placed"]]
        lines += ["", *live] if live else []
    return lines


RENDERERS: dict[str, Renderer] = {
    "adapt_breakeven": Renderer("When does adaptation pay? Break-even in simulation", _breakeven_command,
                                _breakeven_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
