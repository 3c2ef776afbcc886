"""Gymnasium environments of the simulator: how much to speculate, and when to update the drafter.

Each environment runs on a batch core (numpy arrays over N queries or streams). The single
environment here is the core with N = 1; the vector environment in ``simulator.vector_envs`` is the
same core with N slots, so both follow one code path and, with one slot, draw the same random
numbers. Observations are built with ``policies.features``, as in the live engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from core.cost_profile import CostProfile, DraftShape, resolve_profile, token_by_token
from core.errors import InputError
from policies.adaptation import FULL, HEAD, SKIP
from policies.features import (
    ADAPT_INDEX,
    LENGTH_CAP,
    LENGTH_DIM,
    LENGTH_SLICES,
    adapt_bounds,
    adapt_features,
    length_bounds,
    length_features,
)
from simulator.acceptance import AcceptanceModel, check_domains
from simulator.adaptation import AdaptationDynamics, level_rates
from simulator.replay import resolve_acceptance

DEFAULT_TOKENS = 512
DEFAULT_PROMPT = (128, 1024)
RECENT_ALPHA, LONG_ALPHA, SHARE_ALPHA = 0.3, 0.05, 0.1
"""EWMA weights of the adaptation observation: short and long tau, and the domain shares."""

ProfileArg = str | Path | CostProfile | None
AcceptanceArg = str | Path | AcceptanceModel | None
Phases = Sequence[tuple[int, Mapping[str, float] | None]]
ResetResult = tuple[np.ndarray, dict[str, Any]]
StepResult = tuple[np.ndarray, float, bool, bool, dict[str, Any]]


def _check_query(tokens_per_query: int, prompt_tokens: Sequence[int]) -> tuple[int, int, int]:
    """Validated (tokens per query, shortest prompt, longest prompt)."""
    if isinstance(tokens_per_query, bool) or not isinstance(tokens_per_query, (int, np.integer)) \
            or tokens_per_query < 1:
        raise InputError(f"tokens_per_query = {tokens_per_query!r} is invalid: use an integer >= 1")
    low, high = (int(v) for v in prompt_tokens)
    if not 0 <= low <= high:
        raise InputError(f"prompt_tokens = {tuple(prompt_tokens)} is invalid: "
                         "use (low, high) with 0 <= low <= high")
    return int(tokens_per_query), low, high


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
        self.tokens, self.prompt_low, self.prompt_high = _check_query(tokens_per_query, prompt_tokens)
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
        # A model with ``episodes`` (trace replay) keeps each query inside one recorded query.
        self.episode = np.zeros(num, dtype=np.int64) if hasattr(self.model, "episodes") else None

    def start(self, rng: np.random.Generator, mask: np.ndarray) -> None:
        """Begin a new query in every slot of ``mask``: draw its domain, prompt length and recorded query."""
        k = int(mask.sum())
        domain = np.minimum(np.searchsorted(self.cdf, rng.random(k), side="right"), self.cdf.size - 1)
        self.domain[mask] = domain
        self.context[mask] = rng.integers(self.prompt_low, self.prompt_high + 1, size=k)
        self.remaining[mask] = self.tokens
        if self.episode is not None:
            self.episode[mask] = self.model.episodes(rng, domain)

    def keep(self, mask: np.ndarray) -> None:
        """Drop every slot outside ``mask`` (between ``verify`` and ``draft``); new arrays, same order."""
        self.num = int(mask.sum())
        self.rows = np.arange(self.num)
        for name in ("domain", "context", "remaining", "episode"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name)[mask])

    def draft(self, rng: np.random.Generator) -> None:
        """Draw every slot's next drafted iteration and its step times T(0..cap)."""
        if self.episode is None:
            self.draws = self.model.sample(rng, self.domain)
        else:
            self.draws = self.model.sample(rng, self.domain, self.episode)
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


class SpecLengthEnv(gym.Env[np.ndarray, int]):
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
    text position of the domain), so acceptance stays as easy or as hard as one real query's.

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

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, steered: bool = True,
                 observed: ProfileArg = None) -> None:
        self.batch = SpecLengthBatch(1, profile, acceptance, drafter, tokens_per_query, prompt_tokens,
                                     domain_weights, draft_shape, steered, observed)
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(LENGTH_CAP + 1)
        low, high = length_bounds()
        self.observation_space = spaces.Box(low, high, dtype=np.float64)
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Start a new query (seeded by ``seed`` when given)."""
        super().reset(seed=seed)
        self.batch.start(self.np_random, np.ones(1, dtype=bool))
        self.batch.draft(self.np_random)
        self._running = True
        return self._observation(), {}

    def step(self, action: int) -> StepResult:
        """Verify ``action`` positions of the pending draft, then draft the next iteration."""
        assert self.action_space.contains(action), f"{action!r} ({type(action)}) invalid"
        assert self._running, "Call reset before using step method."
        out = self.batch.verify(np.array([action], dtype=np.int64))
        self.batch.draft(self.np_random)
        terminated = bool(out["done"][0])
        self._running = not terminated
        info = {key: int(out[key][0]) for key in ("accepted", "drafted", "available", "tokens")}
        info["seconds"], info["draft_seconds"] = float(out["seconds"][0]), float(out["draft_seconds"][0])
        info["domain"] = self.batch.model.domains[int(out["domain"][0])]
        return self._observation(), -info["seconds"], terminated, False, info

    def _observation(self) -> np.ndarray:
        b = self.batch
        return length_features(b.draws.confidences[0], int(b.context[0]), b.shown_seconds[0])


def default_phases(domains: Sequence[str], queries: int = 2000) -> Phases:
    """A quarter of the stream from the first domain only, then equal shares of every domain."""
    first = max(queries // 4, 1)
    return ((first, {domains[0]: 1.0}), (queries - first, None)) if queries > first else ((queries, None),)


class AdaptStreamBatch:
    """N query streams at once: the state and dynamics both AdaptStream environments run."""

    STATE = ("t", "served", "level", "good", "draft", "good_draft", "head", "full", "head_windows",
             "full_windows", "trigger", "since", "recent", "long", "shares")

    def __init__(self, num: int, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", draft_length: int = 8, tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 phases: Phases | None = None,
                 dynamics: AdaptationDynamics | None = None,
                 draft_shape: DraftShape | None = None) -> None:
        self.profile = resolve_profile(profile)
        self.model = resolve_acceptance(acceptance)
        if not 1 <= draft_length <= self.model.cap:
            raise InputError(f"draft_length = {draft_length} is invalid: use 1..{self.model.cap}")
        self.draft_length = int(draft_length)
        self.dynamics = dynamics or AdaptationDynamics()
        self.tokens, self.prompt_low, self.prompt_high = _check_query(tokens_per_query, prompt_tokens)
        self.survival = self.model.survival(self.draft_length)
        self.steps = self.profile.step_table(drafter, self.draft_length, draft_shape)
        self.verified = self.model.verified_shares(self.draft_length)  # (domains, n): iterations verifying n
        # A tree is drafted whole every iteration, also where fewer of its nodes (or none) are verified.
        draft = self.profile.draft_row(drafter, self.draft_length, draft_shape)
        self.unverified = draft[-1] - draft if draft_shape is not None else np.zeros_like(draft)
        self.drafting = draft + self.unverified  # an iteration's drafting seconds, by positions verified
        # indexed by action: the buffer an update trains on (skip's entry is never used)
        self.capacity = np.array([1.0, self.dynamics.head_capacity, self.dynamics.full_capacity])
        rows = []
        for length, weights in phases or default_phases(self.model.domains):
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
                raise InputError(f"phase length {length!r} is invalid: give each phase >= 1 queries")
            cdf = np.cumsum(check_domains(weights, self.model.domains))
            rows.append(np.repeat(cdf[None], length, axis=0))
        self.cdf = np.concatenate(rows)
        self.queries = self.cdf.shape[0]
        self.num = num
        d = len(self.model.domains)
        self.state = {name: np.zeros((num, d) if name in ("level", "good", "head", "full", "shares") else num)
                      for name in self.STATE}

    def start(self, mask: np.ndarray) -> None:
        """Begin a new stream in every slot of ``mask``: the drafter as profiled, empty buffers."""
        for name, values in self.state.items():
            values[mask] = 1.0 if name in ("level", "good", "draft", "good_draft") else 0.0

    def checkpoint(self, mask: np.ndarray) -> None:
        """Remember the current drafter of the slots in ``mask`` as their last good one."""
        self.state["good"][mask] = self.state["level"][mask]
        self.state["good_draft"][mask] = self.state["draft"][mask]

    def revert(self, mask: np.ndarray) -> None:
        """Restore the last good drafter of the slots in ``mask``."""
        self.state["level"][mask] = self.state["good"][mask]
        self.state["draft"][mask] = self.state["good_draft"][mask]

    def fills(self) -> tuple[np.ndarray, np.ndarray]:
        """(head fill, full fill) of every slot, fractions of the buffer capacities."""
        s, cap = self.state, self.capacity
        return np.minimum(s["head"].sum(1) / cap[HEAD], 1.0), np.minimum(s["full"].sum(1) / cap[FULL], 1.0)

    def serve(self, rng: np.random.Generator, action: np.ndarray, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Run each slot's update (``action``), then serve its next query, for the slots ``idx``."""
        s = {name: values[idx] for name, values in self.state.items()}
        k, rows, dyn = idx.size, np.arange(idx.size), self.dynamics
        action = np.asarray(action)[idx]
        is_full = action == FULL
        used = np.where(is_full[:, None], s["full"], s["head"])
        used_total = used.sum(1)
        runs = (action != SKIP) & (used_total > 0)
        fill = np.minimum(used_total / self.capacity[action], 1.0)
        share = used / np.where(used_total > 0, used_total, 1.0)[:, None]
        moved = dyn.updated(rng, s["level"], is_full, fill, share)
        s["level"] = np.where(runs[:, None], moved, s["level"])
        s["draft"] = np.where(runs, dyn.updated_draft(s["draft"], is_full, fill), s["draft"])
        windows = np.where(is_full, s["full_windows"], s["head_windows"])
        cost = np.where(is_full, self.profile.update_cost("full", fill, windows),
                        self.profile.update_cost("head", fill, windows))
        update_seconds = np.where(runs, cost, 0.0)
        for name in ("head", "head_windows"):
            s[name][runs] = 0.0
        for name in ("full", "full_windows"):
            s[name][runs & is_full] = 0.0
        s["trigger"][runs] = 0.0
        s["since"][runs] = 0.0

        cdf = self.cdf[np.minimum(s["t"], self.queries - 1).astype(np.int64)]
        domain = np.minimum((rng.random(k)[:, None] >= cdf).sum(1), cdf.shape[1] - 1)
        prompt = rng.integers(self.prompt_low, self.prompt_high + 1, size=k)
        noise = rng.standard_normal(k)
        accepted = level_rates(self.survival[domain], s["level"][rows, domain])
        sigma = dyn.query_noise
        tau = np.clip((1.0 + accepted) * np.exp(sigma * noise - sigma**2 / 2), 1.0, 1.0 + self.draft_length)
        iterations = np.ceil(self.tokens / tau)
        redrafted = (s["draft"] - 1.0)[:, None] * self.drafting  # updates changed the drafter's trees
        step = self.steps(prompt + self.tokens / 2) + self.unverified + redrafted
        seconds = iterations * (step * self.verified[domain]).sum(1) + self.profile.prefill_cost(prompt)
        cut = np.clip(self.model.query_rejection_rates(rng, domain), 0.0, 1.0)  # each buffers a position
        rejected = rng.binomial(iterations.astype(np.int64), cut)
        for name in ("head", "full"):
            s[name], s[f"{name}_windows"] = _push(s[name], s[f"{name}_windows"], rows, domain, rejected,
                                                  self.capacity[HEAD if name == "head" else FULL])
        s["trigger"] += rejected
        s["since"] += 1
        tau = self.tokens / iterations
        first = s["served"] == 0
        s["recent"] = np.where(first, tau, (1 - RECENT_ALPHA) * s["recent"] + RECENT_ALPHA * tau)
        s["long"] = np.where(first, tau, (1 - LONG_ALPHA) * s["long"] + LONG_ALPHA * tau)
        onehot = np.eye(cdf.shape[1])[domain]
        s["shares"] = np.where(first[:, None], onehot, (1 - SHARE_ALPHA) * s["shares"] + SHARE_ALPHA * onehot)
        s["served"] += 1
        s["t"] += 1
        for name, values in s.items():
            self.state[name][idx] = values
        return {
            "reward": -(seconds + update_seconds),
            "tokens_per_second": self.tokens / seconds,
            "tau": tau,
            "query_seconds": seconds,
            "update_seconds": update_seconds,
            "updated": runs,
            "domain": domain,
            "done": s["t"] >= self.queries,
        }

    def observations(self) -> np.ndarray:
        """(N, features): row i equals ``adapt_features`` of slot i (layout of ADAPT_INDEX)."""
        s = self.state
        d = s["shares"].shape[1]
        obs = np.empty((self.num, len(ADAPT_INDEX) + d))
        obs[:, ADAPT_INDEX["head_fill"]], obs[:, ADAPT_INDEX["full_fill"]] = self.fills()
        obs[:, ADAPT_INDEX["trigger"]] = s["trigger"]
        obs[:, ADAPT_INDEX["recent_tau"]] = s["recent"]
        obs[:, ADAPT_INDEX["tau_trend"]] = s["recent"] - s["long"]
        obs[:, ADAPT_INDEX["queries_since_update"]] = s["since"]
        obs[:, len(ADAPT_INDEX):] = s["shares"]
        return obs


def _push(buffer: np.ndarray, windows: np.ndarray, rows: np.ndarray, domain: np.ndarray, added: np.ndarray,
          capacity: float) -> tuple[np.ndarray, np.ndarray]:
    """Add ``added`` rejected positions of ``domain`` (one query: one window) to each row's buffer, the
    oldest leaving past capacity (and with them the same share of the query windows)."""
    total = buffer.sum(1)
    keep = np.clip(capacity - added, 0.0, total) / np.where(total > 0, total, 1.0)
    buffer = buffer * keep[:, None]
    buffer[rows, domain] += np.minimum(added, capacity)
    return buffer, windows * keep + (added > 0)


class AdaptStreamEnv(gym.Env[np.ndarray, int]):
    """
    ## Description

    Whether to spend compute updating the drafter online (SpecBlock appendix A.3). A step is one
    query of a mixed-domain stream whose mix shifts (by default: a quarter of the stream from the
    first domain only, then equal shares of all). Verification leaves rejected positions with their
    target distributions (one per iteration whose draft was cut short, at the rate of a recorded
    query of the domain: ``query_rejection_rates``); they fill a head buffer and a full buffer.
    Before each query the policy chooses to skip, to train the head on the head buffer, or to train
    the whole drafter on the full buffer; an update moves each domain's acceptance toward a ceiling
    in proportion to that domain's share of the buffer, with diminishing returns and a small chance
    of harm (``simulator.adaptation.AdaptationDynamics``; its ``head_draft`` and ``full_draft`` move
    the drafting time the same way), and costs the profile's update time (per query window the
    buffer holds, see Rewards). Queries then run at the drafter's current acceptance with the
    profile's iteration time.

    ## Action Space

    ``Discrete(3)``: 0 skip, 1 head update, 2 full update (a full update empties both buffers, a
    head update the head buffer; an update on an empty buffer does nothing and costs nothing).

    ## Observation Space

    ``policies.features.adapt_features``: float64, ``6 + domains`` entries.

    | Num | Observation                                                          | Min  | Max |
    |-----|----------------------------------------------------------------------|------|-----|
    | 0   | head_fill: head-buffer fill, fraction of its capacity                | 0    | 1   |
    | 1   | full_fill: full-buffer fill, fraction of its capacity                | 0    | 1   |
    | 2   | trigger: rejected positions buffered since the last update           | 0    | Inf |
    | 3   | recent_tau: EWMA (weight 0.3) of each query's tau                    | 0    | Inf |
    | 4   | tau_trend: recent_tau minus a slow EWMA (weight 0.05)                | -Inf | Inf |
    | 5   | queries_since_update                                                 | 0    | Inf |
    | 6.. | share of each domain among recent queries (EWMA, weight 0.1)         | 0    | 1   |

    ## Rewards

    Minus the query's seconds plus the seconds of the update run before it. A query's seconds are
    its iterations' and its start (``CostProfile.prefill_cost`` of its prompt: the target's prefill
    and the drafter's begin, when the profile measured them). An update costs
    ``CostProfile.update_cost`` of the query windows in the buffer it trained on (every query that
    buffered a rejection adds one; positions evicted past capacity take their share of windows with
    them): linear between the profile's one-window and full-buffer times, or per window, or for a
    profile without window counts its full-buffer time times the buffer's fill.

    ## Starting State

    The drafter as profiled (every domain's level 1), empty buffers, an all-zero observation.

    ## Episode End

    Termination after the stream's last query (the sum of the phase lengths). No truncation.

    ## Arguments

    | Parameter          | Type                              | Default     | Description                    |
    |--------------------|-----------------------------------|-------------|--------------------------------|
    | `profile`          | path, CostProfile or None         | None        | None: the paper-derived A100   |
    | `acceptance`       | AcceptanceModel, trace path, None | None        | its ``survival`` gives each    |
    |                    |                                   |             | domain's per-position rates    |
    | `drafter`          | str                               | "specblock" | drafter kind in the profile    |
    | `draft_length`     | int                               | 8           | positions verified per step    |
    | `tokens_per_query` | int                               | 512         | tokens each query generates    |
    | `prompt_tokens`    | (int, int)                        | (128, 1024) | prompt length range            |
    | `phases`           | [(queries, {domain: weight})]     | None        | ``default_phases`` (2000); a   |
    |                    |                                   |             | None weight: equal shares      |
    | `dynamics`         | AdaptationDynamics or None        | None        | update effects, buffer sizes   |
    | `draft_shape`      | as SpecLength's                   | None        | None: a chain of the verified  |
    |                    |                                   |             | positions; else a tree's shape |

    A query costs its iterations times the mean iteration time over how many positions iterations
    verify (``verified_shares`` of the acceptance model: a replayed drafter that drafted fewer than
    ``draft_length`` positions verifies fewer); a tree (``draft_shape``) is drafted whole every
    iteration, whatever it verifies.

    ``info`` after each step (``policies.adaptation.ADAPT_INFO_KEYS`` and more):
    ``tokens_per_second`` (the query's tokens over its seconds, the update excluded), ``tau``,
    ``query_seconds``, ``update_seconds``, ``updated`` (whether an update ran) and ``domain``.
    ``checkpoint()`` and ``revert()`` save and restore the drafter, for policies that ask to revert.

    ## Examples

    ```python
    >>> import gymnasium as gym
    >>> import simulator
    >>> env = gym.make("specblock/AdaptStream-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(0)

    ```
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", draft_length: int = 8, tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 phases: Phases | None = None,
                 dynamics: AdaptationDynamics | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None) -> None:
        self.batch = AdaptStreamBatch(1, profile, acceptance, drafter, draft_length, tokens_per_query,
                                      prompt_tokens, phases, dynamics, draft_shape)
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(3)
        low, high = adapt_bounds(len(self.batch.model.domains))
        self.observation_space = spaces.Box(low, high, dtype=np.float64)
        self._running = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Start a new stream (seeded by ``seed`` when given)."""
        super().reset(seed=seed)
        self.batch.start(np.ones(1, dtype=bool))
        self._running = True
        return self._observation(), {}

    def step(self, action: int) -> StepResult:
        """Run the chosen update, then serve the next query of the stream."""
        assert self.action_space.contains(action), f"{action!r} ({type(action)}) invalid"
        assert self._running, "Call reset before using step method."
        out = self.batch.serve(self.np_random, np.array([action], dtype=np.int64), np.arange(1))
        terminated = bool(out["done"][0])
        self._running = not terminated
        info: dict[str, Any] = {key: float(out[key][0]) for key in
                                ("tokens_per_second", "tau", "query_seconds", "update_seconds")}
        info["updated"] = bool(out["updated"][0])
        info["domain"] = self.batch.model.domains[int(out["domain"][0])]
        return self._observation(), float(out["reward"][0]), terminated, False, info

    def checkpoint(self) -> None:
        """Save the current drafter as the last good one."""
        self.batch.checkpoint(np.ones(1, dtype=bool))

    def revert(self) -> None:
        """Restore the last good drafter."""
        self.batch.revert(np.ones(1, dtype=bool))

    def _observation(self) -> np.ndarray:
        s = self.batch.state
        head_fill, full_fill = self.batch.fills()
        return adapt_features(float(head_fill[0]), float(full_fill[0]), float(s["trigger"][0]),
                              float(s["recent"][0]), float(s["recent"][0] - s["long"][0]), int(s["since"][0]),
                              s["shares"][0])
