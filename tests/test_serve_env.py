"""``specblock/SpecServe-v0``: speculative decoding under continuous batching, single and vector forms."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import simulator  # noqa: F401  (registers the environments)
from core.cost_profile import CostProfile, profile_from_json, resolve_profile
from core.errors import InputError
from core.serve_costs import (
    backlog_seconds,
    batch_verify_seconds,
    chain_fit,
    chains_fit,
    drafting_seconds,
    drafting_table,
    iteration_costs,
)
from policies.features import LENGTH_CAP, serve_features, serve_slots
from simulator.spec_serve import Arrivals, ServeBatch, SpecServeEnv

SMALL = {"rate": 8.0, "requests": 6, "max_batch": 3, "prompt_tokens": (16, 64), "output_tokens": (8, 24)}


def serve(env: gym.Env, length: int, seed: int = 0) -> list[dict]:
    """One episode with every request verifying ``length`` positions; the infos of its steps."""
    obs, _ = env.reset(seed=seed)
    infos, done = [], False
    while not done:
        obs, reward, done, truncated, info = env.step(np.full(SMALL["max_batch"], length))
        assert not truncated and reward >= 0 and obs.shape == env.observation_space.shape
        infos.append(info)
    return infos


def test_the_checkers_of_gymnasium_and_stable_baselines3_pass() -> None:
    check_env(SpecServeEnv(**SMALL), skip_render_check=True)
    sb3_check_env(SpecServeEnv(**SMALL), warn=False)


@pytest.mark.parametrize("length", [0, 3, LENGTH_CAP])
def test_every_request_completes_with_its_tokens(length: int) -> None:
    """Tokens emitted add up to the requests' outputs; the batch never exceeds its cap; every request
    gets a first token after it arrived and a positive time per output token."""
    env = SpecServeEnv(**SMALL)
    infos = serve(env, length)
    batch = env.batch
    assert sum(i["tokens"] for i in infos) == int(batch.output[0].sum())
    assert max(i["running"] for i in infos) <= SMALL["max_batch"]
    ttft = [t for i in infos for t in i["ttft"]]
    tpot = [t for i in infos for t in i["tpot"]]
    assert len(ttft) == len(tpot) == SMALL["requests"] and min(ttft) > 0 and min(tpot) > 0
    assert np.all(batch.first[0] >= batch.arrival[0]) and np.all(batch.finish[0] >= batch.first[0])
    if length == 0:  # plain decoding: one token per request and iteration
        assert all(i["tokens"] == i["running"] and i["accepted"] == 0 for i in infos)


def test_an_iteration_costs_drafting_and_one_batched_verify() -> None:
    """Seconds of a step: each request's chain drafting plus the batched verify at the mean nodes and
    context (a profile without batched samples: one forward over all nodes at the summed context)."""
    env = SpecServeEnv(**SMALL)
    env.reset(seed=3)
    batch, profile = env.batch, resolve_profile(None)
    active = batch.active[0]
    action = np.array([2, 5, 1])
    n = np.minimum(action, batch.drafted[0])[active]
    contexts = batch.context[0][active]
    drafting = profile.draft_row("specblock", LENGTH_CAP)[n].sum()  # SpecBlock drafts request by request
    expected = drafting + profile.verify_seconds((n + 1).sum(), contexts.sum())
    _, _, _, _, info = env.step(action)
    assert info["iteration_seconds"] == pytest.approx(float(expected))
    assert batch_verify_seconds(profile, np.array([0]), np.array([1.0]), np.array([10.0]))[0] == 0.0


def test_the_observation_is_the_shared_serving_features() -> None:
    env = SpecServeEnv(**SMALL)
    obs, _ = env.reset(seed=1)
    slots = serve_slots(obs)
    assert slots.shape == (SMALL["max_batch"], 3 + LENGTH_CAP)
    costs = tuple(obs[3:7])
    assert np.array_equal(obs, serve_features(int(obs[0]), int(obs[1]), costs, slots))
    assert costs[0] > 0 and costs[1] > 0 and costs[2] > 0 and costs[3] >= 0
    assert obs[0] == env.batch.active[0].sum() and np.all(slots[~env.batch.active[0]] == 0)
    with pytest.raises(InputError, match="serve_features"):
        serve_slots(obs[:-1])


def test_the_vector_form_with_one_server_draws_as_the_single_env() -> None:
    single = SpecServeEnv(**SMALL)
    vector = gym.make_vec("specblock/SpecServe-v0", num_envs=1, vectorization_mode="vector_entry_point",
                          **SMALL)
    a, _ = single.reset(seed=5)
    b, _ = vector.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(12):
        action = rng.integers(0, LENGTH_CAP + 1, SMALL["max_batch"])
        a, ra, da, _, ia = single.step(action)
        b, rb, db, _, ib = vector.step(action[None])
        assert np.array_equal(a, b[0]) and ra == pytest.approx(rb[0]) and da == db[0]
        assert ia["tokens"] == ib["tokens"][0] and ia["seconds"] == pytest.approx(ib["seconds"][0])
        if da:
            break


def test_speculation_raises_throughput_on_the_paper_profile() -> None:
    """On the same arrivals, verifying 4 positions per request gives more tokens per second than plain
    decoding (the paper's A100 verify step is memory-bound at these batch sizes)."""
    plain = serve(SpecServeEnv(**SMALL), 0, seed=2)
    spec = serve(SpecServeEnv(**SMALL), 4, seed=2)
    rate = [sum(i["tokens"] for i in run) / sum(i["seconds"] for i in run) for run in (plain, spec)]
    assert rate[1] > rate[0]


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"rate": 0.0}, "rate"), ({"requests": 0}, "requests"), ({"max_batch": 0}, "max_batch"),
    ({"prompt_tokens": (10, 5)}, "prompt_tokens"), ({"output_tokens": (0, 5)}, "output_tokens"),
])
def test_bad_settings_are_input_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        ServeBatch(1, **{**SMALL, **kwargs})


def test_a_recorded_arrival_trace_is_replayed() -> None:
    """Trace-driven serving: the episode serves exactly the recorded requests, each admitted no earlier
    than it arrived, in order; a malformed trace is refused."""
    trace = Arrivals(np.array([0.0, 0.01, 0.5, 0.5]), np.array([20, 40, 30, 10]), np.array([5, 9, 3, 7]),
                     np.array([0, 1, 0, 1]))
    env = SpecServeEnv(max_batch=SMALL["max_batch"], arrivals=trace)
    infos = serve(env, 2)
    batch = env.batch
    assert batch.requests == 4 and np.array_equal(batch.arrival[0], trace.seconds)
    assert sum(i["tokens"] for i in infos) == int(trace.output.sum())
    assert np.all(batch.first[0] >= trace.seconds) and np.all(np.diff(batch.first[0]) >= 0)
    with pytest.raises(InputError, match="arrival order"):
        Arrivals(np.array([1.0, 0.5]), np.array([3, 3]), np.array([2, 2]), np.array([0, 0]))
    with pytest.raises(InputError, match="acceptance model has"):
        SpecServeEnv(arrivals=Arrivals(np.array([0.0]), np.array([3]), np.array([2]), np.array([99])))


def test_a_chains_drafting_splits_into_its_start_and_a_cost_per_position() -> None:
    """``chain_fit``: an affine row gives back its intercept and slope; the observation shows them."""
    row = np.array([0.0, *(0.5 + 0.25 * k for k in range(1, LENGTH_CAP + 1))])
    assert chain_fit(row) == pytest.approx((0.5, 0.25))
    profile = resolve_profile(None)
    chains = chains_fit(np.arange(3)[:, None] * row)  # two requests drafting in turn: each its own chain
    assert chains[2] == pytest.approx((0.5, 0.25))
    costs = iteration_costs(profile, chains, np.array([0.0, 2.0]), np.array([0.0, 64.4]))
    assert costs.at(0) == (0.0, 0.0, 0.0, 0.0) and costs.at(1)[2:] == pytest.approx((0.25, 0.5))
    assert costs.at(1) == iteration_costs(profile, chains, 2, 64).at(0)  # priced at whole tokens


def lockstep_profile(per_call: float, per_chain: float) -> CostProfile:
    """The paper profile with draft-model chains whose lockstep forward costs ``per_call`` plus
    ``per_chain`` per chain drafting, per position."""
    data = resolve_profile(None).to_json()
    data["models"]["drafters"]["draft-model"] = "a draft model"
    data["samples"]["draft"]["draft-model"] = [{"tokens": k, "seconds": [k * (per_call + per_chain)]}
                                               for k in (1, 4)]
    data["samples"]["batch_draft"] = [
        {"requests": r, "tokens": k, "seconds": [k * (per_call + r * per_chain)]}
        for r in (1, 4) for k in (1, 4)]
    return profile_from_json({**data, "fits": None})


def test_lockstep_drafting_costs_each_position_once_for_every_chain_drafting_it() -> None:
    """With ``samples.batch_draft`` draft-model chains cost by depth what the chains still drafting there
    add (a call, then a share per chain), not each chain's own row; without it, or for another drafter,
    the requests' rows summed."""
    profile = lockstep_profile(per_call=1.0, per_chain=0.25)
    table = drafting_table(profile, "draft-model", 4, LENGTH_CAP)
    assert table[0].sum() == 0 and table[:, 0].sum() == 0
    assert table[3, 2] == pytest.approx(2 * (1.0 + 3 * 0.25))
    ragged = np.array([[4, 1, 0, 2]])  # depth 1: 3 chains, depth 2: 2, depths 3 and 4: 1
    expected = (1 + 3 * 0.25) + (1 + 2 * 0.25) + 2 * (1 + 0.25)
    assert drafting_seconds(table, ragged) == pytest.approx([expected])
    alone = drafting_table(profile, "eagle", 4, LENGTH_CAP)
    row = profile.draft_row("eagle", LENGTH_CAP)
    assert drafting_seconds(alone, ragged) == pytest.approx([row[[4, 1, 0, 2]].sum()])
    chains = chains_fit(table)  # a request's share of a batch drafting alike: the call split among them
    assert chains[4] == pytest.approx((0.0, (1.0 + 4 * 0.25) / 4))
    for name in ("batch_draft", "draft_backlog"):
        data = profile.to_json()
        data["samples"]["draft_backlog"] = [{"tokens": 1, "seconds": [1.0]}]
        del data["samples"]["draft"]["draft-model"], data["models"]["drafters"]["draft-model"]
        data["samples"].pop("batch_draft" if name == "draft_backlog" else "draft_backlog")
        with pytest.raises(InputError, match=f"{name} needs the draft-model series"):
            profile_from_json({**data, "fits": None})


def test_a_draft_model_chain_first_runs_its_backlog() -> None:
    """Three requests of 20-token prompts admitted at once: a chain that drafts at every iteration pays its
    19-token prompt at its first proposal only (18 tokens over a backlog of one, at 1 s a token); one that
    never drafts never pays; another drafter keeps no backlog."""
    plain = lockstep_profile(per_call=1.0, per_chain=0.25)
    data = plain.to_json()
    data["samples"]["draft_backlog"] = [{"tokens": t, "seconds": [float(t)]} for t in (1, 100)]
    charged = profile_from_json({**data, "fits": None})
    at_once = Arrivals(np.zeros(3), np.full(3, 20), np.full(3, 12), np.zeros(3, dtype=int))

    def seconds(profile: CostProfile, length: int, drafter: str = "draft-model") -> float:
        env = SpecServeEnv(profile, drafter=drafter, max_batch=3, arrivals=at_once)
        return sum(info["seconds"] for info in serve(env, length))

    assert seconds(charged, 3) - seconds(plain, 3) == pytest.approx(3 * 18.0)
    assert seconds(charged, 0) == seconds(plain, 0)
    assert seconds(charged, 3, "eagle") == seconds(plain, 3, "eagle")
    assert np.all(backlog_seconds(charged, "draft-model", np.array([1, 19])) == [0.0, 18.0])
