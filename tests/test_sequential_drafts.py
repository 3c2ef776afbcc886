"""A token-by-token drafter under a length policy: the simulator drafts and charges what the engine does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_fidelity import PROMPTS, chain_traces, flat_profile

from experiments.pipeline import fidelity
from policies.base import make_policy
from policies.features import LENGTH_CAP, LENGTH_SLICES, length_features
from real_engine.speculate import LengthControlled
from simulator.rollout import sequential_drafts

CONF, STEPS = LENGTH_SLICES["confidences"], LENGTH_SLICES["step_seconds"]


class Chain:
    """A drafter stand-in with the draft model's stopping hook (LengthControlled installs its rule)."""

    model_seconds = 0.0
    keep_drafting = None


@pytest.mark.parametrize("spec", [{"kind": "threshold", "params": {"threshold": 0.4}},
                                  {"kind": "libraspec", "params": {}},
                                  {"kind": "fixed", "params": {"length": 3}}])
def test_the_simulator_stops_a_chain_where_the_engine_does(spec: dict) -> None:
    profile, rng = flat_profile(), np.random.default_rng(0)
    policy = make_policy(spec["kind"], spec["params"])
    engine = LengthControlled(Chain(), policy, profile, "draft-model")
    engine.context, engine.steps = 100, profile.step_seconds("draft-model", range(LENGTH_CAP + 1), 100.0)
    depth = 8
    confidences = rng.uniform(0.2, 1.0, (64, depth))
    obs = np.stack([length_features(c, 100, engine.steps) for c in confidences])
    simulated = sequential_drafts(lambda o, rows: policy.choose_batch(o[:, CONF], o[:, STEPS]), obs,
                                  np.full(64, depth))
    for c, d in zip(confidences, simulated, strict=True):
        live = next((k for k in range(depth) if not engine.keep_drafting(list(c[:k]))), depth)
        assert d == live
    assert len(set(simulated.tolist())) > 1 or spec["kind"] != "threshold"  # stops at several depths


def test_a_probe_token_the_policy_then_drops_is_charged() -> None:
    """Confidences 0.5 and a threshold of 0.6: the chain drafts one token, then verifies none of it, so
    each step costs a vanilla step (2 ms) plus one draft token (0.5 ms); a fixed length pays no extra."""
    config = fidelity.make_config("c", "draft-model", "chain", 4, depth=4)
    threshold = make_policy("threshold", {"threshold": 0.6})
    out = fidelity.simulate(flat_profile(), chain_traces(accepted=4), config, PROMPTS, tokens=60, queries=8,
                            seed=0, policy=threshold)
    assert out["tau"] == pytest.approx(1.0)
    assert out["iteration_seconds"] == pytest.approx(2e-3 + 5e-4)
    fixed = fidelity.simulate(flat_profile(), chain_traces(accepted=4), config, PROMPTS, tokens=60, queries=8,
                              seed=0)
    assert fixed["iteration_seconds"] == pytest.approx(2e-3 + 5e-3)  # 4 tokens drafted and verified


def test_adaptstream_charges_what_replayed_iterations_verify() -> None:
    """Half the recorded iterations drafted 2 positions, half 8: with 8 asked for, a query's iterations
    cost the mean of T(2) and T(8), not T(8) (a SpecBlock tree is often smaller than its budget)."""


    from simulator.adapt_stream import AdaptStreamEnv
    from simulator.replay import TraceReplay

    short, long = chain_traces(accepted=1, drafted=2), chain_traces(accepted=4, drafted=8)
    long["query_id"] += 100
    replay = TraceReplay.from_traces(pd.concat([short, long], ignore_index=True))
    np.testing.assert_allclose(replay.verified_shares(8)[:, [2, 8]], 0.5)
    profile = flat_profile()
    env = AdaptStreamEnv(profile, replay, "draft-model", draft_length=8, tokens_per_query=40,
                         prompt_tokens=(100, 100), phases=((3, None),))
    env.reset(seed=0)
    _, _, _, _, info = env.step(0)
    per_iteration = info["query_seconds"] / (40 / info["tau"])
    steps = profile.step_seconds("draft-model", [2, 8], 120.0)
    assert per_iteration == pytest.approx(steps.mean(), rel=1e-9)


def test_a_tree_drafted_whole_is_charged_even_when_nothing_is_left_to_verify() -> None:
    """A whole-tree drafter whose trees come out empty (a SpecBlock rank head that stops every branch)
    still ran: each step costs the vanilla step plus the tree's drafting, as in the engine."""
    from core.cost_profile import profile_from_json

    data = flat_profile().to_json()
    data.pop("fits")
    data["samples"]["draft_trees"] = {"draft-model": [{"depth": d, "width": w, "seconds": [3e-3]}
                                                      for d in (2, 4) for w in (2, 3)]}
    tree = fidelity.make_config("t", "draft-model", "tree", 8, depth=4, width=3, budget=8)
    shape = fidelity.draft_shape(tree)
    for drafted, accepted, seconds in ((0, 0, 2e-3 + 3e-3), (4, 2, 3e-3 + 5e-3)):
        traces = chain_traces(accepted, drafted=drafted)
        out = fidelity.simulate(profile_from_json(data), traces, tree, PROMPTS, tokens=60, queries=8, seed=0,
                                shape=shape)
        assert out["tau"] == pytest.approx(1 + accepted)
        assert out["iteration_seconds"] == pytest.approx(seconds)  # vanilla or verify(n + 1), plus the tree


def test_rejections_count_cut_short_drafts_not_empty_ones() -> None:
    """The engine buffers a rejection when a draft was cut short; an empty draft (nothing drafted) or a
    chain accepted whole is none: the replay's rates follow the same rule."""


    from simulator.replay import TraceReplay

    cut = chain_traces(accepted=1, drafted=4)  # every draft cut short
    whole = chain_traces(accepted=4, drafted=4)  # every draft accepted whole
    empty = chain_traces(accepted=0, drafted=0)
    whole["query_id"] += 100
    empty["query_id"] += 200
    replay = TraceReplay.from_traces(pd.concat([cut, whole, empty], ignore_index=True))
    assert sorted(replay.query_cut.tolist()) == [0.0] * 8 + [1.0] * 4  # per recorded query
    draws = replay.query_rejection_rates(np.random.default_rng(0), np.zeros(2000, dtype=np.int64))
    assert set(draws.tolist()) == {0.0, 1.0}  # a query is drawn whole: its share, not the domain mean
    assert draws.mean() == pytest.approx(10 / 40, abs=0.03)  # cut queries hold 10 of 40 text positions


def test_iterations_the_query_end_cut_short_are_not_replayed() -> None:
    """A 10-token query of a 4-deep chain: the loop drafts at most the tokens left less one, so its last
    two iterations (3 then 2 tokens left: drafts of 2 and 1) are end effects, left out of the replay."""
    from simulator.positions import end_limited

    depths, accepted = [4, 4, 2, 1], [4, 1, 0, 1]
    rows = pd.DataFrame({
        "query_id": 0, "domain": "a", "drafter": "draft-model", "iteration": np.arange(4),
        "context_length": 100, "depths": [np.arange(1, d + 1) for d in depths],
        "parents": [np.arange(-1, d - 1) for d in depths], "confidences": [np.full(d, 0.5) for d in depths],
        "rank_buckets": [np.full(d, -1) for d in depths],
        "on_path": [np.arange(d) < a for d, a in zip(depths, accepted, strict=True)], "accepted": accepted,
        "draft_seconds": 0.0, "verify_seconds": 0.0})
    np.testing.assert_array_equal(end_limited(rows), [False, False, True, True])
    np.testing.assert_array_equal(end_limited(rows.iloc[::-1]), [True, True, False, False])  # row order kept
