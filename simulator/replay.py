"""Trace replay: recorded iterations drawn as the acceptance at uniformly random text positions.

``TraceReplay`` keeps each simulated query inside one recorded query (the derivation is in its
docstring); ``resolve_acceptance`` turns an acceptance argument (a model, a trace file, or None) into a
model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from policies.features import LENGTH_CAP
from simulator.acceptance import AcceptanceModel, Draws
from simulator.parametric import default_acceptance
from simulator.positions import PositionTable, positions
from simulator.traces import load_traces


class TraceReplay:
    """Replays recorded iterations so that each draw is the acceptance at a uniformly random text position.

    Why rows are not drawn uniformly: a trace is recorded at one drafting depth D and each iteration
    starts where the previous one's accepted tokens and bonus token left off (p_{j+1} = p_j + a_j + 1),
    so a query of T_q text positions (T_q = sum_j (a_j + 1)) leaves R_q = T_q / tau_q(D) rows, tau_q(D)
    being its tokens per iteration at depth D.

    1. Inside a query whose drafter hits are independent of where earlier iterations started (exact
       when hits are i.i.d. per text position: every start is a stopping time and the text after it is
       fresh), each row is already a draw at a uniformly random position of that query, whatever D was.
    2. Across queries it is not: pooled rows weigh query q by R_q, so easy queries (crossed in a few
       long iterations) are under-represented, the more so the deeper the recording. A uniformly random
       position falls in q with probability T_q / sum T, so each row of q weighs T_q / R_q = tau_q(D).
       ``survival`` and ``sample`` without ``episode`` use these weights.
    3. A simulated query must also stay inside one recorded query: a policy verifying n positions spends
       T / tau_q(n) iterations on q's text, so its tokens per iteration is the harmonic mean of tau_q(n)
       over queries, not the arithmetic mean that independent draws from the position mixture give
       (pooled rows are right only at n = D). ``episodes`` gives each simulated query the query of a
       uniformly random position (q with probability T_q / sum T within its domain) and
       ``sample(rng, domain, episode)`` draws that query's rows uniformly: exact for every n and every
       policy under 1; only the variation of acceptance inside one query is left unmodelled.
    4. That variation matters to a policy that stops where the drafter is unsure: the positions its
       iterations start at follow its own stops (after a plain step, often another hard position), not
       the rejections of the recording. ``walk`` replays a query as the engine decodes it: from the
       query's first row, each iteration moves on the tokens it emitted to the row recorded at that text
       position, and only where none was recorded to a uniformly random row of the query. On a probed
       trace (``real_engine.trace.Probe``: a row at every position of greedy text, the same text whatever
       the policy) this is the engine's own sequence of iterations. A decode's trace holds only the
       positions where that decode's iterations started, which a policy that stops elsewhere does not
       reach, so its queries are walked as under 3., each iteration at a uniformly random row.

    A table without query ids treats each domain as one query (rows drawn uniformly within a domain).
    """

    def __init__(self, table: PositionTable) -> None:
        query = table.domain if table.query is None else table.query
        context = np.arange(table.domain.size) if table.context is None else table.context
        order = np.lexsort((context, query, table.domain))
        self.domains = table.domains
        self.cap = table.confidences.shape[1]
        self.counts = np.bincount(table.domain, minlength=len(table.domains))
        self.offsets = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
        self.confidences = np.ascontiguousarray(table.confidences[order])
        self.drafted = table.drafted[order]
        self.cut = (table.chain_accepted < table.drafted if table.cut is None else table.cut)[order]
        lengths = np.arange(self.cap + 1)
        by_length = (table.need[order][:, None, :] <= lengths[None, :, None]).sum(axis=2)
        self.accepted_all = by_length[:, -1]
        chain = np.array_equal(by_length, np.minimum(self.accepted_all[:, None], lengths))
        self.by_length = None if chain else by_length
        tokens = self.accepted_all + 1 if table.tokens is None else table.tokens[order]
        key = np.stack((table.domain, query), axis=1)[order]
        first = np.flatnonzero(np.concatenate(([True], np.any(key[1:] != key[:-1], axis=1))))
        self.query_offsets = first
        self.query_rows = np.diff(np.append(first, key.shape[0]))
        self.query_tokens = np.add.reduceat(tokens.astype(np.float64), first)
        self.query_cut = np.add.reduceat(self.cut.astype(np.float64), first) / self.query_rows
        query_domain = key[first, 0]
        # The walk's lookup: (query, context) as one sorted key, so a text position is found by bisection.
        self.row_query = np.repeat(np.arange(first.size), self.query_rows)
        # A probed query's rows moved on fewer positions than their decode would have (one each).
        self.query_probed = np.logical_or.reduceat(tokens < self.accepted_all + 1, first)
        span = int(context.max(initial=0)) + self.cap + 2  # past any position a walk moves to
        self._position_key = self.row_query * span + context[order]
        self.weights = np.repeat(self.query_tokens / self.query_rows, self.query_rows)  # tau_q(D) per row
        self._row_cumulative = np.cumsum(self.weights)
        self._query_cumulative = np.cumsum(self.query_tokens)
        per_domain = np.bincount(query_domain, minlength=len(self.domains))
        self._domain_queries = (np.concatenate(([0], np.cumsum(per_domain)[:-1])), per_domain)

    @classmethod
    def from_traces(cls, traces: pd.DataFrame, cap: int = LENGTH_CAP) -> TraceReplay:
        """Replay the iterations of a trace DataFrame."""
        return cls(positions(traces, cap))

    def episodes(self, rng: np.random.Generator, domain: np.ndarray) -> np.ndarray:
        """The recorded query of a uniformly random text position of each requested domain."""
        first, count = self._domain_queries
        return _weighted_pick(self._query_cumulative, np.take(first, domain), np.take(count, domain),
                              rng.random(domain.size))

    def sample(self, rng: np.random.Generator, domain: np.ndarray,
               episode: np.ndarray | None = None) -> Draws:
        """Recorded iterations at uniformly random positions of each domain, or of each episode's query."""
        u = rng.random(domain.size)
        if episode is None:
            first, count = np.take(self.offsets, domain), np.take(self.counts, domain)
            return self.at(_weighted_pick(self._row_cumulative, first, count, u))
        return self.at(self._any_row(episode, u))

    def first_rows(self, rng: np.random.Generator, episode: np.ndarray) -> np.ndarray:
        """Where a walk of each episode's query starts: a probed query's first row (its earliest text
        position), a uniformly random row of any other."""
        random = self._any_row(episode, rng.random(episode.size))
        return np.where(np.take(self.query_probed, episode), np.take(self.query_offsets, episode), random)

    def walk(self, rng: np.random.Generator, row: np.ndarray, moved: np.ndarray) -> np.ndarray:
        """The rows after ``row`` once each has moved its query on ``moved`` tokens: in a probed query the row
        recorded at that text position, else (past its end, or in a decode's trace, whose rows sit where that
        decode's own iterations happened to start) a uniformly random row of the query (4. above)."""
        query = np.take(self.row_query, row)
        want = np.take(self._position_key, row) + moved
        found = np.minimum(np.searchsorted(self._position_key, want), self._position_key.size - 1)
        hit = (np.take(self._position_key, found) == want) & np.take(self.query_probed, query)
        return np.where(hit, found, self._any_row(query, rng.random(row.size)))

    def _any_row(self, query: np.ndarray, u: np.ndarray) -> np.ndarray:
        """A uniformly random row of each ``query`` (one uniform ``u`` each)."""
        return np.take(self.query_offsets, query) + (u * np.take(self.query_rows, query)).astype(np.int64)

    def at(self, row: np.ndarray) -> Draws:
        """The recorded iterations of ``row``."""
        by_length = None if self.by_length is None else np.take(self.by_length, row, axis=0)
        return Draws(np.take(self.confidences, row, axis=0), np.take(self.drafted, row),
                     np.take(self.accepted_all, row), by_length)

    def survival(self, n: int) -> np.ndarray:
        """P(accepted >= i) per domain with n positions verified, at a uniformly random text position."""
        if self.by_length is None:
            accepted = np.minimum(self.accepted_all, n)
        else:
            accepted = self.by_length[:, min(n, self.cap)]
        at_least = (accepted[:, None] >= np.arange(n + 1)) * self.weights[:, None]
        domain = np.repeat(np.arange(len(self.domains)), self.counts)
        sums = np.zeros((len(self.domains), n + 1))
        np.add.at(sums, domain, at_least)
        return sums / np.bincount(domain, self.weights, minlength=len(self.domains))[:, None]

    def query_rejection_rates(self, rng: np.random.Generator, domain: np.ndarray) -> np.ndarray:
        """The cut-short share of the recorded query of a uniformly random text position (``episodes``)."""
        return self.query_cut[self.episodes(rng, domain)]

    def verified_shares(self, n: int) -> np.ndarray:
        """Share of each domain's recorded iterations that verify i = 0..n positions (min(drafted, n))."""
        domain = np.repeat(np.arange(len(self.domains)), self.counts)
        shares = np.zeros((len(self.domains), n + 1))
        np.add.at(shares, (domain, np.minimum(self.drafted, n)), 1.0)
        return shares / np.maximum(self.counts, 1)[:, None]


def _weighted_pick(cumulative: np.ndarray, first: np.ndarray, count: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Index in ``[first, first + count)`` with probability proportional to its weight (``cumulative``
    holds the running sums of the weights), one per uniform ``u``."""
    low = np.where(first > 0, cumulative[np.maximum(first - 1, 0)], 0.0)
    high = cumulative[first + count - 1]
    pick = np.searchsorted(cumulative, low + u * (high - low), side="right")
    return np.clip(pick, first, first + count - 1)


def resolve_acceptance(acceptance: AcceptanceModel | str | Path | None) -> AcceptanceModel:
    """An acceptance model given as itself, as a trace file to replay, or None for ``default_acceptance``."""
    if acceptance is None:
        return default_acceptance()
    if isinstance(acceptance, (str, Path)):
        return TraceReplay.from_traces(load_traces(acceptance))
    return acceptance
