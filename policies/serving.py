"""Speculation-length policies under load: a length for every running request of a batch, from the
serving observation (``policies.features.serve_features``), the same in ``SpecServe-v0`` and the live
batched engine.

A request's expected tokens from verifying ``k`` draft positions are ``1 + sum_j prod_{l <= j} c_l``
(the bonus token, then each position reached), from its draft's confidences; the next iteration costs
``base_seconds + sum_i k_i (node_seconds + draft_seconds) + draft_start_seconds * #{i: k_i > 0}`` (the
observation's cost fields: the batched verify with no draft, one more verified node at this batch,
drafting per position, and starting a request's chain). The kinds:

- ``batch-table``: vLLM's per-batch-size table: one length for every request, read from the batch's
  size (``l1`` .. ``l8``; larger batches use ``l8``).
- ``goodput``: SmartSpec's choice of one length for the whole batch: the ``k`` up to ``max_length`` that
  maximizes expected tokens per second of the iteration.
- ``libraspec-batch``: LibraSpec per request with the batch's marginal cost: add positions one at a time
  to the request whose next position brings the most expected tokens per second of its cost (a
  request's first position also pays its chain's start) while that raises the iteration's expected
  tokens per second by more than the factor ``margin`` (optimal for the ratio without start costs: every
  request's expected tokens are concave in its length; a greedy approximation with them).
- ``threshold-batch``: per request, the positions whose path confidence is at least ``threshold``.
"""

from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, NamedTuple

import numpy as np

from policies.base import Params, Policy, register
from policies.calibration import Calibration
from policies.features import (
    LENGTH_CAP,
    SERVE_GLOBAL,
    SERVE_INDEX,
    SERVE_SLOT_SLICES,
    serve_probe,
    serve_slots,
)

TABLE_SIZES = 8  # batch sizes the table names; larger batches use the last entry
NEVER = MappingProxyType({f"l{i}": 0 for i in range(1, TABLE_SIZES + 1)})
"""``batch-table`` parameters that never speculate: vanilla decoding as a serving policy."""


def request_view(obs: np.ndarray, calibration: Calibration | None = None
                 ) -> tuple[np.ndarray, np.ndarray, Costs]:
    """(active slots, path confidences [slots, cap] (each position's confidence through ``calibration``
    first, when given), the iteration's costs)."""
    slots = serve_slots(obs)
    active = slots[:, SERVE_SLOT_SLICES["active"]][:, 0] > 0
    confidences = slots[:, SERVE_SLOT_SLICES["confidences"]]
    if calibration is not None:
        confidences = calibration.apply(confidences)
    return active, np.cumprod(confidences, axis=1), observed_costs(obs)


def observed_costs(obs: np.ndarray) -> Costs:
    """The iteration's ``Costs`` from a serving observation's cost fields."""
    base, node, draft, start = (float(obs[SERVE_INDEX[name]]) for name in SERVE_GLOBAL[3:])
    return Costs(base, node + draft, start)


class Costs(NamedTuple):
    """An iteration's seconds: ``base``, plus ``step`` per verified position (its node and its drafting),
    plus ``start`` per request that drafts at all."""

    base: float
    step: float
    start: float

    def seconds(self, lengths: np.ndarray) -> float:
        """The iteration's seconds when the requests verify ``lengths`` positions."""
        return self.base + self.step * float(lengths.sum()) + self.start * float((lengths > 0).sum())


def expected_rate(paths: np.ndarray, lengths: np.ndarray, costs: Costs) -> float:
    """Expected tokens per second of an iteration in which each request verifies ``lengths`` positions."""
    reach = np.arange(LENGTH_CAP)[None, :] < lengths[:, None]
    seconds = costs.seconds(lengths)
    return (lengths.size + float((paths * reach).sum())) / seconds if seconds > 0 else 0.0


def keeps_drafting(policy: Policy, obs: np.ndarray, slot: int, confidences: Sequence[float]) -> bool:
    """Whether request ``slot``'s chain drafts one more position under a serving ``policy``: whether the
    policy, shown that request's ``confidences`` so far and a certain next one with every other draft
    empty (``serve_probe``), would verify more than it has. The one rule of the live engine
    (``real_engine.speculate.ServeSteering``) and of the simulator (``simulator.rollout.serve_drafts``)."""
    k = len(confidences)
    if k >= LENGTH_CAP:
        return False
    if isinstance(policy, ServingPolicy):  # the same answer, from the probe's parts
        return policy.keeps(obs, slot, confidences)
    return int(np.asarray(policy.act(serve_probe(obs, slot, np.asarray(confidences))))[slot]) > k


class ServingPolicy(ABC):
    """What the serving policies share: no learned state; ``act`` gives one length per batch slot, from
    the slots' confidences mapped through the policy's ``calibration`` when it has one (kinds that read
    confidences: ``policies.calibration``)."""

    kind: ClassVar[str]
    role: ClassVar[str] = "serving"
    reads_confidences: ClassVar[bool] = True  # so a calibration may come with it (``make_policy``)

    def __init__(self, params: Params, seed: int | None = None,
                 calibration: Calibration | None = None) -> None:
        self.params, self.calibration = params, calibration

    def reset(self, seed: int | None = None) -> None:
        """Nothing to forget."""
        del seed

    def observe(self, obs: np.ndarray, action: np.ndarray, reward: float, info: Mapping[str, float]) -> None:
        """Nothing to learn."""
        del obs, action, reward, info

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Lengths per batch slot (0 for empty slots)."""
        active, paths, costs = request_view(obs, self.calibration)
        out = np.zeros(active.size, dtype=np.int64)
        if active.any():
            out[active] = self.lengths(paths[active], costs)
        return out

    @abstractmethod
    def lengths(self, paths: np.ndarray, costs: Costs) -> np.ndarray:
        """The running requests' lengths."""

    def keeps(self, obs: np.ndarray, slot: int, confidences: Sequence[float]) -> bool:
        """``keeps_drafting``'s answer (``act`` on ``serve_probe(obs, slot, confidences)`` verifies more
        than ``confidences``), from the probe's parts: every other draft is empty, so only this request's
        path confidences are computed. The engine asks it for every position every chain drafts."""
        active = serve_slots(obs)[:, SERVE_SLOT_SLICES["active"]][:, 0] > 0
        if not active[slot]:
            return False
        k = len(confidences)
        paths = np.zeros((int(active.sum()), LENGTH_CAP))
        paths[int(active[:slot].sum()), :k + 1] = np.cumprod(self.calibrated([*confidences, 1.0]))
        return int(self.lengths(paths, observed_costs(obs))[int(active[:slot].sum())]) > k

    def calibrated(self, confidences: Sequence[float]) -> np.ndarray:
        """A request's confidences by position through the calibration (as they are when none)."""
        conf = np.asarray(confidences, dtype=np.float64)
        return conf if self.calibration is None else self.calibration.apply(conf)


@dataclasses.dataclass(frozen=True)
class TableParams(Params):
    """Lengths by batch size 1..8."""

    l1: int = 4
    l2: int = 4
    l3: int = 3
    l4: int = 3
    l5: int = 2
    l6: int = 2
    l7: int = 2
    l8: int = 1
    RANGES: ClassVar[Mapping[str, tuple]] = {f"l{i}": (0, LENGTH_CAP, True)
                                             for i in range(1, TABLE_SIZES + 1)}


@register
class BatchTable(ServingPolicy):
    """vLLM-style: one length for the whole batch, by its size."""

    kind = "batch-table"
    params_type = TableParams
    tune_rank = 2
    reads_confidences = False

    def lengths(self, paths: np.ndarray, costs: Costs) -> np.ndarray:
        return np.full(paths.shape[0], self.table[min(paths.shape[0], TABLE_SIZES) - 1])

    def keeps(self, obs: np.ndarray, slot: int, confidences: Sequence[float]) -> bool:
        active = serve_slots(obs)[:, SERVE_SLOT_SLICES["active"]][:, 0] > 0
        return bool(active[slot]) and self.table[min(int(active.sum()), TABLE_SIZES) - 1] > len(confidences)

    @functools.cached_property
    def table(self) -> tuple[int, ...]:
        """The lengths by batch size (read at every decision: built once)."""
        return dataclasses.astuple(self.params)


@dataclasses.dataclass(frozen=True)
class GoodputParams(Params):
    """The longest length the batch may take."""

    max_length: int = 8
    RANGES: ClassVar[Mapping[str, tuple]] = {"max_length": (0, LENGTH_CAP, True)}


@register
class Goodput(ServingPolicy):
    """SmartSpec-style: the one batch-wide length with the highest expected tokens per second."""

    kind = "goodput"
    params_type = GoodputParams
    tune_rank = 3

    def lengths(self, paths: np.ndarray, costs: Costs) -> np.ndarray:
        count, k = paths.shape[0], np.arange(self.params.max_length + 1)
        tokens = count + np.concatenate(([0.0], np.cumsum(paths.sum(0))))[k]  # expected_rate for every k
        seconds = costs.base + costs.step * (count * k) + costs.start * (count * (k > 0))
        rates = np.divide(tokens, seconds, out=np.zeros(k.size), where=seconds > 0)
        return np.full(count, int(np.argmax(rates)))


@dataclasses.dataclass(frozen=True)
class MarginalParams(Params):
    """The longest length a request may take, and how much a position must raise the rate."""

    max_length: int = 8
    margin: float = 1.0
    RANGES: ClassVar[Mapping[str, tuple]] = {"max_length": (0, LENGTH_CAP, True),
                                             "margin": (0.5, 2.0, False)}


@register
class LibraSpecBatch(ServingPolicy):
    """LibraSpec per request with the batch's marginal cost (module doc)."""

    kind = "libraspec-batch"
    params_type = MarginalParams
    tune_rank = 1

    def lengths(self, paths: np.ndarray, costs: Costs) -> np.ndarray:
        rows = paths.tolist()  # a few requests and positions: plain floats beat numpy's per-call overhead
        k = [0] * len(rows)
        tokens, seconds = float(len(rows)), costs.base
        cap, margin = min(self.params.max_length, LENGTH_CAP), self.params.margin
        while True:
            gains = [row[n] if n < cap else -1.0 for row, n in zip(rows, k, strict=True)]
            cost = [costs.step + (costs.start if n == 0 else 0.0) for n in k]  # a first one starts a chain
            scores = [g / c for g, c in zip(gains, cost, strict=True)] if min(cost) > 0 else gains
            best = scores.index(max(scores))
            worth = gains[best] * seconds > margin * tokens * cost[best]  # raises tokens/s enough
            if gains[best] <= 0 or seconds <= 0 or not worth:
                return np.asarray(k, dtype=np.int64)
            k[best] += 1
            tokens, seconds = tokens + gains[best], seconds + cost[best]


@dataclasses.dataclass(frozen=True)
class ThresholdParams(Params):
    """The path confidence a position needs, and the longest length."""

    threshold: float = 0.5
    max_length: int = 8
    RANGES: ClassVar[Mapping[str, tuple]] = {"threshold": (0.0, 1.0, False),
                                             "max_length": (0, LENGTH_CAP, True)}


@register
class ThresholdBatch(ServingPolicy):
    """Per request: the leading positions whose path confidence is at least ``threshold``."""

    kind = "threshold-batch"
    params_type = ThresholdParams
    tune_rank = 4

    def lengths(self, paths: np.ndarray, costs: Costs) -> np.ndarray:
        return np.minimum((paths >= self.params.threshold).sum(1), self.params.max_length)

    def keeps(self, obs: np.ndarray, slot: int, confidences: Sequence[float]) -> bool:
        k = len(confidences)  # the probe's path confidences do not rise: more than k iff the (k+1)-th passes
        if k >= self.params.max_length or serve_slots(obs)[slot, SERVE_SLOT_SLICES["active"]][0] <= 0:
            return False
        return bool(np.cumprod(self.calibrated([*confidences, 1.0]))[-1] >= self.params.threshold)
