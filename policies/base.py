"""The policy protocol, the registry of policy kinds and the versioned JSON policy file.

A policy kind is one class with its ``kind`` (hyphenated, as on the command line), ``role`` (one of
``core.names.ROLES``) and frozen ``params_type``, made known by ``register``; everything that lists kinds
(``specblock tune``, the pipeline, the studies) reads this registry. A policy file is
``{"kind": str, "version": 1, "params": {...}}`` with every parameter of that kind present, and for a
policy that reads confidences optionally ``"calibration": {...}`` (``policies.calibration``: how its
confidences map to acceptance probabilities). Files are plain JSON,
written atomically and validated when loaded; nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from core.errors import InputError
from core.files import MAX_POLICY_BYTES, read_json, write_json
from core.names import ROLES
from policies.calibration import Calibration

POLICY_FILE_VERSION = 1


class Policy(Protocol):
    """A decision rule the simulator and the engine drive the same way: act, then observe the outcome."""

    kind: ClassVar[str]
    role: ClassVar[str]
    params: Any

    def reset(self, seed: int | None = None) -> None:
        """Forget all learned state and reseed the random generator."""

    def act(self, obs: np.ndarray) -> int:
        """Choose an action for the observation built by ``policies.features``."""

    def observe(self, obs: np.ndarray, action: int, reward: float, info: Mapping[str, float]) -> None:
        """Learn from the outcome of taking ``action`` on ``obs``."""


POLICY_KINDS: dict[str, type] = {}
"""Every registered policy class, by its ``kind``."""
KIND_ALIASES: Mapping[str, str] = {
    "epsilon_greedy": "epsilon-greedy", "cost_aware_bandit": "cost-aware-bandit",
    "libraspec_exhaustive": "libraspec-exhaustive",
}
"""Old spellings of kinds, still read from policy files and accepted wherever a kind is named."""

P = TypeVar("P", bound=type)


def register(cls: P) -> P:
    """Class decorator: make a policy kind known to every list of kinds and loadable from files (needs
    ``kind``, ``role`` and ``params_type``; ``tune_rank`` optionally, see ``tune_rank``)."""
    params_type = getattr(cls, "params_type", None)
    if getattr(cls, "role", None) not in ROLES or not dataclasses.is_dataclass(params_type):
        raise TypeError(f"policy class {cls.__name__} needs a role in {ROLES} and a params_type dataclass")
    POLICY_KINDS[cls.kind] = cls
    return cls


def canonical_kind(kind: str) -> str:
    """``kind`` as registered: an old spelling (``KIND_ALIASES``) becomes its current one."""
    return KIND_ALIASES.get(kind, kind)


def tune_rank(cls: type) -> float | None:
    """Where kind ``cls`` comes among its role's kinds that `specblock tune` searches by default: its class
    attribute ``tune_rank`` (lower first; after every ranked kind when it sets none), or None when it sets
    ``tune_rank = None``: tuned only when named."""
    return getattr(cls, "tune_rank", math.inf)


def check_number(name: str, value: Any, low: float, high: float, integer: bool = False) -> int | float:
    """Return ``value`` as a plain int/float; InputError naming ``name`` and its range if outside it."""
    kind = "an integer" if integer else "a number"
    valid = Integral if integer else Real
    if isinstance(value, bool) or not isinstance(value, valid) or not (low <= value <= high):
        raise InputError(f"parameter {name} = {value!r} is invalid: use {kind} in [{low}, {high}]")
    return int(value) if integer else float(value)


@dataclasses.dataclass(frozen=True)
class Params:
    """Base of each kind's frozen parameters, checked against ``RANGES`` when constructed.

    ``RANGES`` maps each field to ``(low, high, integer)`` or to a tuple of allowed strings. ``SEARCH`` and
    ``ORDERED`` tell a tune study (``experiments.tuning.tune``) how to search them.
    """

    RANGES: ClassVar[Mapping[str, tuple]] = {}
    SEARCH: ClassVar[Mapping[str, tuple[float, float]]] = {}
    """The (low, high) a tune study searches, for parameters whose valid range is unbounded or far wider
    than a useful search (the others are searched over their whole ``RANGES``)."""
    ORDERED: ClassVar[tuple[str, ...]] = ()
    """Parameters that must be non-decreasing: a sampled configuration takes their values sorted."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            spec, value = self.RANGES[field.name], getattr(self, field.name)
            if all(isinstance(choice, str) for choice in spec):
                if value not in spec:
                    raise InputError(f"parameter {field.name} = {value!r} is invalid: "
                                     f"use one of {', '.join(spec)}")
            else:
                object.__setattr__(self, field.name, check_number(field.name, value, *spec))


def _kinds() -> str:
    return ", ".join(sorted(POLICY_KINDS))


def make_policy(kind: str, params: Mapping[str, Any] | None = None, seed: int | None = None,
                calibration: Calibration | None = None) -> Policy:
    """Build a policy of ``kind``; parameters left out take their defaults, unknown ones are an error; a
    ``calibration`` only for kinds that read confidences (the length and serving policies but the fixed
    ones). An old spelling of ``kind`` (``KIND_ALIASES``) builds the kind it names."""
    kind = canonical_kind(kind)
    if kind not in POLICY_KINDS:
        raise InputError(f"unknown policy kind {kind!r}: use one of {_kinds()}")
    cls = POLICY_KINDS[kind]
    params = dict(params or {})
    names = {f.name for f in dataclasses.fields(cls.params_type)}
    extra = sorted(set(params) - names)
    if extra:
        raise InputError(f"unknown parameter(s) {', '.join(extra)} for policy kind {kind!r}: "
                         f"use only {', '.join(sorted(names))}")
    if calibration is None:
        return cls(cls.params_type(**params), seed=seed)
    if not getattr(cls, "reads_confidences", False):
        raise InputError(f"policy kind {kind!r} reads no drafter confidences: drop its calibration")
    return cls(cls.params_type(**params), seed=seed, calibration=calibration)


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The JSON-ready file content of ``policy``."""
    out = {"kind": policy.kind, "version": POLICY_FILE_VERSION, "params": dataclasses.asdict(policy.params)}
    calibration = getattr(policy, "calibration", None)
    return out if calibration is None else {**out, "calibration": calibration.to_dict()}


def save_policy(policy: Policy, path: str | Path) -> Path:
    """Write ``policy`` as a versioned JSON policy file, atomically."""
    return write_json(path, policy_to_dict(policy))


def policy_from_dict(data: Any, seed: int | None = None, source: str = "policy") -> Policy:
    """Validate a decoded policy file (every key and parameter present, nothing extra) and build it."""
    if not isinstance(data, dict) or not {"kind", "version", "params"} <= set(data) <= {
            "kind", "version", "params", "calibration"}:
        raise InputError(f"{source}: a policy file must be a JSON object with exactly the keys "
                         "kind, version, params (and optionally calibration): re-export it with save_policy")
    if data["version"] != POLICY_FILE_VERSION or isinstance(data["version"], bool):
        raise InputError(f"{source}: policy file version {data['version']!r} is not supported: "
                         f"re-export it with version {POLICY_FILE_VERSION}")
    kind, params = data["kind"], data["params"]
    kind = canonical_kind(kind) if isinstance(kind, str) else kind
    if not isinstance(kind, str) or kind not in POLICY_KINDS:
        raise InputError(f"{source}: unknown policy kind {kind!r}: use one of {_kinds()}")
    if not isinstance(params, dict):
        raise InputError(f"{source}: params must be a JSON object: write the {kind} parameters by name")
    names = {f.name for f in dataclasses.fields(POLICY_KINDS[kind].params_type)}
    missing = sorted(names - set(params))
    if missing:
        raise InputError(f"{source}: missing parameter(s) {', '.join(missing)} for policy kind {kind!r}: "
                         "add them (save_policy writes every parameter)")
    calibration = data.get("calibration")
    try:
        return make_policy(kind, params, seed=seed,
                           calibration=None if calibration is None else Calibration.from_dict(calibration))
    except InputError as err:
        raise InputError(f"{source}: {err}") from None


def load_policy(path: str | Path, seed: int | None = None) -> Policy:
    """Read and validate a policy file written by ``save_policy``."""
    data = read_json(path, MAX_POLICY_BYTES, "policy file", "pass a file written by save_policy")
    return policy_from_dict(data, seed=seed, source=str(path))


def info_value(info: Mapping[str, float], key: str, kind: str) -> float:
    """``info[key]`` as a float; InputError naming the key the policy ``kind`` needs when it is absent."""
    if key not in info:
        raise InputError(f"policy {kind!r} needs info[{key!r}] after each step: have the environment or "
                         "engine report it")
    return float(info[key])
