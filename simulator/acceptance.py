"""Acceptance models: what the drafter offers at each iteration and how much of it the verifier accepts.

Positions follow ``policies.features``: a chain's positions are its depths; a tree's nodes are
ranked by decreasing path-confidence product and ``c_i`` is the ratio of consecutive products, so
the top-n nodes are what a length policy's action n sends to the verifier (they always include
every ancestor). An iteration is drawn as ``Draws``: the confidences, the drafted count, and the
tokens accepted for every n the policy may choose (a chain accepts ``min(accepted_all, n)``; a
tree accepts the accepted path's nodes among the top n, which is exact for greedy verification and
an approximation for sampling verifiers).

This module holds what every model shares (``Draws``, the ``AcceptanceModel`` protocol, domain
weights); the models live beside it:

- ``simulator.positions``: recorded iterations (draft trees) in position form (``PositionTable``).
- ``simulator.replay``: ``TraceReplay`` replays recorded iterations as the acceptance at uniformly
  random text positions; ``resolve_acceptance`` picks a model from an argument.
- ``simulator.parametric``: ``ParametricAcceptance``, the per-domain chain model with Platt-calibrated
  confidences, and the paper-derived ``paper_acceptance`` / ``default_acceptance``.
- ``simulator.adaptation``: ``AdaptationDynamics``, how drafter updates move acceptance (AdaptStream).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from core.errors import InputError


@dataclass(frozen=True)
class Draws:
    """A batch of drafted iterations: what the policy sees and what the verifier would accept."""

    confidences: np.ndarray  # (N, cap) float32 c_1..c_cap, 0.0 past the drafted positions
    drafted: np.ndarray  # (N,) positions drafted
    accepted_all: np.ndarray  # (N,) tokens accepted when every drafted position is verified
    by_length: np.ndarray | None = None  # (N, cap + 1) tokens accepted for each n; None: a chain

    def accepted(self, n: np.ndarray) -> np.ndarray:
        """Tokens accepted when the first ``n`` positions of each draft are verified."""
        if self.by_length is None:
            return np.minimum(self.accepted_all, n)
        return np.take_along_axis(self.by_length, np.asarray(n)[:, None], axis=1)[:, 0]


class AcceptanceModel(Protocol):
    """What the environments need from an acceptance model."""

    domains: tuple[str, ...]
    cap: int

    def sample(self, rng: np.random.Generator, domain: np.ndarray) -> Draws:
        """One drafted iteration for each domain index in ``domain``."""

    def survival(self, n: int) -> np.ndarray:
        """(domains, n + 1): P(at least i tokens accepted when n positions are verified), i = 0..n."""

    def verified_shares(self, n: int) -> np.ndarray:
        """(domains, n + 1): the share of iterations that verify i positions when n are asked for
        (fewer where fewer were drafted), i = 0..n: what an iteration's verify costs on average."""

    def query_rejection_rates(self, rng: np.random.Generator, domain: np.ndarray) -> np.ndarray:
        """For each domain index in ``domain``, one query's share of iterations whose draft was cut short
        (its deepest branch not accepted whole; an empty draft is not): each buffers one rejected
        position for online adaptation. Queries differ: one the drafter offers nothing on buffers
        nothing."""


def check_domains(weights: Mapping[str, float] | Sequence[float] | None,
                  domains: Sequence[str]) -> np.ndarray:
    """Domain weights as a probability vector over ``domains`` (uniform when None)."""
    if weights is None:
        return np.full(len(domains), 1.0 / len(domains))
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(domains))
        if unknown:
            raise InputError(f"unknown domain(s) {', '.join(unknown)}: the acceptance model has "
                             f"{', '.join(domains)}")
        weights = [float(weights.get(d, 0.0)) for d in domains]
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(domains),) or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise InputError(f"domain weights {list(w)} are invalid: give {len(domains)} non-negative weights "
                         "with a positive sum")
    return w / w.sum()
