"""Observation features, length policies and adaptation policies (numpy only, fast)."""

from __future__ import annotations

import numpy as np
import pytest

from policies import InputError, make_policy
from policies.adaptation import FULL, HEAD, SKIP, CostAwareBandit
from policies.calibration import Calibration
from policies.features import (
    ADAPT_FEATURES,
    ADAPT_INDEX,
    LENGTH_CAP,
    LENGTH_DIM,
    LENGTH_SLICES,
    adapt_bounds,
    adapt_feature_names,
    adapt_features,
    length_bounds,
    length_features,
    tree_confidences,
)
from policies.length import LibraSpecLength, LibraSpecParams, expected_tokens, speedup_curve

STEPS = np.linspace(1.0, 2.6, LENGTH_CAP + 1)


# ---------------------------------------------------------------- features

def test_length_features_layout_and_padding():
    conf = np.array([0.9, 0.8, 0.4])
    obs = length_features(conf, 37, STEPS)
    assert obs.shape == (LENGTH_DIM,) == (1 + LENGTH_CAP + LENGTH_CAP + 1,)
    assert obs.dtype == np.float64
    assert obs[LENGTH_SLICES["context_length"]][0] == 37
    np.testing.assert_array_equal(obs[LENGTH_SLICES["confidences"]][:3], conf)
    np.testing.assert_array_equal(obs[LENGTH_SLICES["confidences"]][3:], 0.0)
    np.testing.assert_array_equal(obs[LENGTH_SLICES["step_seconds"]], STEPS)
    np.testing.assert_array_equal(conf, [0.9, 0.8, 0.4])  # pure: the input is untouched
    low, high = length_bounds()
    assert np.all(low <= obs) and np.all(obs <= high)


@pytest.mark.parametrize("conf, ctx, steps", [
    (np.full(LENGTH_CAP + 1, 0.5), 0, STEPS),          # too many confidences
    (np.array([1.2]), 0, STEPS),                        # confidence above 1
    (np.array([[0.5]]), 0, STEPS),                      # not 1-D
    (np.array([np.nan]), 0, STEPS),                     # not finite
    (np.array([0.5]), -1, STEPS),                       # negative context
    (np.array([0.5]), 3.5, STEPS),                      # non-integer context
    (np.array([0.5]), 0, STEPS[:-1]),                   # wrong number of step times
    (np.array([0.5]), 0, np.zeros(LENGTH_CAP + 1)),     # non-positive step times
])
def test_length_features_rejects_bad_inputs(conf, ctx, steps):
    with pytest.raises(InputError):
        length_features(conf, ctx, steps)


def test_adapt_features_layout_and_validation():
    obs = adapt_features(1.0, 0.25, 7.0, 3.2, -0.1, 5, np.array([0.5, 0.25, 0.25]))
    assert obs.shape == (len(ADAPT_FEATURES) + 3,)
    assert adapt_feature_names(3)[len(ADAPT_FEATURES):] == ("share_0", "share_1", "share_2")
    expected = {"head_fill": 1.0, "full_fill": 0.25, "trigger": 7.0, "recent_tau": 3.2,
                "tau_trend": -0.1, "queries_since_update": 5}
    assert {name: obs[i] for name, i in ADAPT_INDEX.items()} == expected
    np.testing.assert_array_equal(obs[len(ADAPT_FEATURES):], [0.5, 0.25, 0.25])
    low, high = adapt_bounds(3)
    assert np.all(low <= obs) and np.all(obs <= high)
    good = dict(head_fill=0.5, full_fill=0.5, trigger=1.0, recent_tau=2.0, tau_trend=0.0,
                queries_since_update=0, domain_shares=np.array([1.0]))
    adapt_features(**{**good, "domain_shares": np.zeros(2)})  # no query seen yet: all shares 0
    for bad in [{"head_fill": 1.5}, {"full_fill": -0.1}, {"trigger": np.nan}, {"recent_tau": -1.0},
                {"queries_since_update": 2.5}, {"queries_since_update": -1},
                {"domain_shares": np.array([0.5, 0.2])}, {"domain_shares": np.ones((1, 1))}]:
        with pytest.raises(InputError):
            adapt_features(**{**good, **bad})


def test_tree_confidences_reproduce_sorted_path_products():
    products = np.array([0.3, 0.9, 0.05, 0.6])
    conf = tree_confidences(products)
    np.testing.assert_allclose(np.cumprod(conf), [0.9, 0.6, 0.3, 0.05])
    assert np.all(conf <= 1.0)


# ---------------------------------------------------------------- length policies

def length_obs(conf, steps=STEPS):
    return length_features(np.asarray(conf, dtype=float), 100, np.asarray(steps, dtype=float))


def test_expected_tokens_and_speedup_curve():
    np.testing.assert_allclose(expected_tokens([0.5, 0.5]), [1.0, 1.5, 1.75])
    np.testing.assert_allclose(speedup_curve([0.5], [1.0, 2.0, 4.0]), [1.0, 0.75, 0.375])


def test_libraspec_stops_where_speedup_peaks_for_affine_and_convex_costs():
    rng = np.random.default_rng(0)
    greedy, exhaustive = make_policy("libraspec"), make_policy("libraspec-exhaustive")
    chosen = set()
    for trial in range(200):
        conf = rng.uniform(0.2, 1.0, rng.integers(1, LENGTH_CAP + 1))
        n = np.arange(LENGTH_CAP + 1)
        steps = rng.uniform(0.5, 2.0) + rng.uniform(0.01, 0.3) * n
        if trial % 2:
            steps = steps + rng.uniform(0.0, 0.01) * n**2
        best = int(np.argmax(speedup_curve(conf, steps)))
        obs = length_obs(conf, steps)
        assert greedy.act(obs) == best == exhaustive.act(obs)
        chosen.add(best)
    assert len(chosen) >= 5  # the stops are spread out, not trivially 0 or the cap


def test_exhaustive_beats_greedy_on_step_shaped_cost():
    conf = np.full(LENGTH_CAP, 0.9)
    steps = np.full(LENGTH_CAP + 1, 2.0)
    steps[0] = 1.0  # a tile boundary: verifying any token costs a whole tile
    obs = length_obs(conf, steps)
    greedy = make_policy("libraspec").act(obs)
    exhaustive = make_policy("libraspec-exhaustive").act(obs)
    curve = speedup_curve(conf, steps)
    assert (greedy, exhaustive) == (0, LENGTH_CAP)
    assert curve[exhaustive] > 1.5 * curve[greedy]


def test_libraspec_respects_max_length():
    obs = length_obs(np.ones(LENGTH_CAP), np.ones(LENGTH_CAP + 1))
    assert make_policy("libraspec", {"max_length": 5}).act(obs) == 5
    assert make_policy("libraspec-exhaustive", {"max_length": 5}).act(obs) == 5


def test_fixed_and_threshold():
    obs = length_obs([0.9, 0.8, 0.5, 0.5])  # path products 0.9, 0.72, 0.36, 0.18
    assert make_policy("fixed", {"length": 7}).act(obs) == 7
    assert make_policy("threshold", {"threshold": 0.3}).act(obs) == 3
    assert make_policy("threshold", {"threshold": 0.72}).act(obs) == 2
    assert make_policy("threshold", {"threshold": 0.95}).act(obs) == 0
    assert make_policy("threshold", {"threshold": 0.0, "max_length": 9}).act(obs) == 9


def test_heuristic_grows_by_two_and_shrinks_by_one_within_bounds():
    policy = make_policy("heuristic", {"initial": 4, "min_length": 2, "max_length": 9})
    obs = length_obs([0.5])
    lengths = []
    for accepted in [4, 6, 8, 9, 3, 1, 0, 0, 0]:
        n = policy.act(obs)
        lengths.append(n)
        policy.observe(obs, n, 0.0, {"accepted": min(accepted, n), "drafted": n})
    assert lengths == [4, 6, 8, 9, 9, 8, 7, 6, 5]
    for _ in range(10):
        policy.observe(obs, policy.act(obs), 0.0, {"accepted": 0, "drafted": 5})
    assert policy.act(obs) == 2
    policy.reset()
    assert policy.act(obs) == 4
    with pytest.raises(InputError, match="accepted"):
        policy.observe(obs, 4, 0.0, {"drafted": 4})


def test_length_policies_reject_wrong_observation_shape():
    with pytest.raises(InputError):
        make_policy("libraspec").act(np.zeros(LENGTH_DIM - 1))


# ---------------------------------------------------------------- adaptation policies

INFO = {"tokens_per_second": 100.0, "tau": 3.0, "query_seconds": 1.0, "update_seconds": 0.0}


def adapt_obs(head=1.0, full=1.0, trigger=10.0):
    return adapt_features(head, full, trigger, 3.0, 0.0, 0, np.array([0.5, 0.5]))


def step(policy, obs, **info):
    """One query: act, then observe (an update's seconds are reported only when one ran)."""
    action = policy.act(obs)
    info = {**INFO, **info}
    if action == SKIP:
        info["update_seconds"] = 0.0
    policy.observe(obs, action, 0.0, info)
    return action


def test_never_and_always():
    obs = adapt_obs()
    assert make_policy("never").act(obs) == SKIP
    assert make_policy("always", {"update": "full"}).act(obs) == FULL
    assert make_policy("always", {"update": "head"}).act(adapt_obs(head=0.0)) == HEAD


@pytest.mark.parametrize("epsilon", [0.0, 0.3])
def test_epsilon_greedy_explores_at_its_rate(epsilon):
    policy = make_policy("epsilon-greedy", {"epsilon": epsilon, "alpha": 0.5}, seed=3)
    policy.estimates[:] = [1.0, 2.0, 4.0]  # greedy choice: FULL
    obs = adapt_obs()
    actions = np.array([policy.act(obs) for _ in range(30_000)])
    # exploration draws uniformly among all three actions, so 2/3 of explorations leave the greedy one
    assert abs(np.mean(actions != FULL) - epsilon * 2 / 3) < 0.012
    again = make_policy("epsilon-greedy", {"epsilon": epsilon, "alpha": 0.5}, seed=3)
    again.estimates[:] = [1.0, 2.0, 4.0]
    assert [again.act(obs) for _ in range(200)] == actions[:200].tolist()


def test_epsilon_greedy_tries_each_action_then_follows_ewma_of_tau():
    policy = make_policy("epsilon-greedy", {"epsilon": 0.0, "alpha": 0.5}, seed=0)
    obs = adapt_obs()
    taus = {SKIP: 3.0, HEAD: 3.5, FULL: 3.2}
    tried = [step(policy, obs, tau=taus[policy.act(obs)], update_seconds=100.0) for _ in range(3)]
    assert tried == [SKIP, HEAD, FULL]  # untried actions first; no cost term despite 100 s updates
    assert step(policy, obs, tau=2.0) == HEAD  # estimate 3.5 -> EWMA 2.75 with alpha 0.5
    np.testing.assert_allclose(policy.estimates, [3.0, 2.75, 3.2])
    assert policy.act(obs) == FULL


def test_bandit_warm_up_skips_and_measures_the_baseline():
    policy = make_policy("cost-aware-bandit", seed=0)
    actions = [step(policy, adapt_obs(), tokens_per_second=50.0 + q, tau=2.0 + 0.1 * q) for q in range(11)]
    assert actions[:10] == [SKIP] * 10
    assert actions[10] != SKIP
    assert policy.baseline_tps == pytest.approx(np.mean(50.0 + np.arange(10)))
    assert policy.baseline_tau == pytest.approx(np.mean(2.0 + 0.1 * np.arange(10)))
    short = make_policy("cost-aware-bandit", {"warmup": 3}, seed=0)
    short_actions = [step(short, adapt_obs()) for _ in range(4)]
    assert short_actions[:3] == [SKIP] * 3 and short_actions[3] != SKIP


def test_bandit_cold_start_cooldown_and_epsilon_decay():
    # every update costs far more than it gains, so once the cold start is over the bandit must skip
    policy = make_policy("cost-aware-bandit", seed=1)
    for _ in range(10):
        step(policy, adapt_obs())
    actions, epsilons = [], []
    for _ in range(60):
        eps = policy.epsilon
        action = step(policy, adapt_obs(), update_seconds=50.0)
        actions.append(action)
        if action != SKIP:
            epsilons.append(eps)
    events = [i for i, a in enumerate(actions) if a != SKIP]
    assert len(events) == 8
    assert np.diff(events).tolist() == [3] * 7  # two cooldown skips after every event
    np.testing.assert_allclose(epsilons, np.linspace(0.30, 0.10, 8))
    assert policy.epsilon == 0.0
    assert policy.gains[HEAD] < 0 and policy.gains[FULL] < 0
    assert {actions[e] for e in events} == {HEAD, FULL}  # unmeasured actions are tried in the cold start


def test_bandit_cooldown_blocks_the_next_two_queries_even_when_worth_it():
    policy = make_policy("cost-aware-bandit", {"warmup": 0, "cold_start_events": 0, "cooldown": 2}, seed=0)
    policy.gains.update({HEAD: 0.2, FULL: 0.1})
    assert [step(policy, adapt_obs()) for _ in range(7)] == [HEAD, SKIP, SKIP, HEAD, SKIP, SKIP, HEAD]


def test_bandit_decision_rule_after_cold_start():
    policy = make_policy("cost-aware-bandit", {"warmup": 0, "cold_start_events": 0}, seed=0)
    policy.gains.update({HEAD: -0.1, FULL: 0.0})
    assert policy.act(adapt_obs()) == SKIP  # both predicted gains <= 0
    policy.gains.update({HEAD: 0.05, FULL: 0.2})
    assert policy.act(adapt_obs()) == FULL  # the larger gain
    assert policy.act(adapt_obs(full=0.99)) == HEAD  # full buffer not saturated yet
    assert policy.act(adapt_obs(head=0.5, full=0.5)) == SKIP  # no buffer saturated


@pytest.mark.parametrize("trigger, measured", [(4.9, False), (5.0, True)])
def test_bandit_gain_is_net_of_cost_and_gated_by_s_min(trigger, measured):
    policy = make_policy("cost-aware-bandit", {"warmup": 2, "window": 4}, seed=0)
    step(policy, adapt_obs(head=0.0, full=0.0))
    step(policy, adapt_obs(head=0.0, full=0.0))  # baseline 100 tokens/s
    action = step(policy, adapt_obs(full=0.0, trigger=trigger), tokens_per_second=150.0, update_seconds=1.0)
    assert action == HEAD
    for _ in range(3):
        step(policy, adapt_obs(head=0.0, full=0.0), tokens_per_second=150.0)
    # 600 tokens over 4 s of queries + 1 s of update = 120 tokens/s, 20% above the 100 tokens/s reference
    if measured:
        assert policy.gains[HEAD] == pytest.approx(0.2)
    else:
        assert np.isnan(policy.gains[HEAD])


def run_window(policy, tau, window=4):
    assert step(policy, adapt_obs(), tau=tau) != SKIP
    for _ in range(window - 1):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=tau)


def test_bandit_reverts_after_three_monotone_drops():
    policy = make_policy("cost-aware-bandit", {"warmup": 2, "window": 4}, seed=0)
    for _ in range(2):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=3.0)
    run_window(policy, 3.1)
    assert policy.checkpoint_good and not policy.should_revert()
    run_window(policy, 3.0)
    run_window(policy, 2.9)
    assert not policy.should_revert() and not policy.checkpoint_good
    run_window(policy, 2.8)
    assert policy.should_revert()
    policy.acknowledge_revert()
    assert not policy.should_revert()


def test_bandit_says_when_the_good_window_measured_the_drafter_before_this_querys_update():
    """A window a new event closes early measured the drafter that served the previous query (the new
    update may be live for this one); a window that fills measured the current drafter."""
    policy = make_policy("cost-aware-bandit", {"warmup": 2, "window": 4, "cooldown": 1}, seed=0)
    for _ in range(2):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=3.0)
    run_window(policy, 3.1, window=2)
    assert not policy.checkpoint_good
    assert step(policy, adapt_obs(), tau=3.1) != SKIP  # the next event closes the window early
    assert policy.checkpoint_good and policy.checkpoint_previous
    for _ in range(3):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=3.2)
    assert policy.checkpoint_good and not policy.checkpoint_previous  # this window filled


def test_bandit_does_not_revert_when_the_fall_is_not_monotone():
    policy = make_policy("cost-aware-bandit", {"warmup": 2, "window": 4}, seed=0)
    for _ in range(2):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=3.0)
    for tau in [2.9, 2.8, 2.85, 2.7, 2.6]:
        run_window(policy, tau)
        assert not policy.should_revert()
    run_window(policy, 2.5)
    assert policy.should_revert()


def test_bandit_is_deterministic_under_a_seed():
    def actions(seed):
        policy = CostAwareBandit(seed=seed)
        rng = np.random.default_rng(7)
        out = []
        for _ in range(120):
            obs = adapt_obs(head=float(rng.random() < 0.5), full=float(rng.random() < 0.5))
            out.append(step(policy, obs, tokens_per_second=float(rng.uniform(80, 120))))
        return out

    assert actions(5) == actions(5)
    assert any(a != SKIP for a in actions(5))


def test_bandit_requires_its_info_keys():
    policy = make_policy("cost-aware-bandit")
    info = dict(INFO)
    del info["update_seconds"]
    with pytest.raises(InputError, match="update_seconds") as raised:
        policy.observe(adapt_obs(), SKIP, 0.0, info)
    assert "cost-aware-bandit" in str(raised.value)


@pytest.mark.parametrize("previous", [[], [2.5], [2.5, 2.25]])
def test_bandit_equal_tau_windows_are_never_drops(previous):
    """A window whose mean tau equals the one it is compared with is not a drop: it marks the drafter good
    and resets the count, however many follow (after the warm-up baseline, or after drops)."""
    policy = make_policy("cost-aware-bandit", {"warmup": 2, "window": 4, "revert_windows": 3,
                                                 "cold_start_events": 100}, seed=0)
    for _ in range(2):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=3.0)
    for tau in previous:  # falls, but fewer than revert_windows in a row
        run_window(policy, tau)
        assert not policy.checkpoint_good and not policy.should_revert()
    level = previous[-1] if previous else 3.0
    for _ in range(4):
        run_window(policy, level)
        assert policy.checkpoint_good and not policy.should_revert()
        assert policy.good_tau == level
    for _ in range(2):
        run_window(policy, level - 0.5)
        run_window(policy, level - 0.5)  # equal to the window before, which was a drop: not a drop
        assert policy.checkpoint_good and not policy.should_revert()


def test_bandit_gain_weighs_throughput_by_query_seconds():
    """Window throughput is tokens over seconds: queries of 0.25 s at 160 tokens/s after a 100 tokens/s
    baseline, with 0.25 s of update, gain 160 * 1 / 1.25 / 100 - 1 = 0.28."""
    policy = make_policy("cost-aware-bandit", {"warmup": 1, "window": 4, "throughput_alpha": 0.0}, seed=0)
    step(policy, adapt_obs(head=0.0, full=0.0), query_seconds=0.25)
    assert step(policy, adapt_obs(full=0.0), tokens_per_second=160.0, query_seconds=0.25,
                update_seconds=0.25) == HEAD
    for _ in range(3):
        step(policy, adapt_obs(head=0.0, full=0.0), tokens_per_second=160.0, query_seconds=0.25)
    assert policy.gains[HEAD] == pytest.approx(0.28)


@pytest.mark.parametrize(("baseline", "seconds", "measured"), [(0.5, 1.0, True), (0.0, 1.0, False),
                                                               (100.0, 0.0, False)])
def test_bandit_gain_needs_time_spent_and_a_reference(baseline, seconds, measured):
    """A window with no seconds, or no reference throughput, has no gain; small positive ones do."""
    policy = make_policy("cost-aware-bandit", {"warmup": 1, "window": 1, "throughput_alpha": 0.0}, seed=0)
    step(policy, adapt_obs(head=0.0, full=0.0), tokens_per_second=baseline)
    assert step(policy, adapt_obs(full=0.0), tokens_per_second=0.75, query_seconds=seconds) == HEAD
    if measured:
        assert policy.gains[HEAD] == pytest.approx(0.75 / baseline - 1.0)
    else:
        assert np.isnan(policy.gains[HEAD])


def test_bandit_after_a_revert_counts_drops_afresh_and_keeps_measuring():
    policy = make_policy("cost-aware-bandit", {"warmup": 2, "window": 4, "cold_start_events": 100}, seed=0)
    for _ in range(2):
        step(policy, adapt_obs(head=0.0, full=0.0), tau=3.0)
    for tau in (2.9, 2.8, 2.7):
        run_window(policy, tau)
    assert policy.should_revert() is True
    policy.acknowledge_revert()
    assert policy.should_revert() is False
    for tau in (2.6, 2.5):  # compared with the last good tau (3.0), then with each other: two drops
        run_window(policy, tau)
        assert policy.should_revert() is False
    run_window(policy, 2.4)
    assert policy.should_revert() is True


def test_bandit_cold_start_tries_an_unmeasured_update_first():
    policy = make_policy("cost-aware-bandit", {"warmup": 0, "epsilon_start": 0.0, "epsilon_end": 0.0}, seed=0)
    policy.gains.update({HEAD: 0.5, FULL: float("nan")})
    assert policy.act(adapt_obs()) == FULL
    policy.gains.update({HEAD: float("nan"), FULL: 0.5})
    assert policy.act(adapt_obs()) == HEAD
    policy.gains.update({HEAD: 0.1, FULL: 0.5})
    assert policy.act(adapt_obs()) == FULL


def test_epsilon_greedy_names_itself_when_tau_is_missing():
    policy = make_policy("epsilon-greedy")
    info = {k: v for k, v in INFO.items() if k != "tau"}
    with pytest.raises(InputError, match="epsilon-greedy"):
        policy.observe(adapt_obs(), SKIP, 0.0, info)


def batch_inputs(rows: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random drafts (zeros past a random drafted length) and step times, with rows built to tie: a path
    confidence exactly at 0.25, a gain exactly equal to its cost, equal speedups at two lengths."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.2, 1.0, (rows, LENGTH_CAP))
    conf[np.arange(LENGTH_CAP) >= rng.integers(0, LENGTH_CAP + 1, rows)[:, None]] = 0.0
    steps = np.cumsum(rng.uniform(0.001, 0.02, (rows, LENGTH_CAP + 1)), axis=1)
    conf[0], steps[0] = 0.5, 1.0  # P_2 = 0.25 exactly; equal T: S(n) grows while P_n > 0
    conf[1], steps[1] = 0.0, 2.0 + np.arange(LENGTH_CAP + 1)  # nothing drafted
    conf[2, 0], conf[2, 1:], steps[2, 0], steps[2, 1:] = 0.5, 0.0, 2.0, 3.0  # gain 0.5 = cost 0.5; S ties
    return conf, steps


@pytest.mark.parametrize(("kind", "params"), [("fixed", {"length": 5}), ("threshold", {}),
                                              ("threshold", {"threshold": 0.25, "max_length": 9}),
                                              ("libraspec", {}), ("libraspec", {"max_length": 7}),
                                              ("libraspec-exhaustive", {}),
                                              ("libraspec-exhaustive", {"max_length": 5})])
def test_batch_choices_equal_the_single_ones(kind, params):
    policy = make_policy(kind, params)
    conf, steps = batch_inputs()
    got = policy.act_batch(conf, steps)
    assert got.dtype == np.int64
    assert got.tolist() == [policy.choose(c, s) for c, s in zip(conf, steps, strict=True)]


def test_hand_worked_choices_on_ties():
    conf, steps = batch_inputs(rows=3)
    assert make_policy("threshold", {"threshold": 0.25}).choose(conf[0], steps[0]) == 2  # 0.25 is enough
    assert make_policy("libraspec").choose(conf[2], steps[2]) == 0  # a gain equal to its cost: stop
    assert make_policy("libraspec-exhaustive").choose(conf[2], steps[2]) == 0  # S(0) = S(1) = 0.5: smallest
    assert make_policy("libraspec-exhaustive").choose(conf[1], steps[1]) == 0


def test_a_calibration_maps_confidences_before_every_choice():
    sure = Calibration((((0.0, 1.0), (1.0, 1.0)),))  # any drafted confidence is certain
    policy = make_policy("libraspec", calibration=sure)
    conf = np.full((1, LENGTH_CAP), 0.05)
    steps = np.full((1, LENGTH_CAP + 1), 1.0) + 0.1 * np.arange(LENGTH_CAP + 1)
    assert make_policy("libraspec").act_batch(conf, steps).tolist() == [0]
    assert policy.act_batch(conf, steps).tolist() == [LENGTH_CAP]
    assert policy.act(length_features(conf[0], 100, steps[0])) == LENGTH_CAP
    assert LibraSpecLength().params == LibraSpecParams()


def test_expected_tokens_and_speedup_curve_refuse_bad_input():
    for bad in ([0.5, 1.5], [-0.1], [[0.5]]):
        with pytest.raises(InputError, match=r"^confidences must be a 1-D array of values in \[0, 1\]"):
            expected_tokens(np.array(bad))
    good = np.array([0.5, 0.5])
    for steps in ([[1.0, 1.0, 1.0]], [], [1.0, 0.0, 1.0], [1.0, 1.0]):
        with pytest.raises(InputError, match=r"^step_seconds must be a 1-D array of positive times"):
            speedup_curve(good, np.array(steps))
    assert speedup_curve(good, np.array([1.0, 2.0, 4.0])).tolist() == pytest.approx([1.0, 0.75, 1.75 / 4])
    assert speedup_curve(np.array([]), np.array([2.0])).tolist() == [0.5]  # nothing drafted: T(0) alone


def test_heuristic_bounds_may_equal_the_initial_length_and_missing_info_names_it():
    policy = make_policy("heuristic", {"initial": 3, "min_length": 3, "max_length": 3})
    assert policy.act(length_obs(np.zeros(LENGTH_CAP))) == 3
    with pytest.raises(InputError, match=r"min_length=1, initial=5, max_length=4 are invalid: use min_length "
                                         r"<= initial <= max_length"):
        make_policy("heuristic", {"initial": 5, "max_length": 4})
    for missing in ("accepted", "drafted"):
        info = {"accepted": 1, "drafted": 1}
        del info[missing]
        with pytest.raises(InputError, match=missing) as raised:
            policy.observe(length_obs(np.zeros(LENGTH_CAP)), 3, 0.0, info)
        assert "heuristic" in str(raised.value)


def test_bandit_starts_clean_and_a_warm_up_without_seconds_takes_the_reported_throughput():
    policy = make_policy("cost-aware-bandit", {"warmup": 2}, seed=0)
    assert policy.should_revert() is False and policy.checkpoint_good is False
    assert np.isnan(policy.baseline_tps) and np.isnan(policy.baseline_tau)
    step(policy, adapt_obs(), tokens_per_second=80.0, query_seconds=0.0)
    assert policy.checkpoint_good is False
    step(policy, adapt_obs(), tokens_per_second=90.0, query_seconds=0.0)
    assert policy.baseline_tps == 90.0  # no seconds to weigh by: the last reported throughput
