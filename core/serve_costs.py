"""What one iteration of continuous batching costs, from a cost profile: the simulator's SpecServe and the
live engine's serving policies price it the same way.

The target's forward over every running request's draft is the profile's batched verify
(``samples.batch_verify``: requests, nodes per request, context per request; ragged drafts at the mean
nodes and context). A profile without batched samples (the shipped A100 and CPU profiles) charges one
verify forward over every request's nodes at their summed context: on the paper-derived A100 profile,
linear in both, that is weights read once, every node computed and every request's cache read.
Drafting is per request (the batched engine drafts each request's tree in turn).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from core.cost_profile import CostProfile


def batch_verify_seconds(profile: CostProfile, requests: np.ndarray, nodes: np.ndarray,
                         context: np.ndarray) -> np.ndarray:
    """One batched verify forward of ``requests`` requests of ``nodes`` nodes at ``context`` tokens each
    (0 with no request)."""
    requests = np.atleast_1d(np.asarray(requests, dtype=np.float64))
    busy = requests > 0
    out = np.zeros(requests.shape)
    if not busy.any():
        return out
    n = np.broadcast_to(np.asarray(nodes, dtype=np.float64), requests.shape)[busy]
    c = np.broadcast_to(np.asarray(context, dtype=np.float64), requests.shape)[busy]
    r = requests[busy]
    if "batch_verify" in profile.fits:
        out[busy] = profile.batch_verify_seconds(r, n, c)
    else:
        out[busy] = profile.verify_seconds(r * n, r * c)
    return out


class ServeCosts(NamedTuple):
    """The serving observation's cost fields, per batch: the batched verify with no draft, what one more
    verified node of one request adds to it, drafting per further position of a request's chain, and what
    starting a chain costs beyond that (a chain of k >= 1 positions drafts in ``start + k * draft``)."""

    base: np.ndarray
    node: np.ndarray
    draft: np.ndarray
    start: np.ndarray

    def at(self, i: int = 0) -> tuple[float, float, float, float]:
        """Batch ``i``'s fields as floats."""
        return tuple(float(field[i]) for field in self)  # type: ignore[return-value]


def chain_fit(draft_row: np.ndarray) -> tuple[float, float]:
    """(start, per position) of a chain's drafting seconds by length (``draft_row``, index 0 = nothing
    drafted): the least-squares line through lengths 1.., its intercept kept non-negative."""
    k = np.arange(1, len(draft_row))
    slope = max(float(np.polyfit(k, np.asarray(draft_row[1:], dtype=np.float64), 1)[0]), 0.0)
    return max(float(np.mean(draft_row[1:] - slope * k)), 0.0), slope


def iteration_costs(profile: CostProfile, chain: tuple[float, float], running: np.ndarray,
                    context: np.ndarray) -> ServeCosts:
    """For batches of ``running`` requests at mean ``context`` (rounded to a whole token, so that a caller
    may keep them by it): the serving observation's cost fields (``ServeCosts``; drafting from ``chain``,
    ``chain_fit`` of the drafter's row)."""
    running = np.atleast_1d(np.asarray(running, dtype=np.float64))
    context = np.rint(np.asarray(context, dtype=np.float64))
    safe = np.maximum(running, 1.0)
    base = batch_verify_seconds(profile, running, 1.0, context)
    more = batch_verify_seconds(profile, running, 2.0, context)
    node = np.where(running > 0, np.maximum(more - base, 0.0) / safe, 0.0)
    start, slope = chain
    busy = running > 0
    return ServeCosts(base, node, np.where(busy, slope, 0.0), np.where(busy, start, 0.0))
