"""What the simulator charges a policy-steered iteration beyond T(n): the profile's steering series, each
decision's own cost, and the step times the policy is shown; and the profile's estimator and bench."""

from __future__ import annotations

import numpy as np
import pytest
from test_fidelity import chain_traces

from core.cost_profile import profile_from_json
from core.errors import InputError
from policies import make_policy
from policies.features import LENGTH_SLICES
from simulator.replay import TraceReplay
from simulator.rollout import run_length
from simulator.spec_length import SpecLengthVectorEnv


def profile(steering: float | None = None, vanilla: list[float] | None = None, estimator: str | None = None,
            scale: float = 1.0) -> object:
    """Verify 1 ms a node, vanilla 2 ms, 0.5 ms a drafted token (times ``scale``); steering ``steering``
    seconds plus 0.1 ms a drafted position."""
    rows = [1, 2, 4, 8, 16, 32]
    data = {
        "schema_version": 1, "device": "test", "dtype": "float32", "derived_from": None,
        "models": {"target": "t", "drafters": {"draft-model": "d"}},
        "samples": {
            "verify": [{"nodes": n, "context": c, "seconds": [scale * 1e-3 * n]}
                       for n in rows for c in (0, 4096)],
            "vanilla": [{"context": c, "seconds": vanilla or [scale * 2e-3]} for c in (0, 4096)],
            "draft": {"draft-model": [{"tokens": t, "seconds": [scale * 5e-4 * t]} for t in rows]},
            "update": {"head": [1.0], "full": [2.0]}}}
    if steering is not None:
        data["samples"]["steering"] = [{"drafted": d, "seconds": [steering + 1e-4 * d]} for d in (0, 8)]
    if estimator is not None:
        data["estimator"] = estimator
    return profile_from_json(data)


def env(prof: object, steered: bool = True, observed: object = None) -> SpecLengthVectorEnv:
    replay = TraceReplay.from_traces(chain_traces(accepted=4))
    return SpecLengthVectorEnv(4, prof, replay, "draft-model", tokens_per_query=60, prompt_tokens=(50, 50),
                               steered=steered, observed=observed)


def test_steering_is_charged_per_iteration_by_positions_drafted() -> None:
    fixed = make_policy("fixed", {"length": 2})
    plain = run_length(fixed, env(profile()), 0)
    steered = run_length(fixed, env(profile(steering=3e-4)), 0)
    assert steered.iterations == plain.iterations and steered.tokens == plain.tokens
    extra = (steered.seconds - plain.seconds) / steered.iterations
    assert extra == pytest.approx(3e-4 + 2e-4)  # 2 drafted positions
    assert steered.draft_seconds - plain.draft_seconds == pytest.approx(steered.seconds - plain.seconds)
    unsteered = run_length(fixed, env(profile(steering=3e-4), steered=False), 0)
    assert unsteered.seconds == pytest.approx(plain.seconds)


def test_each_decision_costs_its_seconds() -> None:
    fixed = make_policy("fixed", {"length": 2})
    base = run_length(fixed, env(profile()), 0)
    slow = run_length(fixed, env(profile()), 0, decision_seconds=1e-4)
    # the chain is asked before each of 2 tokens and stopped at the third check, then once for n: 4 calls
    assert (slow.seconds - base.seconds) / base.iterations == pytest.approx(4e-4)


def test_observed_profile_changes_what_the_policy_sees_not_what_it_costs() -> None:
    cheap, dear = profile(), profile(scale=2.0)
    shown = env(cheap, observed=dear)
    obs, _ = shown.reset(seed=0)
    same, _ = env(cheap).reset(seed=0)
    steps = LENGTH_SLICES["step_seconds"]
    np.testing.assert_allclose(obs[:, steps], 2 * same[:, steps])
    fixed = make_policy("fixed", {"length": 3})
    assert run_length(fixed, env(cheap, observed=dear), 0).seconds == pytest.approx(
        run_length(fixed, env(cheap), 0).seconds)
    assert shown.single_observation_space.contains(obs[0])


def test_the_estimator_chooses_median_or_mean_of_the_repeats() -> None:
    repeats = [1e-3, 1e-3, 4e-3]
    assert profile(vanilla=repeats).vanilla_seconds(100) == pytest.approx(1e-3)
    mean = profile(vanilla=repeats, estimator="mean")
    assert mean.vanilla_seconds(100) == pytest.approx(2e-3)
    assert profile_from_json(mean.to_json()).vanilla_seconds(100) == pytest.approx(2e-3)  # round trip
    with pytest.raises(InputError, match="estimator 'mode' is unknown"):
        profile(estimator="mode")


def test_bench_runs_preludes_untimed_and_work_between_rounds() -> None:
    from real_engine.timing import Bench

    now = [0.0]
    log: list[str] = []

    def tick(seconds: float, name: str) -> object:
        def run() -> None:
            now[0] += seconds
            log.append(name)
        return run

    bench = Bench(lambda: now[0], repeats=3, warmup=1)
    seconds = bench.add(tick(2.0, "job"), before=tick(100.0, "before"))
    bench.run(between=lambda k: log.append(f"between {k}"))
    assert seconds == [2.0, 2.0, 2.0]  # the prelude's 100 s are not timed
    assert log == ["before", "job", *[x for k in range(3) for x in ("before", "job", f"between {k}")]]


def test_steering_rows_validate() -> None:
    with pytest.raises(InputError, match=r"samples\.steering\[0\]\.drafted = -1"):
        profile_from_json({**profile(steering=1e-4).to_json(), "fits": None,
                           "samples": {**profile(steering=1e-4).to_json()["samples"],
                                       "steering": [{"drafted": -1, "seconds": [1e-4]}]}})
