"""Cost profiles: the schema's checks at the door, interpolation, step times, the paper-derived profile."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from policies.errors import InputError
from simulator.costs import PAPER_PROFILE, load_profile, profile_from_json, save_profile

NODES = [1, 2, 4, 8, 16, 32, 64, 128]
CONTEXTS = [0, 256, 1024, 4096]


def measured(seed: int = 0) -> dict:
    """A profile dict with noisy, non-linear (even non-monotone) times and two repeats per point."""
    rng = np.random.default_rng(seed)

    def times(base: float) -> list[float]:
        return [round(base * f, 9) for f in rng.uniform(0.8, 1.2, size=2)]

    return {
        "schema_version": 1, "device": "test cpu", "dtype": "float32",
        "models": {"target": "tiny",
                   "drafters": {"specblock": "tiny-sb", "eagle": "tiny-eagle", "ngram": "ng"}},
        "block_size": 4, "derived_from": None,
        "samples": {
            "verify": [{"nodes": n, "context": c, "seconds": times(0.01 + 1e-4 * n**1.3 + 1e-6 * c)}
                       for n in NODES for c in CONTEXTS],
            "vanilla": [{"context": c, "seconds": times(0.009 + 1e-6 * c)} for c in CONTEXTS],
            "draft": {
                "specblock": [{"starts": s, "blocks": b, "seconds": times(0.002 * b * (1 + 0.05 * s))}
                              for s in (1, 4) for b in (1, 2, 3)],
                "eagle": [{"depth": d, "seconds": times(0.0015 * d)} for d in (1, 2, 4, 8)],
                "ngram": [{"seconds": times(1e-4)}],
            },
            "update": {"head": times(0.05), "full": times(0.5)},
        },
    }


@pytest.fixture(scope="module")
def profile():
    return profile_from_json(measured())


def test_interpolation_is_exact_on_the_grid(profile):
    grid = profile.fits["verify"]
    nodes, contexts = np.meshgrid(NODES, CONTEXTS, indexing="ij")
    np.testing.assert_array_equal(profile.verify_seconds(nodes, contexts), grid.values)
    median = np.median(measured()["samples"]["verify"][5]["seconds"])
    row = measured()["samples"]["verify"][5]
    assert profile.verify_seconds(row["nodes"], row["context"]) == median
    eagle = measured()["samples"]["draft"]["eagle"][2]
    assert profile.draft_seconds("eagle", depth=eagle["depth"]) == np.median(eagle["seconds"])


@pytest.mark.parametrize("seed", range(5))
def test_interpolation_is_monotone_between_neighbouring_grid_points(profile, seed):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        i, j = rng.integers(len(NODES) - 1), rng.integers(len(CONTEXTS))
        n = np.linspace(NODES[i], NODES[i + 1], 33)
        values = profile.verify_seconds(n, CONTEXTS[j])
        steps = np.diff(values) * np.sign(values[-1] - values[0])
        assert np.all(steps >= -1e-15)
        c = np.linspace(CONTEXTS[min(j, 2)], CONTEXTS[min(j, 2) + 1], 33)
        values = profile.verify_seconds(NODES[i], c)
        assert np.all(np.diff(values) * np.sign(values[-1] - values[0]) >= -1e-15)


def test_outside_the_grid_clamps_below_and_extends_the_last_slope_above(profile):
    assert profile.vanilla_seconds(-50) == profile.vanilla_seconds(0)
    grid = profile.fits["vanilla"]
    slope = max((grid.values[-1] - grid.values[-2]) / (CONTEXTS[-1] - CONTEXTS[-2]), 0.0)
    assert profile.vanilla_seconds(8192) == pytest.approx(grid.values[-1] + slope * 4096, rel=1e-12)
    eagle = profile.fits["draft"]["eagle"].values
    slope = max((eagle[-1] - eagle[-2]) / 4, 0.0)
    assert profile.draft_seconds("eagle", depth=16) == pytest.approx(eagle[-1] + 8 * slope, rel=1e-12)
    assert profile.draft_seconds("ngram") == np.median(measured()["samples"]["draft"]["ngram"][0]["seconds"])


def test_step_seconds_are_draft_plus_verify_and_vanilla_at_zero(profile):
    contexts = np.array([0, 300, 1024, 5000])
    steps = profile.step_seconds("specblock", range(9), contexts)
    assert steps.shape == (4, 9)
    np.testing.assert_allclose(steps[:, 0], profile.vanilla_seconds(contexts), rtol=1e-12)
    for n in range(1, 9):
        blocks = -(-n // 4)
        draft = profile.draft_seconds("specblock", starts=1, blocks=blocks)
        np.testing.assert_allclose(steps[:, n], draft + profile.verify_seconds(n + 1, contexts), rtol=1e-12)
    table = profile.step_table("eagle", 16)
    expected = profile.step_seconds("eagle", range(17), contexts)
    np.testing.assert_allclose(table(contexts), expected, rtol=1e-12)


def test_save_and_load_round_trip(profile, tmp_path):
    path = save_profile(profile, tmp_path / "p.json")
    again = load_profile(path)
    assert again.to_json() == profile.to_json()
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def _set(data: dict, path: tuple, value) -> dict:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


BAD = [
    (("device",), KeyError, "device"),
    (("schema_version",), 2, "schema_version"),
    (("schema_version",), "1", "schema_version"),
    (("models", "target"), KeyError, "models.target"),
    (("samples", "verify", 3, "nodes"), "4", "samples.verify[3].nodes"),
    (("samples", "verify", 3, "nodes"), 0, "samples.verify[3].nodes"),
    (("samples", "verify", 3, "seconds"), [0.01, -0.002], "samples.verify[3].seconds[1]"),
    (("samples", "verify", 3, "seconds"), [], "samples.verify[3].seconds"),
    (("samples", "vanilla", 0, "seconds", 0), float("nan"), "samples.vanilla[0].seconds[0]"),
    (("samples", "update", "full"), KeyError, "samples.update.full"),
    (("samples", "draft", "warp"), [{"seconds": [1.0]}], "warp"),
    (("models", "drafters", "eagle"), KeyError, "models.drafters"),
    (("block_size",), KeyError, "block_size"),
    (("samples", "verify"), None, "samples.verify"),
    (("update_windows",), {"head": 4}, "update_windows"),
    (("update_windows",), {"head": 4, "full": 0}, "update_windows"),
    (("update_windows",), [4, 16], "update_windows"),
    (("samples", "update_single"), {"head": [0.1]}, "update_single"),
    (("samples", "update_single"), [0.1, 0.2], "update_single"),
    (("samples", "prefill"), [{"tokens": 0, "seconds": [0.01]}], "samples.prefill[0].tokens"),
    (("samples", "prefill"), [{"context": 64, "seconds": [0.01]}], "samples.prefill[0]"),
]


@pytest.mark.parametrize(("path", "value", "named"), BAD, ids=[b[2] for b in BAD])
def test_a_bad_profile_fails_naming_the_field(tmp_path: Path, path, value, named):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(_set(measured(), path, value)))
    with pytest.raises(InputError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load_profile(file)


def test_a_grid_with_a_hole_fails_naming_the_missing_point():
    data = measured()
    rows = data["samples"]["verify"]
    data["samples"]["verify"] = [r for r in rows if (r["nodes"], r["context"]) != (8, 256)]
    with pytest.raises(InputError, match="nodes=8, context=256"):
        profile_from_json(data)


def test_stale_fits_fail_and_matching_fits_load(profile):
    data = profile.to_json()
    assert profile_from_json(data).to_json() == data
    data["fits"]["verify"]["seconds"][2][1] *= 1.5
    with pytest.raises(InputError, match=r"fits\.verify"):
        profile_from_json(data)


def test_unreadable_files_and_unknown_drafters(tmp_path, profile):
    with pytest.raises(InputError, match="no such cost profile"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(InputError, match="not a JSON cost profile"):
        load_profile(tmp_path / "x.json")
    with pytest.raises(InputError, match="no drafter 'medusa'"):
        profile.draft_seconds("medusa")
    with pytest.raises(InputError, match="starts, blocks"):
        profile.draft_seconds("specblock", depth=3)
    with pytest.raises(InputError, match="update kind"):
        profile.update_seconds("lora")


def test_the_paper_profile_reproduces_the_published_drafter_shares():
    paper = load_profile(PAPER_PROFILE)
    assert paper.derived_from is not None and "2605.07243" in paper.derived_from.source
    assert "ASSUMED" in paper.derived_from.derivation
    specblock = paper.draft_seconds("specblock", starts=1, blocks=2)
    eagle = paper.draft_seconds("eagle", depth=7)
    assert (specblock, eagle) == pytest.approx((0.007, 0.017))
    assert specblock / (specblock + paper.verify_seconds(33, 1024)) == pytest.approx(0.16, abs=1e-4)
    assert eagle / (eagle + paper.verify_seconds(61, 1024)) == pytest.approx(0.31, abs=1e-4)
    assert paper.vanilla_seconds(1024) < paper.verify_seconds(1, 1024)
    assert paper.update_seconds("full") == pytest.approx(10 * paper.update_seconds("head"), rel=1e-3)


def test_update_cost_charges_query_windows_when_the_profile_counts_them(profile, tmp_path):
    head = profile.update_seconds("head")
    assert profile.update_cost("head", fill=0.25, windows=3) == pytest.approx(0.25 * head)  # no counts: fill
    counted = load_profile(save_profile(profile_from_json({**profile.to_json(), "fits": None,
                                                           "update_windows": {"head": 4, "full": 16}}),
                                        tmp_path / "w.json"))
    assert counted.update_windows == {"head": 4, "full": 16}
    assert counted.update_cost("head", fill=0.25, windows=3) == pytest.approx(0.75 * head)
    full = np.asarray(counted.update_cost("full", fill=np.array([1.0, 0.1]), windows=np.array([16, 1])))
    assert full == pytest.approx(np.array([1.0, 1 / 16]) * profile.update_seconds("full"))


def test_update_cost_interpolates_between_one_window_and_the_full_buffer(profile, tmp_path):
    head, full = profile.update_seconds("head"), profile.update_seconds("full")
    data = {**profile.to_json(), "fits": None, "update_windows": {"head": 4, "full": 16}}
    data["samples"] = {**data["samples"], "update_single": {"head": [0.4 * head], "full": [0.1 * full]}}
    counted = load_profile(save_profile(profile_from_json(data), tmp_path / "s.json"))
    windows = np.array([0.5, 1.0, 2.5, 4.0, 6.0])
    slope = (head - 0.4 * head) / 3  # from one window to the profiled four
    expected = [0.2 * head, 0.4 * head, 0.4 * head + 1.5 * slope, head, head + 2 * slope]
    assert np.asarray(counted.update_cost("head", fill=0.5, windows=windows)) == pytest.approx(expected)
    assert counted.update_cost("full", fill=0.5, windows=16) == pytest.approx(full)
    without = {**data, "update_windows": None}
    with pytest.raises(InputError, match="update_windows"):
        profile_from_json(without)


def test_prefill_cost_interpolates_the_measured_starts_and_is_zero_without_them(profile, tmp_path):
    assert np.all(np.asarray(profile.prefill_cost(np.array([64, 256]))) == 0.0)
    data = {**profile.to_json(), "fits": None}
    data["samples"] = {**data["samples"], "prefill": [{"tokens": 64, "seconds": [0.02, 0.03, 0.025]},
                                                      {"tokens": 256, "seconds": [0.08]}]}
    loaded = load_profile(save_profile(profile_from_json(data), tmp_path / "p.json"))
    assert np.asarray(loaded.prefill_cost(np.array([64, 160, 256]))) == pytest.approx([0.025, 0.0525, 0.08])
