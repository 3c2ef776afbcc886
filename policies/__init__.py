"""Speculation-length, adaptation and serving policies, their file format, and the shared observation
features.

A policy kind is one class with one registration (``policies.base.register``), in a module imported
here; its ``role`` and ``tune_rank`` say where it goes (``role_kinds``, ``tune_kinds``). numpy only: this
package imports neither torch nor the engine, so the simulator and the engine can both depend on it.
"""

from core.errors import InputError
from policies.adaptation import (
    ACTIONS,
    ADAPT_INFO_KEYS,
    FULL,
    HEAD,
    SKIP,
    AlwaysAdapt,
    CostAwareBandit,
    EpsilonGreedyAdapt,
    NeverAdapt,
)
from policies.base import (
    KIND_ALIASES,
    POLICY_FILE_VERSION,
    POLICY_KINDS,
    Policy,
    canonical_kind,
    load_policy,
    make_policy,
    policy_from_dict,
    policy_to_dict,
    save_policy,
    tune_rank,
)
from policies.features import (
    ADAPT_FEATURES,
    ADAPT_INDEX,
    LENGTH_CAP,
    LENGTH_DIM,
    LENGTH_SLICES,
    adapt_features,
    length_features,
)
from policies.length import (
    FixedLength,
    HeuristicLength,
    LibraSpecExhaustive,
    LibraSpecLength,
    ThresholdLength,
    expected_tokens,
    speedup_curve,
)
from policies.serving import BatchTable, Goodput, LibraSpecBatch, ThresholdBatch

__all__ = [
    "ACTIONS",
    "ADAPT_FEATURES",
    "ADAPT_INDEX",
    "ADAPT_INFO_KEYS",
    "FULL",
    "HEAD",
    "KIND_ALIASES",
    "LENGTH_CAP",
    "LENGTH_DIM",
    "LENGTH_SLICES",
    "POLICY_FILE_VERSION",
    "POLICY_KINDS",
    "SKIP",
    "AlwaysAdapt",
    "BatchTable",
    "CostAwareBandit",
    "EpsilonGreedyAdapt",
    "FixedLength",
    "Goodput",
    "HeuristicLength",
    "InputError",
    "LibraSpecBatch",
    "LibraSpecExhaustive",
    "LibraSpecLength",
    "NeverAdapt",
    "Policy",
    "ThresholdBatch",
    "ThresholdLength",
    "adapt_features",
    "canonical_kind",
    "check_role",
    "expected_tokens",
    "length_features",
    "load_policy",
    "make_policy",
    "policy_from_dict",
    "policy_role",
    "policy_to_dict",
    "role_kinds",
    "save_policy",
    "speedup_curve",
    "tune_kinds",
]

USES = {"length": "a length policy steers one query's drafts (`specblock generate|bench --policy`)",
        "adaptation": "an adaptation policy decides drafter updates across a stream of queries (deploy it "
                      "with `specblock pipeline`)",
        "serving": "a serving policy sets the lengths of a batch's requests (the SpecServe-v0 environment)"}
"""Where a policy of each role (``core.names.ROLES``) goes, for error messages."""


def policy_role(policy: Policy) -> str:
    """``length``, ``adaptation`` or ``serving``: what ``policy`` decides (its class's ``role``)."""
    return type(policy).role


def role_kinds(role: str, tuned: bool = False) -> tuple[str, ...]:
    """The registered policy kinds that play ``role``, in registration order; ``tuned``: only those tuned
    by default (``tune_rank`` not None)."""
    return tuple(kind for kind, cls in POLICY_KINDS.items()
                 if cls.role == role and not (tuned and tune_rank(cls) is None))


def tune_kinds(role: str) -> tuple[str, ...]:
    """The kinds `specblock tune <role>` searches when none are named: ``role_kinds(role, tuned=True)`` by
    their ``tune_rank`` (ties in registration order)."""
    return tuple(sorted(role_kinds(role, tuned=True), key=lambda kind: tune_rank(POLICY_KINDS[kind])))


def check_role(policy: Policy, role: str, source: str) -> Policy:
    """``policy`` when it plays ``role``; else InputError naming ``source``, its role and where it goes."""
    actual = policy_role(policy)
    if actual != role:
        raise InputError(f"{source}: kind {policy.kind!r} is not a {role} policy: {USES[actual]}; give a "
                         f"{role} policy")
    return policy
