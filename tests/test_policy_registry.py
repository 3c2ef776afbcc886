"""A policy kind is one module plus one registration: a toy length policy registered here is a length
kind everywhere kinds are listed (``role_kinds``, `specblock tune length`'s defaults, the pipeline's
length kinds), is searched within its own ``SEARCH`` and ``ORDERED``, and loads from a policy file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from core.names import ROLES
from core.paths import PAPER_PROFILE
from experiments.pipeline.run import length_kinds
from experiments.tuning.tune import Traffic, check_kinds, configurations, evaluate, make_setting
from policies import (
    POLICY_FILE_VERSION,
    POLICY_KINDS,
    USES,
    load_policy,
    make_policy,
    policy_role,
    role_kinds,
    save_policy,
    tune_kinds,
)
from policies.base import Params, register
from policies.features import LENGTH_CAP
from policies.length import _LengthPolicy


@dataclass(frozen=True)
class ToyParams(Params):
    """``length``: positions verified, at most ``cap``."""

    length: int = 2
    cap: int = LENGTH_CAP
    RANGES: ClassVar = {"length": (0, LENGTH_CAP, True), "cap": (0, LENGTH_CAP, True)}
    SEARCH: ClassVar = {"length": (1, 3)}
    ORDERED: ClassVar = ("length", "cap")


class ToyLength(_LengthPolicy):
    """Verify ``min(length, cap)`` positions whatever the confidences."""

    kind = "toy-length"
    params_type = ToyParams
    reads_confidences = False

    def choose(self, confidences: np.ndarray, step_seconds: np.ndarray) -> int:
        return min(self.params.length, self.params.cap)


@pytest.fixture
def toy() -> Iterator[str]:
    """The toy kind, registered for one test (the registry is shared by the whole test session)."""
    register(ToyLength)
    yield ToyLength.kind
    del POLICY_KINDS[ToyLength.kind]


def test_every_role_has_a_use_and_its_kinds(toy: str):
    assert tuple(USES) == ROLES
    assert set(POLICY_KINDS) == {kind for role in ROLES for kind in role_kinds(role)}


def test_one_registration_makes_a_length_kind_everywhere(toy: str):
    assert policy_role(make_policy(toy)) == "length" and toy in role_kinds("length")
    before = ("libraspec", "threshold", "heuristic", "fixed")  # ranked on their classes; the toy sets none
    assert tune_kinds("length") == check_kinds("length", ()) == (*before, toy)
    assert length_kinds() == ("fixed", "threshold", "heuristic", "libraspec", toy)
    assert toy not in role_kinds("serving") + tune_kinds("adaptation")


def test_the_toy_is_searched_within_its_own_bounds_and_simulated(toy: str):
    configs = configurations(toy, "random", 12, seed=0)
    assert configs[0] == {"length": 2, "cap": LENGTH_CAP} and len(configs) > 1
    assert all(c["length"] <= min(3, c["cap"]) for c in configs)  # drawn in 1..3, then sorted with cap
    setting = make_setting("length", PAPER_PROFILE, queries=8, chunks=1, traffic=Traffic())
    assert evaluate(setting, toy, {"length": 3, "cap": 3}).tokens_per_second > 0


def test_the_toy_loads_from_a_policy_file(toy: str, tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"kind": toy, "version": POLICY_FILE_VERSION,
                                "params": {"length": 3, "cap": 5}}))
    policy = load_policy(path)
    assert type(policy) is ToyLength and policy.params == ToyParams(3, 5)
    assert load_policy(save_policy(policy, tmp_path / "again.json")).params == policy.params


def test_a_policy_without_a_role_is_refused():
    class Roleless:
        kind = "roleless"
        params_type = ToyParams

    with pytest.raises(TypeError, match="role"):
        register(Roleless)
    assert "roleless" not in POLICY_KINDS
