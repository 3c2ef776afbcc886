"""Acceptance models: what the drafter offers at each iteration and how much of it the verifier accepts.

Positions follow ``policies.features``: a chain's positions are its depths; a tree's nodes are
ranked by decreasing path-confidence product and ``c_i`` is the ratio of consecutive products, so
the top-n nodes are what a length policy's action n sends to the verifier (they always include
every ancestor). An iteration is drawn as ``Draws``: the confidences, the drafted count, and the
tokens accepted for every n the policy may choose (a chain accepts ``min(accepted_all, n)``; a
tree accepts the accepted path's nodes among the top n, which is exact for greedy verification and
an approximation for sampling verifiers).

- ``TraceReplay`` replays recorded iterations as the acceptance at uniformly random text positions,
  each simulated query inside one recorded query (the derivation is in its docstring).
- ``ParametricAcceptance`` is a chain model: per domain, confidence logits are normal with a shared
  per-iteration term (easy iterations are easy everywhere), and the chance to accept position i
  given that 1..i-1 were is a Platt-scaled calibration of its confidence,
  ``logit P(accept_i) = a_i + b_i logit(c_i)``. ``fit`` estimates it from traces;
  ``paper_acceptance`` builds a calibrated one matching the SpecBlock paper's per-position rates.
- ``AdaptationDynamics``: per-domain acceptance levels that drafter updates move (AdaptStream);
  ``fit_adaptation`` estimates them from streams the engine served (``AdaptRecord``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize

from core.errors import InputError
from policies.adaptation import FULL, SKIP
from policies.features import LENGTH_CAP
from simulator.traces import load_traces, node_arrays

_EPS = 1e-6
_QUADRATURE = np.polynomial.hermite_e.hermegauss(48)
_NODES, _WEIGHTS = _QUADRATURE[0], _QUADRATURE[1] / np.sqrt(2.0 * np.pi)  # E[f(Z)] = sum w f(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return np.log(p / (1.0 - p))


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


def _count_true(mask: np.ndarray) -> np.ndarray:
    """True entries per row of a C-contiguous bool matrix, by popcount of 8 bytes at a time when it can."""
    if mask.shape[1] % 8:
        return mask.sum(axis=1)
    words = np.bitwise_count(mask.view(np.uint64))
    total = words[:, 0].astype(np.int64)
    for j in range(1, words.shape[1]):
        total += words[:, j]
    return total


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


@dataclass(frozen=True)
class PositionTable:
    """Recorded iterations in position form (see the module docstring), one row per iteration."""

    domains: tuple[str, ...]
    domain: np.ndarray  # (R,) index into domains
    confidences: np.ndarray  # (R, cap)
    need: np.ndarray  # (R, cap) n that first includes the k-th accepted-path node; cap + 1 when none
    drafted: np.ndarray  # (R,)
    query: np.ndarray | None = None  # (R,) index of the recorded query; None: each domain is one query
    tokens: np.ndarray | None = None  # (R,) positions the iteration advanced (accepted + 1); None: from need
    cut: np.ndarray | None = None  # (R,) bool: the draft was cut short (accepted < its deepest node's depth)

    @property
    def chain_accepted(self) -> np.ndarray:
        """Leading positions accepted in a row: the accepted length if the positions were a chain."""
        k = np.arange(1, self.need.shape[1] + 1)
        return np.logical_and.accumulate(self.need == k, axis=1).sum(axis=1)


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
                          "tokens": traces["accepted"].to_numpy(dtype=np.int64) + 1, "deepest": deepest})
    frame = frame.sort_values(["domain", "query", "iteration"], kind="stable")
    by_query = frame.groupby(["domain", "query"], sort=False)
    left = by_query["tokens"].transform("sum") - by_query["tokens"].cumsum() + frame["tokens"]
    cap = left - 1
    limited = (frame["deepest"] == cap) & (cap < by_query["deepest"].transform("max"))
    return limited.sort_index().to_numpy()


def positions(traces: pd.DataFrame, cap: int = LENGTH_CAP) -> PositionTable:
    """Turn trace rows (draft trees) into position form: nodes ranked by path product, top ``cap`` kept;
    the iterations the end of their query cut short (``end_limited``) are left out."""
    traces = traces[~end_limited(traces)]
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
                         np.minimum(nodes.count, cap), query.astype(np.int64),
                         traces["accepted"].to_numpy(dtype=np.int64) + 1, accepted < deepest)


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

    A table without query ids treats each domain as one query (rows drawn uniformly within a domain).
    """

    def __init__(self, table: PositionTable) -> None:
        query = table.domain if table.query is None else table.query
        order = np.lexsort((query, table.domain))
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
            row = _weighted_pick(self._row_cumulative, first, count, u)
        else:
            pick = (u * np.take(self.query_rows, episode)).astype(np.int64)
            row = np.take(self.query_offsets, episode) + pick
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


@dataclass(frozen=True)
class ParametricAcceptance:
    """Chain model per domain: logit c_i = mu_i + shared_sd * z + own_sd * eps_i; accept by Platt calibration.

    Arrays are indexed (domain, position); positions at or past ``depth[domain]`` are never drafted.
    """

    domains: tuple[str, ...]
    depth: np.ndarray  # (D,) positions drafted per iteration
    mu: np.ndarray  # (D, cap) mean confidence logit
    shared_sd: np.ndarray  # (D,) sd of the per-iteration logit shift shared by all positions
    own_sd: np.ndarray  # (D,) sd of each position's own logit noise
    calib_a: np.ndarray  # (D, cap) Platt intercept
    calib_b: np.ndarray  # (D, cap) Platt slope
    _single: dict = field(init=False, repr=False, compare=False)  # float32 copies for sampling

    def __post_init__(self) -> None:
        d, cap = self.mu.shape
        shapes = {"depth": (d,), "shared_sd": (d,), "own_sd": (d,), "calib_a": (d, cap), "calib_b": (d, cap)}
        for name, shape in shapes.items():
            if np.shape(getattr(self, name)) != shape:
                raise InputError(f"{name} has shape {np.shape(getattr(self, name))}, expected {shape}: "
                                 "give every array one row per domain")
        if len(self.domains) != d or np.any(self.depth < 0) or np.any(self.depth > cap):
            raise InputError(f"domains and depth must match mu's {d} rows, depth in 0..{cap}")
        if np.any(self.shared_sd < 0) or np.any(self.own_sd < 0):
            raise InputError("shared_sd and own_sd must be >= 0: they are standard deviations")
        for name in ("depth", "mu", "shared_sd", "own_sd", "calib_a", "calib_b"):
            frozen = np.array(getattr(self, name), dtype=np.int64 if name == "depth" else np.float64)
            frozen.setflags(write=False)
            object.__setattr__(self, name, frozen)
        single = {name: np.asarray(getattr(self, name), dtype=np.float32)
                  for name in ("mu", "shared_sd", "own_sd", "calib_a", "calib_b")}
        single["live"] = np.arange(cap) < np.asarray(self.depth)[:, None]
        single["identity"] = bool(np.all(self.calib_a == 0) and np.all(self.calib_b == 1))
        object.__setattr__(self, "_single", single)

    @property
    def cap(self) -> int:
        """Positions per draw."""
        return self.mu.shape[1]

    def sample(self, rng: np.random.Generator, domain: np.ndarray) -> Draws:
        """Draw confidences from the logit-normal model, then the accepted chain with one uniform.

        Position k is accepted iff u < prod_{i<=k} P(accept_i): the same law as accepting position
        by position, for a sixteenth of the random numbers (float32 throughout, for speed).
        """
        n, cap, f = domain.size, self.cap, self._single
        shift = np.take(f["shared_sd"], domain) * rng.standard_normal(n, dtype=np.float32)
        noise = rng.standard_normal((n, cap), dtype=np.float32)
        own = np.take(f["own_sd"], domain)[:, None] * noise
        logit = np.take(f["mu"], domain, axis=0) + shift[:, None] + own
        live = np.take(f["live"], domain, axis=0)
        confidences = _sigmoid(logit) * live
        if f["identity"]:
            reach = confidences.copy()
        else:
            calibrated = np.take(f["calib_a"], domain, axis=0) + np.take(f["calib_b"], domain, axis=0) * logit
            reach = _sigmoid(calibrated) * live
        for k in range(1, cap):  # column by column: numpy's cumprod along a short last axis is slow
            np.multiply(reach[:, k], reach[:, k - 1], out=reach[:, k])
        accepted = _count_true(reach > rng.random(n, dtype=np.float32)[:, None])
        return Draws(confidences, np.take(self.depth, domain), accepted)

    def position_rates(self) -> np.ndarray:
        """(D, quadrature nodes, cap): P(accept position i | reached, shared shift at each node)."""
        rates = _rates(self.mu, self.shared_sd[:, None], self.own_sd[:, None], self.calib_a, self.calib_b)
        live = np.arange(self.cap) < self.depth[:, None]
        return np.swapaxes(rates * live[..., None], 1, 2)

    def survival(self, n: int) -> np.ndarray:
        """P(accepted >= i) per domain by Gauss-Hermite quadrature over both noise terms."""
        if not 0 <= n <= self.cap:
            raise InputError(f"n = {n} is outside 0..{self.cap}: ask for a drafted length")
        reach = np.cumprod(self.position_rates()[:, :, :n], axis=2)
        return np.hstack([np.ones((len(self.domains), 1)), np.einsum("k,dki->di", _WEIGHTS, reach)])

    def rejection_rates(self) -> np.ndarray:
        """A chain of ``depth`` positions is cut short unless all of them are accepted."""
        survival = self.survival(self.cap)
        return 1.0 - survival[np.arange(len(self.domains)), self.depth]

    def query_rejection_rates(self, rng: np.random.Generator, domain: np.ndarray) -> np.ndarray:
        """The domain's rate: the model's queries differ only through the shared per-iteration term."""
        if "rejection" not in self._single:  # computed once: AdaptStream asks at every query
            self._single["rejection"] = self.rejection_rates()
        return self._single["rejection"][domain]

    def verified_shares(self, n: int) -> np.ndarray:
        """Every iteration drafts its domain's ``depth``: it verifies min(depth, n) positions."""
        shares = np.zeros((len(self.domains), n + 1))
        shares[np.arange(len(self.domains)), np.minimum(self.depth, n)] = 1.0
        return shares

    @classmethod
    def fit(cls, table: PositionTable, ridge: float = 1.0) -> ParametricAcceptance:
        """Fit to recorded iterations (moments of the confidence logits; ridge-regularized Platt scaling).

        Positions are treated as a chain: position i counts as accepted when 1..i all were.
        """
        d, cap = len(table.domains), table.confidences.shape[1]
        live = np.arange(cap) < table.drafted[:, None]
        logit = _logit(table.confidences)
        count = np.zeros((d, cap))
        total = np.zeros((d, cap))
        np.add.at(count, table.domain, live)
        np.add.at(total, table.domain, np.where(live, logit, 0.0))
        mu = np.divide(total, count, out=np.zeros((d, cap)), where=count > 0)
        resid = np.where(live, logit - mu[table.domain], 0.0)
        k = live.sum(axis=1)
        sums, squares = resid.sum(axis=1), (resid**2).sum(axis=1)
        pairs = np.divide(sums**2 - squares, k * (k - 1), out=np.zeros_like(sums), where=k > 1)
        variance = _per_domain(squares, k, table.domain, d)
        shared = np.clip(_per_domain(pairs, (k > 1).astype(float), table.domain, d), 0.0, variance)
        accepted = table.chain_accepted
        reached = live & (np.arange(cap) <= accepted[:, None])
        group = (table.domain[:, None] * cap + np.arange(cap))[reached]
        calib_a, calib_b = _platt(logit[reached], (np.arange(cap) < accepted[:, None])[reached], group,
                                  d * cap, ridge)
        return cls(table.domains, _depths(table, d), mu,
                   np.sqrt(shared), np.sqrt(np.maximum(variance - shared, _EPS)),
                   calib_a.reshape(d, cap), calib_b.reshape(d, cap))


def _rates(mu: np.ndarray | float, shared_sd: np.ndarray | float, own_sd: np.ndarray | float,
           calib_a: np.ndarray | float, calib_b: np.ndarray | float) -> np.ndarray:
    """P(accept | reached) at each quadrature node of the shared shift, own noise integrated out.

    Arguments broadcast together to a shape S; the result has shape S + (quadrature nodes,).
    """
    mu, shared_sd, own_sd, calib_a, calib_b = np.broadcast_arrays(mu, shared_sd, own_sd, calib_a, calib_b)
    logit = (mu[..., None, None] + shared_sd[..., None, None] * _NODES[:, None]
             + own_sd[..., None, None] * _NODES[None, :])
    return _sigmoid(calib_a[..., None, None] + calib_b[..., None, None] * logit) @ _WEIGHTS


def _per_domain(values: np.ndarray, weights: np.ndarray, domain: np.ndarray, d: int) -> np.ndarray:
    """Per-domain sum of values over sum of weights (0 where a domain has no weight)."""
    num = np.bincount(domain, values, minlength=d)
    den = np.bincount(domain, weights, minlength=d)
    return np.divide(num, den, out=np.zeros(d), where=den > 0)


def _depths(table: PositionTable, d: int) -> np.ndarray:
    """Largest drafted count seen in each domain."""
    depth = np.zeros(d, dtype=np.int64)
    np.maximum.at(depth, table.domain, table.drafted)
    return depth


def _platt(x: np.ndarray, y: np.ndarray, group: np.ndarray, groups: int, ridge: float,
           steps: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Logistic regression ``logit P(y) = a + b x`` per group by Newton steps, ridge toward a = 0, b = 1."""
    a, b = np.zeros(groups), np.ones(groups)
    y = y.astype(np.float64)
    for _ in range(steps):
        p = _sigmoid(a[group] + b[group] * x)
        w = p * (1.0 - p)
        grad_a = np.bincount(group, p - y, groups) + ridge * a
        grad_b = np.bincount(group, (p - y) * x, groups) + ridge * (b - 1.0)
        h_aa = np.bincount(group, w, groups) + ridge
        h_ab = np.bincount(group, w * x, groups)
        h_bb = np.bincount(group, w * x * x, groups) + ridge
        det = h_aa * h_bb - h_ab**2
        a, b = a - (h_bb * grad_a - h_ab * grad_b) / det, b - (h_aa * grad_b - h_ab * grad_a) / det
    return a, b


PAPER_DOMAINS: Mapping[str, float] = {"code": 1.0, "tests": 0.9, "prose": 1.2, "text": 1.4}
"""Default domains and the exponent each raises the paper's per-position rates to (assumed)."""


def paper_rates(cap: int = LENGTH_CAP) -> np.ndarray:
    """SpecBlock's per-position acceptance on Llama-3.1-8B (appendix C): 0.82 at position 1 falling
    linearly to the published 0.544 at position 8; past 8 (beyond the paper's M = 2) the same slope,
    floored at 0.30 (assumed)."""
    slope = (0.82 - 0.544) / 7
    return np.maximum(0.82 - slope * np.arange(cap), 0.30)


def paper_acceptance(domains: Mapping[str, float] = PAPER_DOMAINS, cap: int = LENGTH_CAP,
                     shared_sd: float = 1.0, own_sd: float = 0.75) -> ParametricAcceptance:
    """A calibrated drafter (accept probability = confidence) whose P(accept i | 1..i-1 accepted)
    equals ``paper_rates() ** exponent`` for each domain's exponent (1 = the paper's own rates).

    Each mean logit is solved in turn so the model's exact conditional rate (by quadrature) matches.
    """
    names = tuple(domains)
    d = len(names)
    mu = np.zeros((d, cap))
    for row, name in enumerate(names):
        if not 0 < domains[name] < np.inf:
            raise InputError(f"domain {name!r}: exponent {domains[name]!r} is invalid: use a positive number")
        target = paper_rates(cap) ** domains[name]
        reach = _WEIGHTS.copy()  # quadrature weight times P(positions before i accepted) at each node
        for i in range(cap):
            def gap(m: float, reach: np.ndarray = reach, rate: float = target[i]) -> float:
                return float(reach @ (_rates(np.float64(m), shared_sd, own_sd, 0.0, 1.0) - rate))

            mu[row, i] = brentq(gap, -30.0, 30.0, xtol=1e-12)
            reach = reach * _rates(mu[row, i], shared_sd, own_sd, 0.0, 1.0)
    return ParametricAcceptance(names, np.full(d, cap), mu, np.full(d, shared_sd), np.full(d, own_sd),
                                np.zeros((d, cap)), np.ones((d, cap)))


@functools.cache
def default_acceptance() -> ParametricAcceptance:
    """The paper-derived parametric model with its default domains (built once, then shared)."""
    return paper_acceptance()


def resolve_acceptance(acceptance: AcceptanceModel | str | Path | None) -> AcceptanceModel:
    """An acceptance model given as itself, as a trace file to replay, or None for ``default_acceptance``."""
    if acceptance is None:
        return default_acceptance()
    if isinstance(acceptance, (str, Path)):
        return TraceReplay.from_traces(load_traces(acceptance))
    return acceptance


ADAPT_BOUNDS = {"head_reach": (-1.0, 1.0), "head_draft": (0.25, 4.0), "full_draft": (0.25, 4.0)}
"""``AdaptationDynamics`` fields whose range is not [0, 1] (capacities and noise: [0, inf))."""


@dataclass(frozen=True)
class AdaptationDynamics:
    """How drafter updates move each domain's acceptance; the defaults come from the SpecBlock paper.

    A domain's level ``m`` multiplies every position's rejection probability (1 = the drafter as
    profiled). An update trained on a buffer moves ``m`` toward ``1 - headroom`` (full) or
    ``1 - head_reach * headroom`` (head only) by ``rate * fill * share`` of the remaining gap, where
    ``share`` is the domain's share of the buffer: diminishing returns, and nothing for domains the
    buffer does not hold. Updates move ``m`` toward their floor from either side: a head update after
    full ones can give back part of their gain, and a negative ``head_reach`` (in [-1, 1]) makes head
    updates converge on a worse drafter than the profiled one (the engine's drafter does that when
    its head is retrained on small buffers after every query). With probability ``harm_probability``
    an update hurts instead, raising ``m`` by ``harm_size * rate * fill * share * headroom``.
    ``headroom`` is set so that a fully adapted drafter gains about 0.26 tau at 8 positions over the
    default domains (the paper: +0.22..0.30 after 8 adaptation epochs); the full update's larger
    reach matches the paper's slightly higher tau without the head-only action (4.58 vs 4.54); fast
    rates (returns diminish within a few updates) let a cost-aware policy beat updating after every
    query, as in the paper. Rates,
    reach, harm and buffer sizes are not given by the paper (assumed) until the engine fits them.
    ``head_capacity`` and ``full_capacity`` count rejected positions a buffer holds (fill 1 when
    full); ``query_noise`` is the log-normal spread of one query's tau around its expectation.

    ``head_draft`` and ``full_draft`` are the drafting time, relative to the drafter as profiled, that
    head and full updates move toward by ``fill`` of the gap: retraining SpecBlock's rank head changes
    how many blocks and start nodes its trees take (1: updates leave drafting as profiled). Their
    rate is the buffer's fill alone, so that they stay identified whatever the acceptance fit says
    about the rates.
    """

    headroom: float = 0.10
    head_reach: float = 0.6
    head_rate: float = 0.5
    full_rate: float = 0.8
    harm_probability: float = 0.05
    harm_size: float = 0.5
    head_capacity: int = 128
    full_capacity: int = 1024
    query_noise: float = 0.1
    head_draft: float = 1.0
    full_draft: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            unbounded = f.name.endswith(("capacity", "noise"))
            low, high = ADAPT_BOUNDS.get(f.name, (0.0, np.inf if unbounded else 1.0))
            if isinstance(value, bool) or not low <= value <= high:
                raise InputError(f"AdaptationDynamics.{f.name} = {value!r} is out of range: use "
                                 f"[{low}, {high}]")
        if self.head_capacity < 1 or self.full_capacity < 1:
            raise InputError("buffer capacities must be >= 1 rejected position")

    def updated(self, rng: np.random.Generator, level: np.ndarray, full: np.ndarray, fill: np.ndarray,
                share: np.ndarray) -> np.ndarray:
        """Levels (N, D) after one update per stream: ``full`` (N,) bool picks full vs head, ``fill``
        (N,) is the used buffer's fill in [0, 1], ``share`` (N, D) its domain composition."""
        rate = np.where(full, self.full_rate, self.head_rate)
        floor = 1.0 - self.headroom * np.where(full, 1.0, self.head_reach)
        push = (rate * fill)[:, None] * share
        harm = rng.random(level.shape[0]) < self.harm_probability
        gain = push * (floor[:, None] - level)
        return level + np.where(harm[:, None], self.harm_size * push * self.headroom, gain)

    def updated_draft(self, draft: np.ndarray, full: np.ndarray, fill: np.ndarray) -> np.ndarray:
        """Drafting-time ratios (N,) after one update per stream (``full`` and ``fill`` as in
        ``updated``)."""
        return draft + fill * (np.where(full, self.full_draft, self.head_draft) - draft)


def level_rates(survival: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Expected accepted tokens at acceptance levels ``level``.

    ``survival`` (..., n + 1) gives the drafter's conditional rates ``S(i) / S(i-1)``; a level ``m``
    turns each rejection probability ``1 - rate`` into ``m (1 - rate)``. Shapes broadcast.
    """
    rates = np.divide(survival[..., 1:], survival[..., :-1], out=np.zeros_like(survival[..., 1:]),
                      where=survival[..., :-1] > 0)
    reach = np.cumprod(np.clip(1.0 - np.asarray(level)[..., None] * (1.0 - rates), 0.0, 1.0), axis=-1)
    return reach.sum(axis=-1)



@dataclass(frozen=True)
class AdaptRecord:
    """One stream the engine served, as :func:`fit_adaptation` reads it (Q queries, D domains)."""

    domain: np.ndarray  # (Q,) domain index of each query
    tau: np.ndarray  # (Q,) measured tokens per target forward
    action: np.ndarray  # (Q,) SKIP, HEAD or FULL: the update trained right before the query (SKIP: none)
    fill: np.ndarray  # (Q,) that update's buffer fill, in [0, 1]
    share: np.ndarray  # (Q, D) that buffer's domain composition
    revert: np.ndarray  # (Q,) bool: the last good drafter was restored after the query
    checkpoint: np.ndarray  # (Q,) bool: the drafter became the last good one after the query
    draft: np.ndarray | None = None  # (Q,) drafting time relative to the drafter as profiled, if known


ADAPT_FITTED = ("headroom", "head_reach", "head_rate", "full_rate")
"""The ``AdaptationDynamics`` fields :func:`fit_adaptation` estimates."""


def adaptation_tau(dynamics: AdaptationDynamics, survival: np.ndarray, record: AdaptRecord) -> np.ndarray:
    """Expected tau of each query of ``record`` under ``dynamics`` (harm taken in expectation), every
    domain starting at level 1; ``survival`` (D, n + 1) is the drafter's as profiled."""
    certain = [replace(dynamics, harm_probability=p) for p in (0.0, 1.0)]  # updates without / with harm
    rng = np.random.default_rng(0)  # drawn from, but both certain cases ignore the draw
    level = np.ones((1, survival.shape[0]))
    good = level
    out = np.empty(len(record.tau))
    for i, d in enumerate(record.domain):
        if record.action[i] != SKIP:
            args = (level, np.array([record.action[i] == FULL]), record.fill[i:i + 1], record.share[i:i + 1])
            p = dynamics.harm_probability
            level = (1.0 - p) * certain[0].updated(rng, *args) + p * certain[1].updated(rng, *args)
        out[i] = 1.0 + level_rates(survival[d], level[0, d])
        if record.revert[i]:
            level = good
        if record.checkpoint[i]:
            good = level
    return out


def adaptation_draft(dynamics: AdaptationDynamics, record: AdaptRecord) -> np.ndarray:
    """Expected drafting-time ratio of each query of ``record`` under ``dynamics`` (1 at the start)."""
    draft = good = 1.0
    out = np.empty(len(record.tau))
    for i in range(len(out)):
        if record.action[i] != SKIP:
            draft = float(dynamics.updated_draft(np.array([draft]), np.array([record.action[i] == FULL]),
                                                 record.fill[i:i + 1])[0])
        out[i] = draft
        if record.revert[i]:
            draft = good
        if record.checkpoint[i]:
            good = draft
    return out


def fit_adaptation(survival: np.ndarray, records: Sequence[AdaptRecord],
                   base: AdaptationDynamics = AdaptationDynamics(),
                   headroom_starts: Sequence[float] = (0.05, 0.2, 0.5)) -> AdaptationDynamics:
    """``base`` with ``ADAPT_FITTED`` estimated from engine streams and ``query_noise`` from the residuals.

    Least squares between each query's measured tau and :func:`adaptation_tau` (bounded L-BFGS-B from
    each headroom start); the harm terms and the buffer capacities stay ``base``'s. ``survival`` must be
    the acceptance model the simulation will use (``model.survival(draft_length)``). When every record
    has its ``draft`` ratios, ``head_draft`` and ``full_draft`` are then fitted to them the same way.
    """
    if not records or not all(len(r.tau) for r in records):
        raise InputError("fit_adaptation needs at least one non-empty stream: record some queries first")
    if any(np.any(np.asarray(r.tau) <= 0) for r in records):
        raise InputError("measured tau must be positive: pass tokens per target forward (>= 1)")

    bounds = [ADAPT_BOUNDS.get(name, (0.0, 1.0)) for name in ADAPT_FITTED]

    def dynamics(x: np.ndarray) -> AdaptationDynamics:
        return replace(base, **{name: float(np.clip(v, *bound))
                                for name, v, bound in zip(ADAPT_FITTED, x, bounds, strict=True)})

    def loss(x: np.ndarray) -> float:
        dyn = dynamics(x)
        return sum(float(((adaptation_tau(dyn, survival, r) - r.tau) ** 2).sum()) for r in records)

    start = [getattr(base, name) for name in ADAPT_FITTED]
    best = min((minimize(loss, [h, *start[1:]], method="L-BFGS-B", bounds=bounds)
                for h in headroom_starts), key=lambda result: result.fun)
    fitted = dynamics(best.x)
    ratio = np.concatenate([r.tau / adaptation_tau(fitted, survival, r) for r in records])
    fitted = replace(fitted, query_noise=float(np.std(np.log(ratio))))
    if not all(r.draft is not None for r in records):
        return fitted
    names = ("head_draft", "full_draft")

    def drafting(x: np.ndarray) -> AdaptationDynamics:
        return replace(fitted, **{n: float(np.clip(v, *ADAPT_BOUNDS[n]))
                                  for n, v in zip(names, x, strict=True)})

    def draft_loss(x: np.ndarray) -> float:
        dyn = drafting(x)
        return sum(float(((adaptation_draft(dyn, r) - r.draft) ** 2).sum()) for r in records)

    best = minimize(draft_loss, [1.0, 1.0], method="L-BFGS-B", bounds=[ADAPT_BOUNDS[n] for n in names])
    return drafting(best.x)

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


def synthetic_traces(model: ParametricAcceptance, queries: int, iterations: int, seed: int,
                     drafter: str = "synthetic") -> pd.DataFrame:
    """Chain traces drawn from ``model`` (times 0.0): ``iterations`` rows for each of ``queries`` queries,
    the domains taken in turn. For tests and benchmarks of the replay and fitting paths."""
    rng = np.random.default_rng(seed)
    rows = queries * iterations
    domain = np.arange(rows) // iterations % len(model.domains)
    draws = model.sample(rng, domain)
    drafted, accepted = draws.drafted, draws.accepted_all
    return pd.DataFrame({
        "query_id": np.arange(rows) // iterations,
        "domain": np.asarray(model.domains)[domain],
        "drafter": drafter,
        "iteration": np.arange(rows) % iterations,
        "context_length": 128 + 4 * (np.arange(rows) % iterations),
        "depths": [np.arange(1, k + 1) for k in drafted],
        "parents": [np.arange(-1, k - 1) for k in drafted],
        "confidences": [c[:k].astype(np.float64) for c, k in zip(draws.confidences, drafted, strict=True)],
        "rank_buckets": [np.full(k, -1) for k in drafted],
        "on_path": [np.arange(k) < a for k, a in zip(drafted, accepted, strict=True)],
        "accepted": accepted,
        "draft_seconds": 0.0,
        "verify_seconds": 0.0,
    })
