"""Cost profiles: the schema's checks at the door, interpolation, step times, the paper-derived profile."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from core.cost_profile import load_profile, profile_from_json, resolve_profile, save_profile, token_by_token
from core.errors import InputError
from core.interpolation import Grid, Series, blend
from core.paths import PAPER_PROFILE

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


def falling() -> dict:
    """``measured()`` with last segments that fall: vanilla by context, eagle by depth, verify by both."""
    data = measured()
    samples = data["samples"]
    samples["vanilla"] = [{"context": c, "seconds": [s]}
                          for c, s in zip(CONTEXTS, [0.010, 0.012, 0.014, 0.011], strict=True)]
    samples["draft"]["eagle"] = [{"depth": d, "seconds": [s]}
                                 for d, s in zip((1, 2, 4, 8), [0.002, 0.003, 0.004, 0.0035], strict=True)]
    for row in samples["verify"]:
        row["seconds"] = [0.02 + 1e-4 * min(row["nodes"], 64) - 5e-5 * (row["nodes"] == 128)
                          + (2e-6 * row["context"] if row["context"] < 4096 else 1e-3)]
    return data


def test_extrapolation_never_falls_below_the_last_grid_value_nor_slopes_down():
    """Past the grid a falling last segment extends flat (its slope floored at 0), a rising one rises."""
    profile = profile_from_json(falling())
    far = np.array([4096, 4097, 6000, 8192, 100_000])
    np.testing.assert_array_equal(profile.vanilla_seconds(far), np.full(far.size, 0.011))
    assert profile.draft_seconds("eagle", depth=16) == 0.0035
    assert profile.draft_seconds("eagle", depth=9) == 0.0035
    last = profile.fits["verify"].values[-1]  # nodes = 128 at each context
    assert profile.verify_seconds(1000, 0) == last[0] and profile.verify_seconds(300, 256) == last[1]
    values = profile.fits["verify"].values
    assert np.all(values[:, -1] < values[:, -2])  # context 4096 costs less than 1024 here
    np.testing.assert_array_equal(profile.verify_seconds(np.array(NODES), 9000), values[:, -1])
    steps = profile.step_seconds("eagle", range(9), far)  # the step table extrapolates its own columns
    np.testing.assert_array_equal(steps[:, 0], np.full(far.size, 0.011))
    assert np.all(np.diff(steps, axis=0) == 0.0)
    grown = profile_from_json(measured()).vanilla_seconds(np.array([4096, 6000, 8192, 100_000]))
    assert np.all(np.diff(grown) > 0)  # a rising last segment keeps its slope


@pytest.mark.parametrize(("lo", "hi", "w", "want"), [(2.0, 1.0, 3.0, 1.0), (2.0, 1.0, 1.0, 1.0),
                                                     (1.0, 2.0, 3.0, 4.0), (1.0, 3.0, 0.5, 2.0),
                                                     (3.0, 1.0, 0.25, 2.5), (1.0, 1.0, 7.0, 1.0)])
def test_blend_is_linear_inside_and_never_slopes_down_outside(lo: float, hi: float, w: float, want: float):
    assert float(blend(np.array(lo), np.array(hi), np.array(w))) == want


def test_a_grid_with_a_single_point_axis_interpolates_along_the_others():
    """An axis measured at one value (one context, say) is constant along it, whichever axis it is."""
    first = Grid(("context", "nodes"), (np.array([512.0]), np.array([1.0, 3.0])), np.array([[1.0, 2.0]]))
    assert first(123, 2) == 1.5 and first(9999, 3) == 2.0
    np.testing.assert_array_equal(first(np.array([0, 512, 4096]), np.array([1, 2, 3])), [1.0, 1.5, 2.0])
    last = Grid(("nodes", "context"), (np.array([1.0, 3.0]), np.array([512.0])), np.array([[1.0], [2.0]]))
    assert last(2, 99) == 1.5 and last(3, 4096) == 2.0


def test_grid_values_are_floats_for_scalars_and_refuse_a_wrong_number_of_coordinates(profile):
    assert type(profile.vanilla_seconds(100)) is float
    assert type(profile.verify_seconds(3, 100)) is float
    assert np.shape(profile.verify_seconds(np.array([3, 4]), 100)) == (2,)
    with pytest.raises(ValueError):
        profile.fits["verify"](3)
    with pytest.raises(ValueError):
        profile.fits["vanilla"](3, 100)


def test_fits_name_their_axes_with_integers(profile):
    fits = profile.to_json()["fits"]
    assert fits["verify"]["nodes"] == NODES and fits["verify"]["context"] == CONTEXTS
    assert all(type(v) is int for v in fits["verify"]["nodes"] + fits["vanilla"]["context"])


def test_a_series_takes_the_median_unless_told_otherwise():
    series = Series(("nodes",), (((1,), (1.0, 2.0, 9.0)), ((2,), (4.0,))))
    assert series.grid("s").values.tolist() == [2.0, 4.0]
    assert series.grid("s", "mean").values.tolist() == [4.0, 4.0]


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
    (("samples", "verify", 3, "seconds"), [0.0], "samples.verify[3].seconds[0] = 0.0 is not a positive"),
    (("samples", "verify", 3, "seconds"), [True], "samples.verify[3].seconds[0] = true is not a positive"),
    (("samples", "verify"), {"nodes": 1}, "field samples.verify must be a list of rows"),
    (("samples", "verify", 0, "foo"), 1, "samples.verify[0] has unknown key"),
    (("samples", "draft", "eagle"), {"depth": 1}, "field samples.draft.eagle must be a non-empty list"),
]


@pytest.mark.parametrize(("path", "value", "named"), BAD, ids=[b[2] for b in BAD])
def test_a_bad_profile_fails_naming_the_field(tmp_path: Path, path, value, named):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(_set(measured(), path, value)))
    with pytest.raises(InputError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load_profile(file)


def test_infinite_seconds_and_a_malformed_block_size_are_refused():
    data = measured()
    data["samples"]["verify"][3]["seconds"] = [float("inf")]
    with pytest.raises(InputError, match=r"samples\.verify\[3\]\.seconds\[0\] = Infinity is not a "):
        profile_from_json(data)
    data = measured()
    del data["samples"]["draft"]["specblock"], data["models"]["drafters"]["specblock"]
    data["block_size"] = "4"
    with pytest.raises(InputError, match="field block_size must be a positive integer"):
        profile_from_json(data)


def rich() -> dict:
    """``measured()`` with every optional part: estimator, shapes, windows, single-window updates, prefill,
    steering, draft-model chains and trees, and a derivation."""
    data = measured()
    data["estimator"] = "mean"
    data["block_size"] = 1
    data["draft_shapes"] = {"eagle": {"top_k": 1, "total_tokens": 8}}
    data["update_windows"] = {"head": 1, "full": 2}
    data["derived_from"] = {"source": "a test", "derivation": "made up"}
    data["models"]["drafters"]["draft-model"] = "tiny-draft"
    samples = data["samples"]
    samples["update_single"] = {"head": [0.01], "full": [0.1]}
    samples["prefill"] = [{"tokens": t, "seconds": [1e-4 * t, 3e-4 * t]} for t in (64, 256)]
    samples["steering"] = [{"drafted": d, "seconds": [1e-5 * (d + 1), 3e-5 * (d + 1)]} for d in (0, 4, 16)]
    samples["draft"]["draft-model"] = [{"tokens": t, "seconds": [0.001 * t]} for t in (1, 2, 4)]
    trees = [{"depth": d, "width": w, "seconds": [1e-3 * d * w, 3e-3 * d * w]}
             for d in (1, 4) for w in (1, 3)]
    samples["draft_trees"] = {"draft-model": trees}
    batch = [{"requests": r, "nodes": n, "context": c, "seconds": [1e-4 * r * n + 1e-6 * c]}
             for r in (1, 4) for n in (1, 9) for c in (64, 256)]
    samples["batch_verify"] = batch
    samples["draft_backlog"] = [{"tokens": t, "seconds": [1e-3 + 1e-5 * t]} for t in (1, 96)]
    for rows in (samples["verify"], samples["vanilla"], *samples["draft"].values(), samples["prefill"],
                 samples["steering"], trees, batch, samples["draft_backlog"]):
        for row in rows:  # a third, slow repeat: the mean is no longer the median
            row["seconds"] = [*row["seconds"], 3 * row["seconds"][0], 20 * row["seconds"][0]]
    return data


def test_every_optional_part_round_trips_and_is_used(tmp_path):
    profile = profile_from_json(rich())
    again = load_profile(save_profile(profile, tmp_path / "rich.json"))
    data = again.to_json()
    assert data == profile.to_json()
    assert (data["dtype"], data["estimator"], data["block_size"]) == ("float32", "mean", 1)
    assert data["derived_from"] == {"source": "a test", "derivation": "made up"}
    assert set(data["samples"]) >= {"update_single", "prefill", "steering", "draft_trees", "batch_verify"}
    assert set(data["fits"]) >= {"update_single", "prefill", "steering", "draft_trees", "batch_verify"}
    samples = rich()["samples"]

    def mean(rows: list, **point: int) -> float:
        """The mean of the repeats at ``point``, which the profile says to use (not their median)."""
        seconds = next(r["seconds"] for r in rows if all(r[k] == v for k, v in point.items()))
        assert np.median(seconds) < 0.9 * np.mean(seconds)
        return float(np.mean(seconds))

    assert again.verify_seconds(8, 256) == pytest.approx(mean(samples["verify"], nodes=8, context=256))
    assert again.vanilla_seconds(0) == pytest.approx(mean(samples["vanilla"], context=0))
    assert again.steering_seconds(4) == pytest.approx(mean(samples["steering"], drafted=4))
    assert again.prefill_cost(64) == pytest.approx(mean(samples["prefill"], tokens=64))
    batched = mean(samples["batch_verify"], requests=4, nodes=9, context=256)
    assert again.batch_verify_seconds(4, 9, 256) == pytest.approx(batched)
    halfway = (mean(samples["batch_verify"], requests=1, nodes=9, context=256) + batched) / 2
    assert again.batch_verify_seconds(2.5, 9, 256) == pytest.approx(halfway)  # linear between requests
    backlog = mean(samples["draft_backlog"], tokens=96) - mean(samples["draft_backlog"], tokens=1)
    assert again.draft_backlog_seconds(np.array([0, 1, 96])) == pytest.approx([0.0, 0.0, backlog])
    trees = samples["draft_trees"]["draft-model"]
    tree = again.draft_seconds("draft-model", depth=4, width=3)
    assert tree == pytest.approx(mean(trees, depth=4, width=3))
    chains = samples["draft"]["draft-model"]
    assert again.draft_seconds("draft-model", tokens=2) == pytest.approx(mean(chains, tokens=2))
    blocks = samples["draft"]["specblock"]
    block = again.draft_seconds("specblock", starts=4, blocks=2)
    assert block == pytest.approx(mean(blocks, starts=4, blocks=2))
    full = np.mean(rich()["samples"]["update"]["full"])
    assert again.update_cost("full", fill=1.0, windows=2) == pytest.approx(full)
    plain = profile_from_json(measured()).to_json()
    assert "update_windows" not in plain and "update_single" not in plain["samples"]
    assert "steering" not in plain["fits"] and "draft_trees" not in plain["fits"]
    with pytest.raises(InputError, match="no batched verify samples"):
        profile_from_json(measured()).batch_verify_seconds(2, 4, 64)


def test_a_profile_at_one_context_costs_every_context_alike():
    data = measured()
    samples = data["samples"]
    samples["verify"] = [r for r in samples["verify"] if r["context"] == 256]
    samples["vanilla"] = [r for r in samples["vanilla"] if r["context"] == 256]
    profile = profile_from_json(data)
    steps = profile.step_seconds("eagle", range(5), np.array([0, 256, 9000]))
    assert steps.shape == (3, 5)
    np.testing.assert_array_equal(steps, np.broadcast_to(steps[1], (3, 5)))
    assert steps[0, 0] == profile.vanilla_seconds(256)
    step = profile.draft_seconds("eagle", depth=3) + profile.verify_seconds(4, 256)
    assert steps[0, 3] == pytest.approx(step)


def test_draft_rows_start_at_zero_and_step_tables_are_read_only(profile):
    assert profile.chain_draft_seconds("eagle", 0) == 0.0
    assert profile.draft_row("eagle", 3)[0] == 0.0 and profile.draft_row("eagle", 0).tolist() == [0.0]
    tree = profile.draft_row("eagle", 3, {"depth": 2})
    assert tree.tolist() == [0.0, *[profile.draft_seconds("eagle", depth=2)] * 3]
    with pytest.raises(InputError, match="n_max = -1 is negative"):
        profile.draft_row("eagle", -1)
    table = profile.step_table("eagle", 4)
    with pytest.raises(ValueError):
        table.table[0, 0] = 1.0
    assert profile.step_seconds("eagle", [], 100).shape == (0,)
    for bad in ([[1, 2]], [-1, 2]):
        with pytest.raises(InputError, match="n_range must be a 1-D sequence of draft lengths >= 0"):
            profile.step_seconds("eagle", bad, 100)
    none = profile.prefill_cost(np.array([64, 256]))
    assert none.shape == (2,) and none.dtype == np.float64 and not none.any()
    none = profile.steering_seconds(np.array([0, 3, 4]))
    assert none.shape == (3,) and none.dtype == np.float64 and not none.any()
    assert not np.any(profile.draft_backlog_seconds(np.array([1, 96])))


@pytest.mark.parametrize("counted", [1, 2])
def test_update_cost_from_one_window_with_few_windows_counted(profile, counted):
    data = {**profile.to_json(), "fits": None, "update_windows": {"head": counted, "full": 16}}
    one, head = 0.3 * profile.update_seconds("head"), profile.update_seconds("head")
    data["samples"] = {**data["samples"], "update_single": {"head": [one], "full": [0.1]}}
    loaded = profile_from_json(data)
    slope = 0.0 if counted == 1 else head - one
    windows = np.array([0.5, 1.0, 1.5, 3.0])
    expected = [0.5 * one, one, one + 0.5 * slope, one + 2 * slope]
    assert np.asarray(loaded.update_cost("head", fill=1.0, windows=windows)) == pytest.approx(expected)


def test_resolve_profile_and_token_by_token(tmp_path, profile):
    path = save_profile(profile, tmp_path / "mine.json")
    assert resolve_profile(path).device == "test cpu"
    assert resolve_profile(profile) is profile
    assert resolve_profile(None).derived_from is not None  # the shipped paper profile
    assert token_by_token("draft-model") and not token_by_token("eagle") and not token_by_token("nope")


def test_stale_fits_fail_within_a_part_per_million_and_when_malformed(profile):
    for value in (None, "x", "list", "keys"):
        data = profile.to_json()
        seconds = data["fits"]["verify"]["seconds"][2]
        if value == "list":
            data["fits"]["verify"] = [1.0]
        elif value == "keys":
            del data["fits"]["verify"]["nodes"]
        else:  # a relative change of 1e-7: far below numpy's default tolerance, far above the profile's
            seconds[1] = seconds[1] * (1 + 1e-7) if value is None else value
        with pytest.raises(InputError, match=r"^fits(\.verify(\.seconds)?)? does not match the samples"):
            profile_from_json(data)


def test_a_drafter_grid_with_a_hole_fails_naming_its_series():
    data = measured()
    rows = data["samples"]["draft"]["specblock"]
    data["samples"]["draft"]["specblock"] = [r for r in rows if (r["starts"], r["blocks"]) != (4, 2)]
    with pytest.raises(InputError, match=r"samples\.draft\.specblock has no row for starts=4, blocks=2"):
        profile_from_json(data)


def test_a_grid_with_a_hole_fails_naming_the_missing_point():
    data = measured()
    rows = data["samples"]["verify"]
    data["samples"]["verify"] = [r for r in rows if (r["nodes"], r["context"]) != (8, 256)]
    with pytest.raises(InputError, match="samples.verify has no row for nodes=8, context=256: measure every "
                                         "combination of nodes, context "
                       r"\(a full grid\)"):
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
