"""Verification LP solve time against vocabulary V, draft length L and number of drafts K.

For V = 2..4, L = 1..3, K = 1..3 it builds the LP of random Dirichlet(1) instances and solves it
with Clarabel (the default) and HiGHS, recording wall time (build + solve), the variable count and
the optimum. A problem over the size limit of ``simulator.lp`` is skipped with its variable count,
and a solver that runs past the time budget is recorded as skipped for that shape. Saves
``benchmarks/results/lp_solve_time.json``.

    specblock benchmark lp_solve_time [--instances 2] [--time-budget 60]
"""

from __future__ import annotations

import statistics
from pathlib import Path

import click
import numpy as np

from benchmarks.output import finish, table
from core.errors import InputError
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag
from experiments.report_format import table as md_table
from simulator.instances import random_instance
from simulator.lp import MAX_VARIABLES, SOLVERS, LPSolveError, lp_size, solve_lp

SEED = 0
VOCABS, LENGTHS, DRAFTS = (2, 3, 4), (1, 2, 3), (1, 2, 3)


def measure(vocab: int, length: int, drafts: int, instances: int, budget: float,
            rng: np.random.Generator) -> list[dict]:
    """One row per solver for this shape: mean and max seconds and the mean optimum, or why it was skipped."""
    size = lp_size(vocab, length, drafts)
    shape = {"vocab": vocab, "length": length, "drafts": drafts, "variables": size}
    if size > MAX_VARIABLES:
        return [{**shape, "solver": s, "skipped": f"over the size limit of {MAX_VARIABLES:,} variables"}
                for s in SOLVERS]
    insts = [random_instance(vocab, length, rng) for _ in range(instances)]
    rows = []
    for solver in SOLVERS:
        try:
            results = [solve_lp(inst, drafts, solver=solver, time_limit=budget) for inst in insts]
        except LPSolveError as exc:
            skipped = f"over the time budget of {budget:g} s: {exc}"
            rows.append({**shape, "solver": solver, "skipped": skipped})
            continue
        seconds = [r.seconds for r in results]
        rows.append({**shape, "solver": solver, "instances": instances,
                     "seconds_mean": statistics.mean(seconds), "seconds_max": max(seconds),
                     "value_mean": statistics.mean(r.value for r in results),
                     "fallbacks": sum(r.solver != solver for r in results)})
    return rows


@click.command("lp_solve_time")
@click.option("--instances", type=int, default=2, show_default=True, help="Random instances per shape.")
@click.option("--time-budget", type=float, default=60.0, show_default=True, help="Seconds allowed per solve.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for lp_solve_time.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(instances: int, time_budget: float, out: Path, as_json: bool) -> None:
    """Verification LP solve time against vocabulary, draft length and number of drafts."""
    if instances < 1 or not time_budget > 0:
        raise InputError(f"--instances {instances} --time-budget {time_budget}: give at least 1 instance and "
                         "a positive budget")
    rng = np.random.default_rng(SEED)
    rows = []
    show = table(as_json)
    show(f"{'V':>2} {'L':>2} {'K':>2} {'variables':>10} {'solver':>9} {'mean s':>8} {'max s':>8} "
         f"{'LP mean':>8}")
    for vocab in VOCABS:
        for length in LENGTHS:
            for drafts in DRAFTS:
                for row in measure(vocab, length, drafts, instances, time_budget, rng):
                    rows.append(row)
                    figures = (f"skipped: {row['skipped'][:40]}" if "skipped" in row else
                               f"{row['seconds_mean']:8.3f} {row['seconds_max']:8.3f} "
                               f"{row['value_mean']:8.4f}")
                    show(f"{vocab:>2} {length:>2} {drafts:>2} {row['variables']:>10,} {row['solver']:>9} "
                         f"{figures}")
    config = {"vocabs": VOCABS, "lengths": LENGTHS, "drafts": DRAFTS, "instances": instances,
              "time_budget_s": time_budget, "max_variables": MAX_VARIABLES, "drafter": "indep"}
    finish(as_json, rows, save_result("lp_solve_time", rows, config, SEED, out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _lp_solve_time_command(name: str, config: Record) -> str:
    return (f"{benchmark('lp_solve_time')}{flag('--instances', config['instances'], 2)}"
            f"{flag('--time-budget', config['time_budget_s'], 60.0)}")


def _lp_solve_time_body(record: Record) -> Lines:
    solvers = sorted({r["solver"] for r in record["results"]})
    cells: dict[tuple[int, int, int], Record] = {}
    for r in record["results"]:
        entry = cells.setdefault((r["vocab"], r["length"], r["drafts"]), {"variables": r["variables"]})
        entry[r["solver"]] = "skipped" if r.get("skipped") else f"{r['seconds_mean']:.3f}"
    lines = ["Mean seconds per solve of the verification LP by vocabulary V, draft length L, drafts K.", ""]
    rows = [[*key, f"{entry['variables']:,}", *(entry.get(s, "-") for s in solvers)]
            for key, entry in sorted(cells.items())]
    return lines + md_table(["V", "L", "K", "variables", *solvers], rows)


RENDERERS: dict[str, Renderer] = {
    "lp_solve_time": Renderer("LP solve time", _lp_solve_time_command, _lp_solve_time_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
