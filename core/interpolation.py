"""Piecewise-linear interpolation of timings measured on a full grid of parameters (the cost profile's
series and their fits): exact on the grid, monotone between neighbouring points, clamped below the
grid and extended along the last segment's slope (never downward) above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import InputError

ESTIMATORS: Mapping[str, Callable[[Any], Any]] = {"median": np.median, "mean": np.mean}
"""How a configuration's repeated timings become one value: the median resists outliers; the mean is the
expected cost, which a decoding loop's total pays (its slow iterations included)."""


def bracket(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left grid index and the weight of the right neighbour; below the grid the weight is 0."""
    x = np.maximum(x, grid[0])
    i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, grid.size - 2)
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


def blend(lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Linear between lo and hi (exact at w = 0 and 1); past hi, the same slope floored at 0."""
    inside = lo * (1.0 - w) + hi * w
    return np.where(w > 1.0, hi + (w - 1.0) * np.maximum(hi - lo, 0.0), inside)


@dataclass(frozen=True)
class Grid:
    """Median seconds on a full grid of parameters, interpolated piecewise linearly between them."""

    keys: tuple[str, ...]
    axes: tuple[np.ndarray, ...]
    values: np.ndarray  # shape tuple(len(axis) for axis in axes)

    def __call__(self, *coords: float | np.ndarray) -> float | np.ndarray:
        """Seconds at the given parameter values (broadcast together; a float for scalars)."""
        shape = np.broadcast_shapes(*(np.shape(c) for c in coords))
        size = math.prod(shape)
        values = np.broadcast_to(self.values, (size, *self.values.shape))
        rows = np.arange(size)
        for axis, coord in zip(self.axes, coords, strict=True):
            if axis.size == 1:
                values = values[:, 0]
                continue
            x = np.broadcast_to(np.asarray(coord, dtype=np.float64), shape).ravel()
            i, w = bracket(axis, x)
            w = w.reshape(w.shape + (1,) * (values.ndim - 2))
            values = blend(values[rows, i], values[rows, i + 1], w)
        out = values.reshape(shape)
        return float(out) if out.ndim == 0 else out

    def to_json(self) -> dict[str, Any]:
        """The ``fits`` entry of this grid."""
        out: dict[str, Any] = {key: axis.astype(int).tolist()
                               for key, axis in zip(self.keys, self.axes, strict=True)}
        out["seconds"] = self.values.tolist()
        return out


@dataclass(frozen=True)
class Series:
    """Repeated timings of one kind of call, one row per measured configuration."""

    keys: tuple[str, ...]
    rows: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]  # (parameter values, seconds)

    def grid(self, where: str, estimator: str = "median") -> Grid:
        """The ``estimator`` (``ESTIMATORS``) of every configuration on a full grid; InputError when the
        grid has holes."""
        combine = ESTIMATORS[estimator]
        pooled: dict[tuple[int, ...], list[float]] = {}
        for point, seconds in self.rows:
            pooled.setdefault(point, []).extend(seconds)
        axes = tuple(np.array(sorted({p[k] for p in pooled}), dtype=np.float64)
                     for k in range(len(self.keys)))
        values = np.empty(tuple(a.size for a in axes))
        for index in np.ndindex(values.shape):
            point = tuple(int(axes[k][i]) for k, i in enumerate(index))
            if point not in pooled:
                named = ", ".join(f"{k}={v}" for k, v in zip(self.keys, point, strict=True))
                raise InputError(f"{where} has no row for {named}: measure every combination of "
                                 f"{', '.join(self.keys)} (a full grid)")
            values[index] = float(combine(pooled[point]))
        return Grid(self.keys, axes, values)

    def to_json(self) -> list[dict[str, Any]]:
        """The ``samples`` entry of this series."""
        return [{**dict(zip(self.keys, point, strict=True)), "seconds": list(seconds)}
                for point, seconds in self.rows]
