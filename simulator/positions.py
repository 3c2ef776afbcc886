"""Recorded iterations in position form: what ``TraceReplay`` replays and ``ParametricAcceptance.fit`` reads.

A draft tree's nodes are ranked by decreasing path-confidence product and ``c_i`` is the ratio of
consecutive products (``simulator.acceptance`` explains why); ``need`` says which top-n first includes
each accepted-path node. Iterations that the end of their query cut short are left out
(``end_limited``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from policies.features import LENGTH_CAP
from simulator.traces import node_arrays


@dataclass(frozen=True)
class PositionTable:
    """Recorded iterations in position form (see the module docstring), one row per iteration."""

    domains: tuple[str, ...]
    domain: np.ndarray  # (R,) index into domains
    confidences: np.ndarray  # (R, cap)
    need: np.ndarray  # (R, cap) n that first includes the k-th accepted-path node; cap + 1 when none
    drafted: np.ndarray  # (R,)
    query: np.ndarray | None = None  # (R,) index of the recorded query; None: each domain is one query
    tokens: np.ndarray | None = None  # (R,) positions the recorded decode moved on (``advances``); None: need
    cut: np.ndarray | None = None  # (R,) bool: the draft was cut short (accepted < its deepest node's depth)
    context: np.ndarray | None = None  # (R,) the iteration's text position (context length); None: unknown

    @property
    def chain_accepted(self) -> np.ndarray:
        """Leading positions accepted in a row: the accepted length if the positions were a chain."""
        k = np.arange(1, self.need.shape[1] + 1)
        return np.logical_and.accumulate(self.need == k, axis=1).sum(axis=1)


def advances(traces: pd.DataFrame) -> np.ndarray:
    """(R,) the positions the recorded decode moved its query on at each row: the next iteration's context
    length less the row's own; the accepted tokens plus one where that is not a positive step (a query's
    last row, rows not recorded as a decode) but one for the last row of a probed query
    (``real_engine.trace.Probe``: its target verified nothing, so its rows moved on fewer positions)."""
    frame = pd.DataFrame({"domain": traces["domain"].to_numpy(dtype=str),
                          "query": traces["query_id"].to_numpy(dtype=np.int64),
                          "iteration": traces["iteration"].to_numpy(dtype=np.int64),
                          "context": traces["context_length"].to_numpy(dtype=np.int64),
                          "verified": traces["accepted"].to_numpy(dtype=np.int64) + 1})
    frame = frame.sort_values(["domain", "query", "iteration"], kind="stable")
    keys = [frame["domain"], frame["query"]]
    step = (frame.groupby(keys, sort=False)["context"].shift(-1) - frame["context"]).fillna(0)
    probed = ((step > 0) & (step < frame["verified"])).groupby(keys, sort=False).transform("any")
    last = frame.groupby(keys, sort=False).cumcount(ascending=False) == 0
    moved = np.where(step > 0, step, np.where(last & probed, 1, frame["verified"]))
    return pd.Series(moved, index=frame.index).sort_index().to_numpy(dtype=np.int64)


def end_limited(traces: pd.DataFrame) -> np.ndarray:
    """(R,) bool: the iterations whose draft the end of their query cut short.

    The decode loop never drafts more than the tokens a query still has to generate, less one, so a
    query's last iterations draft less than its drafter otherwise does; replayed as ordinary
    iterations they would bias acceptance down (the simulator ends its own queries). True where the
    draft is exactly as deep as that cap (the tokens left when the iteration began, less one) and the
    cap is below the deepest draft of its query (so a query's deepest iteration always stays).
    """
    nodes = node_arrays(traces)
    deepest = np.zeros(len(traces), dtype=np.int64)
    np.maximum.at(deepest, nodes.row, nodes.depths)
    frame = pd.DataFrame({"domain": traces["domain"].to_numpy(dtype=str),
                          "query": traces["query_id"].to_numpy(dtype=np.int64),
                          "iteration": traces["iteration"].to_numpy(dtype=np.int64),
                          "tokens": advances(traces), "deepest": deepest})
    frame = frame.sort_values(["domain", "query", "iteration"], kind="stable")
    by_query = frame.groupby(["domain", "query"], sort=False)
    left = by_query["tokens"].transform("sum") - by_query["tokens"].cumsum() + frame["tokens"]
    cap = left - 1
    limited = (frame["deepest"] == cap) & (cap < by_query["deepest"].transform("max"))
    return limited.sort_index().to_numpy()


def positions(traces: pd.DataFrame, cap: int = LENGTH_CAP) -> PositionTable:
    """Turn trace rows (draft trees) into position form: nodes ranked by path product, top ``cap`` kept;
    the iterations the end of their query cut short (``end_limited``) are left out."""
    kept = ~end_limited(traces)
    moved = advances(traces)[kept]
    traces = traces[kept]
    nodes = node_arrays(traces)
    product = nodes.confidences.astype(np.float64).copy()
    for depth in range(2, int(nodes.depths.max(initial=1)) + 1):
        at = np.flatnonzero(nodes.depths == depth)
        product[at] *= product[nodes.parents[at]]
    order = np.lexsort((nodes.local, -product, nodes.row))
    row = nodes.row[order]
    rank = np.arange(order.size) - nodes.start[row]
    ranked = product[order]
    previous = np.where(rank > 0, np.concatenate(([1.0], ranked[:-1])), 1.0)
    ratio = np.divide(ranked, previous, out=np.zeros_like(ranked), where=previous > 0)
    keep = rank < cap
    rows = nodes.count.size
    confidences = np.zeros((rows, cap), dtype=np.float32)
    confidences[row[keep], rank[keep]] = ratio[keep]
    need = np.full((rows, cap), cap + 1, dtype=np.int64)
    on = keep & nodes.on_path[order]
    need[row[on], nodes.depths[order][on] - 1] = rank[on] + 1
    deepest = np.zeros(rows, dtype=np.int64)
    np.maximum.at(deepest, nodes.row, nodes.depths)
    accepted = traces["accepted"].to_numpy(dtype=np.int64)
    domains, domain = np.unique(traces["domain"].to_numpy(dtype=str), return_inverse=True)
    pairs = np.stack((domain, traces["query_id"].to_numpy(dtype=np.int64)), axis=1)
    query = np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)
    return PositionTable(tuple(str(d) for d in domains), domain.astype(np.int64), confidences, need,
                         np.minimum(nodes.count, cap), query.astype(np.int64), moved, accepted < deepest,
                         traces["context_length"].to_numpy(dtype=np.int64))
