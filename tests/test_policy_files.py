"""The versioned JSON policy file: round trip for every kind, and a clear one-line error per bad file."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

from policies import (
    KIND_ALIASES,
    POLICY_FILE_VERSION,
    POLICY_KINDS,
    InputError,
    load_policy,
    make_policy,
    policy_role,
    save_policy,
)
from policies.features import SERVE_SLOT_DIM, adapt_features, length_features, serve_features

# Non-default parameters for every kind, so a round trip proves each one is written and read back.
NON_DEFAULT = {
    "fixed": {"length": 7},
    "threshold": {"threshold": 0.45, "max_length": 9},
    "heuristic": {"initial": 3, "min_length": 2, "max_length": 12, "grow": 3, "shrink": 2},
    "libraspec": {"max_length": 11},
    "libraspec-exhaustive": {"max_length": 13},
    "never": {},
    "always": {"update": "full"},
    "epsilon-greedy": {"epsilon": 0.2, "alpha": 0.4},
    "cost-aware-bandit": {"warmup": 5, "cold_start_events": 4, "epsilon_start": 0.5, "epsilon_end": 0.05,
                          "cooldown": 3, "s_min": 7.0, "gain_alpha": 0.25, "throughput_alpha": 0.1,
                          "saturation": 0.9, "window": 6, "revert_windows": 2},
    "batch-table": {"l1": 6, "l4": 2, "l8": 0},
    "goodput": {"max_length": 5},
    "libraspec-batch": {"max_length": 6, "margin": 1.2},
    "threshold-batch": {"threshold": 0.35, "max_length": 5},
}


def test_every_registered_kind_is_covered():
    assert set(NON_DEFAULT) == set(POLICY_KINDS)


@pytest.mark.parametrize("kind", sorted(NON_DEFAULT))
def test_round_trip(kind, tmp_path):
    policy = make_policy(kind, NON_DEFAULT[kind])
    defaults = POLICY_KINDS[kind].params_type()
    assert all(getattr(policy.params, k) != getattr(defaults, k) for k in NON_DEFAULT[kind])
    path = save_policy(policy, tmp_path / "policy.json")
    assert [p.name for p in tmp_path.iterdir()] == ["policy.json"]  # no temporary file left behind
    data = json.loads(path.read_text())
    assert data == {"kind": kind, "version": POLICY_FILE_VERSION, "params": dataclasses.asdict(policy.params)}
    loaded = load_policy(path, seed=0)
    assert type(loaded) is type(policy) and loaded.params == policy.params
    if policy_role(policy) == "length":
        obs = length_features(np.array([0.9, 0.7, 0.6, 0.2]), 10, np.linspace(1.0, 1.8, 17))
    elif policy_role(policy) == "serving":
        slots = np.zeros((2, SERVE_SLOT_DIM))
        slots[0, :7] = (1, 40, 20, 0.9, 0.8, 0.7, 0.6)
        obs = serve_features(1, 0, (0.03, 0.001, 0.001, 0.0005), slots)
    else:
        obs = adapt_features(1.0, 1.0, 9.0, 3.0, 0.0, 0, np.array([1.0]))
    assert np.array_equal(loaded.act(obs), make_policy(kind, NON_DEFAULT[kind], seed=0).act(obs))


@pytest.mark.parametrize("old", sorted(KIND_ALIASES))
def test_a_file_of_an_old_spelled_kind_loads_as_the_kind_it_names(old, tmp_path):
    """Files written before kinds were hyphenated (``epsilon_greedy``, ...) load through the aliases; saved
    again, they take the current spelling."""
    kind = KIND_ALIASES[old]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"kind": old, "version": POLICY_FILE_VERSION, "params": NON_DEFAULT[kind]}))
    loaded = load_policy(path)
    assert loaded.kind == kind and loaded.params == make_policy(kind, NON_DEFAULT[kind]).params
    assert json.loads(save_policy(loaded, tmp_path / "new.json").read_text())["kind"] == kind
    assert old not in POLICY_KINDS


def test_numpy_parameters_are_stored_as_plain_json(tmp_path):
    policy = make_policy("threshold", {"threshold": np.float32(0.5), "max_length": np.int64(4)})
    loaded = load_policy(save_policy(policy, tmp_path / "p.json"))
    assert loaded.params.max_length == 4 and type(loaded.params.max_length) is int


def good_file():
    return {"kind": "threshold", "version": POLICY_FILE_VERSION,
            "params": {"threshold": 0.4, "max_length": 8}}


BAD_FILES = {
    "unknown kind": ({**good_file(), "kind": "oracle"}, "unknown policy kind 'oracle'"),
    "wrong version": ({**good_file(), "version": 2}, "version 2"),
    "out-of-range": ({**good_file(), "params": {"threshold": 1.5, "max_length": 8}}, "threshold = 1.5"),
    "integer as float": ({**good_file(), "params": {"threshold": 0.4, "max_length": 8.5}}, "max_length"),
    "boolean": ({**good_file(), "params": {"threshold": True, "max_length": 8}}, "threshold"),
    "extra parameter": ({**good_file(), "params": {"threshold": 0.4, "max_length": 8, "gamma": 1}}, "gamma"),
    "missing parameter": ({**good_file(), "params": {"threshold": 0.4}}, "missing parameter(s) max_length"),
    "extra key": ({**good_file(), "note": "hi"}, "exactly the keys"),
    "not an object": ([1, 2], "exactly the keys"),
    "params not an object": ({**good_file(), "params": [0.4, 8]}, "params must be a JSON object"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_raises_one_line_input_error(name, tmp_path):
    content, expected = BAD_FILES[name]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError) as err:
        load_policy(path)
    message = str(err.value)
    assert "\n" not in message and expected in message and str(path) in message


@pytest.mark.parametrize("raw", [b"{not json", pickle.dumps(good_file()), b""])
def test_non_json_file_is_refused_without_unpickling(raw, tmp_path):
    path = tmp_path / "policy.json"
    path.write_bytes(raw)
    with pytest.raises(InputError, match="not a JSON policy file") as err:
        load_policy(path)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such policy file"):
        load_policy(tmp_path / "absent.json")


@pytest.mark.parametrize("kind, params, fragment", [
    ("fixed", {"length": 17}, "length = 17 is invalid: use an integer in [0, 16]"),
    ("heuristic", {"initial": 1, "min_length": 2}, "min_length <= initial <= max_length"),
    ("always", {"update": "both"}, "use one of head, full"),
    ("cost-aware-bandit", {"window": 0}, "window = 0"),
    ("epsilon-greedy", {"epsilon": -0.1}, "epsilon = -0.1"),
    ("libraspec", {"max_len": 3}, "unknown parameter(s) max_len"),
    ("tree_search", {}, "unknown policy kind"),
])
def test_construction_validates_parameters(kind, params, fragment):
    with pytest.raises(InputError) as err:
        make_policy(kind, params)
    assert fragment in str(err.value)
