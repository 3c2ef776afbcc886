"""Speculation-length and adaptation policies, their file format, and the shared observation features.

numpy only: this package imports neither torch nor the engine, so the simulator and the engine can
both depend on it.
"""

from core.errors import InputError
from policies import adaptation, length, serving
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
    POLICY_FILE_VERSION,
    POLICY_KINDS,
    Policy,
    load_policy,
    make_policy,
    policy_from_dict,
    policy_to_dict,
    save_policy,
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
]

ROLES = {length.__name__: "length", adaptation.__name__: "adaptation", serving.__name__: "serving"}
"""What a policy decides, by the module of its kind: a query's speculation lengths, drafter updates
across a stream, or the lengths of every request of a batch."""
USES = {"length": "a length policy steers one query's drafts (`specblock generate|bench --policy`)",
        "adaptation": "an adaptation policy decides drafter updates across a stream of queries (deploy it "
                      "with `specblock pipeline`)",
        "serving": "a serving policy sets the lengths of a batch's requests (the SpecServe-v0 environment)"}


def policy_role(policy: Policy) -> str:
    """``length``, ``adaptation`` or ``serving``: what ``policy`` decides (``ROLES``)."""
    return ROLES[type(policy).__module__]


def role_kinds(role: str) -> tuple[str, ...]:
    """The registered policy kinds that play ``role``, in registration order."""
    return tuple(kind for kind, cls in POLICY_KINDS.items() if ROLES[cls.__module__] == role)


def check_role(policy: Policy, role: str, source: str) -> Policy:
    """``policy`` when it plays ``role``; else InputError naming ``source``, its role and where it goes."""
    actual = policy_role(policy)
    if actual != role:
        raise InputError(f"{source}: kind {policy.kind!r} is not a {role} policy: {USES[actual]}; give a "
                         f"{role} policy")
    return policy
