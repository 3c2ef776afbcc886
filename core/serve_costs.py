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


def iteration_costs(profile: CostProfile, draft_row: np.ndarray, running: np.ndarray, context: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For batches of ``running`` requests at mean ``context``: the batched verify with no draft, what one
    more verified node of one request adds to it, and drafting per position per request (``draft_row``:
    a chain's drafting seconds by length, its mean slope): the serving observation's cost fields."""
    running = np.atleast_1d(np.asarray(running, dtype=np.float64))
    safe = np.maximum(running, 1.0)
    base = batch_verify_seconds(profile, running, 1.0, context)
    more = batch_verify_seconds(profile, running, 2.0, context)
    node = np.where(running > 0, np.maximum(more - base, 0.0) / safe, 0.0)
    slope = float(draft_row[-1] - draft_row[0]) / max(len(draft_row) - 1, 1)
    return base, node, np.where(running > 0, slope, 0.0)
