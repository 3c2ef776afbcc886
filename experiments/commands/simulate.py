"""`specblock simulate`: predict each policy's tokens/s, tau and latency on the simulator.

Defaults: the profile is ``data/profiles/cpu_shipped.json`` when it exists, else the paper-derived
A100 profile; the acceptance model replays ``data/traces/default.parquet`` when the shipped profile
is used and the traces exist, else it is the paper-derived parametric model
(``simulator.acceptance.default_acceptance``). The drafter is the one the traces were recorded with,
else ``specblock`` when profiled, else the profile's first.
Without ``--policy`` the baselines are fixed lengths 1, 2, 4 and 8. Vanilla decoding (length 0) is
always evaluated: ``speedup`` is tokens/s over vanilla's. Length policies serve ``--queries`` queries
(SpecLength); adaptation policies serve one stream of ``--queries`` queries (AdaptStream).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from policies.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PROFILE = ROOT / "data" / "profiles" / "cpu_shipped.json"
SHIPPED_TRACES = ROOT / "data" / "traces" / "default.parquet"
BASELINES = (1, 2, 4, 8)


def default_drafter(profile: Any, traces: Any) -> str:
    kinds = sorted(profile.drafters)
    if traces is not None:
        used = sorted(set(traces["drafter"]))
        if len(used) != 1 or used[0] not in kinds:
            raise InputError(f"the traces were recorded with drafter(s) {', '.join(used)} and the profile "
                             f"times {', '.join(kinds)}: pass traces of one profiled drafter")
        return used[0]
    return "specblock" if "specblock" in kinds else kinds[0]


def _evaluate(profile_path: Path | None, traces_path: Path | None, policy_paths: tuple[Path, ...],
              queries: int, seed: int) -> dict[str, Any]:
    from policies.base import load_policy, make_policy
    from simulator.acceptance import TraceReplay, default_acceptance
    from simulator.costs import PAPER_PROFILE, load_profile
    from simulator.envs import AdaptStreamEnv, default_phases
    from simulator.rollout import is_adaptation, run_adapt, run_length
    from simulator.traces import load_traces
    from simulator.vector_envs import SpecLengthVectorEnv

    if profile_path is None:
        profile_path = SHIPPED_PROFILE if SHIPPED_PROFILE.exists() else PAPER_PROFILE
        # The shipped traces belong with the shipped profile, never with a profile the user picked.
        if traces_path is None and profile_path == SHIPPED_PROFILE and SHIPPED_TRACES.exists():
            traces_path = SHIPPED_TRACES
    profile = load_profile(profile_path)
    traces = None if traces_path is None else load_traces(traces_path)
    drafter = default_drafter(profile, traces)
    model = default_acceptance() if traces is None else TraceReplay.from_traces(traces)
    named = [("vanilla", make_policy("fixed", {"length": 0}))]
    if policy_paths:
        named += [(path.stem, load_policy(path, seed=seed)) for path in policy_paths]
    else:
        named += [(f"fixed-{n}", make_policy("fixed", {"length": n})) for n in BASELINES]
    rows = []
    for name, policy in named:
        if is_adaptation(policy):
            env = AdaptStreamEnv(profile, model, drafter, phases=default_phases(model.domains, queries))
            outcome, where = run_adapt(policy, env, seed), "AdaptStream"
        else:
            outcome = run_length(policy, SpecLengthVectorEnv(queries, profile, model, drafter), seed)
            where = "SpecLength"
        rows.append({"name": name, "kind": policy.kind, "env": where,
                     "tokens_per_second": outcome.tokens_per_second, "tau": outcome.tau,
                     "latency_seconds": outcome.latency_seconds})
    for row in rows:
        row["speedup"] = row["tokens_per_second"] / rows[0]["tokens_per_second"]
    return {"profile": str(profile_path), "derived": profile.derived_from is not None,
            "traces": None if traces_path is None else str(traces_path),
            "acceptance": "parametric" if traces is None else "replay", "drafter": drafter,
            "queries": queries, "seed": seed, "policies": rows}


def _table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    source = "paper-derived" if result["derived"] else "measured"
    table = Table(title=f"Simulated decoding: {result['drafter']} drafter, {result['acceptance']} acceptance",
                  caption=f"profile {result['profile']} ({source}); {result['queries']} queries, "
                          f"seed {result['seed']}")
    for name in ("policy", "kind", "env", "tokens/s", "tau", "latency s", "speedup"):
        table.add_column(name, justify="left" if name in ("policy", "kind", "env") else "right")
    for row in result["policies"]:
        table.add_row(row["name"], row["kind"], row["env"], f"{row['tokens_per_second']:.2f}",
                      f"{row['tau']:.3f}", f"{row['latency_seconds']:.3f}", f"{row['speedup']:.3f}")
    Console().print(table)


@click.command("simulate")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path),
              help="Cost profile JSON [default: data/profiles/cpu_shipped.json, else the A100 paper "
                   "profile].")
@click.option("--traces", "traces_path", type=click.Path(path_type=Path),
              help="Acceptance traces (parquet) to replay [default: data/traces/default.parquet, "
                   "else the parametric model].")
@click.option("--policy", "policy_paths", type=click.Path(path_type=Path), multiple=True,
              help="Policy file to evaluate (repeatable) [default: fixed lengths 1, 2, 4, 8].")
@click.option("--queries", type=int, default=100, show_default=True, help="Queries per policy.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the simulated queries.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def command(profile_path: Path | None, traces_path: Path | None, policy_paths: tuple[Path, ...], queries: int,
            seed: int, as_json: bool) -> None:
    """Predict tokens/s, tau and latency of speculation policies on the simulator."""
    if queries < 1:
        raise InputError(f"--queries {queries} is too few: simulate at least 1 query")
    result = _evaluate(profile_path, traces_path, policy_paths, queries, seed)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        _table(result)
