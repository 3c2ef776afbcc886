"""Fit a drafter's confidence calibration (``policies.calibration.Calibration``) from recorded traces.

Every drafted node whose parent was accepted (or that hangs from the root) is one verdict: its
confidence, its depth, and whether the verifier accepted it. Per depth, an isotonic regression
(scikit-learn's, bounded to [0, 1]) maps confidence to the acceptance rate; depths with fewer than
``min_samples`` verdicts are pooled with all deeper ones into one last map.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression

from core.errors import InputError
from policies.calibration import MAX_POSITIONS, Calibration


def verdicts(traces: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(depth, confidence, accepted) of every drafted node the verifier reached."""
    depth, conf, accepted = [], [], []
    for depths, parents, confidences, on_path in traces[["depths", "parents", "confidences",
                                                         "on_path"]].itertuples(index=False):
        parents, on_path = np.asarray(parents), np.asarray(on_path, dtype=bool)
        reached = (parents < 0) | on_path[np.maximum(parents, 0)]
        depth.append(np.asarray(depths)[reached])
        conf.append(np.asarray(confidences, dtype=np.float64)[reached])
        accepted.append(on_path[reached])
    if not depth:
        raise InputError("the traces hold no iteration: record traces with a drafter before calibrating")
    return np.concatenate(depth), np.concatenate(conf), np.concatenate(accepted).astype(np.float64)


def fit_calibration(traces: pd.DataFrame, min_samples: int = 40) -> Calibration:
    """Isotonic maps from confidence to acceptance, one per depth while depths have ``min_samples``
    verdicts, then one for all deeper positions."""
    depth, conf, accepted = verdicts(traces)
    if depth.size < min_samples:
        raise InputError(f"{depth.size} drafted verdicts are too few to calibrate (need {min_samples}): "
                         "record more calibration prompts")
    knots = []
    for k in range(1, MAX_POSITIONS + 1):
        pool = depth == k
        last = np.count_nonzero(depth == k + 1) < min_samples or k == MAX_POSITIONS
        if last:
            pool = depth >= k
        if np.count_nonzero(pool) < min_samples:  # too few at this depth: the previous map goes on
            break
        fit = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(conf[pool], accepted[pool])
        knots.append((tuple(fit.X_thresholds_.tolist()), tuple(fit.y_thresholds_.tolist())))
        if last:
            break
    return Calibration(tuple(knots))
