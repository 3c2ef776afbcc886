"""``specblock/AdaptStream-v0``: whether to spend compute updating the drafter online (SpecBlock
appendix A.3).

``AdaptStreamBatch`` is the batch core over N streams; ``AdaptStreamEnv`` is it with N = 1 and
``AdaptStreamVectorEnv`` with N slots (``simulator.env_base`` explains the layout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from core.cost_profile import UPDATE_KINDS, DraftShape, resolve_profile
from core.errors import InputError
from policies.adaptation import FULL, HEAD, SKIP
from policies.features import ADAPT_INDEX, adapt_bounds, adapt_features
from simulator.acceptance import check_domains
from simulator.adaptation import AdaptationDynamics, level_rates
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

Phases = Sequence[tuple[int, Mapping[str, float] | None]]
"""A stream's domain mix over time: (queries, {domain: weight}, None for equal shares) per phase."""

RECENT_ALPHA, LONG_ALPHA, SHARE_ALPHA = 0.3, 0.05, 0.1
"""EWMA weights of the adaptation observation: short and long tau, and the domain shares."""


def default_phases(domains: Sequence[str], queries: int = 2000) -> Phases:
    """A quarter of the stream from the first domain only, then equal shares of every domain."""
    first = max(queries // 4, 1)
    return ((first, {domains[0]: 1.0}), (queries - first, None)) if queries > first else ((queries, None),)


def slowdowns(overlap_slowdown: float | Mapping[str, float]) -> tuple[float, float]:
    """(head, full) slowdown of a query beside a training update: one factor for both kinds, or one per
    kind (``{"head": ..., "full": ...}``); each >= 1."""
    given = (overlap_slowdown if isinstance(overlap_slowdown, Mapping)
             else dict.fromkeys(UPDATE_KINDS, overlap_slowdown))
    if set(given) != set(UPDATE_KINDS) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1.0 for v in given.values()):
        raise InputError(f"overlap_slowdown = {overlap_slowdown!r} is invalid: use a factor >= 1, or one per "
                         f"update kind ({', '.join(UPDATE_KINDS)})")
    return tuple(float(given[kind]) for kind in UPDATE_KINDS)


class AdaptStreamBatch:
    """N query streams at once: the state and dynamics both AdaptStream environments run."""

    STATE = ("t", "served", "level", "good", "previous", "pending", "draft", "good_draft", "previous_draft",
             "pending_draft", "busy", "training", "waiting", "head", "full", "head_windows", "full_windows",
             "trigger", "since", "recent", "long", "shares")
    LEVELS = ("level", "good", "previous", "pending", "head", "full", "shares")  # per domain: (N, D)
    PROFILED = ("level", "good", "previous", "pending", "draft", "good_draft", "previous_draft",
                "pending_draft")
    """State that starts at the drafter as profiled (1); the rest starts at 0."""

    def __init__(self, num: int, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", draft_length: int = 8, tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 phases: Phases | None = None,
                 dynamics: AdaptationDynamics | None = None,
                 draft_shape: DraftShape | None = None, overlap: bool = False,
                 overlap_slowdown: float | Mapping[str, float] = 1.0) -> None:
        self.overlap = bool(overlap)
        # indexed by action, as ``capacity``: a query's slowdown beside the kind of update training
        self.slowdown = np.array([1.0, *slowdowns(overlap_slowdown)])
        self.profile = resolve_profile(profile)
        self.model = resolve_acceptance(acceptance)
        if not 1 <= draft_length <= self.model.cap:
            raise InputError(f"draft_length = {draft_length} is invalid: use 1..{self.model.cap}")
        self.draft_length = int(draft_length)
        self.dynamics = dynamics or AdaptationDynamics()
        self.tokens, self.prompt_low, self.prompt_high = check_query(tokens_per_query, prompt_tokens)
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
        self.state = {name: np.zeros((num, d) if name in self.LEVELS else num) for name in self.STATE}

    def start(self, mask: np.ndarray) -> None:
        """Begin a new stream in every slot of ``mask``: the drafter as profiled, empty buffers."""
        for name, values in self.state.items():
            values[mask] = 1.0 if name in self.PROFILED else 0.0

    def checkpoint(self, mask: np.ndarray, previous: bool = False) -> None:
        """Remember the current drafter of the slots in ``mask`` as their last good one; with ``previous``,
        the one that served before the last step's update (the drafter a window closed early measured)."""
        level, draft = ("previous", "previous_draft") if previous else ("level", "draft")
        self.state["good"][mask] = self.state[level][mask]
        self.state["good_draft"][mask] = self.state[draft][mask]

    def revert(self, mask: np.ndarray) -> None:
        """Restore the last good drafter of the slots in ``mask`` (an update still training is dropped)."""
        self.state["level"][mask] = self.state["good"][mask]
        self.state["draft"][mask] = self.state["good_draft"][mask]
        self.state["waiting"][mask] = 0.0

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
        s["previous"], s["previous_draft"] = s["level"].copy(), s["draft"].copy()
        # overlapped: an update that finished during the last query goes live now; one still training
        # refuses another (the engine's trainer thread is busy)
        ready = (s["waiting"] > 0) & (s["busy"] <= 0)
        s["level"] = np.where(ready[:, None], s["pending"], s["level"])
        s["draft"] = np.where(ready, s["pending_draft"], s["draft"])
        s["waiting"][ready] = 0.0
        runs = (action != SKIP) & (used_total > 0) & (s["busy"] <= 0)
        fill = np.minimum(used_total / self.capacity[action], 1.0)
        share = used / np.where(used_total > 0, used_total, 1.0)[:, None]
        moved = dyn.updated(rng, s["level"], is_full, fill, share)
        moved_draft = dyn.updated_draft(s["draft"], is_full, fill)
        windows = np.where(is_full, s["full_windows"], s["head_windows"])
        cost = np.where(is_full, self.profile.update_cost("full", fill, windows),
                        self.profile.update_cost("head", fill, windows))
        train_seconds = np.where(runs, cost, 0.0)
        if self.overlap:
            s["pending"] = np.where(runs[:, None], moved, s["pending"])
            s["pending_draft"] = np.where(runs, moved_draft, s["pending_draft"])
            s["busy"] = np.where(runs, cost, s["busy"])
            s["training"] = np.where(runs, action, s["training"])
            s["waiting"][runs] = 1.0
            update_seconds = np.zeros(k)
        else:
            s["level"] = np.where(runs[:, None], moved, s["level"])
            s["draft"] = np.where(runs, moved_draft, s["draft"])
            update_seconds = train_seconds
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
        if self.overlap:  # the part of the query beside a training update runs its kind's slowdown slower
            slow = self.slowdown[s["training"].astype(np.int64)]
            beside = np.minimum(s["busy"], seconds * slow)
            seconds = beside + (seconds - beside / slow)
            s["busy"] = np.maximum(s["busy"] - seconds, 0.0)
        cut = np.clip(self.model.query_rejection_rates(rng, domain), 0.0, 1.0)  # each buffers a position
        rejected = rng.binomial(iterations.astype(np.int64), cut)
        head = rejected if dyn.head_share is None else rng.binomial(rejected, dyn.head_share)
        routed = {"head": head, "full": rejected if dyn.head_share is None else rejected - head}
        for name in ("head", "full"):
            s[name], s[f"{name}_windows"] = _push(s[name], s[f"{name}_windows"], rows, domain, routed[name],
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
            "train_seconds": train_seconds,
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


class AdaptStreamEnv(BatchEnv[int]):
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
    | `overlap`          | bool                              | False       | updates train beside decoding  |
    | `overlap_slowdown` | float or {"head": f, "full": f}   | 1.0         | queries' slowdown beside an    |
    |                    |                                   |             | update (one, or per kind)      |

    With ``overlap`` (training on its own core or device, as ``real_engine.stream_server`` runs it) an
    update costs the query nothing directly: it trains for its update time while queries decode, those
    queries run its kind's ``overlap_slowdown`` times slower while it does, its result goes live at the
    first query after it ends, and no other update starts before then (a revert drops it).

    A query costs its iterations times the mean iteration time over how many positions iterations
    verify (``verified_shares`` of the acceptance model: a replayed drafter that drafted fewer than
    ``draft_length`` positions verifies fewer); a tree (``draft_shape``) is drafted whole every
    iteration, whatever it verifies.

    ``info`` after each step (``policies.adaptation.ADAPT_INFO_KEYS`` and more):
    ``tokens_per_second`` (the query's tokens over its seconds, the update excluded), ``tau``,
    ``query_seconds``, ``update_seconds`` (charged to the query), ``train_seconds`` (the update's own),
    ``updated`` (whether an update started) and ``domain``.
    ``checkpoint()`` and ``revert()`` save and restore the drafter, for policies that ask to revert;
    ``checkpoint(previous=True)`` saves the one that served before the last step's update.

    ## Examples

    ```python
    >>> import gymnasium as gym
    >>> import simulator
    >>> env = gym.make("specblock/AdaptStream-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(0)

    ```
    """

    def __init__(self, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", draft_length: int = 8, tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 phases: Phases | None = None,
                 dynamics: AdaptationDynamics | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, overlap: bool = False,
                 overlap_slowdown: float | Mapping[str, float] = 1.0) -> None:
        batch = AdaptStreamBatch(1, profile, acceptance, drafter, draft_length, tokens_per_query,
                                 prompt_tokens, phases, dynamics, draft_shape, overlap, overlap_slowdown)
        super().__init__(batch, *_spaces(batch), render_mode)

    def _begin(self, mask: np.ndarray) -> None:
        """Start a new stream: the drafter as profiled, empty buffers (nothing is drawn)."""
        self.batch.start(mask)

    def step(self, action: int) -> StepResult:
        """Run the chosen update, then serve the next query of the stream."""
        self._check(action)
        out = self.batch.serve(self.np_random, np.array([action], dtype=np.int64), np.arange(1))
        terminated = self._ended(out["done"])
        info: dict[str, Any] = {key: float(out[key][0]) for key in
                                ("tokens_per_second", "tau", "query_seconds", "update_seconds",
                                 "train_seconds")}
        info["updated"] = bool(out["updated"][0])
        info["domain"] = self.batch.model.domains[int(out["domain"][0])]
        return self._observation(), float(out["reward"][0]), terminated, False, info

    def checkpoint(self, previous: bool = False) -> None:
        """Save the current drafter as the last good one (``previous``: the one before the last step's
        update)."""
        self.batch.checkpoint(np.ones(1, dtype=bool), previous)

    def revert(self) -> None:
        """Restore the last good drafter."""
        self.batch.revert(np.ones(1, dtype=bool))

    def _observation(self) -> np.ndarray:
        """``adapt_features`` of the stream."""
        s = self.batch.state
        head_fill, full_fill = self.batch.fills()
        return adapt_features(float(head_fill[0]), float(full_fill[0]), float(s["trigger"][0]),
                              float(s["recent"][0]), float(s["recent"][0] - s["long"][0]), int(s["since"][0]),
                              s["shares"][0])


class AdaptStreamVectorEnv(BatchVectorEnv):
    """``num_envs`` AdaptStream streams stepped together; see :class:`AdaptStreamEnv`."""

    def __init__(self, num_envs: int = 1, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", draft_length: int = 8, tokens_per_query: int = DEFAULT_TOKENS,
                 prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 phases: Phases | None = None,
                 dynamics: AdaptationDynamics | None = None, render_mode: str | None = None,
                 draft_shape: DraftShape | None = None, overlap: bool = False,
                 overlap_slowdown: float | Mapping[str, float] = 1.0) -> None:
        batch = AdaptStreamBatch(num_envs, profile, acceptance, drafter, draft_length, tokens_per_query,
                                 prompt_tokens, phases, dynamics, draft_shape, overlap, overlap_slowdown)
        super().__init__(num_envs, batch, *_spaces(batch), render_mode)

    def _begin(self, mask: np.ndarray) -> None:
        """Start a new stream in every slot of ``mask`` (nothing is drawn)."""
        self.batch.start(mask)

    def step(self, actions: np.ndarray) -> VectorStepResult:
        """Run each slot's update and serve its next query; slots that ended start a new stream."""
        self._check(actions)
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


def _spaces(batch: AdaptStreamBatch) -> tuple[spaces.Discrete, spaces.Box]:
    """An AdaptStream step's action and observation spaces (one share per domain of the core's model)."""
    low, high = adapt_bounds(len(batch.model.domains))
    return spaces.Discrete(3), spaces.Box(low, high, dtype=np.float64)
