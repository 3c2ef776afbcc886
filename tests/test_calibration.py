"""Confidence calibration: the map, its file form, its fit from traces, and that the simulator's batched
choice and the engine's one-at-a-time choice read it identically."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.errors import InputError
from policies import load_policy, make_policy, policy_from_dict, policy_to_dict, save_policy
from policies.calibration import RESOLUTION, Calibration
from policies.features import LENGTH_CAP, LENGTH_SLICES, length_features
from simulator.calibration import fit_calibration, verdicts

TWO = Calibration((((0.0, 0.5, 1.0), (0.2, 0.9, 1.0)), ((0.0, 1.0), (0.1, 0.3))))


def test_apply_follows_each_positions_knots_and_keeps_zero() -> None:
    conf = np.array([[0.25, 0.5, 0.5, 0.0], [0.75, 1.0, 0.0, 1.0]])
    out = TWO.apply(conf)
    expected = np.array([[0.55, 0.2, 0.2, 0.0], [0.95, 0.3, 0.0, 0.3]])  # positions past 2 use the last map
    np.testing.assert_allclose(out, expected, atol=1.0 / RESOLUTION)
    assert out[0, 3] == 0.0 and out[1, 2] == 0.0  # nothing drafted stays nothing
    assert TWO.apply(np.array([1e-9]))[0] > 0  # a tiny drafted confidence is not "nothing"


def test_apply_is_monotone_in_the_confidence() -> None:
    grid = np.linspace(0.001, 1.0, 999)
    assert np.all(np.diff(TWO.apply(grid[:, None])[:, 0]) >= 0)


@pytest.mark.parametrize(("data", "fix"), [
    ({"positions": []}, "1 to"),
    ({"positions": [{"x": [0.5, 0.2], "y": [0.1, 0.2]}]}, "increasing confidences"),
    ({"positions": [{"x": [0.2, 0.5], "y": [0.3, 0.1]}]}, "non-decreasing"),
    ({"positions": [{"x": [0.2], "y": [1.5]}]}, "in [0, 1]"),
    ({"positions": [{"x": [0.2], "y": ["a"]}]}, "numbers"),
    ({"positions": [{"x": [0.2]}]}, "numbers"),
    ({"knots": []}, "refit it"),
    ([1, 2], "refit it"),
])
def test_bad_calibration_is_one_clear_error(data: object, fix: str) -> None:
    with pytest.raises(InputError, match="refit it") as err:
        Calibration.from_dict(data)
    assert fix in str(err.value)


def test_policy_file_carries_the_calibration(tmp_path) -> None:
    policy = make_policy("libraspec", {"max_length": 8}, calibration=TWO)
    path = save_policy(policy, tmp_path / "p.json")
    again = load_policy(path)
    assert again.calibration == TWO and policy_to_dict(again) == policy_to_dict(policy)
    assert "calibration" not in policy_to_dict(make_policy("libraspec"))
    with pytest.raises(InputError, match="reads no drafter confidences"):
        make_policy("cost-aware-bandit", calibration=TWO)
    with pytest.raises(InputError, match="reads no drafter confidences"):
        make_policy("fixed", calibration=TWO)
    data = {**policy_to_dict(policy), "calibration": {"positions": [{"x": [1.0, 0.0], "y": [0, 1]}]}}
    with pytest.raises(InputError, match=r"p\.json: .*increasing confidences"):
        policy_from_dict(data, source="p.json")


def test_calibration_changes_the_choice_alike_one_by_one_and_batched() -> None:
    """LibraSpec with a calibration that raises low confidences drafts more; ``act`` (the engine's) and
    ``act_batch`` (the simulator's) agree row for row."""
    rng = np.random.default_rng(0)
    raise_low = Calibration((((0.0, 0.2, 1.0), (0.0, 0.8, 0.95)),))
    steps = 1e-3 * (2.0 + 0.3 * np.arange(LENGTH_CAP + 1))
    conf = rng.uniform(0.05, 0.6, size=(64, LENGTH_CAP))
    obs = np.stack([length_features(c, 100, steps) for c in conf])
    plain, calibrated = make_policy("libraspec"), make_policy("libraspec", calibration=raise_low)
    one = np.array([calibrated.act(o) for o in obs])
    conf, steps = LENGTH_SLICES["confidences"], LENGTH_SLICES["step_seconds"]
    batched = calibrated.act_batch(obs[:, conf], obs[:, steps])
    np.testing.assert_array_equal(one, batched)
    assert one.mean() > np.mean([plain.act(o) for o in obs])


def chain_rows(rng: np.random.Generator, rows: int, depth: int = 4) -> pd.DataFrame:
    """Greedy chains whose node at depth d is accepted with probability sqrt(confidence) given its parent."""
    conf = rng.uniform(0.01, 1.0, size=(rows, depth))
    accept = rng.random((rows, depth)) < np.sqrt(conf)
    on_path = np.cumprod(accept, axis=1).astype(bool)
    return pd.DataFrame({"depths": [np.arange(1, depth + 1)] * rows,
                         "parents": [np.arange(-1, depth - 1)] * rows,
                         "confidences": list(conf), "on_path": list(on_path)})


def test_verdicts_keep_only_nodes_the_verifier_reached() -> None:
    traces = pd.DataFrame({"depths": [np.array([1, 2, 3])], "parents": [np.array([-1, 0, 1])],
                           "confidences": [np.array([0.9, 0.5, 0.4])],
                           "on_path": [np.array([True, False, False])]})
    depth, conf, accepted = verdicts(traces)
    np.testing.assert_array_equal(depth, [1, 2])  # node 3's parent was rejected: never verified
    np.testing.assert_array_equal(accepted, [1.0, 0.0])
    np.testing.assert_allclose(conf, [0.9, 0.5])


def test_fit_recovers_the_acceptance_curve_per_position() -> None:
    traces = chain_rows(np.random.default_rng(1), 20000)
    calibration = fit_calibration(traces, min_samples=200)
    assert len(calibration.knots) == 4
    grid = np.linspace(0.1, 0.9, 9)
    for k in range(4):
        column = np.zeros((grid.size, k + 1))
        column[:, k] = grid
        np.testing.assert_allclose(calibration.apply(column)[:, k], np.sqrt(grid), atol=0.1)


def test_thin_deep_positions_are_pooled_and_too_few_verdicts_refused() -> None:
    traces = chain_rows(np.random.default_rng(2), 150, depth=6)
    calibration = fit_calibration(traces, min_samples=60)
    assert 1 <= len(calibration.knots) < 6  # deep positions, rarely reached, share the last map
    with pytest.raises(InputError, match="too few to calibrate"):
        fit_calibration(traces.head(3), min_samples=60)
