"""The policy studies: speculation length, cost-aware online adaptation, and serving under
load (``experiments.tuning.serving_study``).

Run ``specblock study length|adaptation|serving``. Each study tunes policies with Ray Tune on
tuning seeds (``experiments.tuning.tune``), then evaluates every policy on held-out seeds with the same
simulated work for all of them (common random numbers), and writes ``benchmarks/results/
study_<name>.json`` (``save_result``), ``.md`` (tables) and ``.png`` (plots).

- ``length``: per cost profile and drafter, and per traffic: fixed lengths 0..16 (the best one is
  the oracle on the held-out queries, a strict reference), LibraSpec (marginal and exhaustive),
  threshold and heuristic (defaults and tuned). Traffics: ``steady`` (one domain, constant
  confidences: the regime where a fixed length is already optimal), ``paper`` (the paper-derived
  four domains, confidences varying per iteration), ``mixed`` (three domains of very different
  acceptance). The CPU profile is studied when ``data/profiles/cpu_shipped.json`` exists.
- ``adapt``: one AdaptStream stream per seed with a domain shift (a quarter from one domain, then an
  equal mix): never, always (head, full), epsilon-greedy (default, tuned), the cost-aware bandit
  (default, tuned). Reported as tokens/s and the paired ratio to ``never`` over the held-out streams.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.cost_profile import load_profile
from core.errors import InputError
from core.files import atomic_write, write_text
from core.paths import CPU_PROFILE, PAPER_PROFILE, RESULTS, STUDY_RUNS, repo_relative
from experiments.defaults import HELD_OUT_SEED, TUNE_SEED
from experiments.folders import fresh
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, table
from experiments.tuning.ray_session import start_ray
from experiments.tuning.serving_study import serve_markdown, serve_plot, serve_study
from experiments.tuning.tune import Setting, Traffic, evaluate, make_setting, tune_policies
from policies import role_kinds
from policies.features import LENGTH_CAP
from simulator.rollout import Outcome

LENGTH_TRAFFICS: dict[str, Traffic] = {
    "steady": Traffic((("code", 1.0),), shared_sd=0.0, own_sd=0.0),
    "paper": Traffic(),
    "mixed": Traffic((("easy", 0.25), ("code", 1.0), ("hard", 4.0)), shared_sd=0.5, own_sd=0.5),
}
"""Acceptance models of the length study (exponents on the paper's per-position rates)."""


def _run_all(jobs: Sequence[tuple[Setting, str, dict[str, Any]]]) -> list[Outcome]:
    """Evaluate each (setting, kind, params) as a Ray task: the jobs spread over the cluster's CPUs."""
    import ray  # after experiments.tuning.ray_session has set Ray's environment

    remote = ray.remote(num_cpus=1)(evaluate)
    return ray.get([remote.remote(setting, kind, params) for setting, kind, params in jobs])


def _fmt(tps: float, ref: float) -> str:
    return f"{tps:.2f} ({tps / ref:.3f})"


def length_cases() -> tuple[list[tuple[str, Path, str]], list[str]]:
    """(label, profile, drafter) of every studied cost profile, and notes on the ones skipped."""
    cases = [("A100 paper, specblock (step costs)", PAPER_PROFILE, "specblock"),
             ("A100 paper, eagle (affine costs)", PAPER_PROFILE, "eagle")]
    if CPU_PROFILE.exists():
        drafters = sorted(load_profile(CPU_PROFILE).drafters)
        cases += [(f"CPU shipped, {kind}", CPU_PROFILE, kind) for kind in drafters]
        return cases, []
    return cases, [f"{repo_relative(CPU_PROFILE)} does not exist yet: "
                   "the CPU profile is skipped"]


def length_study(samples: int = 12, tune_queries: int = 192, held_queries: int = 384) -> dict[str, Any]:
    """Tune and compare the length policies on every (profile, drafter, traffic) case."""
    cases, notes = length_cases()
    rows = []
    for label, profile, drafter in cases:
        for traffic_name, traffic in LENGTH_TRAFFICS.items():
            tuning = make_setting("length", profile, queries=tune_queries, chunks=4, seed=TUNE_SEED,
                                  traffic=traffic, drafter=drafter)
            held = dataclasses.replace(tuning, queries=held_queries, seed=HELD_OUT_SEED)
            slug = f"{profile.stem}-{drafter}-{traffic_name}"
            tuned = tune_policies(tuning, ("threshold", "heuristic"), samples,
                                  fresh(STUDY_RUNS / "length" / slug))
            named = [(f"fixed-{n}", "fixed", {"length": n}) for n in range(LENGTH_CAP + 1)]
            named += [("libraspec", "libraspec", {}), ("libraspec-exhaustive", "libraspec-exhaustive", {}),
                      ("threshold (default)", "threshold", {}), ("heuristic (default)", "heuristic", {}),
                      ("threshold (tuned)", "threshold", tuned.best_by_kind["threshold"]["params"]),
                      ("heuristic (tuned)", "heuristic", tuned.best_by_kind["heuristic"]["params"])]
            outcomes = _run_all([(held, kind, params) for _, kind, params in named])
            tps = {name: o.tokens_per_second for (name, _, _), o in zip(named, outcomes, strict=True)}
            fixed = [tps[f"fixed-{n}"] for n in range(LENGTH_CAP + 1)]
            best_n = int(np.argmax(fixed))
            rows.append({"case": label, "profile": repo_relative(profile), "drafter": drafter,
                         "traffic": traffic_name, "best_fixed_length": best_n, "best_fixed": fixed[best_n],
                         "vanilla": fixed[0],
                         "fixed_curve": fixed, "tokens_per_second": {k: v for k, v in tps.items()
                                                                     if not k.startswith("fixed-")},
                         "tuned_params": {k: v["params"] for k, v in tuned.best_by_kind.items()},
                         "tune_trials_per_minute": tuned.trials_per_minute})
            print(f"{label} / {traffic_name}: best fixed {best_n} {fixed[best_n]:.2f}, "
                  f"libraspec {tps['libraspec']:.2f}", file=sys.stderr)
    return {"rows": rows, "notes": notes}


POLICY_ORDER = ("libraspec", "libraspec-exhaustive", "threshold (default)", "threshold (tuned)",
                "heuristic (default)", "heuristic (tuned)")


def length_markdown(result: dict[str, Any], config: dict[str, Any]) -> str:
    """The length study's tables: tokens/s and the ratio to the oracle best fixed length."""
    lines = ["# Length policies in simulation", "",
             f"Held-out evaluation: {config['held_queries']} queries (seed {HELD_OUT_SEED}); tuning: "
             f"{config['tune_queries']} queries (seed {TUNE_SEED}), {config['samples']} random "
             "configurations per kind with Ray Tune. Cells: simulated tokens/s (ratio to the best fixed "
             "length, chosen with hindsight on the held-out queries).", ""]
    header = ["case", "traffic", "vanilla", "best fixed (n)", *POLICY_ORDER]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["rows"]:
        ref = row["best_fixed"]
        cells = [row["case"], row["traffic"], f"{row['vanilla']:.2f}",
                 f"{ref:.2f} ({row['best_fixed_length']})",
                 *(_fmt(row["tokens_per_second"][name], ref) for name in POLICY_ORDER)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"Note: {note}" for note in result["notes"]), "", "Tuned parameters:", ""]
    for row in result["rows"]:
        lines.append(f"- {row['case']} / {row['traffic']}: {row['tuned_params']}")
    return "\n".join(lines) + "\n"


def length_plot(result: dict[str, Any], path: Path) -> None:
    """Tokens/s against the fixed length, one panel per case, with LibraSpec and the tuned policies."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    cols = len(LENGTH_TRAFFICS)
    fig, axes = plt.subplots(len(rows) // cols, cols, figsize=(4.2 * cols, 3.2 * (len(rows) // cols)),
                             squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=True):
        ax.plot(range(LENGTH_CAP + 1), row["fixed_curve"], "o-", color="0.4", ms=3, label="fixed n")
        for name, style in (("libraspec", "C0-"), ("libraspec-exhaustive", "C0--"),
                            ("threshold (tuned)", "C1:"), ("heuristic (tuned)", "C2-.")):
            ax.axhline(row["tokens_per_second"][name], ls=style[2:], color=style[:2], label=name)
        ax.set_title(f"{row['case']}\n{row['traffic']} traffic", fontsize=8)
        ax.set_xlabel("fixed length n")
        ax.set_ylabel("simulated tokens/s")
        ax.set_ylim(bottom=min(row["fixed_curve"][1:]) * 0.97)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


ADAPT_POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("never", "never", {}), ("always (head)", "always", {"update": "head"}),
    ("always (full)", "always", {"update": "full"}), ("epsilon-greedy (default)", "epsilon-greedy", {}),
    ("cost-aware (default)", "cost-aware-bandit", {}),
)


def _tuned_name(kind: str) -> str:
    """The adaptation study's name of ``kind`` tuned: its default row's name with "(tuned)" (the kind's
    own when it has no default row)."""
    default = next((name for name, row_kind, _ in ADAPT_POLICIES
                    if row_kind == kind and name.endswith(" (default)")), f"{kind} (default)")
    return default.replace(" (default)", " (tuned)")


def adapt_study(samples: int = 32, queries: int = 2000, tune_streams: int = 4, held_streams: int = 8,
                scheduler: str = "asha") -> dict[str, Any]:
    """Tune the adaptation policies on shifted streams (ASHA: poor configurations stop after a stream);
    compare every policy on held-out streams."""
    tuning = make_setting("adaptation", PAPER_PROFILE, queries=queries, chunks=tune_streams, seed=TUNE_SEED,
                          traffic=Traffic(), drafter="specblock")
    tuned = {kind: tune_policies(tuning, (kind,), samples, fresh(STUDY_RUNS / "adaptation" / kind),
                                 scheduler=scheduler)
             for kind in role_kinds("adaptation", tuned=True)}  # apart: ASHA compares within a kind
    named = [*ADAPT_POLICIES, *((_tuned_name(kind), kind, t.best["params"]) for kind, t in tuned.items())]
    streams = [dataclasses.replace(tuning, chunks=1, seed=HELD_OUT_SEED + k) for k in range(held_streams)]
    outcomes = _run_all([(stream, kind, params) for _, kind, params in named for stream in streams])
    per_stream = {name: [o.tokens_per_second for o in outcomes[i * held_streams:(i + 1) * held_streams]]
                  for i, (name, _, _) in enumerate(named)}
    taus = {name: float(np.mean([o.tau for o in outcomes[i * held_streams:(i + 1) * held_streams]]))
            for i, (name, _, _) in enumerate(named)}
    never = np.array(per_stream["never"])
    rows = []
    for name, kind, params in named:
        tps = np.array(per_stream[name])
        ratio = tps / never
        rows.append({"policy": name, "kind": kind, "params": params, "tokens_per_second": float(tps.mean()),
                     "tau": taus[name], "per_stream": tps.tolist(), "ratio_to_never": float(ratio.mean()),
                     "ratio_stderr": float(ratio.std(ddof=1) / np.sqrt(ratio.size))})
    summary = {kind: {"trials": len(t.table), "complete": int(t.table["complete"].sum()),
                      "tune_seconds": t.tune_seconds, "trials_per_minute": t.trials_per_minute,
                      "best": t.best}
               for kind, t in tuned.items()}
    return {"rows": rows, "tune": summary}


def adapt_markdown(result: dict[str, Any], config: dict[str, Any]) -> str:
    """The adaptation study's table: tokens/s, tau and the paired ratio to never."""
    lines = ["# Adaptation policies in simulation", "",
             f"AdaptStream, A100 paper profile, specblock drafter: {config['held_streams']} held-out streams "
             f"of {config['queries']} queries (seeds {HELD_OUT_SEED}..), a quarter from one domain then an "
             f"equal mix of four. Tuning: {config['samples']} random configurations per kind with Ray Tune "
             f"({config['scheduler']} scheduler) on {config['tune_streams']} other streams. Ratio: mean over "
             "streams of tokens/s over never's on the same stream (+- standard error).", "",
             "| policy | tokens/s | tau | ratio to never |", "|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['policy']} | {row['tokens_per_second']:.2f} | {row['tau']:.3f} | "
                     f"{row['ratio_to_never']:.4f} +- {row['ratio_stderr']:.4f} |")
    streams = {row["policy"]: np.array(row["per_stream"]) for row in result["rows"]}
    paired = streams["cost-aware (tuned)"] / streams["cost-aware (default)"]
    lines += ["", f"Cost-aware tuned over default, paired by stream: {paired.mean():.4f} +- "
              f"{paired.std(ddof=1) / np.sqrt(paired.size):.4f} (better on {(paired > 1).sum()} of "
              f"{paired.size} streams)."]
    lines += ["", "Tuned parameters:", ""]
    lines += [f"- {kind} ({t['trials']} trials, {t['complete']} run to the end, {t['trials_per_minute']:.1f} "
              f"trials/min): {t['best']['params']}" for kind, t in result["tune"].items()]
    return "\n".join(lines) + "\n"


def adapt_plot(result: dict[str, Any], path: Path) -> None:
    """Paired ratio to never per policy, with standard errors."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.bar(range(len(rows)), [r["ratio_to_never"] for r in rows], yerr=[r["ratio_stderr"] for r in rows],
           color=["0.6" if "tuned" not in r["policy"] else "C0" for r in rows], capsize=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [r["policy"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s over never (paired)")
    low = min(r["ratio_to_never"] for r in rows)
    ax.set_ylim(min(low, 1.0) - 0.02, max(r["ratio_to_never"] for r in rows) + 0.02)
    ax.set_title("Online adaptation on a shifted stream (simulated, A100 paper profile)", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


STUDIES = {
    "serving": (serve_study, serve_markdown, serve_plot,
              {"samples": 32, "requests": 64, "tune_episodes": 2, "episodes": 4}),
    "length": (length_study, length_markdown, length_plot,
               {"samples": 12, "tune_queries": 192, "held_queries": 384}),
    "adaptation": (adapt_study, adapt_markdown, adapt_plot,
              {"samples": 32, "queries": 2000, "tune_streams": 4, "held_streams": 8, "scheduler": "asha"}),
}


def run_study(name: str, directory: Path = RESULTS) -> dict[str, Any]:
    """Run one study on local Ray and write its JSON, markdown and PNG under ``directory``."""
    if name not in STUDIES:
        raise InputError(f"unknown study {name!r}: use one of {', '.join(STUDIES)}")
    study, markdown, plot, config = STUDIES[name]
    start = time.perf_counter()
    start_ray()
    result = study(**config)
    result["seconds"] = time.perf_counter() - start
    save_result(f"study_{name}", result, {"study": name, **config}, TUNE_SEED, directory)
    write_text(directory / f"study_{name}.md", markdown(result, config))
    plot(result, directory / f"study_{name}.png")
    return result


# --- its section of docs/results.md ----------------------------------------------------------------


def _study_command(name: str, config: Record) -> str:
    return f"specblock study {config['study']}"


STUDY_LENGTH_POLICIES = ("libraspec", "threshold (tuned)", "heuristic (tuned)")


def _study_length_body(record: Record) -> Lines:
    config = record["config"]
    lines = [f"Simulated tokens/s on {config['held_queries']} held-out queries, policies tuned with Ray Tune "
             f"({config['samples']} configurations per kind on {config['tune_queries']} other queries); the "
             "policies' cells are ratios to the best fixed length, chosen with hindsight.", ""]
    rows = [[r["case"], r["traffic"], f"{r['vanilla']:.2f}",
             f"{r['best_fixed']:.2f} ({r['best_fixed_length']})",
             *(f"{r['tokens_per_second'][p] / r['best_fixed']:.3f}" for p in STUDY_LENGTH_POLICIES)]
            for r in record["results"]["rows"]]
    return lines + table(["case", "traffic", "vanilla", "best fixed (n)", *STUDY_LENGTH_POLICIES], rows)


def _study_adapt_body(record: Record) -> Lines:
    config = record["config"]
    lines = [f"AdaptStream: {config['held_streams']} held-out streams of {config['queries']} queries; ratio: "
             "mean over streams of tokens/s over `never`'s on the same stream (+- standard error).", ""]
    rows = [[r["policy"], f"{r['tokens_per_second']:.2f}", f"{r['tau']:.3f}",
             f"{r['ratio_to_never']:.4f} +- {r['ratio_stderr']:.4f}"] for r in record["results"]["rows"]]
    return lines + table(["policy", "tokens/s", "tau", "ratio to never"], rows)


RENDERERS: dict[str, Renderer] = {
    "study_length": Renderer("Study: length policies in simulation", _study_command, _study_length_body),
    "study_adaptation": Renderer("Study: adaptation policies in simulation", _study_command,
                                 _study_adapt_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
