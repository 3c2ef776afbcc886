"""Simulator rollout speed on one CPU core: SpecLength iterations/s and AdaptStream queries/s.

Runs the numpy vector environments with policies computed in numpy (no per-slot Python): a fixed
length, and a confidence threshold over the observation; AdaptStream skips, or trains the full
drafter whenever its buffer is full. The process is pinned to one core (the rollouts make no BLAS
calls, so no thread pool is involved). Counts only real steps (a slot's next-step autoreset is not
an iteration). Prints and saves ``benchmarks/results/rollout_speed.json``.

    .venv/bin/python benchmarks/rollout_speed.py [--seconds S]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

from experiments.provenance import save_result
from policies.features import ADAPT_INDEX, LENGTH_SLICES
from simulator.acceptance import TraceReplay, default_acceptance, positions, synthetic_traces
from simulator.vector_envs import AdaptStreamVectorEnv, SpecLengthVectorEnv

SEED = 0


def threshold(obs: np.ndarray, level: float = 0.3) -> np.ndarray:
    """Verify the positions whose path confidence stays at or above ``level`` (vectorized)."""
    return (np.cumprod(obs[:, LENGTH_SLICES["confidences"]], axis=1) >= level).sum(axis=1)


def full_when_full(obs: np.ndarray) -> np.ndarray:
    """Train the full drafter (action 2) in every stream whose full buffer is saturated."""
    return 2 * (obs[:, ADAPT_INDEX["full_fill"]] >= 1.0)


def measure(env: SpecLengthVectorEnv | AdaptStreamVectorEnv, policy: Callable[[np.ndarray], np.ndarray],
            seconds: float) -> tuple[float, float]:
    """Real steps per wall second and per CPU second of ``env`` under ``policy`` for about ``seconds``.

    Per CPU second is what a core of our own would give on a machine shared with other jobs.
    """
    obs, _ = env.reset(seed=SEED)
    for _ in range(3):  # warm-up
        obs, *_ = env.step(policy(obs))
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        restarting = int(env.prev_done.sum())
        obs, *_ = env.step(policy(obs))
        steps += env.num_envs - restarting
    return steps / (time.perf_counter() - start), steps / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="Wall seconds per measurement.")
    args = parser.parse_args()
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    traces = synthetic_traces(default_acceptance(), queries=400, iterations=50, seed=SEED)
    models = {"parametric": default_acceptance(), "replay": TraceReplay(positions(traces))}
    rows = []
    for name, model in models.items():
        for slots in (1024, 4096):
            env = SpecLengthVectorEnv(slots, acceptance=model)
            fixed = np.full(slots, 8, dtype=np.int64)
            for policy_name, policy in (("fixed-8", lambda obs, a=fixed: a), ("threshold-0.3", threshold)):
                rate, cpu_rate = measure(env, policy, args.seconds)
                rows.append({"env": "SpecLength", "acceptance": name, "policy": policy_name,
                             "num_envs": slots, "per_second": rate, "per_cpu_second": cpu_rate,
                             "unit": "iterations"})
                print(f"SpecLength  {name:10s} {policy_name:14s} num_envs={slots:5d}: {rate:11,.0f} it/s, "
                      f"{cpu_rate:11,.0f} it/CPU-s")
    slots = 1024
    env = AdaptStreamVectorEnv(slots)
    skip = np.zeros(slots, dtype=np.int64)
    for policy_name, policy in (("skip", lambda obs: skip), ("full-when-full", full_when_full)):
        rate, cpu_rate = measure(env, policy, args.seconds)
        rows.append({"env": "AdaptStream", "acceptance": "parametric", "policy": policy_name,
                     "num_envs": slots, "per_second": rate, "per_cpu_second": cpu_rate, "unit": "queries"})
        print(f"AdaptStream parametric {policy_name:14s} num_envs={slots:5d}: {rate:11,.0f} queries/s, "
              f"{cpu_rate:11,.0f} queries/CPU-s")
    config = {"seconds_per_measurement": args.seconds, "pinned_core": core, "load_average": os.getloadavg(),
              "tokens_per_query": 512, "replay_rows": 20_000}
    path = save_result("rollout_speed", rows, config, SEED)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
