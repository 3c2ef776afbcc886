"""Per-shape drafting costs: the draft model's tree series, fixed draft settings, tree-shaped step tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_costs import measured

from core.cost_profile import load_profile, profile_from_json, save_profile
from core.errors import InputError
from core.paths import PAPER_PROFILE
from policies.features import LENGTH_CAP, LENGTH_SLICES
from simulator.spec_length import SpecLengthEnv, SpecLengthVectorEnv

DEPTHS, WIDTHS = (2, 4, 8), (2, 4)


def tree_cost(depth: int, width: int) -> float:
    """A made-up tree drafting time: one draft forward per level, wider frontiers cost a little more."""
    return 1e-3 * depth * (1.0 + 0.1 * width)


def with_trees() -> dict:
    """``test_costs.measured()`` plus a draft model (chains and top-k trees) and fixed draft settings."""
    data = measured()
    data["models"]["drafters"]["draft-model"] = "tiny-draft"
    data["samples"]["draft"]["draft-model"] = [{"tokens": n, "seconds": [1e-3 * n]} for n in (1, 2, 4, 8)]
    data["samples"]["draft_trees"] = {"draft-model": [
        {"depth": d, "width": w, "seconds": [tree_cost(d, w)]} for d in DEPTHS for w in WIDTHS]}
    data["draft_shapes"] = {"eagle": {"top_k": 4, "total_tokens": 24}, "draft-model": {"tree_budget": 16}}
    return data


@pytest.fixture(scope="module")
def profile():
    return profile_from_json(with_trees())


def test_tree_series_interpolate_between_shapes(profile) -> None:
    assert profile.draft_seconds("draft-model", depth=4, width=2) == pytest.approx(tree_cost(4, 2))
    assert profile.draft_seconds("draft-model", tokens=4) == pytest.approx(4e-3)  # the chain series
    between = profile.draft_seconds("draft-model", depth=6, width=3)  # bilinear in depth and width
    assert between == pytest.approx(np.mean([tree_cost(d, w) for d in (4, 8) for w in (2, 4)]))
    rows = with_trees()["samples"]["draft"]["specblock"]
    sb = {(r["starts"], r["blocks"]): np.median(r["seconds"]) for r in rows}
    assert profile.draft_seconds("specblock", starts=4, blocks=2) == sb[4, 2]
    third = sb[1, 2] + (sb[4, 2] - sb[1, 2]) / 3  # 2 starts: a third of the way from 1 to 4
    assert profile.draft_seconds("specblock", starts=2, blocks=2) == pytest.approx(third)


def test_a_tree_shape_costs_the_whole_tree_for_every_n(profile) -> None:
    shape = {"depth": 4, "width": 3}
    steps = profile.step_seconds("draft-model", range(13), 256.0, shape)
    verify = profile.verify_seconds(np.arange(2, 14), 256.0)
    whole = profile.draft_seconds("draft-model", **shape)
    np.testing.assert_allclose(steps[1:], whole + verify, rtol=1e-12)
    assert steps[0] == pytest.approx(profile.vanilla_seconds(256.0))
    eagle = profile.step_seconds("eagle", range(9), 256.0, {"depth": 6})  # an EAGLE tree of depth 6
    np.testing.assert_allclose(eagle[1:] - profile.verify_seconds(np.arange(2, 10), 256.0),
                               profile.draft_seconds("eagle", depth=6), rtol=1e-12)
    chain = profile.step_seconds("eagle", range(9), 256.0)  # a chain drafts only n positions
    assert chain[1] < eagle[1]
    assert profile.step_table("eagle", 8) is not profile.step_table("eagle", 8, {"depth": 6})  # cached apart


def test_a_list_of_shapes_costs_their_mean(profile) -> None:
    shapes = [{"starts": 1, "blocks": 1}, {"starts": 4, "blocks": 2}, {"starts": 2.5, "blocks": 2}]
    steps = profile.step_seconds("specblock", range(5), 256.0, shapes)
    mean = np.mean([profile.draft_seconds("specblock", **s) for s in shapes])
    np.testing.assert_allclose(steps[1:], mean + profile.verify_seconds(np.arange(2, 6), 256.0), rtol=1e-12)
    one = profile.step_seconds("specblock", range(5), 256.0, shapes[1])
    assert one[1] > steps[1]  # a different list is a different table, not a cached one
    with pytest.raises(InputError, match="list of draft shapes is empty"):
        profile.step_table("specblock", 4, [])


def test_shapes_must_name_a_series(profile) -> None:
    with pytest.raises(InputError, match=r"timed by \(tokens\) or \(depth, width\)"):
        profile.step_table("draft-model", 4, {"depth": 4})
    with pytest.raises(InputError, match=r"timed by \(depth\), got"):
        profile.draft_seconds("eagle", depth=4, width=2)
    chain = profile.step_seconds("draft-model", range(5), 256.0)  # no shape: the chain series, per n
    drafting = chain[1:] - profile.verify_seconds(np.arange(2, 6), 256.0)
    np.testing.assert_allclose(drafting, [1e-3, 2e-3, 3e-3, 4e-3])


def test_shapes_round_trip_and_old_files_still_load(profile, tmp_path: Path) -> None:
    back = load_profile(save_profile(profile, tmp_path / "p.json"))
    assert back.draft_shapes["eagle"]["total_tokens"] == 24 and back == profile
    paper = load_profile(PAPER_PROFILE).to_json()  # schema v1 files need none of the new fields
    assert "draft_shapes" not in paper and "draft_trees" not in paper["samples"]


@pytest.mark.parametrize(("shapes", "message"), [
    ({"medusa": {"heads": 4}}, "samples.draft lacks"),
    ({"eagle": {"depth": 4}}, "not the grid keys"),
    ({"draft-model": {"width": 4}}, "not the grid keys"),
    ({"eagle": {"top_k": 0}}, "positive integers"),
    ({"eagle": {"top_k": 2.5}}, "positive integers"),
    ({"eagle": 4}, "must be an object"),
])
def test_bad_shapes_fail_at_the_door(shapes: dict, message: str, tmp_path: Path) -> None:
    data = with_trees()
    data["draft_shapes"] = shapes
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=message):
        load_profile(path)


def test_bad_tree_series_are_refused() -> None:
    data = with_trees()
    data["samples"]["draft_trees"]["draft-model"].pop()
    with pytest.raises(InputError, match=r"draft_trees\.draft-model has no row for depth=8, width=4"):
        profile_from_json(data)
    data = with_trees()
    data["samples"]["draft_trees"]["eagle"] = [{"depth": 2, "width": 2, "seconds": [1e-3]}]
    with pytest.raises(InputError, match="with kind in draft-model"):
        profile_from_json(data)
    data = with_trees()
    del data["samples"]["draft"]["draft-model"], data["models"]["drafters"]["draft-model"]
    del data["draft_shapes"]
    with pytest.raises(InputError, match=r"next to their samples\.draft series"):
        profile_from_json(data)


def test_the_env_costs_a_tree_shape() -> None:
    env = SpecLengthEnv(drafter="eagle", draft_shape={"depth": 6})
    obs, _ = env.reset(seed=0)
    expected = env.batch.profile.step_seconds("eagle", range(LENGTH_CAP + 1), obs[0], {"depth": 6})
    np.testing.assert_allclose(obs[LENGTH_SLICES["step_seconds"]], expected, rtol=1e-12)
    assert obs[LENGTH_SLICES["step_seconds"]][1] > env.batch.profile.step_seconds("eagle", [1], obs[0])[0]


def test_the_vector_env_costs_a_tree_shape_as_the_single_env() -> None:
    single = SpecLengthEnv(drafter="eagle", draft_shape={"depth": 6})
    vector = SpecLengthVectorEnv(1, drafter="eagle", draft_shape={"depth": 6})
    np.testing.assert_array_equal(single.reset(seed=3)[0], vector.reset(seed=3)[0][0])
