"""Run a policy through the simulator and total what it achieved (the simulator's prediction).

Length policies run on the batch core of a ``SpecLengthVectorEnv``, one query per slot, finished
queries dropped as they end; each query is served by its own fresh copy of the policy (its
parameters, not learned state), or, for a stateless policy with ``choose_batch`` (fixed, threshold,
LibraSpec), by one numpy call that chooses the same actions for every slot at once. Adaptation
policies run one ``AdaptStreamEnv`` stream and follow the engine's loop (``policies.adaptation``):
act, serve, observe, revert when the policy asks, checkpoint when it says the drafter is good.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from policies import adaptation
from policies.base import Policy, policy_from_dict, policy_to_dict
from policies.features import LENGTH_SLICES
from simulator.envs import AdaptStreamEnv
from simulator.vector_envs import SpecLengthVectorEnv


@dataclass(frozen=True)
class Outcome:
    """Totals of one policy's run: tokens emitted, seconds spent (updates included), target forwards."""

    queries: int
    tokens: float
    seconds: float
    iterations: float

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


def is_adaptation(policy: Policy) -> bool:
    """Whether ``policy`` decides drafter updates (else it decides speculation lengths)."""
    return type(policy).__module__ == adaptation.__name__


def _copy(policy: Policy, seed: int) -> Policy:
    return policy_from_dict(policy_to_dict(policy), seed=seed)


def run_length(policy: Policy, env: SpecLengthVectorEnv, seed: int) -> Outcome:
    """Serve one query per slot of ``env`` with copies of a length ``policy``.

    Drives a copy of the env's batch core after ``reset`` and drops each query once it is done, so no
    work goes to finished slots; the env itself needs a ``reset`` before it is stepped again.
    """
    slots = env.num_envs
    batched = hasattr(policy, "choose_batch")
    conf, steps = LENGTH_SLICES["confidences"], LENGTH_SLICES["step_seconds"]
    copies = [] if batched else [_copy(policy, seed + i) for i in range(slots)]
    env.reset(seed=seed)
    batch, rng = copy.copy(env.batch), env.np_random
    slot = np.arange(slots)  # which query each remaining row serves
    tokens = seconds = iterations = 0.0
    while batch.num:
        obs = batch.observations()
        if batched:
            actions = policy.choose_batch(obs[:, conf], obs[:, steps])
        else:
            actions = np.array([copies[i].act(row) for i, row in zip(slot, obs, strict=True)], dtype=np.int64)
        info = batch.verify(actions)
        done = info.pop("done")
        for k in [] if batched else range(batch.num):
            copies[slot[k]].observe(obs[k], int(actions[k]), -float(info["seconds"][k]),
                                    {key: v[k] for key, v in info.items()})
        tokens += float(info["tokens"].sum())
        seconds += float(info["seconds"].sum())
        iterations += batch.num
        if done.any():
            batch.keep(~done)
            slot = slot[~done]
        batch.draft(rng)
    return Outcome(slots, tokens, seconds, iterations)


def run_adapt(policy: Policy, env: AdaptStreamEnv, seed: int) -> Outcome:
    """Serve one stream of ``env`` with a fresh copy of an adaptation ``policy``."""
    agent = _copy(policy, seed)
    obs, _ = env.reset(seed=seed)
    queries = 0
    tokens = seconds = iterations = 0.0
    terminated = False
    while not terminated:
        action = agent.act(obs)
        next_obs, reward, terminated, _, info = env.step(action)
        agent.observe(obs, action, reward, info)
        if getattr(agent, "should_revert", lambda: False)():
            env.revert()
            agent.acknowledge_revert()
        if getattr(agent, "checkpoint_good", False):
            env.checkpoint()
        query_tokens = env.batch.tokens
        queries += 1
        tokens += query_tokens
        seconds += info["query_seconds"] + info["update_seconds"]
        iterations += query_tokens / info["tau"]
        obs = next_obs
    return Outcome(queries, tokens, seconds, iterations)
