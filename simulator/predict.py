"""Predict a policy on a machine's costs and a drafter's acceptance: the one place every job turns "this
policy, this cost profile, this acceptance" into an environment and its rollout.

``make_env`` builds the environment a policy's role plays in (a length policy: ``SpecLengthVectorEnv``
with one query per slot; an adaptation policy: one ``AdaptStreamEnv`` stream, the default domain shift
unless ``phases`` are given; a serving policy: one ``SpecServeEnv`` episode) and ``predict`` runs the
policy through it with ``simulator.rollout``. Tuning's objective, `specblock simulate`, the pipeline's
and the fidelity study's predictions, adapt-live's and serve-bench's all call these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies import policy_role
from policies.base import Policy
from simulator.acceptance import AcceptanceModel
from simulator.adapt_stream import AdaptStreamEnv, default_phases
from simulator.env_base import ProfileArg
from simulator.rollout import Outcome, run_adapt, run_length, run_serve
from simulator.spec_length import SpecLengthVectorEnv
from simulator.spec_serve import SpecServeEnv

ROLLOUTS = {"length": run_length, "adaptation": run_adapt, "serving": run_serve}


@dataclass(frozen=True)
class Prediction:
    """What the rollout totalled, and the environment after it (a serving episode's latencies)."""

    outcome: Outcome
    env: Any


def make_env(role: str, profile: ProfileArg, acceptance: AcceptanceModel, drafter: str, queries: int,
             **options: Any) -> Any:
    """The environment a policy of ``role`` is predicted in: ``queries`` length queries (one per slot), an
    adaptation stream of ``queries`` queries, or a serving episode of ``queries`` arrivals; ``options``
    go to the environment as they are (``phases`` defaulting to ``default_phases``)."""
    if role == "length":
        return SpecLengthVectorEnv(queries, profile, acceptance, drafter, **options)
    if role == "adaptation":
        phases = options.pop("phases", None) or default_phases(acceptance.domains, queries)
        return AdaptStreamEnv(profile, acceptance, drafter, phases=phases, **options)
    if "arrivals" not in options:
        options["requests"] = queries
    return SpecServeEnv(profile, acceptance, drafter, **options)


def predict(policy: Policy, profile: ProfileArg, acceptance: AcceptanceModel, drafter: str, *, queries: int,
            seed: int, env_options: Mapping[str, Any] | None = None,
            rollout_options: Mapping[str, Any] | None = None) -> Prediction:
    """``policy`` run once through its role's environment (``make_env``) with ``seed``; ``rollout_options``
    go to the rollout (``decision_seconds``; a serving rollout's ``iteration_seconds``)."""
    role = policy_role(policy)
    env = make_env(role, profile, acceptance, drafter, queries, **dict(env_options or {}))
    return Prediction(ROLLOUTS[role](policy, env, seed, **dict(rollout_options or {})), env)
