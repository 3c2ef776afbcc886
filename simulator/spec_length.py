"""``specblock/SpecLength-v0``: how much to speculate, one decoding iteration a step.

``SpecLengthBatch`` is the batch core over N queries; ``SpecLengthEnv`` is it with N = 1 and
``SpecLengthVectorEnv`` with N slots (``simulator.env_base`` explains the layout). Observations are built
with ``policies.features``, as in the live engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from gymnasium import spaces

from core.cost_profile import DraftShape, resolve_profile, token_by_token
from core.errors import InputError
from policies.features import (
    LENGTH_CAP,
    LENGTH_DIM,
    LENGTH_SLICES,
    length_bounds,
    length_features,
)
from simulator.acceptance import check_domains
from simulator.env_base import (
    DEFAULT_PROMPT,
    DEFAULT_TOKENS,
    AcceptanceArg,
    BatchEnv,
    BatchVectorEnv,
    ProfileArg,
    StepResult,
    VectorStepResult,
    check_query,
)
from simulator.replay import resolve_acceptance


class SpecLengthBatch:
    """N SpecLength queries at once: the state and dynamics both SpecLength environments run."""

    def __init__(self, num: int, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 domain_weights: Mapping[str, float] | None = None,
                 draft_shape: DraftShape | None = None, steered: bool = True,
                 observed: ProfileArg = None) -> None:
        self.profile = resolve_profile(profile)
        self.model = resolve_acceptance(acceptance)
        if self.model.cap != LENGTH_CAP:
            raise InputError(f"the acceptance model offers {self.model.cap} positions, the length features "
                             f"{LENGTH_CAP}: build it with cap={LENGTH_CAP}")
        self.drafter = drafter
        self.steps = self.profile.step_table(drafter, LENGTH_CAP, draft_shape)
        # What drafting costs by positions drafted, so that ``verify`` can charge drafting the policy did not
        # verify: a draft-model chain stops token by token where a length policy would verify no more
        # (``sequential``, as in ``real_engine.speculate``); a tree (``draft_shape``) is drafted whole.
        self.sequential = draft_shape is None and token_by_token(drafter)
        self.whole = draft_shape is not None
        self.draft_cost = self.profile.draft_row(drafter, LENGTH_CAP, draft_shape)
        # The policy's own work per iteration in the engine, by positions drafted (zero when not steered).
        self.steering = steered * np.asarray(self.profile.steering_seconds(np.arange(LENGTH_CAP + 1)))
        self.cdf = np.cumsum(check_domains(domain_weights, self.model.domains))
        self.tokens, self.prompt_low, self.prompt_high = check_query(tokens_per_query, prompt_tokens)
        every = np.arange(self.prompt_high + self.tokens + 1)
        self.dense_steps = self.steps(every)  # T(n) at every context
        # What the policy is shown: T(n) of the profile it was deployed with, when that is not the one
        # that costs the iterations (a profile measured again beside the live runs).
        self.dense_shown = self.dense_steps if observed is None else resolve_profile(observed).step_table(
            drafter, LENGTH_CAP, draft_shape)(every)
        self.num = num
        self.domain = np.zeros(num, dtype=np.int64)
        self.context = np.zeros(num, dtype=np.int64)
        self.remaining = np.zeros(num, dtype=np.int64)
        self.rows = np.arange(num)
        # A model with ``walk`` (trace replay) replays one recorded query per query, text position by
        # position from its first row (``TraceReplay.walk``): ``row`` is where each slot stands, ``moved``
        # the tokens its last iteration emitted.
        walks = hasattr(self.model, "walk")
        self.episode = np.zeros(num, dtype=np.int64) if walks else None
        self.row = np.zeros(num, dtype=np.int64) if walks else None
        self.moved = np.zeros(num, dtype=np.int64) if walks else None

    def start(self, rng: np.random.Generator, mask: np.ndarray) -> None:
        """Begin a new query in every slot of ``mask``: draw its domain, prompt length and recorded query."""
        k = int(mask.sum())
        domain = np.minimum(np.searchsorted(self.cdf, rng.random(k), side="right"), self.cdf.size - 1)
        self.domain[mask] = domain
        self.context[mask] = rng.integers(self.prompt_low, self.prompt_high + 1, size=k)
        self.remaining[mask] = self.tokens
        if self.episode is not None:
            self.episode[mask] = self.model.episodes(rng, domain)
            self.row[mask] = self.model.first_rows(rng, self.episode[mask])
            self.moved[mask] = 0

    def keep(self, mask: np.ndarray) -> None:
        """Drop every slot outside ``mask`` (between ``verify`` and ``draft``); new arrays, same order."""
        self.num = int(mask.sum())
        self.rows = np.arange(self.num)
        for name in ("domain", "context", "remaining", "episode", "row", "moved"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name)[mask])

    def draft(self, rng: np.random.Generator) -> None:
        """Draw every slot's next drafted iteration and its step times T(0..cap)."""
        if self.episode is None:
            self.draws = self.model.sample(rng, self.domain)
        else:
            self.row = np.where(self.moved > 0, self.model.walk(rng, self.row, self.moved), self.row)
            self.draws = self.model.at(self.row)
        self.step_seconds = np.take(self.dense_steps, self.context, axis=0)
        self.shown_seconds = np.take(self.dense_shown, self.context, axis=0)

    def verify(self, action: np.ndarray, drafted: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Verify the first ``action`` positions of each pending draft and commit the outcome.

        ``drafted``: the positions the drafter drafted before the policy chose (``rollout.run_length``
        decides it as the engine does; for a tree, 0 when drafting was skipped, else any n >= 1). The
        target verifies at most those, and drafting it did not verify is charged too (a chain's tokens
        past n; a whole tree whose verified part is empty). None: a chain drafts exactly what it
        verifies, a tree is drafted whenever ``action`` >= 1.
        """
        n = np.minimum(action, self.draws.drafted)
        if drafted is None:
            drafted = action if self.whole else n
        n = np.minimum(n, drafted)
        cost = self.draft_cost
        drafted = np.minimum(drafted, LENGTH_CAP)
        drafting = cost[drafted] + self.steering[drafted]
        seconds = self.step_seconds[self.rows, n] + drafting - cost[n]
        accepted = self.draws.accepted(n)
        if self.moved is not None:
            self.moved = accepted + 1
        tokens = np.minimum(accepted + 1, self.remaining)
        self.remaining -= tokens
        self.context += tokens
        return {
            "seconds": seconds,
            "draft_seconds": drafting,
            "accepted": accepted,
            "drafted": n,
            "available": self.draws.drafted,
            "tokens": tokens,
            "domain": self.domain.copy(),
            "done": self.remaining <= 0,
        }

    def observations(self) -> np.ndarray:
        """(N, LENGTH_DIM): row i equals ``length_features`` of slot i (the layout of LENGTH_SLICES)."""
        obs = np.empty((self.num, LENGTH_DIM))
        obs[:, LENGTH_SLICES["context_length"]] = self.context[:, None]
        obs[:, LENGTH_SLICES["confidences"]] = self.draws.confidences
        obs[:, LENGTH_SLICES["step_seconds"]] = self.shown_seconds
        return obs


class SpecLengthEnv(BatchEnv[int]):
    """
    ## Description

    How many drafted positions to send to the verifier at each decoding iteration. An episode is
    one query; a step is one iteration: the drafter has drafted (the observation shows its
    confidence in each position and what an iteration costs for every choice), the policy picks n,
    the target verifies the first n positions, accepts a prefix of them and emits one more token.
    Costs come from a cost profile (``core.cost_profile``), acceptance from an acceptance model
    (``simulator.acceptance``: trace replay or the parametric model). Positions of a tree drafter
    are its nodes ranked by path confidence (``policies.features``).

    ## Action Space

    ``Discrete(LENGTH_CAP + 1)``: n, the positions to verify. 0 is a plain decoding step (no draft
    sent, vanilla cost); n larger than what was drafted verifies all drafted positions.

    ## Observation Space

    ``policies.features.length_features``: a float64 array of shape (34,).

    | Num     | Observation                                                         | Min | Max |
    |---------|---------------------------------------------------------------------|-----|-----|
    | 0       | context length (tokens in the KV cache)                             | 0   | Inf |
    | 1..16   | c_1..c_16: confidence that position i is accepted given 1..i-1 were; | 0   | 1   |
    |         | 0 past the drafted positions                                        |     |     |
    | 17..33  | T(0)..T(16): seconds of the iteration if n positions are verified,  | 0   | Inf |
    |         | T(n) = T_draft(n) + T_verify(n + 1 nodes); T(0) = vanilla decode    |     |     |

    ## Rewards

    Minus the iteration's seconds, T(n) for the n actually verified, plus the drafting the policy did
    not verify and the policy's own work in the engine (the profile's ``steering`` series, when it has
    one and ``steered``), so the return of an episode is minus the query's latency.

    ## Starting State

    A new query: its domain drawn from ``domain_weights``, its prompt length uniform in
    ``prompt_tokens``, and its first drafted iteration. With trace replay the query also picks the
    recorded query whose iterations it replays (``TraceReplay.episodes``: that of a uniformly random
    text position of the domain), so acceptance stays as easy or as hard as one real query's; it walks
    that query's text from its first recorded iteration as the engine would (``TraceReplay.walk``).

    ## Episode End

    Termination when the query has emitted ``tokens_per_query`` tokens (every step emits at least
    one, so an episode has at most that many steps). No truncation.

    ## Arguments

    | Parameter          | Type                             | Default      | Description                     |
    |--------------------|----------------------------------|--------------|---------------------------------|
    | `profile`          | path, CostProfile or None        | None         | None: the paper-derived A100    |
    |                    |                                  |              | Llama-3.1-8B profile            |
    | `acceptance`       | AcceptanceModel, trace path, None| None         | None: ``default_acceptance()``; |
    |                    |                                  |              | a path: replay of that trace    |
    | `drafter`          | str                              | "specblock"  | drafter kind in the profile     |
    | `tokens_per_query` | int                              | 512          | tokens each query generates     |
    | `prompt_tokens`    | (int, int)                       | (128, 1024)  | prompt length range             |
    | `domain_weights`   | {domain: weight} or None         | None         | None: uniform over the model's  |
    | `draft_shape`      | {parameter: value}, a list of    | None         | a tree drafted whole each step  |
    |                    | them, or None                    |              | (``CostProfile.step_table``; a  |
    |                    |                                  |              | list costs its mean); None: a   |
    |                    |                                  |              | chain of n positions            |
    | `steered`          | bool                             | True         | charge the policy's own work    |
    |                    |                                  |              | (False: a drafter run as it is  |
    |                    |                                  |              | configured, no policy)          |
    | `observed`         | path, CostProfile or None        | None         | the profile whose T(n) the      |
    |                    |                                  |              | policy is shown (the one it was |
    |                    |                                  |              | deployed with); None: `profile` |

    ``info`` after each step: ``accepted`` (draft tokens accepted), ``drafted`` (positions
    verified), ``available`` (positions drafted), ``tokens`` (tokens emitted), ``seconds``,
    ``draft_seconds`` (the part of them spent drafting and steering) and ``domain`` (the query's
    domain name).

    ## Examples

    ```python
    >>> import gymnasium as gym
    >>> import simulator
    >>> env = gym.make("specblock/SpecLength-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(4)
    >>> envs = gym.make_vec("specblock/SpecLength-v0", num_envs=1024, vectorization_mode="vector_entry_point")

    ```
    """

    def __init__(self, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, steered: bool = True,
                 observed: ProfileArg = None) -> None:
        batch = SpecLengthBatch(1, profile, acceptance, drafter, tokens_per_query, prompt_tokens,
                                domain_weights, draft_shape, steered, observed)
        super().__init__(batch, *_spaces(), render_mode)

    def step(self, action: int) -> StepResult:
        """Verify ``action`` positions of the pending draft, then draft the next iteration."""
        self._check(action)
        out = self.batch.verify(np.array([action], dtype=np.int64))
        self.batch.draft(self.np_random)
        terminated = self._ended(out["done"])
        info = {key: int(out[key][0]) for key in ("accepted", "drafted", "available", "tokens")}
        info["seconds"], info["draft_seconds"] = float(out["seconds"][0]), float(out["draft_seconds"][0])
        info["domain"] = self.batch.model.domains[int(out["domain"][0])]
        return self._observation(), -info["seconds"], terminated, False, info

    def _observation(self) -> np.ndarray:
        """``length_features`` of the query."""
        b = self.batch
        return length_features(b.draws.confidences[0], int(b.context[0]), b.shown_seconds[0])


class SpecLengthVectorEnv(BatchVectorEnv):
    """``num_envs`` SpecLength queries stepped together; see :class:`SpecLengthEnv`."""

    def __init__(self, num_envs: int = 1, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, steered: bool = True,
                 observed: ProfileArg = None) -> None:
        batch = SpecLengthBatch(num_envs, profile, acceptance, drafter, tokens_per_query, prompt_tokens,
                                domain_weights, draft_shape, steered, observed)
        super().__init__(num_envs, batch, *_spaces(), render_mode)

    def step(self, actions: np.ndarray) -> VectorStepResult:
        """Verify each slot's chosen positions; slots that ended on the previous step start anew."""
        self._check(actions)
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


def _spaces() -> tuple[spaces.Discrete, spaces.Box]:
    """A SpecLength step's action and observation spaces."""
    low, high = length_bounds()
    return spaces.Discrete(LENGTH_CAP + 1), spaces.Box(low, high, dtype=np.float64)
