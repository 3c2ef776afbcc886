"""The serving policies: a speculation length per running request from the serving observation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InputError
from policies import load_policy, make_policy, save_policy
from policies.calibration import Calibration
from policies.features import LENGTH_CAP, SERVE_SLOT_DIM, serve_features, serve_probe
from policies.serving import expected_rate, keeps_drafting, request_view
from simulator.spec_serve import SpecServeEnv


def observation(confidences: list[list[float]], cap: int = 4,
                costs: tuple[float, ...] = (0.03, 0.0005, 0.0004, 0.0)) -> np.ndarray:
    """A serving observation with one running request per confidence row, the other slots empty."""
    slots = np.zeros((cap, SERVE_SLOT_DIM))
    for i, row in enumerate(confidences):
        slots[i, :3] = (1, 100 + i, 50)
        slots[i, 3:3 + len(row)] = row
    return serve_features(len(confidences), 0, costs, slots)


def test_the_table_reads_the_batch_size() -> None:
    policy = make_policy("batch-table", {"l1": 7, "l2": 5, "l8": 1})
    assert policy.act(observation([[0.9]])).tolist() == [7, 0, 0, 0]
    assert policy.act(observation([[0.9], [0.1]])).tolist() == [5, 5, 0, 0]
    with pytest.raises(InputError, match="l3"):
        make_policy("batch-table", {"l3": LENGTH_CAP + 1})


def test_goodput_and_the_marginal_rule_are_the_best_choices_by_enumeration() -> None:
    """Goodput's length is the best one batch-wide length; LibraSpec per request (margin 1) reaches the
    best expected rate over every per-request choice, found by enumeration on two requests."""
    obs = observation([[0.95, 0.9, 0.85, 0.6, 0.3, 0.2], [0.5, 0.4, 0.2, 0.1, 0.1, 0.1]])
    active, paths, costs = request_view(obs)
    paths = paths[active]
    goodput = make_policy("goodput", {"max_length": 6}).act(obs)[:2]
    best_one = max(range(7), key=lambda k: expected_rate(paths, np.full(2, k), costs))
    assert goodput.tolist() == [best_one] * 2
    marginal = make_policy("libraspec-batch", {"max_length": 6, "margin": 1.0}).act(obs)[:2]
    best = max(expected_rate(paths, np.array(k), costs) for k in itertools.product(range(7), repeat=2))
    assert expected_rate(paths, marginal, costs) == pytest.approx(best)
    assert marginal[0] > marginal[1]  # the surer request speculates further


def test_a_chain_start_cost_keeps_the_unsure_request_plain() -> None:
    """With a chain's start to pay, the marginal rule leaves the unsure request undrafted where drafting its
    first position would lower the iteration's expected rate, and stays within a few percent of the best
    rate found by enumeration (greedy with a fixed cost is an approximation)."""
    obs = observation([[0.95, 0.9, 0.85, 0.6, 0.3, 0.2], [0.3, 0.2, 0.1, 0.1, 0.1, 0.1]],
                      costs=(0.03, 0.0005, 0.0004, 0.01))
    active, paths, costs = request_view(obs)
    marginal = make_policy("libraspec-batch", {"max_length": 6, "margin": 1.0}).act(obs)[:2]
    assert marginal[0] > 0 and marginal[1] == 0
    paths = paths[active]
    best = max(expected_rate(paths, np.array(k), costs) for k in itertools.product(range(7), repeat=2))
    assert expected_rate(paths, marginal, costs) >= 0.97 * best


def test_the_threshold_keeps_the_confident_positions() -> None:
    obs = observation([[0.9, 0.8, 0.5, 0.9], [0.4]])
    strict = make_policy("threshold-batch", {"threshold": 0.5, "max_length": 8})
    loose = make_policy("threshold-batch", {"threshold": 0.3, "max_length": 1})
    assert strict.act(obs).tolist() == [2, 0, 0, 0] and loose.act(obs).tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("kind", ["batch-table", "goodput", "libraspec-batch", "threshold-batch"])
def test_each_policy_serves_an_episode_and_round_trips_its_file(kind: str, tmp_path) -> None:
    policy = make_policy(kind)
    env = SpecServeEnv(rate=8.0, requests=5, max_batch=3, prompt_tokens=(16, 32), output_tokens=(8, 16))
    obs, _ = env.reset(seed=0)
    done, tokens = False, 0
    while not done:
        action = policy.act(obs)
        assert env.action_space.contains(action)
        obs, _, done, _, info = env.step(action)
        tokens += info["tokens"]
    assert tokens == int(env.batch.output[0].sum())
    again = load_policy(save_policy(policy, tmp_path / f"{kind}.json"))
    assert again.kind == kind and again.params == policy.params


CALIBRATION = Calibration((((0.0, 0.3, 1.0), (0.1, 0.6, 0.9)), ((0.0, 1.0), (0.0, 0.8))))
probability = st.floats(0.0, 1.0)


seconds = st.floats(0.0, 0.05).map(lambda x: round(x, 6))  # none so small that a rate overflows


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["batch-table", "goodput", "libraspec-batch", "threshold-batch"]),
       calibrated=st.booleans(), max_length=st.integers(0, LENGTH_CAP), margin=st.floats(0.5, 2.0),
       threshold=probability, costs=st.tuples(*[seconds] * 4), data=st.data(),
       rows=st.lists(st.lists(probability, max_size=LENGTH_CAP), min_size=1, max_size=4))
def test_a_policys_own_keep_rule_answers_as_its_act_on_the_probe(kind, calibrated, max_length, margin,
                                                                 threshold, costs, data, rows) -> None:
    """``keeps_drafting`` asks each serving kind its own ``keeps`` (the engine asks it for every drafted
    position): the same answer as ``act`` on the probe, ``keeps_drafting``'s definition."""
    params = {"batch-table": {"l1": max_length, "l3": max_length // 2},
              "goodput": {"max_length": max_length},
              "libraspec-batch": {"max_length": max_length, "margin": margin},
              "threshold-batch": {"threshold": threshold, "max_length": max_length}}[kind]
    policy = make_policy(kind, params)
    if calibrated and kind != "batch-table":
        policy.calibration = CALIBRATION
    obs = observation(rows, costs=costs)
    slot = data.draw(st.integers(0, 3))
    confidences = data.draw(st.lists(probability, max_size=LENGTH_CAP - 1))
    by_act = int(policy.act(serve_probe(obs, slot, np.asarray(confidences)))[slot]) > len(confidences)
    assert keeps_drafting(policy, obs, slot, confidences) == by_act
