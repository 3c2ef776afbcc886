"""Numpy-batched vector forms of the simulator's environments (Gymnasium ``VectorEnv``).

Each runs the same batch core as its single environment (``simulator.envs``) over ``num_envs``
slots with no per-slot Python loop, so thousands of queries step together. Both use Gymnasium's
next-step autoreset: the step after a slot terminates starts its next episode, returns that
episode's first observation with reward 0, and ignores the slot's action. ``infos`` holds one array
per key of the single environment's ``info`` (domains as indices into the model's ``domains``).
With ``num_envs=1`` a vector env draws the same random numbers as its single env.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from core.cost_profile import DraftShape
from policies.features import LENGTH_CAP, adapt_bounds, length_bounds, serve_bounds
from simulator.adapt_stream import AdaptStreamBatch
from simulator.adaptation import AdaptationDynamics
from simulator.envs import (
    DEFAULT_PROMPT,
    DEFAULT_TOKENS,
    AcceptanceArg,
    Phases,
    ProfileArg,
    ResetResult,
    SpecLengthBatch,
)
from simulator.serve import (
    DEFAULT_BATCH,
    DEFAULT_OUTPUT,
    DEFAULT_RATE,
    DEFAULT_REQUESTS,
    Arrivals,
    ServeBatch,
)

VectorStepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class SpecLengthVectorEnv(VectorEnv):
    """``num_envs`` SpecLength queries stepped together; see ``simulator.envs.SpecLengthEnv``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, steered: bool = True,
                 observed: ProfileArg = None) -> None:
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.batch = SpecLengthBatch(num_envs, profile, acceptance, drafter, tokens_per_query, prompt_tokens,
                                     domain_weights, draft_shape, steered, observed)
        self.single_action_space = spaces.Discrete(LENGTH_CAP + 1)
        self.action_space = batch_space(self.single_action_space, num_envs)
        low, high = length_bounds()
        self.single_observation_space = spaces.Box(low, high, dtype=np.float64)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Start a new query in every slot."""
        super().reset(seed=seed)
        self.batch.start(self.np_random, np.ones(self.num_envs, dtype=bool))
        self.batch.draft(self.np_random)
        self.prev_done[:] = False
        self._running = True
        return self.batch.observations(), {}

    def step(self, actions: np.ndarray) -> VectorStepResult:
        """Verify each slot's chosen positions; slots that ended on the previous step start anew."""
        assert self.action_space.contains(actions), f"{actions!r} ({type(actions)}) invalid"
        assert self._running, "Call reset before using step method."
        info = self.batch.verify(np.asarray(actions, dtype=np.int64))
        restart = self.prev_done
        if restart.any():
            self.batch.start(self.np_random, restart)
            for values in info.values():
                values[restart] = 0
        self.batch.draft(self.np_random)
        self.prev_done = info.pop("done")
        truncated = np.zeros(self.num_envs, dtype=bool)
        return self.batch.observations(), -info["seconds"], self.prev_done.copy(), truncated, info


class AdaptStreamVectorEnv(VectorEnv):
    """``num_envs`` AdaptStream streams stepped together; see ``simulator.adapt_stream.AdaptStreamEnv``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", draft_length: int = 8, tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 phases: Phases | None = None,
                 dynamics: AdaptationDynamics | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, overlap: bool = False,
                 overlap_slowdown: float | Mapping[str, float] = 1.0) -> None:
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.batch = AdaptStreamBatch(num_envs, profile, acceptance, drafter, draft_length, tokens_per_query,
                                      prompt_tokens, phases, dynamics, draft_shape, overlap, overlap_slowdown)
        self.single_action_space = spaces.Discrete(3)
        self.action_space = batch_space(self.single_action_space, num_envs)
        low, high = adapt_bounds(len(self.batch.model.domains))
        self.single_observation_space = spaces.Box(low, high, dtype=np.float64)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Start a new stream in every slot."""
        super().reset(seed=seed)
        self.batch.start(np.ones(self.num_envs, dtype=bool))
        self.prev_done[:] = False
        self._running = True
        return self.batch.observations(), {}

    def step(self, actions: np.ndarray) -> VectorStepResult:
        """Run each slot's update and serve its next query; slots that ended start a new stream."""
        assert self.action_space.contains(actions), f"{actions!r} ({type(actions)}) invalid"
        assert self._running, "Call reset before using step method."
        restart = self.prev_done
        self.batch.start(restart)
        active = np.flatnonzero(~restart)
        keys = ("reward", "tokens_per_second", "tau", "query_seconds", "update_seconds", "train_seconds",
                "updated", "domain", "done")
        info = {key: np.zeros(self.num_envs, dtype=bool if key in ("updated", "done") else
                              np.int64 if key == "domain" else np.float64) for key in keys}
        if active.size:
            for key, values in self.batch.serve(self.np_random, np.asarray(actions), active).items():
                info[key][active] = values
        self.prev_done = info.pop("done")
        reward = info.pop("reward")
        truncated = np.zeros(self.num_envs, dtype=bool)
        return self.batch.observations(), reward, self.prev_done.copy(), truncated, info

    def checkpoint(self, mask: np.ndarray | None = None, previous: bool = False) -> None:
        """Save the current drafter of the slots in ``mask`` (all when None) as their last good one
        (``previous``: the one before the last step's update)."""
        self.batch.checkpoint(np.ones(self.num_envs, dtype=bool) if mask is None else mask, previous)

    def revert(self, mask: np.ndarray | None = None) -> None:
        """Restore the last good drafter of the slots in ``mask`` (all when None)."""
        self.batch.revert(np.ones(self.num_envs, dtype=bool) if mask is None else mask)


class SpecServeVectorEnv(VectorEnv):
    """``num_envs`` SpecServe servers stepped together; see ``simulator.serve.SpecServeEnv``. ``infos``
    holds per server ``tokens``, ``seconds``, ``iteration_seconds``, ``draft_seconds``, ``running``,
    ``accepted`` and ``completed`` (requests completed at the step); latencies are the single env's."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", rate: float = DEFAULT_RATE, requests: int = DEFAULT_REQUESTS,
                 max_batch: int = DEFAULT_BATCH, prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 output_tokens: Sequence[int] = DEFAULT_OUTPUT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 arrivals: Arrivals | None = None, observed: ProfileArg = None) -> None:
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.batch = ServeBatch(num_envs, profile, acceptance, drafter, rate, requests, max_batch,
                                prompt_tokens, output_tokens, domain_weights, arrivals, observed)
        self.single_action_space = spaces.MultiDiscrete([LENGTH_CAP + 1] * self.batch.cap)
        self.action_space = batch_space(self.single_action_space, num_envs)
        low, high = serve_bounds(self.batch.cap)
        self.single_observation_space = spaces.Box(low, high, dtype=np.float64)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Draw a new episode in every server."""
        super().reset(seed=seed)
        self.batch.start(self.np_random, np.ones(self.num_envs, dtype=bool))
        self.batch.draft(self.np_random)
        self.prev_done[:] = False
        self._running = True
        return self.batch.observations(), {}

    def step(self, actions: np.ndarray) -> VectorStepResult:
        """One iteration of every server; servers that ended on the previous step start anew."""
        assert self.action_space.contains(np.asarray(actions, dtype=np.int64)), f"{actions!r} invalid"
        assert self._running, "Call reset before using step method."
        out = self.batch.verify(np.asarray(actions, dtype=np.int64))
        keys = ("tokens", "seconds", "iteration_seconds", "draft_seconds", "running", "accepted")
        info = {key: out[key] for key in keys}
        info["completed"] = np.array([f.size for f in out["finished"]])
        restart = self.prev_done
        if restart.any():
            self.batch.start(self.np_random, restart)
            for values in info.values():
                values[restart] = 0
        self.batch.draft(self.np_random)
        self.prev_done = out["done"] & ~restart
        seconds = info["seconds"]
        reward = np.divide(info["tokens"], seconds, out=np.zeros(self.num_envs), where=seconds > 0)
        truncated = np.zeros(self.num_envs, dtype=bool)
        return self.batch.observations(), reward, self.prev_done.copy(), truncated, info
