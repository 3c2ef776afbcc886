"""What one iteration of continuous batching costs, from a cost profile: the simulator's SpecServe and the
live engine's serving policies price it the same way.

The target's forward over every running request's draft is the profile's batched verify
(``samples.batch_verify``: requests, nodes per request, context per request; ragged drafts at the mean
nodes and context). A profile without batched samples (the shipped A100 and CPU profiles) charges one
verify forward over every request's nodes at their summed context: on the paper-derived A100 profile,
linear in both, that is weights read once, every node computed and every request's cache read.
Drafting follows the engine: draft-model chains draft in lockstep, one packed forward per position over
every chain still drafting (``samples.batch_draft``), so depth d costs what the chains still drafting at
d add to a lockstep draft; a profile without those samples, or another drafter, drafts request by request.
A draft-model chain first runs what its model has not (its prompt, at its first proposal:
``samples.draft_backlog``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from core.cost_profile import CostProfile
from core.names import registry


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


def drafting_table(profile: CostProfile, drafter: str, max_batch: int, cap: int) -> np.ndarray:
    """(max_batch + 1, cap + 1) seconds of one iteration's drafting when r requests (row) each draft k
    positions (column): lockstep chains of a drafter drafting with the draft model (``samples.batch_draft``)
    where measured, else r chains drafted in turn."""
    r, k = np.arange(max_batch + 1)[:, None], np.arange(cap + 1)[None, :]
    if registry[drafter].needs_draft_model and "batch_draft" in profile.fits:
        requests, tokens = np.broadcast_arrays(np.maximum(r, 1), np.maximum(k, 1))
        table = np.asarray(profile.batch_draft_seconds(requests, tokens))
        return np.where((r > 0) & (k > 0), table, 0.0)
    return r * profile.draft_row(drafter, cap)[None, :]


def backlog_seconds(profile: CostProfile, drafter: str, backlog: np.ndarray) -> np.ndarray:
    """What each request's drafting adds by first running the ``backlog`` committed tokens its draft model
    has not run (its prompt at its first proposal): ``CostProfile.draft_backlog_seconds`` for the drafters
    drafting with the draft model, 0 for drafters that keep no cache of their own."""
    backlog = np.asarray(backlog, dtype=np.float64)
    if not registry[drafter].needs_draft_model:
        return np.zeros(backlog.shape)
    return np.asarray(profile.draft_backlog_seconds(backlog), dtype=np.float64)


def drafting_seconds(table: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    """Seconds of drafting ``drafted`` ((..., B) positions per request) by ``drafting_table``'s ``table``:
    position d costs what the requests drafting at least d add to it (exact when all draft alike)."""
    depth = np.arange(1, table.shape[1])
    drafting = (np.asarray(drafted)[..., None] >= depth).sum(-2)  # (..., cap): requests drafting each depth
    return np.diff(table, axis=1)[drafting, depth - 1].sum(-1)


def chains_fit(table: np.ndarray) -> np.ndarray:
    """(max_batch + 1, 2): per request of a batch of r drafting alike, (start, per position) of its share
    of ``drafting_table``'s row r (``chain_fit``); zeros for r = 0."""
    fits = [(0.0, 0.0)] + [tuple(x / r for x in chain_fit(row)) for r, row in enumerate(table) if r > 0]
    return np.asarray(fits)


def chain_fit(draft_row: np.ndarray) -> tuple[float, float]:
    """(start, per position) of a chain's drafting seconds by length (``draft_row``, index 0 = nothing
    drafted): the least-squares line through lengths 1.., its intercept kept non-negative."""
    k = np.arange(1, len(draft_row))
    slope = max(float(np.polyfit(k, np.asarray(draft_row[1:], dtype=np.float64), 1)[0]), 0.0)
    return max(float(np.mean(draft_row[1:] - slope * k)), 0.0), slope


def iteration_costs(profile: CostProfile, chains: np.ndarray, running: np.ndarray,
                    context: np.ndarray) -> ServeCosts:
    """For batches of ``running`` requests at mean ``context`` (rounded to a whole token, so that a caller
    may keep them by it): the serving observation's cost fields (``ServeCosts``; drafting per request
    from ``chains``, ``chains_fit`` of the drafting table)."""
    running = np.atleast_1d(np.asarray(running, dtype=np.float64))
    context = np.rint(np.asarray(context, dtype=np.float64))
    safe = np.maximum(running, 1.0)
    base = batch_verify_seconds(profile, running, 1.0, context)
    more = batch_verify_seconds(profile, running, 2.0, context)
    node = np.where(running > 0, np.maximum(more - base, 0.0) / safe, 0.0)
    start, slope = np.asarray(chains)[np.minimum(running.astype(np.int64), len(chains) - 1)].T
    return ServeCosts(base, node, slope, start)
