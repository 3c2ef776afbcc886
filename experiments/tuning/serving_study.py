"""The serving study (`specblock study serving`): speculation under load, in simulation.

Per case (the CPU's measured serving costs with the draft model's recorded chains, and the A100
paper-derived profile with EAGLE-3 chains and the paper's acceptance, both labelled simulated), the
serving policies are tuned with Ray Tune on SpecServe at half the case's capacity (the arrival rate that
vanilla decoding at a full batch serves), then every policy and vanilla serve held-out episodes at
arrival rates from a tenth of capacity to beyond it, each with the same arrivals and acceptance draws
(common random numbers). Reported per rate: throughput (tokens over the time from the first arrival to
the last completion), time per output token (median and p99) and time to first token (median), and each
policy's throughput over vanilla's; the tuned table's lengths by batch size say where speculation
switches off. Writes ``study_serving.json``, ``.md`` and ``.png`` (throughput against p99 TPOT).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from core.cost_profile import load_profile
from core.files import atomic_write, write_json
from core.paths import PAPER_PROFILE, SERVE_PROFILE, STUDY_RUNS, TRACES, repo_relative
from core.serve_costs import batch_verify_seconds
from experiments.defaults import HELD_OUT_SEED, TUNE_SEED
from experiments.folders import fresh
from experiments.tuning.tune import Setting, Traffic, make_setting, make_tuned, tune_policies, world
from policies import role_kinds
from policies.serving import NEVER
from simulator.calibration import fit_calibration
from simulator.predict import predict
from simulator.spec_serve import ServeTraffic
from simulator.traces import load_traces

LOADS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5)
"""Arrival rates studied, as fractions of the case's capacity."""
TUNE_LOAD = 0.5


@dataclasses.dataclass(frozen=True)
class ServeCase:
    """One studied deployment: its label, cost profile, drafter, acceptance (recorded traces, else the
    paper's parametric model) and traffic (batch cap, prompt and output lengths)."""

    label: str
    profile: Path
    drafter: str
    traces: Path | None
    traffic: ServeTraffic


CASES = (
    ServeCase("CPU: draft-model chains, measured serving costs, recorded acceptance (simulated)",
              SERVE_PROFILE, "draft-model", TRACES,
              ServeTraffic(max_batch=8, prompt_tokens=(96, 96), output_tokens=(32, 32))),
    ServeCase("A100 paper-derived: EAGLE-3 chains, paper acceptance (simulated)", PAPER_PROFILE, "eagle",
              None, ServeTraffic(max_batch=8, prompt_tokens=(128, 1024), output_tokens=(64, 256))),
)


def capacity(case: ServeCase) -> float:
    """Requests per second that vanilla decoding at a full batch serves: each request's prefill, then its
    output at a full batch's per-token share of a plain step."""
    profile = load_profile(case.profile)
    prompt, output = (float(np.mean(case.traffic.prompt_tokens)), float(np.mean(case.traffic.output_tokens)))
    cap = case.traffic.max_batch
    step = float(batch_verify_seconds(profile, cap, 1.0, prompt + output / 2)[0])
    return 1.0 / (float(profile.prefill_cost(prompt)) + output * step / cap)


def serve_point(setting: Setting, kind: str, params: dict[str, Any], episodes: int) -> dict[str, Any]:
    """``episodes`` held-out episodes of ``setting`` served by ``kind(params)``: tokens, seconds from the
    first arrival to the last completion, and every request's TPOT and TTFT."""
    profile, model = world(setting.profile, setting.traces, setting.traffic)
    policy = make_tuned(setting, kind, params)
    tokens = seconds = 0.0
    tpot: list[float] = []
    ttft: list[float] = []
    for k in range(episodes):
        prediction = predict(policy, profile, model, setting.drafter, queries=setting.queries,
                             seed=setting.seed + k, env_options=setting.serve.options())
        out, env = prediction.outcome, prediction.env
        first, per = env.batch.latencies(0, np.arange(env.batch.requests))
        tokens += out.tokens
        seconds += float(env.batch.clock[0] - env.batch.arrival[0, 0])
        ttft, tpot = ttft + first, tpot + per
    return {"tokens_per_second": tokens / seconds, "tpot_ms_p50": 1e3 * float(np.median(tpot)),
            "tpot_ms_p99": 1e3 * float(np.percentile(tpot, 99)), "ttft_ms_p50": 1e3 * float(np.median(ttft))}


def _calibration(case: ServeCase, folder: Path) -> Path | None:
    """The confidence calibration fitted from the case's traces (None for the parametric acceptance)."""
    if case.traces is None:
        return None
    return write_json(folder / "calibration.json", fit_calibration(load_traces(case.traces)).to_dict())


def serve_study(samples: int = 32, requests: int = 64, tune_episodes: int = 2, episodes: int = 4
                ) -> dict[str, Any]:
    """Tune the serving policies per case, then serve every rate with each (module doc)."""
    import ray  # after experiments.tuning.ray_session has set Ray's environment

    remote = ray.remote(num_cpus=1)(serve_point)
    rows = []
    for case in CASES:
        folder = fresh(STUDY_RUNS / "serving" / case.profile.stem)
        rate = capacity(case)
        tuning = make_setting("serving", case.profile, case.traces, requests, tune_episodes, TUNE_SEED,
                              traffic=None if case.traces else Traffic(), drafter=case.drafter,
                              calibration=_calibration(case, folder),
                              serve=dataclasses.replace(case.traffic, rate=TUNE_LOAD * rate))
        kinds = role_kinds("serving", tuned=True)  # in registration order
        tuned = tune_policies(tuning, kinds, samples, folder)
        named = [("vanilla", "batch-table", dict(NEVER)),
                 ("libraspec-batch (default)", "libraspec-batch", {}),
                 *((f"{kind} (tuned)", kind, tuned.best_by_kind[kind]["params"]) for kind in kinds)]
        jobs = [(load, name, remote.remote(dataclasses.replace(
                    tuning, seed=HELD_OUT_SEED, serve=dataclasses.replace(case.traffic, rate=load * rate)),
                    kind, params, episodes)) for load in LOADS for name, kind, params in named]
        points: dict[str, dict[str, Any]] = {name: {} for name, _, _ in named}
        for load, name, ref in jobs:
            points[name][f"{load:g}"] = ray.get(ref)
        for by_load in points.values():
            for load, point in by_load.items():
                point["over_vanilla"] = (point["tokens_per_second"]
                                         / points["vanilla"][load]["tokens_per_second"])
        rows.append({"case": case.label, "profile": repo_relative(case.profile), "drafter": case.drafter,
                     "traffic": dataclasses.asdict(case.traffic), "capacity": rate,
                     "rates": {f"{load:g}": load * rate for load in LOADS}, "policies": points,
                     "tuned": {kind: tuned.best_by_kind[kind]["params"] for kind in kinds}})
    return {"rows": rows}


def serve_markdown(result: dict[str, Any], config: dict[str, Any]) -> str:
    """Per case: each policy's throughput (over vanilla) and p99 TPOT at every load; the tuned table."""
    lines = ["# Speculation under load (simulated)", "",
             f"SpecServe episodes of {config['requests']} requests; policies tuned with Ray Tune "
             f"({config['samples']} random configurations per kind, {config['tune_episodes']} episodes, "
             f"seed {TUNE_SEED}) at half the case's capacity, then {config['episodes']} held-out episodes "
             f"per point (seeds {HELD_OUT_SEED}..), every policy on the same arrivals. Cells: tokens/s (over "
             "vanilla) / p99 TPOT ms. Load: arrival rate over the case's capacity (vanilla at a full "
             "batch).", ""]
    for row in result["rows"]:
        loads = list(row["rates"])
        header = " | ".join(f"load {load} ({row['rates'][load]:.2f}/s)" for load in loads)
        traffic = row["traffic"]
        lines += [f"## {row['case']}", "", f"Capacity {row['capacity']:.2f} requests/s; batch cap "
                  f"{traffic['max_batch']}, prompts of {traffic['prompt_tokens']} and outputs of "
                  f"{traffic['output_tokens']} tokens (low, high).", "", f"| policy | {header} |",
                  "|---|" + "---|" * len(loads)]
        for name, by_load in row["policies"].items():
            cells = [f"{p['tokens_per_second']:.1f} ({p['over_vanilla']:.3f}) / {p['tpot_ms_p99']:.2f}"
                     for p in (by_load[load] for load in loads)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", tuned_table(row), "Tuned parameters: " + "; ".join(
            f"{k} {v}" for k, v in row["tuned"].items() if k != "batch-table") + ".", ""]
    return "\n".join(lines)


def tuned_table(row: dict[str, Any]) -> str:
    """The tuned per-batch-size table of a case: where it speculates and where it switches off."""
    table = row["tuned"]["batch-table"]
    return "Tuned table, length by batch size: " + ", ".join(
        f"{i}: {table[f'l{i}']}" for i in range(1, row["traffic"]["max_batch"] + 1)) + "."


def serve_plot(result: dict[str, Any], path: Path) -> None:
    """Throughput against p99 TPOT across arrival rates, one line per policy, one panel per case."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(6.0 * len(rows), 4.2), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=True):
        for name, by_load in row["policies"].items():
            points = list(by_load.values())
            ax.plot([p["tokens_per_second"] for p in points], [p["tpot_ms_p99"] for p in points],
                    "o-" if name != "vanilla" else "ks--", ms=3, label=name)
        ax.set_title(f"{row['case']}", fontsize=8)
        ax.set_xlabel("throughput, tokens/s (simulated)")
        ax.set_ylabel("p99 time per output token, ms (simulated)")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
