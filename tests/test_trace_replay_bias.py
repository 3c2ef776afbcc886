"""Trace replay draws the acceptance of a uniformly random text position, whatever depth was recorded.

The synthetic text has easy and hard queries whose drafter hits are i.i.d. per position (rates 0.9 and
0.3), so the acceptance at a position verifying n tokens has ``P(a >= k) = alpha ** k`` (k <= n) and
a query decoded at n has tau = 1 + sum_{k<=n} alpha ** k. A trace recorded at depth 8 has far fewer
rows per easy query than per hard one: drawing its rows uniformly (the old replay) under-weights easy
text, and drawing every iteration independently from the position mixture over-predicts tau.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies.base import make_policy
from simulator.replay import TraceReplay
from simulator.rollout import run_length
from simulator.spec_length import SpecLengthVectorEnv
from simulator.spec_serve import SpecServeEnv

EASY, HARD, DEPTH, TOKENS = 0.9, 0.3, 8, 512


def recorded(depth: int, queries: int = 120, seed: int = 0) -> pd.DataFrame:
    """Chain traces at ``depth``: half the queries easy, half hard; each decodes TOKENS text positions."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(queries):
        alpha = EASY if q % 2 == 0 else HARD
        done = iteration = 0
        while done < TOKENS:
            hits = rng.random(depth) < alpha
            accepted = int(np.argmin(hits)) if not hits.all() else depth
            rows.append({"query_id": q, "accepted": accepted, "iteration": iteration, "alpha": alpha})
            done += accepted + 1
            iteration += 1
    frame = pd.DataFrame(rows)
    k = len(frame)
    return pd.DataFrame({
        "query_id": frame["query_id"], "domain": "text", "drafter": "synthetic",
        "iteration": frame["iteration"], "context_length": 100,
        "depths": [np.arange(1, depth + 1)] * k, "parents": [np.arange(-1, depth - 1)] * k,
        "confidences": [np.full(depth, a) for a in frame["alpha"]], "rank_buckets": [np.full(depth, -1)] * k,
        "on_path": [np.arange(depth) < a for a in frame["accepted"]], "accepted": frame["accepted"],
        "draft_seconds": 0.0, "verify_seconds": 0.0,
    })


def position_survival(n: int) -> np.ndarray:
    """P(accepted >= i), i = 0..n, at a uniformly random position (half of the text is easy)."""
    k = np.arange(n + 1)
    return 0.5 * EASY**k + 0.5 * HARD**k


def tau(alpha: float, n: int) -> float:
    """Tokens per iteration of a query whose hits are i.i.d. with rate ``alpha``, verifying n positions."""
    return 1.0 + sum(alpha**k for k in range(1, n + 1))


@pytest.fixture(scope="module")
def replay() -> TraceReplay:
    return TraceReplay.from_traces(recorded(DEPTH))


@pytest.mark.parametrize("n", [1, 3, 8])
def test_survival_is_the_uniform_position_law(replay: TraceReplay, n: int) -> None:
    np.testing.assert_allclose(replay.survival(n)[0], position_survival(n), atol=0.015)
    pooled = np.mean(np.minimum(replay.accepted_all, n)[:, None] >= np.arange(n + 1), axis=0)
    assert abs(pooled[1] - position_survival(n)[1]) > 0.15  # the old uniform rows: easy text under-weighted


def test_a_shallower_recording_gives_the_same_law(replay: TraceReplay) -> None:
    shallow = TraceReplay.from_traces(recorded(3, seed=1))
    np.testing.assert_allclose(shallow.survival(3), replay.survival(3), atol=0.02)


def test_independent_draws_follow_the_position_law(replay: TraceReplay) -> None:
    draws = replay.sample(np.random.default_rng(0), np.zeros(40_000, dtype=np.int64))
    mean = draws.accepted(np.full(40_000, 3)).mean()
    assert mean == pytest.approx(position_survival(3)[1:].sum(), abs=0.03)


def test_episodes_pick_queries_by_their_text_and_stay_in_them(replay: TraceReplay) -> None:
    rng = np.random.default_rng(1)
    episode = replay.episodes(rng, np.zeros(20_000, dtype=np.int64))
    easy = replay.confidences[replay.query_offsets[episode], 0] == np.float32(EASY)
    assert easy.mean() == pytest.approx(0.5, abs=0.02)  # equal text per query; easy ones have 1/4 the rows
    draws = replay.sample(rng, np.zeros(episode.size, dtype=np.int64), episode)
    assert np.array_equal(draws.confidences[:, 0] == np.float32(EASY), easy)


@pytest.mark.parametrize("n", [3, 8])
def test_simulated_tau_is_the_harmonic_mean_over_queries(replay: TraceReplay, n: int) -> None:
    env = SpecLengthVectorEnv(3000, acceptance=replay, tokens_per_query=256, prompt_tokens=(128, 128))
    out = run_length(make_policy("fixed", {"length": n}), env, seed=0)
    exact = 2.0 / (1.0 / tau(EASY, n) + 1.0 / tau(HARD, n))  # each simulated query follows one recorded one
    arithmetic = 0.5 * (tau(EASY, n) + tau(HARD, n))  # what independent draws from the position law give
    assert out.tau == pytest.approx(exact, rel=0.025)
    assert abs(arithmetic / exact - 1.0) > 0.15


def test_a_served_request_replays_one_recorded_query() -> None:
    """SpecServe gives each request the iterations of one recorded query: every draw of a request carries
    that query's confidence (0.9 or 0.3), never a mix of easy and hard text within one request."""
    model = TraceReplay.from_traces(recorded(DEPTH))
    env = SpecServeEnv(None, model, "specblock", rate=50.0, requests=200, max_batch=4, output_tokens=(64, 64))
    env.reset(seed=0)
    seen: dict[int, set[float]] = {}
    batch = env.batch
    while batch.done[0] < batch.requests:
        for slot in np.flatnonzero(batch.active[0]):
            request = int(batch.slot_request[0, slot])
            seen.setdefault(request, set()).add(round(float(batch.confidences[0, slot, 0]), 3))
        batch.verify(np.full((1, 4), 4))
        batch.draft(env.np_random)
    assert all(len(values) == 1 for values in seen.values()) and len(seen) == 200
    kinds = {next(iter(values)) for values in seen.values()}
    assert kinds == {EASY, HARD}
