"""The parametric acceptance model: a chain per domain with Platt-calibrated confidences.

Per domain, confidence logits are normal with a shared per-iteration term (easy iterations are easy
everywhere), and the chance to accept position i given that 1..i-1 were is a Platt-scaled calibration
of its confidence, ``logit P(accept_i) = a_i + b_i logit(c_i)``. ``ParametricAcceptance.fit``
estimates it from traces; ``paper_acceptance`` builds a calibrated one matching the SpecBlock paper's
per-position rates (``default_acceptance``: its default domains); ``synthetic_traces`` draws chain
traces from one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from core.errors import InputError
from policies.features import LENGTH_CAP
from simulator.acceptance import Draws
from simulator.positions import PositionTable

_EPS = 1e-6
_QUADRATURE = np.polynomial.hermite_e.hermegauss(48)
_NODES, _WEIGHTS = _QUADRATURE[0], _QUADRATURE[1] / np.sqrt(2.0 * np.pi)  # E[f(Z)] = sum w f(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return np.log(p / (1.0 - p))


def _count_true(mask: np.ndarray) -> np.ndarray:
    """True entries per row of a C-contiguous bool matrix, by popcount of 8 bytes at a time when it can."""
    if mask.shape[1] % 8:
        return mask.sum(axis=1)
    words = np.bitwise_count(mask.view(np.uint64))
    total = words[:, 0].astype(np.int64)
    for j in range(1, words.shape[1]):
        total += words[:, j]
    return total


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


def synthetic_traces(model: ParametricAcceptance, queries: int, iterations: int, seed: int,
                     drafter: str = "synthetic") -> pd.DataFrame:
    """Chain traces drawn from ``model`` (times 0.0): ``iterations`` rows for each of ``queries`` queries,
    the domains taken in turn, each row starting where the previous one's tokens left off (a 128-token
    prompt). For tests and benchmarks of the replay and fitting paths."""
    rng = np.random.default_rng(seed)
    rows = queries * iterations
    domain = np.arange(rows) // iterations % len(model.domains)
    draws = model.sample(rng, domain)
    drafted, accepted = draws.drafted, draws.accepted_all
    moved = (accepted + 1).reshape(queries, iterations)
    before = (np.cumsum(moved, axis=1) - moved).reshape(-1)  # tokens each query emitted before the row
    return pd.DataFrame({
        "query_id": np.arange(rows) // iterations,
        "domain": np.asarray(model.domains)[domain],
        "drafter": drafter,
        "iteration": np.arange(rows) % iterations,
        "context_length": 128 + before,
        "depths": [np.arange(1, k + 1) for k in drafted],
        "parents": [np.arange(-1, k - 1) for k in drafted],
        "confidences": [c[:k].astype(np.float64) for c, k in zip(draws.confidences, drafted, strict=True)],
        "rank_buckets": [np.full(k, -1) for k in drafted],
        "on_path": [np.arange(k) < a for k, a in zip(drafted, accepted, strict=True)],
        "accepted": accepted,
        "draft_seconds": 0.0,
        "verify_seconds": 0.0,
    })
