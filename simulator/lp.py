"""The verification LP: the best expected accepted length any lossless verifier can reach.

A verifier sees ``K`` i.i.d. draft paths ``x`` (``K = 1``: one path) and emits a string
``o = x^(k)_{1..j} y``: ``j`` accepted draft tokens and one token of its own. The LP chooses the joint
law ``pi(x, o)`` with the draft marginal fixed to ``q`` and the law of ``o``, continued by the
target, equal to the target's law; its optimum bounds every lossless verifier, including ones that
read off-path probabilities (Thomas & Pal's information-agnostic LP). (The naive LP that only couples
``X ~ q`` with ``Y ~ p`` overestimates: 12/9 instead of 11/9 on the known example.)

Any other law of K draft paths can be given instead (``DraftLaw``, e.g. drafts without replacement or
Hu et al.'s greedy draft): the bound is then that of every lossless verifier of those drafts. The LP
reads the drafts as a multiset for any law, losing nothing: a verifier that reads their order is
matched by its plan averaged over the orders of each multiset, which has the same output law and
accepted length.

How the problem is kept small:

- **One variable per (draft multiset, distinct output string).** Output strings that several paths
  share (every path shares the empty prefix) get one variable, not one per path. Draft tuples that
  are permutations of each other are merged into one multiset with their total probability: the
  LP is symmetric under relabelling the drafts, so averaging any optimum over permutations gives
  an optimum that is constant on each multiset, and merging loses nothing. At ``V=3, L=3, K=2``
  this gives 7,290 variables instead of 14,256 for ordered tuples (324 at ``K = 1``, as before).
- **The lossless constraint stated token by token.** ``sum_k P_out(z^k) p(z_{k+1..L+1}|z^k) =
  p(z)`` for all ``z in V^(L+1)`` holds if and only if, for every string ``t`` of length
  ``m = 1..L+1``, ``E(t) = p(t_m | t^(m-1)) * (E(t^(m-1)) - P_out(t^(m-1)))``, where
  ``E(s) = P(o starts with s)``: given that the output goes past ``s``, its next token follows
  the target (induction on ``m`` both ways; ``E(()) = 1``, ``P_out(()) = 0``). A variable with an
  output of length ``m`` then has about ``m V`` nonzeros instead of ``V^(L+1-m)``.

How it is kept well conditioned (HiGHS reported these LPs infeasible, and Clarabel's optimum drifted
by 1e-6, before both changes):

- **No redundant rows.** The rows ``t = s v`` for ``v = 0..V-1`` sum to an identity
  (``sum_v E(s v) = E(s) - P_out(s)``, ``sum_v p(v|s) = 1``), so the row of the last token is implied
  by the others and dropped: ``V^(L+1) - 1`` lossless rows remain, as many as the constraints over
  ``z in V^(L+1)`` less the one the draft marginals imply.
- **Conditional variables.** The unknowns are ``pi(S, o) / q(S)``, the verifier's law of the output
  given the drafts, so each lies in ``[0, 1]`` even for multisets of probability 1e-11.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from core.errors import InputError
from simulator.instances import ARInstance, check_shape, path_probabilities

SOLVERS = ("CLARABEL", "HIGHS")
MAX_VARIABLES = 500_000  # cvxpy and Clarabel's peak memory grows with the variables: a small machine's bound
DEFAULT_TIME_LIMIT = 120.0
# Clarabel's default tolerances (1e-8) leave the optimum off by up to 1e-7 on these LPs.
TOLERANCES = {"CLARABEL": {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}}


class LPSolveError(RuntimeError):
    """The solver did not return an optimal solution (time limit, numerical failure)."""


@dataclass(frozen=True)
class LPResult:
    """Optimal value of the LP with how it was reached."""

    value: float  # maximal expected number of accepted draft tokens
    status: str  # cvxpy's status ("optimal")
    seconds: float  # wall time to build and solve
    variables: int
    solver: str  # the solver that produced the value (after any fallback)


@dataclass(frozen=True)
class LPProblem:
    """The LP in equality form: maximize ``objective @ x`` s.t. ``a_eq @ x == b_eq``, ``x >= 0``.

    ``x`` is the verifier's law of the output given the drafts, ``pi(S, o) / q(S)``.
    """

    objective: np.ndarray  # [n] accepted length of each variable's output, times its multiset's probability
    a_eq: sp.csr_matrix  # lossless rows (strings of length 1..L+1 not ending in V-1), then one per multiset
    b_eq: np.ndarray
    multisets: np.ndarray  # [M, K] sorted path indices of each draft multiset
    weight: np.ndarray  # [M] probability q(S) of drawing each multiset, in any order
    group: np.ndarray  # [n] the multiset of each variable
    out_length: np.ndarray  # [n] length of the output string (accepted + 1)
    out_code: np.ndarray  # [n] its code among strings of that length (see simulator.instances)


@dataclass(frozen=True)
class DraftLaw:
    """A law of ``K`` draft paths as the LP reads it: each draft multiset of path codes (see
    ``simulator.instances``; rows sorted) and its probability."""

    multisets: np.ndarray  # [M, K] int
    weight: np.ndarray  # [M] float, summing to 1


def check_drafts(drafts: int) -> None:
    """Refuse fewer than one draft path."""
    if drafts < 1:
        raise InputError(f"{drafts} drafts is too few: use at least 1 draft path")


def _multisets(items: int, drafts: int) -> int:
    return math.comb(items + drafts - 1, drafts)


def lp_size(vocab: int, length: int, drafts: int = 1) -> int:
    """Number of LP variables for ``drafts`` paths of ``length`` tokens over ``vocab``, without building it.

    For each accepted length ``j`` a prefix ``a`` of length ``j`` yields ``V`` outputs in every
    multiset that holds a path through ``a``: ``V * V^j * (C(N+K-1, K) - C(N-V^(L-j)+K-1, K))``.
    """
    check_shape(vocab, length)
    check_drafts(drafts)
    paths = vocab**length
    total = _multisets(paths, drafts)
    return vocab * sum(vocab**j * (total - _multisets(paths - vocab ** (length - j), drafts))
                       for j in range(length + 1))


def check_size(vocab: int, length: int, drafts: int, limit: int = MAX_VARIABLES) -> int:
    """Return the variable count, or refuse (naming it) when it exceeds ``limit``."""
    check_shape(vocab, length)
    check_drafts(drafts)
    # Cheap lower bounds first, so absurd inputs are refused without big-integer arithmetic:
    # there are at least V^(L+1) variables, and at least V * (K + 1) of them.
    if (length + 1) * math.log(vocab) > math.log(limit) or vocab * (drafts + 1) > limit:
        raise InputError(f"the LP for V={vocab}, L={length}, K={drafts} would have more than {limit:,} "
                         "variables: reduce the vocabulary, the draft length or the number of drafts")
    size = lp_size(vocab, length, drafts)
    if size > limit:
        raise InputError(f"the LP for V={vocab}, L={length}, K={drafts} would have {size:,} variables (limit "
                         f"{limit:,}): reduce the vocabulary, the draft length or the number of drafts")
    return size


def _draft_multisets(paths: int, drafts: int) -> np.ndarray:
    """Every non-decreasing ``drafts``-tuple of path indices, shape [C(paths+K-1, K), K]."""
    rows = np.arange(paths)[:, None]
    for _ in range(drafts - 1):
        last = rows[:, -1]
        counts = paths - last
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        nxt = np.repeat(last, counts) + np.arange(counts.sum()) - starts
        rows = np.column_stack([np.repeat(rows, counts, axis=0), nxt])
    return rows


def _orderings(multisets: np.ndarray) -> np.ndarray:
    """Number of distinct orderings of each sorted row: K! / prod(multiplicity!)."""
    run = np.ones(len(multisets))
    denominator = np.ones(len(multisets))
    for k in range(1, multisets.shape[1]):
        run = np.where(multisets[:, k] == multisets[:, k - 1], run + 1, 1)
        denominator *= run
    return math.factorial(multisets.shape[1]) / denominator


def _variables(vocab: int, length: int, multisets: np.ndarray) -> tuple[np.ndarray, ...]:
    """(multiset, output length, output code) of every variable: one per distinct output per multiset."""
    groups, lengths, codes = [], [], []
    for j in range(length + 1):
        prefix = multisets // vocab ** (length - j)  # rows are sorted, so equal prefixes are adjacent
        distinct = np.ones(prefix.shape, dtype=bool)
        distinct[:, 1:] = prefix[:, 1:] != prefix[:, :-1]
        row, col = np.nonzero(distinct)
        groups.append(np.repeat(row, vocab))
        codes.append((prefix[row, col][:, None] * vocab + np.arange(vocab)).ravel())
        lengths.append(np.full(len(row) * vocab, j + 1))
    return np.concatenate(groups), np.concatenate(lengths), np.concatenate(codes)


def iid_law(inst: ARInstance, drafts: int) -> DraftLaw:
    """``drafts`` i.i.d. paths from the drafter of ``inst``: every multiset, zero-probability ones too."""
    check_drafts(drafts)
    multisets = _draft_multisets(inst.vocab**inst.length, drafts)
    q_paths = path_probabilities(inst.q_tables, inst.length)[inst.length]
    return DraftLaw(multisets, _orderings(multisets) * np.prod(q_paths[multisets], axis=1))


def merged_law(draws: Iterable[tuple[float, Sequence[int]]], drafts: int) -> DraftLaw:
    """The law of drafts listed as ``(probability, path codes)``, in any order and repetition, as
    multisets of ``drafts`` paths. A draft of fewer paths is padded with copies of its last path (a copy
    offers no new output); draws of probability zero are dropped."""
    check_drafts(drafts)
    merged: dict[tuple[int, ...], float] = defaultdict(float)
    for prob, codes in draws:
        if not 1 <= len(codes) <= drafts:
            raise InputError(f"a draft of {len(codes)} paths in a law of {drafts}: give 1 to {drafts} paths")
        if prob > 0:
            merged[tuple(sorted([*codes, *[codes[-1]] * (drafts - len(codes))]))] += prob
    keys = sorted(merged)
    return DraftLaw(np.array(keys, dtype=np.int64).reshape(len(keys), drafts),
                    np.array([merged[k] for k in keys]))


def build_lp(inst: ARInstance, drafts: int = 1, law: DraftLaw | None = None) -> LPProblem:
    """The LP of ``inst`` with ``drafts`` draft paths, i.i.d. unless ``law`` is given, as sparse matrices
    (see the module doc)."""
    check_drafts(drafts)
    law = iid_law(inst, drafts) if law is None else law
    vocab, length = inst.vocab, inst.length
    multisets, weight = law.multisets, law.weight
    if multisets.ndim != 2 or multisets.shape[1] != drafts or multisets.shape[0] != weight.size:
        raise InputError(f"the draft law has multisets of shape {multisets.shape} for {drafts} drafts and "
                         f"{weight.size} weights: give one sorted row of {drafts} path codes per weight")
    group, out_length, out_code = _variables(vocab, length, multisets)
    n, scale = len(group), weight[group]  # pi = scale * x
    # Lossless row of each string t (by length, then code); the rows t = s (V-1) are dropped.
    offset = np.concatenate([[0, 0], np.cumsum(vocab ** np.arange(1, length + 2))])
    codes = np.concatenate([np.arange(vocab**m) for m in range(1, length + 2)])
    kept = codes % vocab != vocab - 1
    row_of = np.where(kept, np.cumsum(kept) - 1, -1)
    rows, cols, vals = [], [], []
    for m in range(1, length + 2):
        var = np.nonzero(out_length == m)[0]
        for k in range(1, m + 1):  # +1 in E(o^k): the output starts with its own prefixes
            rows.append(offset[k] + out_code[var] // vocab ** (m - k))
            cols.append(var)
            vals.append(scale[var])
        for k in range(1, m):  # -p(v | o^k) in the rows o^k v: the output goes past o^k
            prefix = out_code[var] // vocab ** (m - k)
            rows.append((offset[k + 1] + prefix * vocab)[:, None] + np.arange(vocab))
            cols.append(np.repeat(var[:, None], vocab, axis=1))
            vals.append(-inst.p_tables[k][prefix] * scale[var, None])
    row = row_of[np.concatenate([r.ravel() for r in rows])]
    col = np.concatenate([c.ravel() for c in cols])
    val = np.concatenate([v.ravel() for v in vals])
    keep, n_lossless = row >= 0, int(kept.sum())
    # Then the draft marginal: one row per multiset, a 1 for each of its variables.
    row = np.concatenate([row[keep], n_lossless + group])
    col = np.concatenate([col[keep], np.arange(n)])
    val = np.concatenate([val[keep], np.ones(n)])
    a_eq = sp.coo_matrix((val, (row, col)), shape=(n_lossless + len(multisets), n)).tocsr()
    a_eq.eliminate_zeros()
    b_eq = np.zeros(n_lossless + len(multisets))
    b_eq[: vocab - 1] = inst.p_tables[0][0][:-1]  # E(v) = p(v) for the strings of length 1
    b_eq[n_lossless:] = 1.0  # each multiset's conditional law of the output sums to 1
    return LPProblem(objective=(out_length - 1) * scale, a_eq=a_eq, b_eq=b_eq, multisets=multisets,
                     weight=weight, group=group, out_length=out_length, out_code=out_code)


def _solve(problem: LPProblem, solver: str, time_limit: float) -> tuple[float, str]:
    x = cp.Variable(problem.objective.size, nonneg=True)
    lp = cp.Problem(cp.Maximize(problem.objective @ x), [problem.a_eq @ x == problem.b_eq])
    try:
        with warnings.catch_warnings():  # an inaccurate solution is reported through the status instead
            warnings.simplefilter("ignore", UserWarning)
            lp.solve(solver=solver, time_limit=time_limit, **TOLERANCES.get(solver, {}))
    except cp.SolverError as exc:
        return math.nan, f"solver_error ({exc})"
    return float(lp.value) if lp.value is not None else math.nan, str(lp.status)


def solve_lp(inst: ARInstance, drafts: int = 1, solver: str = "CLARABEL",
             time_limit: float = DEFAULT_TIME_LIMIT, max_variables: int = MAX_VARIABLES,
             law: DraftLaw | None = None) -> LPResult:
    """Maximal expected accepted length over lossless verifiers of ``drafts`` paths of ``inst``, i.i.d.
    from its drafter unless ``law`` is given.

    Refuses (``InputError``) a problem over ``max_variables`` before building it (the i.i.d. count,
    which no other law of as many paths exceeds); raises ``LPSolveError`` if the solver stops short of
    optimal (HiGHS falls back to Clarabel first, unless it ran out of time).
    """
    solver = solver.upper()
    if solver not in SOLVERS:
        raise InputError(f"unknown LP solver {solver!r}: use one of {', '.join(SOLVERS)}")
    if time_limit <= 0:
        raise InputError(f"time limit {time_limit} s is not positive: give the solver some seconds")
    check_size(inst.vocab, inst.length, drafts, max_variables)

    start = time.perf_counter()
    problem = build_lp(inst, drafts, law)
    size = problem.objective.size
    value, status = _solve(problem, solver, time_limit)
    if status not in ("optimal", "user_limit") and solver == "HIGHS":
        solver = "CLARABEL"
        value, status = _solve(problem, solver, max(time_limit - (time.perf_counter() - start), 1.0))
    if status != "optimal":
        limit = f" within the time limit of {time_limit:g} s" if status == "user_limit" else ""
        raise LPSolveError(f"the LP ({size:,} variables) was not solved{limit}: {solver} returned {status}; "
                           "raise the time limit or reduce the vocabulary, the draft length or the drafts")
    return LPResult(value=value, status=status, seconds=time.perf_counter() - start, variables=size,
                    solver=solver)


def expected_token(inst: ARInstance) -> float:
    """Expected accepted tokens of token-level speculative sampling on one path:
    ``sum_i sum_{x^i} prod_{j<=i} min(p, q)``."""
    mass, total = np.ones(1), 0.0
    for m in range(inst.length):
        mass = (mass[:, None] * np.minimum(inst.p_tables[m], inst.q_tables[m])).ravel()
        total += mass.sum()
    return float(total)


def expected_block(inst: ARInstance) -> float:
    """Expected accepted tokens of block verification on one path (Sun et al. 2025): ``sum_i sum_{x^i}
    beta(x^i)`` with ``beta(x^i) = min(q(x^i), beta(x^(i-1)) p(x_i | x^(i-1)))``."""
    q_paths = path_probabilities(inst.q_tables, inst.length)
    beta, total = np.ones(1), 0.0
    for m in range(inst.length):
        beta = np.minimum(q_paths[m + 1], (beta[:, None] * inst.p_tables[m]).ravel())
        total += beta.sum()
    return float(total)
