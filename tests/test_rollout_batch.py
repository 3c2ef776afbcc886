"""Batched length policies choose exactly what their per-observation ``act`` chooses, row for row."""

from __future__ import annotations

import numpy as np
import pytest

from policies.base import make_policy
from policies.features import LENGTH_CAP, LENGTH_SLICES
from simulator.parametric import default_acceptance
from simulator.rollout import run_length
from simulator.spec_length import SpecLengthVectorEnv

CASES = [("fixed", {"length": 5}), ("fixed", {"length": 0}), ("threshold", {"threshold": 0.3}),
         ("threshold", {"threshold": 0.05, "max_length": 6}), ("threshold", {"max_length": 0}),
         ("libraspec", {}), ("libraspec", {"max_length": 4}), ("libraspec", {"max_length": 0}),
         ("libraspec-exhaustive", {}), ("libraspec-exhaustive", {"max_length": 7})]


def observations(rows: int = 3000, seed: int = 0) -> np.ndarray:
    """Length observations with drafted lengths 0..cap, some certain positions, convex and flat costs."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((rows, 1 + LENGTH_CAP + LENGTH_CAP + 1))
    drafted = rng.integers(0, LENGTH_CAP + 1, rows)
    conf = rng.beta(4, 1, (rows, LENGTH_CAP)) * (np.arange(LENGTH_CAP) < drafted[:, None])
    conf[rng.random(rows) < 0.1, :3] = 1.0
    n = np.arange(LENGTH_CAP + 1)
    steps = 0.02 + rng.uniform(0, 1e-3, (rows, 1)) * n + rng.uniform(0, 1e-4, (rows, 1)) * n**2
    steps[rng.random(rows) < 0.1] = 0.02
    obs[:, 0] = rng.integers(0, 2000, rows)
    obs[:, LENGTH_SLICES["confidences"]] = conf
    obs[:, LENGTH_SLICES["step_seconds"]] = steps
    return obs


@pytest.mark.parametrize(("kind", "params"), CASES)
def test_batch_equals_act_row_by_row(kind: str, params: dict) -> None:
    policy = make_policy(kind, params)
    obs = observations()
    batch = policy.choose_batch(obs[:, LENGTH_SLICES["confidences"]], obs[:, LENGTH_SLICES["step_seconds"]])
    assert batch.dtype == np.int64
    np.testing.assert_array_equal(batch, [policy.act(row) for row in obs])


@pytest.mark.parametrize("kind", ["threshold", "libraspec"])
def test_batched_rollout_matches_the_per_slot_copies(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> tuple[float, ...]:
        env = SpecLengthVectorEnv(48, acceptance=default_acceptance(), tokens_per_query=64)
        out = run_length(make_policy(kind, {}), env, seed=3)
        return out.tokens, out.seconds, out.iterations

    batched = run()
    monkeypatch.delattr(type(make_policy(kind, {})), "choose_batch")  # forces one copy per slot
    assert run() == batched
