"""Run a policy through the simulator and total what it achieved (the simulator's prediction).

Length policies run on the batch core of a ``SpecLengthVectorEnv``, one query per slot, finished
queries dropped as they end; each query is served by its own fresh copy of the policy (its
parameters, not learned state), or, for a stateless policy with ``choose_batch`` (fixed, threshold,
LibraSpec), by one numpy call that chooses the same actions for every slot at once. Adaptation
policies run one ``AdaptStreamEnv`` stream and follow the engine's loop (``policies.adaptation``):
act, serve, observe, revert when the policy asks, checkpoint when it says the drafter is good. Serving
policies run one ``SpecServeEnv`` episode: a length per running request at every batched iteration.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.base import Policy, policy_from_dict, policy_to_dict
from policies.features import LENGTH_CAP, LENGTH_SLICES, SERVE_GLOBAL, SERVE_SLOT_SLICES, serve_slots
from policies.serving import keeps_drafting
from simulator.adapt_stream import AdaptStreamEnv
from simulator.spec_length import SpecLengthVectorEnv
from simulator.spec_serve import SpecServeEnv


@dataclass(frozen=True)
class Outcome:
    """Totals of one policy's run: tokens emitted, seconds spent (updates included), target forwards."""

    queries: int
    tokens: float
    seconds: float
    iterations: float
    draft_seconds: float = 0.0  # of ``seconds``: drafting and the length policy's own work

    @property
    def tokens_per_second(self) -> float:
        """Throughput over the whole run."""
        return self.tokens / self.seconds

    @property
    def tau(self) -> float:
        """Tokens per target forward, bonus included (1.0 for vanilla decoding)."""
        return self.tokens / self.iterations

    @property
    def latency_seconds(self) -> float:
        """Mean seconds per query."""
        return self.seconds / self.queries


def _copy(policy: Policy, seed: int) -> Policy:
    return policy_from_dict(policy_to_dict(policy), seed=seed)


def sequential_drafts(choose: Callable[[np.ndarray, np.ndarray], np.ndarray], obs: np.ndarray,
                      available: np.ndarray, checks: np.ndarray | None = None) -> np.ndarray:
    """Positions a token-by-token drafter drafts under a length policy, per row of ``obs``: it stops
    at the first k at which the policy, shown the first k confidences and a certain next one, would
    verify no more than k (``real_engine.speculate.LengthControlled.keep_drafting``, the same rule),
    or when ``available`` (what the drafter can draft) runs out. ``choose(obs, rows)`` gives n for
    the observations of those rows; ``checks``, when given, counts each row's calls."""
    conf = LENGTH_SLICES["confidences"]
    drafted = np.minimum(available, LENGTH_CAP).astype(np.int64)
    open_ = np.ones(len(obs), dtype=bool)
    for k in range(LENGTH_CAP):
        open_ &= k < drafted
        if not open_.any():
            break
        if checks is not None:
            checks += open_
        probe = obs[open_].copy()
        probe[:, conf] = np.where(np.arange(LENGTH_CAP) < k, probe[:, conf], 0.0)
        probe[:, conf.start + k] = 1.0
        rows = np.flatnonzero(open_)
        stop = rows[choose(probe, rows) <= k]
        drafted[stop] = k
        open_[stop] = False
    return drafted


def run_length(policy: Policy, env: SpecLengthVectorEnv, seed: int, decision_seconds: float = 0.0) -> Outcome:
    """Serve one query per slot of ``env`` with copies of a length ``policy``, each of its decisions
    costing ``decision_seconds`` more than the profile's ``steering`` series charges (measured with a
    fixed length, whose decision is free: ``experiments.pipeline.deploy.decision_cost``).

    Drives a copy of the env's batch core after ``reset`` and drops each query once it is done, so no
    work goes to finished slots; the env itself needs a ``reset`` before it is stepped again. As the
    engine's ``LengthControlled`` does, a sequential drafter (``SpecLengthBatch.sequential``) drafts
    what ``sequential_drafts`` says, any other drafts whole unless the policy would verify nothing
    even were the first position certain; each iteration pays for what was drafted.
    """
    slots = env.num_envs
    batched = hasattr(policy, "choose_batch")
    conf, steps = LENGTH_SLICES["confidences"], LENGTH_SLICES["step_seconds"]
    copies = [] if batched else [_copy(policy, seed + i) for i in range(slots)]
    env.reset(seed=seed)
    batch, rng = copy.copy(env.batch), env.np_random
    slot = np.arange(slots)  # which query each remaining row serves
    tokens = seconds = iterations = drafting = 0.0

    def choose(obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        if batched:
            return policy.act_batch(obs[:, conf], obs[:, steps])
        return np.array([copies[slot[r]].act(o) for r, o in zip(rows, obs, strict=True)], dtype=np.int64)

    while batch.num:
        obs = batch.observations()
        checks = np.zeros(batch.num, dtype=np.int64)
        if batch.sequential:  # the chain stops where the policy would: it sees only what was drafted
            drafted = sequential_drafts(choose, obs, batch.draws.drafted, checks)
            obs[:, conf] = np.where(np.arange(LENGTH_CAP) < drafted[:, None], obs[:, conf], 0.0)
        else:  # drafted whole, unless the policy would verify nothing even were the first node certain
            drafted = LENGTH_CAP * sequential_drafts(choose, obs, np.ones(batch.num, dtype=np.int64), checks)
        actions = choose(obs, np.arange(batch.num))
        info = batch.verify(actions, drafted)
        decided = decision_seconds * (checks + (drafted > 0))  # the engine asks once more if it drafted
        info["seconds"] = info["seconds"] + decided
        info["draft_seconds"] = info["draft_seconds"] + decided
        done = info.pop("done")
        for k in [] if batched else range(batch.num):
            copies[slot[k]].observe(obs[k], int(actions[k]), -float(info["seconds"][k]),
                                    {key: v[k] for key, v in info.items()})
        tokens += float(info["tokens"].sum())
        seconds += float(info["seconds"].sum())
        drafting += float(info["draft_seconds"].sum())
        iterations += batch.num
        if done.any():
            batch.keep(~done)
            slot = slot[~done]
        batch.draft(rng)
    return Outcome(slots, tokens, seconds, iterations, drafting)


def serve_query(agent: Policy, env: AdaptStreamEnv, obs: np.ndarray
                ) -> tuple[np.ndarray, bool, dict[str, Any]]:
    """One query of ``env`` under an adaptation policy: act, step, observe, then revert or checkpoint
    the drafter as the policy says; the next observation, whether the stream ended, and the step's info."""
    action = agent.act(obs)
    next_obs, reward, terminated, _, info = env.step(action)
    agent.observe(obs, action, reward, info)
    if getattr(agent, "should_revert", lambda: False)():
        env.revert()
        agent.acknowledge_revert()
    if getattr(agent, "checkpoint_good", False):  # the drafter the closed window measured
        env.checkpoint(previous=getattr(agent, "checkpoint_previous", False))
    return next_obs, terminated, info


def run_adapt(policy: Policy, env: AdaptStreamEnv, seed: int) -> Outcome:
    """Serve one stream of ``env`` with a fresh copy of an adaptation ``policy``."""
    agent = _copy(policy, seed)
    obs, _ = env.reset(seed=seed)
    queries = 0
    tokens = seconds = iterations = 0.0
    terminated = False
    while not terminated:
        next_obs, terminated, info = serve_query(agent, env, obs)
        query_tokens = env.batch.tokens
        queries += 1
        tokens += query_tokens
        seconds += info["query_seconds"] + info["update_seconds"]
        iterations += query_tokens / info["tau"]
        obs = next_obs
    return Outcome(queries, tokens, seconds, iterations)


def serve_drafts(policy: Policy, obs: np.ndarray, available: np.ndarray) -> tuple[np.ndarray, int]:
    """Positions each running request's chain drafts under a serving ``policy`` (``policies.serving.
    keeps_drafting``, the live engine's rule), at most ``available`` ((max_batch,): what the drafter can
    draft, 0 for empty slots); and how many times the policy was asked."""
    rows = serve_slots(obs)
    confidences = rows[:, SERVE_SLOT_SLICES["confidences"]]
    drafted, calls = np.zeros(len(rows), dtype=np.int64), 0
    for slot in np.flatnonzero(available > 0):
        while drafted[slot] < available[slot]:
            calls += 1
            if not keeps_drafting(policy, obs, int(slot), confidences[slot, :drafted[slot]]):
                break
            drafted[slot] += 1
    return drafted, calls


def run_serve(policy: Policy, env: SpecServeEnv, seed: int, iteration_seconds: float = 0.0,
              decision_seconds: float = 0.0) -> Outcome:
    """Serve one episode of ``env`` with a fresh copy of a serving ``policy``, as the live engine does:
    each running request's chain drafts what ``serve_drafts`` says, then the policy, shown what was
    drafted, gives each its length; steering costs ``iteration_seconds`` per iteration and
    ``decision_seconds`` per question asked of the policy. The
    episode's requests, tokens, busy seconds (iterations and prefills) and target forwards taken part in,
    summed over requests (so ``tau`` is a request's); its requests' latencies stay in ``env.batch``
    (``ServeBatch.latencies``)."""
    env.reset(seed=seed)
    own, batch, rng = _copy(policy, seed), env.batch, env.np_random
    conf = SERVE_SLOT_SLICES["confidences"]
    tokens = seconds = iterations = drafting = 0.0
    done = False
    while not done:
        obs = batch.observations()[0]
        available = np.where(batch.active[0], np.minimum(batch.drafted[0], batch.remaining[0] - 1), 0)
        drafted, calls = serve_drafts(own, obs, available)
        rows = serve_slots(obs).copy()  # the policy sees what was drafted
        rows[:, conf] = np.where(np.arange(LENGTH_CAP) < drafted[:, None], rows[:, conf], 0.0)
        shown = np.concatenate((obs[:len(SERVE_GLOBAL)], rows.reshape(-1)))
        decided = iteration_seconds + decision_seconds * (calls + 1)
        batch.clock[0] += decided  # the questions come before the iteration's forward
        info = batch.verify(np.asarray(own.act(shown), dtype=np.int64)[None], drafted[None])
        batch.draft(rng)
        done = bool(info["done"][0])
        tokens += float(info["tokens"][0])
        seconds += float(info["seconds"][0]) + decided
        iterations += float(info["running"][0])
        drafting += float(info["draft_seconds"][0]) + decided
    return Outcome(batch.requests, tokens, seconds, iterations, drafting)
