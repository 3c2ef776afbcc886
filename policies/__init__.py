"""Speculation-length and adaptation policies, their file format, and the shared observation features.

numpy only: this package imports neither torch nor the engine, so the simulator and the engine can
both depend on it.
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

__all__ = [
    "ACTIONS", "ADAPT_FEATURES", "ADAPT_INDEX", "ADAPT_INFO_KEYS", "FULL", "HEAD", "LENGTH_CAP", "LENGTH_DIM",
    "LENGTH_SLICES", "POLICY_FILE_VERSION", "POLICY_KINDS", "SKIP", "AlwaysAdapt", "CostAwareBandit",
    "EpsilonGreedyAdapt", "FixedLength", "HeuristicLength", "InputError", "LibraSpecExhaustive",
    "LibraSpecLength", "NeverAdapt", "Policy", "ThresholdLength", "adapt_features", "expected_tokens",
    "length_features", "load_policy", "make_policy", "policy_from_dict", "policy_to_dict", "save_policy",
    "speedup_curve",
]
