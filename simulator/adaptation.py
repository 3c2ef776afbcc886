"""Adaptation dynamics: per-domain acceptance levels that drafter updates move (AdaptStream).

``AdaptationDynamics`` holds the levels' law (defaults from the SpecBlock paper); ``fit_adaptation``
estimates it from streams the engine served (``AdaptRecord``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
from scipy.optimize import minimize

from core.errors import InputError
from policies.adaptation import FULL, SKIP

ADAPT_BOUNDS = {"head_reach": (-1.0, 1.0), "head_overfit": (0.0, 2.0), "head_draft": (0.25, 4.0),
                "full_draft": (0.25, 4.0)}
"""``AdaptationDynamics`` fields whose range is not [0, 1] (capacities and noise: [0, inf))."""


@dataclass(frozen=True)
class AdaptationDynamics:
    """How drafter updates move each domain's acceptance; the defaults come from the SpecBlock paper.

    A domain's level ``m`` multiplies every position's rejection probability (1 = the drafter as
    profiled). An update trained on a buffer moves ``m`` toward ``1 - headroom`` (full) or
    ``1 - head_reach * headroom`` (head only) by ``rate * fill * share`` of the remaining gap, where
    ``share`` is the domain's share of the buffer: diminishing returns, and nothing for domains the
    buffer does not hold unless ``transfer`` > 0, the part of every update that reaches all domains
    alike (the drafter learns the target's style, not only the buffered domains: on the engine's
    2,000-query stream, full updates trained mostly on code raised prose and text's tau the most).
    Updates move ``m`` toward their floor from either side: a head update after full ones can give
    back part of their gain. A head update's reach is ``head_reach - head_overfit * (1 - fill)``
    (clipped to [-1, 1]): a head retrained on a few positions overfits them, and a negative reach makes
    head updates converge on a worse drafter than the profiled one (the engine's does that when its
    head is retrained on one query's positions after every query). With probability ``harm_probability``
    an update hurts instead, raising ``m`` by ``harm_size * rate * fill * share * headroom`` (``share``
    with ``transfer`` mixed in, as for a gain).
    ``headroom`` is set so that a fully adapted drafter gains about 0.26 tau at 8 positions over the
    default domains (the paper: +0.22..0.30 after 8 adaptation epochs); the full update's larger
    reach matches the paper's slightly higher tau without the head-only action (4.58 vs 4.54); fast
    rates (returns diminish within a few updates) let a cost-aware policy beat updating after every
    query, as in the paper. Rates,
    reach, harm and buffer sizes are not given by the paper (assumed) until the engine fits them.
    ``head_capacity`` and ``full_capacity`` count rejected positions a buffer holds (fill 1 when
    full); ``query_noise`` is the log-normal spread of one query's tau around its expectation.

    ``head_draft`` and ``full_draft`` say how updates move the cost of the drafter's trees, relative to
    its drafting time as profiled (1: updates leave it as profiled): retraining SpecBlock's rank head
    changes how many blocks and start nodes its trees take, so what drafting and verifying them cost.
    A head update moves the ratio toward ``head_draft`` by ``fill`` of the gap; a full update scales it
    by ``1 + fill * (full_draft - 1)``, so full updates compound and keep what head updates did (the
    engine's full updates barely widen the trees, and leave a retrained rank head's widening in
    place). Their rate is the buffer's fill alone, so that they stay identified whatever the
    acceptance fit says about the rates.

    ``head_share`` routes each rejected position to one buffer, the head one with that probability (the
    engine's rank rule, ``real_engine.feedback``, measured on its streams); None puts every position in
    both buffers (the paper does not say how its signals divide).
    """

    headroom: float = 0.10
    head_reach: float = 0.6
    head_rate: float = 0.5
    full_rate: float = 0.8
    harm_probability: float = 0.05
    harm_size: float = 0.5
    head_capacity: int = 128
    full_capacity: int = 1024
    query_noise: float = 0.1
    head_draft: float = 1.0
    full_draft: float = 1.0
    head_share: float | None = None
    transfer: float = 0.0
    head_overfit: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "head_share":
                continue
            unbounded = f.name.endswith(("capacity", "noise"))
            low, high = ADAPT_BOUNDS.get(f.name, (0.0, np.inf if unbounded else 1.0))
            if isinstance(value, bool) or not low <= value <= high:
                raise InputError(f"AdaptationDynamics.{f.name} = {value!r} is out of range: use "
                                 f"[{low}, {high}]")
        if self.head_capacity < 1 or self.full_capacity < 1:
            raise InputError("buffer capacities must be >= 1 rejected position")

    def updated(self, rng: np.random.Generator, level: np.ndarray, full: np.ndarray, fill: np.ndarray,
                share: np.ndarray) -> np.ndarray:
        """Levels (N, D) after one update per stream: ``full`` (N,) bool picks full vs head, ``fill``
        (N,) is the used buffer's fill in [0, 1], ``share`` (N, D) its domain composition."""
        rate = np.where(full, self.full_rate, self.head_rate)
        reach = np.clip(self.head_reach - self.head_overfit * (1.0 - fill), -1.0, 1.0)
        floor = 1.0 - self.headroom * np.where(full, 1.0, reach)
        push = (rate * fill)[:, None] * (self.transfer + (1.0 - self.transfer) * share)
        harm = rng.random(level.shape[0]) < self.harm_probability
        gain = push * (floor[:, None] - level)
        return level + np.where(harm[:, None], self.harm_size * push * self.headroom, gain)

    def updated_draft(self, draft: np.ndarray, full: np.ndarray, fill: np.ndarray) -> np.ndarray:
        """Drafting-time ratios (N,) after one update per stream (``full`` and ``fill`` as in
        ``updated``)."""
        return np.where(full, draft * (1.0 + fill * (self.full_draft - 1.0)),
                        draft + fill * (self.head_draft - draft))


def level_rates(survival: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Expected accepted tokens at acceptance levels ``level``.

    ``survival`` (..., n + 1) gives the drafter's conditional rates ``S(i) / S(i-1)``; a level ``m``
    turns each rejection probability ``1 - rate`` into ``m (1 - rate)``. Shapes broadcast.
    """
    rates = np.divide(survival[..., 1:], survival[..., :-1], out=np.zeros_like(survival[..., 1:]),
                      where=survival[..., :-1] > 0)
    reach = np.cumprod(np.clip(1.0 - np.asarray(level)[..., None] * (1.0 - rates), 0.0, 1.0), axis=-1)
    return reach.sum(axis=-1)


@dataclass(frozen=True)
class AdaptRecord:
    """One stream the engine served, as :func:`fit_adaptation` reads it (Q queries, D domains)."""

    domain: np.ndarray  # (Q,) domain index of each query
    tau: np.ndarray  # (Q,) measured tokens per target forward
    action: np.ndarray  # (Q,) SKIP, HEAD or FULL: the update trained right before the query (SKIP: none)
    fill: np.ndarray  # (Q,) that update's buffer fill, in [0, 1]
    share: np.ndarray  # (Q, D) that buffer's domain composition
    revert: np.ndarray  # (Q,) bool: the last good drafter was restored after the query
    checkpoint: np.ndarray  # (Q,) bool: a drafter became the last good one after the query
    draft: np.ndarray | None = None  # (Q,) drafting time relative to the drafter as profiled, if known
    previous: np.ndarray | None = None  # (Q,) bool: that checkpoint is the drafter before the query's update


ADAPT_FITTED = ("headroom", "head_reach", "head_rate", "full_rate", "transfer", "head_overfit")
"""The ``AdaptationDynamics`` fields :func:`fit_adaptation` estimates."""


def adaptation_tau(dynamics: AdaptationDynamics, survival: np.ndarray, record: AdaptRecord) -> np.ndarray:
    """Expected tau of each query of ``record`` under ``dynamics`` (harm taken in expectation), every
    domain starting at level 1; ``survival`` (D, n + 1) is the drafter's as profiled."""
    certain = [replace(dynamics, harm_probability=p) for p in (0.0, 1.0)]  # updates without / with harm
    rng = np.random.default_rng(0)  # drawn from, but both certain cases ignore the draw
    level = np.ones((1, survival.shape[0]))
    good = level
    out = np.empty(len(record.tau))
    previous = np.zeros(len(out), bool) if record.previous is None else record.previous
    for i, d in enumerate(record.domain):
        before = level
        if record.action[i] != SKIP:
            args = (level, np.array([record.action[i] == FULL]), record.fill[i:i + 1], record.share[i:i + 1])
            p = dynamics.harm_probability
            level = (1.0 - p) * certain[0].updated(rng, *args) + p * certain[1].updated(rng, *args)
        out[i] = 1.0 + level_rates(survival[d], level[0, d])
        if record.revert[i]:
            level = good
        if record.checkpoint[i]:
            good = before if previous[i] else level
    return out


def adaptation_draft(dynamics: AdaptationDynamics, record: AdaptRecord) -> np.ndarray:
    """Expected drafting-time ratio of each query of ``record`` under ``dynamics`` (1 at the start)."""
    draft = good = 1.0
    out = np.empty(len(record.tau))
    previous = np.zeros(len(out), bool) if record.previous is None else record.previous
    for i in range(len(out)):
        before = draft
        if record.action[i] != SKIP:
            draft = float(dynamics.updated_draft(np.array([draft]), np.array([record.action[i] == FULL]),
                                                 record.fill[i:i + 1])[0])
        out[i] = draft
        if record.revert[i]:
            draft = good
        if record.checkpoint[i]:
            good = before if previous[i] else draft
    return out


def fit_adaptation(survival: np.ndarray, records: Sequence[AdaptRecord],
                   base: AdaptationDynamics = AdaptationDynamics(),
                   headroom_starts: Sequence[float] = (0.05, 0.2, 0.5)) -> AdaptationDynamics:
    """``base`` with ``ADAPT_FITTED`` estimated from engine streams and ``query_noise`` from the residuals.

    Least squares between each query's measured tau and :func:`adaptation_tau` (bounded L-BFGS-B from
    each headroom start); the harm terms and the buffer capacities stay ``base``'s. ``survival`` must be
    the acceptance model the simulation will use (``model.survival(draft_length)``). When every record
    has its ``draft`` ratios, ``head_draft`` and ``full_draft`` are then fitted to them the same way.
    """
    if not records or not all(len(r.tau) for r in records):
        raise InputError("fit_adaptation needs at least one non-empty stream: record some queries first")
    if any(np.any(np.asarray(r.tau) <= 0) for r in records):
        raise InputError("measured tau must be positive: pass tokens per target forward (>= 1)")

    bounds = [ADAPT_BOUNDS.get(name, (0.0, 1.0)) for name in ADAPT_FITTED]

    def dynamics(x: np.ndarray) -> AdaptationDynamics:
        return replace(base, **{name: float(np.clip(v, *bound))
                                for name, v, bound in zip(ADAPT_FITTED, x, bounds, strict=True)})

    def loss(x: np.ndarray) -> float:
        dyn = dynamics(x)
        return sum(float(((adaptation_tau(dyn, survival, r) - r.tau) ** 2).sum()) for r in records)

    start = [getattr(base, name) for name in ADAPT_FITTED]
    best = min((minimize(loss, [h, *start[1:]], method="L-BFGS-B", bounds=bounds)
                for h in headroom_starts), key=lambda result: result.fun)
    fitted = dynamics(best.x)
    ratio = np.concatenate([r.tau / adaptation_tau(fitted, survival, r) for r in records])
    fitted = replace(fitted, query_noise=float(np.std(np.log(ratio))))
    if not all(r.draft is not None for r in records):
        return fitted
    names = ("head_draft", "full_draft")

    def drafting(x: np.ndarray) -> AdaptationDynamics:
        return replace(fitted, **{n: float(np.clip(v, *ADAPT_BOUNDS[n]))
                                  for n, v in zip(names, x, strict=True)})

    def draft_loss(x: np.ndarray) -> float:
        dyn = drafting(x)
        return sum(float(((adaptation_draft(dyn, r) - r.draft) ** 2).sum()) for r in records)

    best = minimize(draft_loss, [1.0, 1.0], method="L-BFGS-B", bounds=[ADAPT_BOUNDS[n] for n in names])
    return drafting(best.x)
