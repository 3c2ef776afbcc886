"""The Gymnasium environments: the checker, seeding, the vector forms against the single ones, the rules."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import simulator  # noqa: F401  (registers the environments)
from core.cost_profile import load_profile
from core.errors import InputError
from core.paths import PAPER_PROFILE
from policies.adaptation import ADAPT_INFO_KEYS
from policies.features import ADAPT_INDEX, LENGTH_CAP, adapt_features, length_features
from simulator.adapt_stream import AdaptStreamEnv, AdaptStreamVectorEnv, _push, default_phases
from simulator.adaptation import AdaptationDynamics, level_rates
from simulator.parametric import default_acceptance, synthetic_traces
from simulator.replay import resolve_acceptance
from simulator.rollout import serve_query
from simulator.spec_length import SpecLengthEnv, SpecLengthVectorEnv
from simulator.traces import save_traces

SHORT = {"tokens_per_query": 48}
STREAM = {"phases": ((6, {"code": 1.0}), (10, None)), "tokens_per_query": 64}


def actions(step: int) -> int:
    return (3 * step + 1) % (LENGTH_CAP + 1)


@pytest.mark.filterwarnings("ignore:.*Box observation space.*infinity")
@pytest.mark.parametrize("name", ["specblock/SpecLength-v0", "specblock/AdaptStream-v0"])
def test_environments_pass_the_gymnasium_checker(name):
    check_env(gym.make(name).unwrapped, skip_render_check=True)


def rollout(env: gym.Env, seed: int, policy=actions) -> tuple[list, list]:
    obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], []
    for step in range(10_000):
        obs, reward, terminated, truncated, _ = env.step(policy(step))
        observations.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            return observations, rewards
    raise AssertionError("episode did not end")


@pytest.mark.parametrize(("cls", "kwargs", "policy"), [(SpecLengthEnv, SHORT, actions),
                                                       (AdaptStreamEnv, STREAM, lambda s: s % 3)])
def test_rollouts_are_deterministic_under_a_seed(cls, kwargs, policy):
    first, second, other = (rollout(cls(**kwargs), seed, policy) for seed in (4, 4, 5))
    np.testing.assert_array_equal(np.array(first[0]), np.array(second[0]))
    assert first[1] == second[1]
    assert first[1] != other[1]


def test_speclength_return_is_minus_latency_and_tokens_add_up():
    """The return is minus the query's seconds as the profile prices each step's context and length."""
    profile = load_profile(PAPER_PROFILE)
    env = SpecLengthEnv(profile, **SHORT)
    obs, _ = env.reset(seed=2)
    context = int(obs[0])
    total, tokens, seconds, forwards = 0.0, 0, 0.0, 0
    terminated = False
    while not terminated:
        _, reward, terminated, _, info = env.step(8)
        n = min(8, info["available"])
        assert info["drafted"] == n
        seconds += float(profile.step_seconds("specblock", [n], context)[0] + profile.steering_seconds(n))
        total += reward
        context += info["tokens"]
        tokens += info["tokens"]
        forwards += 1
        assert 0 <= info["accepted"] <= n and info["tokens"] <= info["accepted"] + 1
    assert tokens == SHORT["tokens_per_query"] and total == pytest.approx(-seconds, rel=1e-12)
    assert forwards < tokens  # speculation emits more than one token per target forward on average


def test_vanilla_action_emits_one_token_at_the_vanilla_cost():
    profile = load_profile(PAPER_PROFILE)
    env = SpecLengthEnv(profile, **SHORT)
    obs, _ = env.reset(seed=0)
    context = int(obs[0])
    _, reward, _, _, info = env.step(0)
    assert (info["tokens"], info["accepted"], info["drafted"]) == (1, 0, 0)
    assert reward == pytest.approx(-profile.vanilla_seconds(context), rel=1e-12)
    assert obs[17] == pytest.approx(profile.vanilla_seconds(context), rel=1e-12)


def test_step_before_reset_and_invalid_actions_are_refused():
    env = SpecLengthEnv(**SHORT)
    with pytest.raises(AssertionError, match="reset"):
        env.step(1)
    env.reset(seed=0)
    with pytest.raises(AssertionError, match="invalid"):
        env.step(LENGTH_CAP + 1)


def test_vector_speclength_with_one_slot_replays_the_single_env_exactly():
    single, vector = SpecLengthEnv(**SHORT), SpecLengthVectorEnv(1, **SHORT)
    expected = []
    obs, _ = single.reset(seed=9)
    expected.append(obs)
    step = 0
    for _ in range(3):
        terminated = False
        while not terminated:
            obs, reward, terminated, _, _ = single.step(actions(step))
            expected.append(reward)
            step += 1
        obs, _ = single.reset()
        expected.append(obs)
    got = []
    obs, _ = vector.reset(seed=9)
    got.append(obs[0])
    step = 0
    while len(got) < len(expected):
        obs, reward, terminated, _, _ = vector.step(np.array([actions(step)]))
        step += 1
        got.append(float(reward[0]))
        if terminated[0]:
            obs, reward, _, _, _ = vector.step(np.array([0]))  # next-step autoreset: the new episode
            assert reward[0] == 0.0
            got.append(obs[0])
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_vector_speclength_matches_the_single_env_in_distribution():
    queries = 48
    single = SpecLengthEnv(**SHORT)
    single_returns = [sum(rollout(single, seed, lambda s: 6)[1]) for seed in range(queries)]
    vector = SpecLengthVectorEnv(queries, **SHORT)
    vector.reset(seed=1000)
    returns, alive = np.zeros(queries), np.ones(queries, dtype=bool)
    while alive.any():
        _, reward, terminated, _, _ = vector.step(np.full(queries, 6))
        returns += reward * alive
        alive &= ~terminated
    spread = np.sqrt(np.var(single_returns) / queries + np.var(returns) / queries)
    assert abs(np.mean(single_returns) - returns.mean()) < 4 * spread


def test_vector_observations_are_the_length_features_of_each_slot():
    env = SpecLengthVectorEnv(5, **SHORT)
    obs, _ = env.reset(seed=3)
    obs, *_ = env.step(np.arange(5))
    batch = env.batch
    for i in range(5):
        expected = length_features(batch.draws.confidences[i], int(batch.context[i]), batch.step_seconds[i])
        np.testing.assert_array_equal(obs[i], expected)


def test_vector_adaptstream_observations_are_the_adapt_features_of_each_slot():
    env = AdaptStreamVectorEnv(4, **STREAM)
    env.reset(seed=3)
    for step in range(4):
        obs, *_ = env.step(np.array([0, 1, 2, step % 3]))
    s = env.batch.state
    head_fill, full_fill = env.batch.fills()
    for i in range(4):
        expected = adapt_features(head_fill[i], full_fill[i], s["trigger"][i], s["recent"][i],
                                  s["recent"][i] - s["long"][i], int(s["since"][i]), s["shares"][i])
        np.testing.assert_array_equal(obs[i], expected)


def test_make_vec_uses_the_numpy_vector_envs():
    envs = gym.make_vec("specblock/SpecLength-v0", num_envs=3, vectorization_mode="vector_entry_point")
    assert isinstance(envs.unwrapped, SpecLengthVectorEnv)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 34)
    envs = gym.make_vec("specblock/AdaptStream-v0", num_envs=2, vectorization_mode="vector_entry_point")
    assert isinstance(envs.unwrapped, AdaptStreamVectorEnv)


def test_replaying_a_trace_file(tmp_path):
    traces = synthetic_traces(default_acceptance(), queries=8, iterations=20, seed=0)
    env = gym.make("specblock/SpecLength-v0", acceptance=save_traces(traces, tmp_path / "t.pq"), **SHORT)
    _, rewards = rollout(env, 0)
    assert len(rewards) >= 2 and all(r < 0 for r in rewards)


def test_adaptstream_info_carries_what_adaptation_policies_read():
    env = AdaptStreamEnv(**STREAM)
    obs, _ = env.reset(seed=0)
    assert not obs.any()
    obs, reward, _, _, info = env.step(0)
    assert set(ADAPT_INFO_KEYS) <= set(info)
    assert info["update_seconds"] == 0.0 and reward == pytest.approx(-info["query_seconds"])
    assert info["tokens_per_second"] == pytest.approx(STREAM["tokens_per_query"] / info["query_seconds"])
    fill = obs[1]  # the full buffer's fill: the profile times a full buffer, a partial one costs its share
    assert 0 < fill < 1
    obs, reward, _, _, info = env.step(2)
    full = load_profile(PAPER_PROFILE).update_seconds("full") * fill
    assert info["updated"] and info["update_seconds"] == pytest.approx(full)
    assert reward == pytest.approx(-(info["query_seconds"] + full))


def test_adaptstream_charges_an_update_per_buffered_query_window(tmp_path):
    data = {**load_profile(PAPER_PROFILE).to_json(), "fits": None, "update_windows": {"head": 4, "full": 16}}
    (tmp_path / "p.json").write_text(json.dumps(data))
    env = AdaptStreamEnv(**{**STREAM, "profile": tmp_path / "p.json"})
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    windows = env.unwrapped.batch.state["head_windows"][0]
    assert 0 < windows <= 3  # one per query that buffered a rejection, fewer once the oldest are evicted
    _, _, _, _, info = env.step(1)
    assert info["update_seconds"] == pytest.approx(data["samples"]["update"]["head"][0] / 4 * windows)
    state = env.unwrapped.batch.state
    assert state["head_windows"][0] == (1 if state["head"][0].sum() else 0)  # the update emptied the buffer


def test_adaptstream_charges_each_query_its_prompt_prefill(tmp_path):
    data = {**load_profile(PAPER_PROFILE).to_json(), "fits": None}
    data["samples"] = {**data["samples"], "prefill": [{"tokens": 1, "seconds": [0.5]},
                                                      {"tokens": 4096, "seconds": [0.5]}]}
    (tmp_path / "p.json").write_text(json.dumps(data))
    plain, started = AdaptStreamEnv(**STREAM), AdaptStreamEnv(**{**STREAM, "profile": tmp_path / "p.json"})
    plain.reset(seed=3)
    started.reset(seed=3)
    for _ in range(3):
        a, b = plain.step(0)[4], started.step(0)[4]
        assert b["query_seconds"] == pytest.approx(a["query_seconds"] + 0.5) and b["tau"] == a["tau"]


def test_updates_move_the_drafting_time_as_the_dynamics_say():
    def after_update(head_draft: float) -> tuple[dict, AdaptStreamEnv]:
        dynamics = AdaptationDynamics(head_draft=head_draft, harm_probability=0.0)
        env = AdaptStreamEnv(**STREAM, dynamics=dynamics)
        env.reset(seed=1)
        env.step(0)
        fill = env.unwrapped.batch.fills()[0][0]
        info = env.step(1)[4]
        return {**info, "fill": fill}, env

    same, _ = after_update(1.0)
    slower, env = after_update(3.0)
    batch = env.unwrapped.batch
    assert slower["tau"] == same["tau"] and 0 < slower["fill"] < 1
    assert batch.state["draft"][0] == pytest.approx(1 + 2 * slower["fill"])  # moved by fill of the gap
    domain = batch.model.domains.index(slower["domain"])
    extra = (STREAM["tokens_per_query"] / slower["tau"]) * 2 * slower["fill"] * (
        batch.drafting * batch.verified[domain]).sum()
    assert slower["query_seconds"] - same["query_seconds"] == pytest.approx(extra)
    env.unwrapped.revert()  # to the drafter as profiled (never checkpointed)
    assert batch.state["draft"][0] == 1.0


def late_tau(env: AdaptStreamEnv, update: bool, seed: int) -> float:
    """Mean tau of the last 20 queries; with ``update``, train the full drafter when its buffer is full."""
    obs, _ = env.reset(seed=seed)
    taus, terminated = [], False
    while not terminated:
        obs, _, terminated, _, info = env.step(2 if update and obs[1] >= 1.0 else 0)
        taus.append(info["tau"])
    return float(np.mean(taus[-20:]))


def test_updates_raise_acceptance_and_revert_restores_the_drafter():
    kwargs = {"phases": ((80, None),)}
    skip = np.mean([late_tau(AdaptStreamEnv(**kwargs), False, seed) for seed in range(4)])
    full = np.mean([late_tau(AdaptStreamEnv(**kwargs), True, seed) for seed in range(4)])
    assert full > skip + 0.1
    env = AdaptStreamEnv(**kwargs)
    env.reset(seed=0)
    env.checkpoint()
    for _ in range(5):
        env.step(2)
    assert np.all(env.batch.state["level"] < 1.0)
    env.revert()
    np.testing.assert_array_equal(env.batch.state["level"], 1.0)


def test_vector_adaptstream_with_one_slot_replays_the_single_env_exactly():
    single, vector = AdaptStreamEnv(**STREAM), AdaptStreamVectorEnv(1, **STREAM)
    single.reset(seed=2)
    vector.reset(seed=2)
    for _ in range(2):
        terminated, step = False, 0
        while not terminated:
            obs, reward, terminated, _, info = single.step(step % 3)
            vobs, vreward, vterminated, _, vinfo = vector.step(np.array([step % 3]))
            np.testing.assert_array_equal(vobs[0], obs)
            assert (vreward[0], bool(vterminated[0]), vinfo["tau"][0]) == (reward, terminated, info["tau"])
            step += 1
        single.reset()
        vobs, vreward, *_ = vector.step(np.array([1]))
        assert vreward[0] == 0.0 and not vobs.any()


@pytest.mark.parametrize(("draft_length", "shape", "replay"), [(4, None, False), (8, None, False),
                                                                (8, {"starts": 1, "blocks": 1}, False),
                                                                (6, None, True)])
def test_adapt_stream_query_seconds_follow_the_profile_and_the_acceptance_model(draft_length, shape, replay,
                                                                                 tmp_path):
    """With no query noise and no update, a query's seconds are its iterations (tokens over 1 + the
    expected accepted length, rounded up) times the mean step the verified-length shares weigh, at the
    query's middle context (a tree drafted whole however much of it is verified), plus its prefill;
    computed here from the profile and the acceptance model (parametric, or a trace replay)."""
    profile, model = load_profile(PAPER_PROFILE), default_acceptance()
    if replay:
        traces = synthetic_traces(model, queries=8, iterations=30, seed=1)
        model = resolve_acceptance(save_traces(traces, tmp_path / "t.pq"))
    domain = model.domains[1]
    env = AdaptStreamEnv(profile, model, draft_length=draft_length, tokens_per_query=100,
                         prompt_tokens=(300, 300), phases=((3, {domain: 1.0}),),
                         dynamics=AdaptationDynamics(query_noise=0.0), draft_shape=shape)
    env.reset(seed=0)
    d = model.domains.index(domain)
    accepted = float(level_rates(model.survival(draft_length)[d], np.array(1.0)))
    iterations = np.ceil(100 / (1.0 + accepted))
    steps = profile.step_seconds("specblock", range(draft_length + 1), 300 + 50, shape)
    if shape is not None:  # nothing verified still drafted the whole tree
        steps[0] += profile.draft_seconds("specblock", **shape)
    mean_step = float(steps @ model.verified_shares(draft_length)[d])
    seconds = iterations * mean_step + float(profile.prefill_cost(300))
    for _ in range(3):
        _, reward, _, _, info = env.step(0)
        assert info["domain"] == domain and info["update_seconds"] == 0.0 and not info["updated"]
        assert info["query_seconds"] == pytest.approx(seconds, rel=1e-9)
        assert reward == pytest.approx(-seconds, rel=1e-9)
        assert info["tau"] == pytest.approx(100 / iterations, rel=1e-12)
        assert info["tokens_per_second"] == pytest.approx(100 / seconds, rel=1e-9)


def test_adapt_stream_query_noise_is_log_normal_with_mean_one():
    """Each query's tau is its expectation times exp(sigma Z - sigma^2 / 2), clipped to [1, 1 + L]: the
    mean over 20,000 streams matches that law's mean, integrated here over Z (within 4 standard errors)."""
    profile, model = load_profile(PAPER_PROFILE), default_acceptance()
    sigma, streams, domain = 0.5, 20_000, model.domains[1]
    env = AdaptStreamVectorEnv(streams, profile, model, draft_length=8, tokens_per_query=100_000,
                               prompt_tokens=(300, 300), phases=((2, {domain: 1.0}),),
                               dynamics=AdaptationDynamics(query_noise=sigma))
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.zeros(streams, dtype=np.int64))
    accepted = float(level_rates(model.survival(8)[model.domains.index(domain)], np.array(1.0)))
    z = np.linspace(-9.0, 9.0, 400_001)
    law = np.clip((1.0 + accepted) * np.exp(sigma * z - sigma**2 / 2), 1.0, 9.0)
    expected = np.trapezoid(law * np.exp(-z**2 / 2) / np.sqrt(2 * np.pi), z)
    tau = info["tau"]
    assert abs(tau.mean() - expected) < 4 * tau.std() / np.sqrt(streams)
    assert 1.0 <= tau.min() < 2.0 and tau.max() <= 9.0 and tau.std() > 0.5  # the clip bounds only the tails


def test_push_keeps_the_newest_positions_and_their_share_of_windows():
    """``_push`` by hand: the oldest positions leave past capacity, windows leave with them."""
    rows, domain = np.arange(1), np.array([0])
    buffer, windows = _push(np.array([[3.0, 1.0]]), np.array([2.0]), rows, domain, np.array([2]), 5.0)
    np.testing.assert_allclose(buffer, [[3.0 * 0.75 + 2.0, 0.75]])  # keep 3 of the 4 held, add 2
    np.testing.assert_allclose(windows, [2.0 * 0.75 + 1.0])
    same, kept = _push(buffer, windows, rows, domain, np.array([0]), 5.0)  # nothing rejected: no window
    np.testing.assert_allclose(same, buffer)
    np.testing.assert_allclose(kept, windows)
    full, one = _push(buffer, windows, rows, np.array([1]), np.array([7]), 5.0)  # more than it holds
    np.testing.assert_allclose(full, [[0.0, 5.0]])
    np.testing.assert_allclose(one, [1.0])
    empty, first = _push(np.zeros((2, 2)), np.zeros(2), np.arange(2), np.array([1, 0]), np.array([3, 1]), 5.0)
    np.testing.assert_allclose(empty, [[0.0, 3.0], [1.0, 0.0]])
    np.testing.assert_allclose(first, [1.0, 1.0])
    rows = np.arange(2)  # two streams, each kept by its own total (one below a position)
    two, kept = _push(np.array([[0.25, 0.25], [4.0, 2.0]]), np.array([1.0, 3.0]), rows, np.array([0, 1]),
                      np.array([1, 2]), 3.0)
    np.testing.assert_allclose(two, [[1.25, 0.25], [4.0 / 6.0, 2.0 / 6.0 + 2.0]])
    np.testing.assert_allclose(kept, [2.0, 3.0 / 6.0 + 1.0])


def test_default_phases_and_stream_arguments_are_checked():
    assert default_phases(("a", "b"), 2000) == ((500, {"a": 1.0}), (1500, None))
    assert default_phases(("a", "b"), 9) == ((2, {"a": 1.0}), (7, None))
    assert default_phases(("a", "b"), 4) == ((1, {"a": 1.0}), (3, None))
    assert default_phases(("a", "b"), 1) == ((1, None),)
    assert AdaptStreamEnv(draft_length=1, phases=((1, None),)).batch.queries == 1
    env = AdaptStreamEnv()
    assert env.batch.queries == 2000 and env.action_space.n == 3
    with pytest.raises(AssertionError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(AssertionError, match="invalid"):
        env.step(3)
    env.revert()  # the last good drafter of a new stream is the drafter as profiled
    assert env.batch.state["level"][0].tolist() == [1.0] * len(env.batch.model.domains)
    assert AdaptStreamEnv(draft_length=LENGTH_CAP).batch.draft_length == LENGTH_CAP
    for bad in (0, LENGTH_CAP + 1):
        with pytest.raises(InputError, match=f"draft_length = {bad} is invalid: use 1..{LENGTH_CAP}"):
            AdaptStreamEnv(draft_length=bad)
    for length in (0, True, 1.5):
        with pytest.raises(InputError, match=f"phase length {length!r} is invalid"):
            AdaptStreamEnv(phases=((length, None),))


def test_adapt_stream_state_follows_its_queries_and_updates():
    """Counters, EWMAs, buffers and the updates' resets, from what each step reports."""
    model = default_acceptance()
    domain, last = model.domains[0], model.domains[2]
    env = AdaptStreamEnv(load_profile(PAPER_PROFILE), model, tokens_per_query=256, prompt_tokens=(300, 300),
                         phases=((7, {domain: 1.0}), (1, {last: 1.0})),
                         dynamics=AdaptationDynamics(query_noise=0.0))
    obs, _ = env.reset(seed=3)
    obs, _, _, _, info = env.step(1)  # a head update with nothing buffered does not run
    assert not info["updated"] and info["update_seconds"] == 0.0
    recent = long = info["tau"]
    for step in range(2, 5):
        obs, _, terminated, _, info = env.step(0)
        recent, long = 0.7 * recent + 0.3 * info["tau"], 0.95 * long + 0.05 * info["tau"]
        assert obs[ADAPT_INDEX["recent_tau"]] == pytest.approx(recent)
        assert obs[ADAPT_INDEX["tau_trend"]] == pytest.approx(recent - long)
        assert obs[ADAPT_INDEX["queries_since_update"]] == step
        held = obs[ADAPT_INDEX["head_fill"]] * 128
        assert held == pytest.approx(min(obs[ADAPT_INDEX["trigger"]], 128))  # every rejection is buffered
        assert env.batch.state["head"].sum() <= 128 + 1e-9
        assert obs[ADAPT_INDEX["full_fill"]] * 1024 == pytest.approx(obs[ADAPT_INDEX["trigger"]])
        assert not terminated
    onehot = np.eye(len(model.domains))[model.domains.index(domain)]
    np.testing.assert_allclose(obs[len(ADAPT_INDEX):], onehot)
    trigger = obs[ADAPT_INDEX["trigger"]]
    assert 0 < trigger <= 4 * 256 / info["tau"]  # at most one buffered position per iteration
    env.checkpoint()
    fill, windows = obs[ADAPT_INDEX["head_fill"]], env.batch.state["head_windows"][0]
    obs, _, _, _, info = env.step(1)  # a head update on what the head buffer holds
    assert info["updated"]
    cost = load_profile(PAPER_PROFILE).update_cost("head", fill, windows)
    assert info["update_seconds"] == pytest.approx(cost)
    assert obs[ADAPT_INDEX["queries_since_update"]] == 1
    rejected = obs[ADAPT_INDEX["trigger"]]  # restarted: this query's rejections only, all in the head buffer
    assert obs[ADAPT_INDEX["head_fill"]] * 128 == pytest.approx(min(rejected, 128))
    assert obs[ADAPT_INDEX["full_fill"]] * 1024 == pytest.approx(trigger + rejected)  # the full one kept
    level = env.batch.state["level"][0].copy()
    assert not np.array_equal(level, np.ones(len(model.domains)))  # the update moved acceptance
    obs, _, _, _, info = env.step(2)  # a full update empties both buffers
    assert info["updated"]
    rejected = obs[ADAPT_INDEX["trigger"]]
    assert obs[ADAPT_INDEX["full_fill"]] * 1024 == pytest.approx(rejected)
    env.revert()  # back to the checkpoint, taken before either update
    assert env.batch.state["level"][0].tolist() == [1.0] * len(model.domains)
    assert env.batch.state["draft"][0] == 1.0
    _, _, terminated, _, info = env.step(0)
    assert not terminated and info["domain"] == domain
    _, _, terminated, _, info = env.step(0)
    assert terminated and info["domain"] == last  # the eighth query comes from the last phase


def test_adapt_stream_slots_draw_their_own_prompts():
    env = AdaptStreamVectorEnv(8, load_profile(PAPER_PROFILE), default_acceptance(), tokens_per_query=64,
                               prompt_tokens=(0, 3000), phases=((2, {default_acceptance().domains[0]: 1.0}),),
                               dynamics=AdaptationDynamics(query_noise=0.0))
    env.reset(seed=0)
    info = env.step(np.zeros(8, dtype=np.int64))[4]
    assert len(set(info["query_seconds"].round(12).tolist())) > 4


class _ClosesEarly:
    """An adaptation agent that updates at its second query and then, as the bandit does when that
    update closes its open window early, checkpoints the drafter from before the update."""

    def __init__(self) -> None:
        self.queries = 0
        self.checkpoint_good = self.checkpoint_previous = False

    def act(self, _obs: np.ndarray) -> int:
        return 2 if self.queries == 1 else 0

    def observe(self, _obs: np.ndarray, action: int, _reward: float, _info: dict) -> None:
        self.queries += 1
        self.checkpoint_good = self.checkpoint_previous = action == 2

    def should_revert(self) -> bool:
        return self.queries == 3

    def acknowledge_revert(self) -> None:
        self.queries += 1


def test_a_window_closed_early_checkpoints_the_drafter_it_measured():
    env = AdaptStreamEnv(**STREAM, dynamics=AdaptationDynamics(headroom=0.5, full_rate=1.0,
                                                               harm_probability=0.0))
    agent = _ClosesEarly()
    obs, _ = env.reset(seed=0)
    state = env.unwrapped.batch.state
    for _ in range(2):
        obs, _, _ = serve_query(agent, env, obs)
    assert (state["level"][0] < 1.0).any()  # the full update moved the drafter
    assert (state["good"][0] == 1.0).all()  # but the window measured the one before it
    serve_query(agent, env, obs)  # the policy reverts: the drafter it measured comes back
    assert (state["level"][0] == 1.0).all()


def test_an_overlapped_update_trains_beside_queries_and_goes_live_after_it_ends():
    dynamics = AdaptationDynamics(headroom=0.5, full_rate=1.0, harm_probability=0.0)
    runs = {}
    for slowdown in (1.0, 2.0):
        env = AdaptStreamEnv(**STREAM, dynamics=dynamics, overlap=True, overlap_slowdown=slowdown)
        env.reset(seed=4)
        state = env.unwrapped.batch.state
        steps = [env.step(0)[4], env.step(2)[4]]  # buffer one query, then start a full update
        levels = [state["level"][0].copy()]
        while state["busy"][0] > 0:
            steps.append(env.step(2)[4])  # refused while the update trains
            levels.append(state["level"][0].copy())
        steps.append(env.step(0)[4])  # the update ended during the last query: live from this one
        levels.append(state["level"][0].copy())
        runs[slowdown] = steps, levels
    steps, levels = runs[1.0]
    start = steps[1]
    assert start["updated"] and start["update_seconds"] == 0.0 and start["train_seconds"] > 0
    assert not any(info["updated"] for info in steps[2:])
    assert all((level == 1.0).all() for level in levels[:-1]) and (levels[-1] < 1.0).any()
    assert sum(info["query_seconds"] for info in steps[1:-1]) >= start["train_seconds"]
    # beside the update, a query runs overlap_slowdown times slower, for as long as the update trains
    plain, slow = start["query_seconds"], runs[2.0][0][1]["query_seconds"]
    beside = min(start["train_seconds"], 2.0 * plain)
    assert slow == pytest.approx(beside + plain - beside / 2.0)
    with pytest.raises(InputError, match="overlap_slowdown"):
        AdaptStreamEnv(**STREAM, overlap=True, overlap_slowdown=0.5)


def test_a_query_beside_training_slows_by_the_training_updates_kind():
    def started(action: int, slowdown: object) -> float:
        env = AdaptStreamEnv(**STREAM, dynamics=AdaptationDynamics(harm_probability=0.0), overlap=True,
                             overlap_slowdown=slowdown)
        env.reset(seed=4)
        env.step(0)  # buffer one query
        return env.step(action)[4]["query_seconds"]  # the query served beside the update it started

    for action, kind in ((1, "head"), (2, "full")):
        plain = started(action, 1.0)
        assert started(action, {"head": 1.0, "full": 1.0}) == pytest.approx(plain)
        assert started(action, {kind: 2.0, "full" if kind == "head" else "head": 1.0}) > plain
        assert started(action, {kind: 1.0, "full" if kind == "head" else "head": 2.0}) == pytest.approx(plain)
    for bad in ({"head": 1.5}, {"head": 1.5, "full": 0.9}, {"head": True, "full": 1.0}):
        with pytest.raises(InputError, match="overlap_slowdown"):
            AdaptStreamEnv(**STREAM, overlap=True, overlap_slowdown=bad)


def test_head_share_routes_each_rejected_position_to_one_buffer():
    def buffered(head_share: float | None) -> tuple[float, float, float]:
        env = AdaptStreamEnv(**STREAM, dynamics=AdaptationDynamics(head_share=head_share))
        env.reset(seed=2)
        state = env.unwrapped.batch.state
        for _ in range(4):
            env.step(0)
        return state["head"][0].sum(), state["full"][0].sum(), state["trigger"][0]

    head, full, trigger = buffered(None)
    assert head == full == trigger > 0  # every position in both buffers
    head, full, trigger = buffered(0.3)
    assert head + full == trigger and 0 < head < full
    assert buffered(1.0)[1] == 0 and buffered(0.0)[0] == 0
