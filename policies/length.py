"""Speculation-length policies: how many drafted positions (or tree nodes) to send to the verifier.

Each reads the observation of ``policies.features.length_features`` by name and returns n in
0..LENGTH_CAP. The caller clips n to what was actually drafted (confidences past it are 0.0).
LibraSpec (arXiv 2608.08721) maximizes the expected speedup ``S(n) = N(n) / T(n)`` with
``N(n) = 1 + sum_{j<=n} P_j`` and ``P_j = prod_{i<=j} c_i``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from core.errors import InputError
from policies.base import Params, info_value, register
from policies.calibration import Calibration
from policies.features import LENGTH_CAP, LENGTH_SLICES, check_length_obs


def expected_tokens(confidences: np.ndarray) -> np.ndarray:
    """N(n) for n = 0..len(confidences): expected tokens emitted per iteration, bonus token included."""
    conf = np.asarray(confidences, dtype=np.float64)
    if conf.ndim != 1 or not np.all((conf >= 0) & (conf <= 1)):
        raise InputError("confidences must be a 1-D array of values in [0, 1]: pass one per position")
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(conf))))


def speedup_curve(confidences: np.ndarray, step_seconds: np.ndarray) -> np.ndarray:
    """S(n) = N(n) / T(n) for n = 0..len(step_seconds) - 1 (confidences padded with 0.0 to fit)."""
    steps = np.asarray(step_seconds, dtype=np.float64)
    conf = np.asarray(confidences, dtype=np.float64)
    if steps.ndim != 1 or steps.size == 0 or not np.all(steps > 0) or conf.size > steps.size - 1:
        raise InputError("step_seconds must be a 1-D array of positive times, one more than the confidences: "
                         "predict T(n) for n = 0..len(confidences)")
    padded = np.zeros(steps.size - 1)
    padded[: conf.size] = conf
    return expected_tokens(padded) / steps


def _split(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    obs = check_length_obs(obs)
    return obs[LENGTH_SLICES["confidences"]], obs[LENGTH_SLICES["step_seconds"]]


class _LengthPolicy(ABC):
    """Shared plumbing of the length policies: ``choose`` maps (confidences, T) to n, the confidences
    first mapped through the policy's ``calibration`` when it has one (``policies.calibration``)."""

    kind: ClassVar[str]
    role: ClassVar[str] = "length"
    params_type: ClassVar[type[Params]]
    reads_confidences: ClassVar[bool] = True  # so a calibration may come with it (``make_policy``)

    def __init__(self, params: Params | None = None, seed: int | None = None,
                 calibration: Calibration | None = None) -> None:
        self.params = params if params is not None else self.params_type()
        self.calibration = calibration
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        """Nothing to forget: the choice depends on the observation only."""
        del seed

    def act(self, obs: np.ndarray) -> int:
        """Positions to verify for this observation."""
        confidences, steps = _split(obs)
        return self.choose(self._calibrated(confidences), steps)

    def act_batch(self, confidences: np.ndarray, step_seconds: np.ndarray) -> np.ndarray:
        """``act`` for every row of (N, cap) confidences and (N, cap + 1) step seconds (policies with
        ``choose_batch``)."""
        return self.choose_batch(self._calibrated(confidences), step_seconds)

    def _calibrated(self, confidences: np.ndarray) -> np.ndarray:
        return confidences if self.calibration is None else self.calibration.apply(confidences)

    @abstractmethod
    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        """Positions to verify given the confidences c_1..c_cap and the iteration times T(0)..T(cap)."""

    def observe(self, obs: np.ndarray, action: int, reward: float, info: Mapping[str, float]) -> None:
        """Stateless: the outcome changes nothing."""
        del obs, action, reward, info


@dataclass(frozen=True)
class FixedParams(Params):
    """``length``: positions verified every iteration."""

    length: int = 4
    RANGES: ClassVar = {"length": (0, LENGTH_CAP, True)}


@register
class FixedLength(_LengthPolicy):
    """Always verify the same number of positions."""

    kind = "fixed"
    params_type = FixedParams
    tune_rank = 4
    reads_confidences = False

    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        return self.params.length

    def choose_batch(self, confidences: np.ndarray, step_seconds: np.ndarray) -> np.ndarray:
        """``choose`` for every row of (N, cap) confidences and (N, cap + 1) step seconds."""
        return np.full(confidences.shape[0], self.params.length, dtype=np.int64)


@dataclass(frozen=True)
class ThresholdParams(Params):
    """``threshold``: minimum path-confidence product of a verified position; ``max_length``: its cap."""

    threshold: float = 0.3
    max_length: int = LENGTH_CAP
    RANGES: ClassVar = {"threshold": (0.0, 1.0, False), "max_length": (0, LENGTH_CAP, True)}


@register
class ThresholdLength(_LengthPolicy):
    """Verify positions while the path confidence ``P_j`` stays at or above the threshold."""

    kind = "threshold"
    params_type = ThresholdParams
    tune_rank = 2

    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        below = np.cumprod(confidences[: self.params.max_length]) < self.params.threshold
        return int(np.argmax(below)) if below.any() else int(below.size)

    def choose_batch(self, confidences: np.ndarray, step_seconds: np.ndarray) -> np.ndarray:
        """``choose`` for every row of (N, cap) confidences and (N, cap + 1) step seconds."""
        path, leading = np.ones(confidences.shape[0]), _Leading(confidences.shape[0])
        for i in range(self.params.max_length):  # column by column: faster than cumprod on short rows
            path *= confidences[:, i]
            leading.step(path >= self.params.threshold)
        return leading.count


@dataclass(frozen=True)
class HeuristicParams(Params):
    """Start at ``initial``, add ``grow`` after a fully accepted draft, remove ``shrink`` otherwise."""

    initial: int = 4
    min_length: int = 1
    max_length: int = LENGTH_CAP
    grow: int = 2
    shrink: int = 1
    RANGES: ClassVar = {
        "initial": (0, LENGTH_CAP, True), "min_length": (0, LENGTH_CAP, True),
        "max_length": (0, LENGTH_CAP, True), "grow": (0, LENGTH_CAP, True), "shrink": (0, LENGTH_CAP, True),
    }
    ORDERED: ClassVar = ("min_length", "initial", "max_length")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.min_length <= self.initial <= self.max_length:
            raise InputError(f"parameters min_length={self.min_length}, initial={self.initial}, "
                             f"max_length={self.max_length} are invalid: "
                             "use min_length <= initial <= max_length")


@register
class HeuristicLength(_LengthPolicy):
    """The +2/-1 rule: grow by ``grow`` when every verified position was accepted, else shrink.

    Reads ``info["accepted"]`` (drafted positions accepted) and ``info["drafted"]`` (positions verified).
    """

    kind = "heuristic"
    params_type = HeuristicParams
    tune_rank = 3
    reads_confidences = False

    def reset(self, seed: int | None = None) -> None:
        """Return to the initial length."""
        self.length = self.params.initial

    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        return self.length

    def observe(self, obs: np.ndarray, action: int, reward: float, info: Mapping[str, float]) -> None:
        """Grow after a fully accepted draft, shrink after a rejection, within [min_length, max_length]."""
        p = self.params
        if info_value(info, "accepted", self.kind) >= info_value(info, "drafted", self.kind):
            self.length = min(self.length + p.grow, p.max_length)
        else:
            self.length = max(self.length - p.shrink, p.min_length)


@dataclass(frozen=True)
class LibraSpecParams(Params):
    """``max_length``: the largest n considered."""

    max_length: int = LENGTH_CAP
    RANGES: ClassVar = {"max_length": (0, LENGTH_CAP, True)}


@register
class LibraSpecLength(_LengthPolicy):
    """Marginal greedy stop: extend n -> n+1 iff ``P_{n+1} / N(n) > (T(n+1) - T(n)) / T(n)``.

    That is exactly ``S(n+1) > S(n)``; the first failure is the optimum when T is convex non-decreasing.
    """

    kind = "libraspec"
    params_type = LibraSpecParams
    tune_rank = 1

    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        paths = np.cumprod(confidences)
        tokens = expected_tokens(confidences)
        for n in range(self.params.max_length):
            gain = paths[n] / tokens[n]
            cost = (step_seconds[n + 1] - step_seconds[n]) / step_seconds[n]
            if not gain > cost:
                return n
        return self.params.max_length

    def choose_batch(self, confidences: np.ndarray, step_seconds: np.ndarray) -> np.ndarray:
        """``choose`` for every row of (N, cap) confidences and (N, cap + 1) step seconds."""
        path, leading = np.ones(confidences.shape[0]), _Leading(confidences.shape[0])
        total = np.zeros_like(path)  # P_1 + ... + P_n, summed in cumsum's order
        for n in range(self.params.max_length):
            path *= confidences[:, n]
            cost = (step_seconds[:, n + 1] - step_seconds[:, n]) / step_seconds[:, n]
            leading.step(path / (1.0 + total) > cost)
            total += path
        return leading.count


@register
class LibraSpecExhaustive(_LengthPolicy):
    """Argmax of ``S(n)`` over n = 0..max_length (the smallest n on ties): robust to step-shaped costs."""

    kind = "libraspec-exhaustive"
    params_type = LibraSpecParams
    tune_rank = None  # tuned only when named: the studies compare it at its defaults beside libraspec

    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        return int(np.argmax(speedup_curve(confidences, step_seconds)[: self.params.max_length + 1]))

    def choose_batch(self, confidences: np.ndarray, step_seconds: np.ndarray) -> np.ndarray:
        """``choose`` for every row of (N, cap) confidences and (N, cap + 1) step seconds."""
        path, total = np.ones(confidences.shape[0]), np.zeros(confidences.shape[0])
        best, chosen = 1.0 / step_seconds[:, 0], np.zeros(path.size, dtype=np.int64)
        for n in range(1, self.params.max_length + 1):
            path *= confidences[:, n - 1]
            total += path
            speedup = (1.0 + total) / step_seconds[:, n]
            better = speedup > best  # strict: the smallest n wins ties, as argmax does
            chosen[better] = n
            np.maximum(best, speedup, out=best)
        return chosen


class _Leading:
    """Counts, per row, how many leading steps were all True."""

    def __init__(self, rows: int) -> None:
        self.alive = np.ones(rows, dtype=bool)
        self.count = np.zeros(rows, dtype=np.int64)

    def step(self, ok: np.ndarray) -> None:
        """Add one step's outcome per row."""
        self.alive &= ok
        self.count += self.alive
