"""What the simulator's Gymnasium environments share: their arguments' types and defaults, and the
reset/step skeleton of a single environment and of a vector one.

Each environment (``simulator.spec_length``, ``simulator.adapt_stream``, ``simulator.spec_serve``) runs
on a batch core: numpy arrays over N queries, streams or servers. Its single environment is the core
with N = 1 (:class:`BatchEnv`); its vector environment (:class:`BatchVectorEnv`) is the same core with
``num_envs`` slots and no per-slot Python loop, so thousands of episodes step together, and with one
slot it draws the same random numbers as the single one. Vector environments use Gymnasium's next-step
autoreset: the step after a slot terminates starts its next episode, returns that episode's first
observation with reward 0, and ignores the slot's action. Their ``infos`` hold one array per key of the
single environment's ``info`` (domains as indices into the model's ``domains``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from core.cost_profile import CostProfile
from core.errors import InputError
from simulator.acceptance import AcceptanceModel

DEFAULT_TOKENS = 512
DEFAULT_PROMPT = (128, 1024)

ProfileArg = str | Path | CostProfile | None
AcceptanceArg = str | Path | AcceptanceModel | None
ResetResult = tuple[np.ndarray, dict[str, Any]]
StepResult = tuple[np.ndarray, float, bool, bool, dict[str, Any]]
VectorStepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]

ActType = TypeVar("ActType")


def check_query(tokens_per_query: int, prompt_tokens: Sequence[int]) -> tuple[int, int, int]:
    """Validated (tokens per query, shortest prompt, longest prompt)."""
    if isinstance(tokens_per_query, bool) or not isinstance(tokens_per_query, (int, np.integer)) \
            or tokens_per_query < 1:
        raise InputError(f"tokens_per_query = {tokens_per_query!r} is invalid: use an integer >= 1")
    low, high = (int(v) for v in prompt_tokens)
    if not 0 <= low <= high:
        raise InputError(f"prompt_tokens = {tuple(prompt_tokens)} is invalid: "
                         "use (low, high) with 0 <= low <= high")
    return int(tokens_per_query), low, high


class _Batched:
    """What both bases do with their batch core: begin episodes in its slots and check a step's call."""

    batch: Any
    np_random: np.random.Generator
    action_space: gym.Space[Any]
    _running: bool

    def _begin(self, mask: np.ndarray) -> None:
        """Begin a new episode in every slot of ``mask``, its first draft drawn (a core without drafts
        overrides this)."""
        self.batch.start(self.np_random, mask)
        self.batch.draft(self.np_random)

    def _check(self, action: Any) -> None:
        """The asserts of ``step``: ``action`` lies in the action space, and ``reset`` was called."""
        assert self.action_space.contains(action), f"{action!r} ({type(action)}) invalid"
        assert self._running, "Call reset before using step method."


class BatchEnv(_Batched, gym.Env[np.ndarray, ActType]):
    """A single environment: its batch core with one slot. Subclasses build the core and the spaces,
    and write ``step``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, batch: Any, action_space: gym.Space[Any], observation_space: gym.Space[Any],
                 render_mode: str | None) -> None:
        self.batch = batch
        self.render_mode = render_mode
        self.action_space = action_space
        self.observation_space = observation_space
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Begin a new episode (seeded by ``seed`` when given)."""
        super().reset(seed=seed)
        self._begin(np.ones(1, dtype=bool))
        self._running = True
        return self._observation(), {}

    def _ended(self, done: np.ndarray) -> bool:
        """Whether the step ended the episode (``done``: the core's per-slot flags); then the next step
        needs a reset."""
        terminated = bool(done[0])
        self._running = not terminated
        return terminated

    def _observation(self) -> np.ndarray:
        """The slot's observation, as the core builds it."""
        return self.batch.observations()[0]


class BatchVectorEnv(_Batched, VectorEnv):
    """A vector environment: its batch core with ``num_envs`` slots, with next-step autoreset
    (``prev_done``: the slots whose episode ended at the last step). Subclasses build the core and the
    single spaces, and write ``step``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, batch: Any, action_space: gym.Space[Any],
                 observation_space: gym.Space[Any], render_mode: str | None) -> None:
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.batch = batch
        self.single_action_space = action_space
        self.action_space = batch_space(action_space, num_envs)
        self.single_observation_space = observation_space
        self.observation_space = batch_space(observation_space, num_envs)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Begin a new episode in every slot (seeded by ``seed`` when given)."""
        super().reset(seed=seed)
        self._begin(np.ones(self.num_envs, dtype=bool))
        self.prev_done[:] = False
        self._running = True
        return self.batch.observations(), {}
