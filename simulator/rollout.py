"""Run a policy through the simulator and total what it achieved (the simulator's prediction).

Length policies run on ``SpecLengthVectorEnv``, one query per slot, each query served by its own
fresh copy of the policy (its parameters, not learned state). Adaptation policies run one
``AdaptStreamEnv`` stream and follow the engine's loop (``policies.adaptation``): act, serve,
observe, revert when the policy asks, checkpoint when it says the drafter is good.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies import adaptation
from policies.base import Policy, policy_from_dict, policy_to_dict
from policies.length import FixedLength
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
    """Serve one query per slot of ``env`` with copies of a length ``policy``."""
    slots = env.num_envs
    fixed = isinstance(policy, FixedLength)
    copies = [] if fixed else [_copy(policy, seed + i) for i in range(slots)]
    obs, _ = env.reset(seed=seed)
    alive = np.ones(slots, dtype=bool)
    tokens = seconds = iterations = 0.0
    while alive.any():
        if fixed:
            actions = np.full(slots, policy.params.length, dtype=np.int64)
        else:
            actions = np.array([copies[i].act(obs[i]) if alive[i] else 0 for i in range(slots)],
                               dtype=np.int64)
        next_obs, reward, terminated, _, info = env.step(actions)
        for i in [] if fixed else np.flatnonzero(alive):
            copies[i].observe(obs[i], int(actions[i]), float(reward[i]), {k: v[i] for k, v in info.items()})
        tokens += float(info["tokens"][alive].sum())
        seconds += float(info["seconds"][alive].sum())
        iterations += float(alive.sum())
        alive &= ~terminated
        obs = next_obs
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
