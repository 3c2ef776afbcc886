"""Calibration of drafter confidences into acceptance probabilities, per drafted position.

A drafter's confidence in a token (its own probability of it) is not the probability that the
verifier accepts it: at temperature 0 a token is accepted when it is the target's argmax, which a
small draft model's 0.3 often is. Length policies that read confidences as probabilities (LibraSpec,
threshold) then draft too little or too much. A ``Calibration`` maps each position's confidence
through a monotone piecewise-linear curve (the knots of an isotonic regression fitted to recorded
verdicts, ``simulator.calibration``). It travels inside the policy file, so the simulator and the
engine apply the very same map to the very same features.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import InputError

MAX_POSITIONS = 64
MAX_KNOTS = 4096
RESOLUTION = 4096  # confidences are looked up on this grid: within 1/8192 of the knots' line, and fast


@dataclass(frozen=True)
class Calibration:
    """Per position k (1-based), knots ``(x, y)``: the acceptance probability at confidence ``x`` given
    positions 1..k-1 were accepted, linear between knots and clamped outside them. Positions past the
    last map use the last one. A confidence of 0 (nothing drafted there) stays 0."""

    knots: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.knots) <= MAX_POSITIONS:
            raise InputError(f"a calibration needs 1 to {MAX_POSITIONS} positions, got {len(self.knots)}: "
                             "refit it from traces")
        for k, (x, y) in enumerate(self.knots, start=1):
            xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            ok = (xs.ndim == 1 and xs.shape == ys.shape and 1 <= xs.size <= MAX_KNOTS
                  and np.all(np.isfinite(xs)) and np.all(np.isfinite(ys)) and np.all(np.diff(xs) > 0)
                  and np.all(np.diff(ys) >= 0) and xs.min() >= 0 and xs.max() <= 1
                  and ys.min() >= 0 and ys.max() <= 1)
            if not ok:
                raise InputError(f"calibration position {k}: knots must be equally long lists (1 to "
                                 f"{MAX_KNOTS}) of increasing confidences and non-decreasing probabilities "
                                 "in [0, 1]: refit it")
        grid = np.linspace(0.0, 1.0, RESOLUTION + 1)
        table = np.stack([np.interp(grid, x, y) for x, y in self.knots])
        table[:, 0] = 0.0  # nothing drafted stays nothing
        table.setflags(write=False)
        object.__setattr__(self, "_table", table)

    def apply(self, confidences: np.ndarray) -> np.ndarray:
        """Calibrated probabilities of ``confidences`` (..., positions), position by position: one table
        lookup on the ``RESOLUTION`` grid (a policy calls it several times per decoding iteration)."""
        conf = np.asarray(confidences, dtype=np.float64)
        cells = np.rint(np.clip(conf, 0.0, 1.0) * RESOLUTION).astype(np.int64)
        cells[conf > 0] = np.maximum(cells[conf > 0], 1)  # a tiny drafted confidence is not "nothing"
        rows = np.minimum(np.arange(conf.shape[-1]), len(self.knots) - 1)
        return self._table[rows, cells]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"positions": [{"x": [...], "y": [...]}, ...]}``."""
        return {"positions": [{"x": list(x), "y": list(y)} for x, y in self.knots]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibration") -> Calibration:
        """Validate the JSON form and build the calibration (InputError naming the problem and the fix)."""
        positions = data.get("positions") if isinstance(data, Mapping) else None
        if not isinstance(positions, list) or set(data) != {"positions"}:
            raise InputError(f'{source}: a calibration must be {{"positions": [{{"x": [...], '
                             '"y": [...]}, ...]}: refit it from traces')
        knots = []
        for k, entry in enumerate(positions[:MAX_POSITIONS + 1], start=1):
            if not isinstance(entry, Mapping) or set(entry) != {"x", "y"} or not all(
                    isinstance(entry[key], list) and len(entry[key]) <= MAX_KNOTS and all(
                        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                        for v in entry[key]) for key in ("x", "y")):
                raise InputError(f"{source}: position {k} must be {{\"x\": [numbers], \"y\": [numbers]}}: "
                                 "refit it from traces")
            knots.append((tuple(float(v) for v in entry["x"]), tuple(float(v) for v in entry["y"])))
        try:
            return cls(tuple(knots))
        except InputError as err:
            raise InputError(f"{source}: {err}") from None
