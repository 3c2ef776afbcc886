"""Simulator rollout speed on one CPU core: SpecLength iterations/s and AdaptStream queries/s.

Three ways to run a stateless length policy (fixed 8, confidence threshold 0.3, LibraSpec) are timed
in the same run: ``simulator.rollout.run_length`` on a ``SpecLengthVectorEnv`` (the policy's batched
``choose_batch`` chooses for every slot in one numpy call), the bare vector env stepped with that
batched call, and the single environment stepped with the policy's ``act``, one observation at a
time (the ratio column is against this loop). AdaptStream skips, or trains the full drafter whenever
its buffer is full. The process is pinned to one core (the rollouts make no BLAS calls, so no thread
pool is involved); rates are given per wall second and per CPU second of this process (what a core
of our own would give on a machine shared with other jobs). Only real steps count (a slot's
next-step autoreset and the idle slots at the end of a rollout are not iterations). Prints and
saves ``benchmarks/results/rollout_speed.json``.

    specblock benchmark rollout_speed [--seconds S]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from benchmarks.output import finish, table
from core.errors import InputError
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag
from experiments.report_format import table as md_table
from policies.base import Policy, make_policy
from policies.features import ADAPT_INDEX, LENGTH_SLICES
from simulator.acceptance import AcceptanceModel
from simulator.adapt_stream import AdaptStreamVectorEnv
from simulator.parametric import default_acceptance, synthetic_traces
from simulator.replay import TraceReplay
from simulator.rollout import run_length
from simulator.spec_length import SpecLengthEnv, SpecLengthVectorEnv

SEED = 0
SLOTS = 4096
POLICIES = {"fixed-8": ("fixed", {"length": 8}), "threshold-0.3": ("threshold", {"threshold": 0.3}),
            "libraspec": ("libraspec", {})}


def clocks() -> tuple[float, float]:
    """(wall, CPU) seconds now."""
    return time.perf_counter(), time.process_time()


def rates(count: float, start: tuple[float, float]) -> tuple[float, float]:
    """``count`` per wall second and per CPU second since ``start``."""
    wall, cpu = clocks()
    return count / (wall - start[0]), count / (cpu - start[1])


def batched(policy: Policy) -> Callable[[np.ndarray], np.ndarray]:
    """The policy's batched choice as a function of a batch of observations."""
    conf, steps = LENGTH_SLICES["confidences"], LENGTH_SLICES["step_seconds"]
    return lambda obs: policy.choose_batch(obs[:, conf], obs[:, steps])


def time_rollouts(policy: Policy, model: AcceptanceModel, seconds: float) -> tuple[float, float]:
    """Iterations per second of whole ``run_length`` rollouts of SLOTS queries, repeated for ``seconds``."""
    iterations, seed, start = 0.0, SEED, clocks()
    while iterations == 0 or time.perf_counter() - start[0] < seconds:
        iterations += run_length(policy, SpecLengthVectorEnv(SLOTS, acceptance=model), seed).iterations
        seed += 1
    return rates(iterations, start)


def time_steps(env: SpecLengthVectorEnv | AdaptStreamVectorEnv, choose: Callable[[np.ndarray], np.ndarray],
               seconds: float) -> tuple[float, float]:
    """Real steps per second of a vector env under a batched policy for about ``seconds``."""
    obs, _ = env.reset(seed=SEED)
    for _ in range(3):  # warm-up
        obs, *_ = env.step(choose(obs))
    steps, start = 0, clocks()
    while time.perf_counter() - start[0] < seconds:
        restarting = int(env.prev_done.sum())
        obs, *_ = env.step(choose(obs))
        steps += env.num_envs - restarting
    return rates(steps, start)


def time_single(policy: Policy, model: AcceptanceModel, seconds: float) -> tuple[float, float]:
    """Steps per second of the single environment with the policy's ``act``, one step at a time."""
    env = SpecLengthEnv(acceptance=model)
    obs, _ = env.reset(seed=SEED)
    steps, start = 0, clocks()
    while time.perf_counter() - start[0] < seconds:
        obs, _, terminated, _, _ = env.step(policy.act(obs))
        steps += 1
        if terminated:
            obs, _ = env.reset()
    return rates(steps, start)


def speclength_rows(seconds: float, show: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every SpecLength measurement, with the ratio of each to the single-env loop of its policy."""
    traces = synthetic_traces(default_acceptance(), queries=400, iterations=50, seed=SEED)
    models = {"parametric": default_acceptance(), "replay": TraceReplay.from_traces(traces)}
    rows = []
    for name, model in models.items():
        for label, (kind, params) in POLICIES.items():
            policy = make_policy(kind, params)
            single = time_single(policy, model, seconds)
            found = {"run_length": time_rollouts(policy, model, seconds),
                     "vector_env": time_steps(SpecLengthVectorEnv(SLOTS, acceptance=model), batched(policy),
                                              seconds),
                     "single_env": single}
            for path, (rate, cpu_rate) in found.items():
                rows.append({"env": "SpecLength", "path": path, "acceptance": name, "policy": label,
                             "num_envs": 1 if path == "single_env" else SLOTS, "per_second": rate,
                             "per_cpu_second": cpu_rate, "vs_single_env": rate / single[0],
                             "vs_single_env_cpu": cpu_rate / single[1], "unit": "iterations"})
                show(f"SpecLength  {name:10s} {label:13s} {path:10s}: {rate:11,.0f} it/s "
                     f"{cpu_rate:11,.0f} it/CPU-s  x{rate / single[0]:6.1f} vs single env")
    return rows


def adaptstream_rows(seconds: float, show: Callable[[str], None]) -> list[dict[str, Any]]:
    """AdaptStream queries per second with two batched adaptation rules."""
    env = AdaptStreamVectorEnv(1024)
    skip = np.zeros(1024, dtype=np.int64)
    full = ADAPT_INDEX["full_fill"]
    rules = {"skip": lambda obs: skip, "full-when-full": lambda obs: 2 * (obs[:, full] >= 1.0)}
    rows = []
    for label, rule in rules.items():
        rate, cpu_rate = time_steps(env, rule, seconds)
        rows.append({"env": "AdaptStream", "path": "vector_env", "acceptance": "parametric", "policy": label,
                     "num_envs": 1024, "per_second": rate, "per_cpu_second": cpu_rate, "unit": "queries"})
        show(f"AdaptStream parametric {label:14s}: {rate:11,.0f} queries/s {cpu_rate:11,.0f} queries/CPU-s")
    return rows


@click.command("rollout_speed")
@click.option("--seconds", type=float, default=3.0, show_default=True, help="Wall seconds per measurement.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for rollout_speed.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(seconds: float, out: Path, as_json: bool) -> None:
    """Simulator rollout speed on one pinned core: SpecLength iterations/s, AdaptStream queries/s."""
    if not seconds > 0:
        raise InputError(f"--seconds {seconds}: give a positive number of seconds")
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    load = os.getloadavg()
    show = table(as_json)
    rows = speclength_rows(seconds, show) + adaptstream_rows(seconds, show)
    config = {"seconds_per_measurement": seconds, "pinned_core": core, "load_average_before": load,
              "load_average_after": os.getloadavg(), "num_envs": SLOTS, "tokens_per_query": 512,
              "replay": "synthetic traces of default_acceptance(), 400 queries x 50 iterations"}
    finish(as_json, rows, save_result("rollout_speed", rows, config, SEED, out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _rollout_speed_command(name: str, config: Record) -> str:
    return f"{benchmark('rollout_speed')}{flag('--seconds', config['seconds_per_measurement'], 3.0)}"


def _rollout_speed_body(record: Record) -> Lines:
    rows = [[r["env"], r["acceptance"], r["policy"], r["path"], f"{r['num_envs']:,}",
             f"{r['per_second']:,.0f} {r['unit']}",
             f"{r['vs_single_env']:.0f}x" if "vs_single_env" in r else "-"] for r in record["results"]]
    return ["Simulator steps per second; vs one env: over a single Gymnasium environment's rate.", "",
            *md_table(["environment", "acceptance", "policy", "path", "envs", "per second", "vs one env"],
                      rows)]


RENDERERS: dict[str, Renderer] = {
    "rollout_speed": Renderer("Simulator rollout speed", _rollout_speed_command, _rollout_speed_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
