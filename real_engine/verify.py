"""Lossless verifiers: check a draft tree against one target forward and emit the accepted tokens.

Every verifier takes the tree, ``p`` ([nodes, vocab]; row ``i`` is the target's already-warped
next-token law after the prefix ending at node ``i``) and a :class:`Sampler` through which all its
randomness flows. Real decoding passes a :class:`TorchSampler`; ``real_engine.exact`` passes a sampler
that enumerates every outcome, so the same code is proven lossless exactly (``tests/test_verify_*.py``).

- ``greedy``: argmax matching on any tree (temperature 0).
- ``token``: token-level speculative sampling (Leviathan et al. 2023) on the first path.
- ``block``: block verification, BV (Sun et al., ICLR 2025, arXiv 2403.10444) on the first path.
- ``rrs``: recursive rejection sampling over the tree's token trie (SpecInfer, arXiv 2305.09781), with a
  rule per ``child_rule``: i.i.d. children, children without replacement (Sequoia), top-k point masses.
- ``gbv``: greedy multi-path block verification (after Thomas & Pal, arXiv 2602.16961).
- ``seqbv``: sequential BV with residual hand-off over the paths (this project's own).
- ``gds``: greedy draft selection (after Hu et al., ICLR 2025): the top K-1 tokens of ``q`` and one sampled
  path, verified optimally at the first step and by BV along the accepted path.

Provenance, stated plainly:

- *Follow a paper's pseudo-code*: ``token`` (Leviathan et al.'s algorithm), ``block`` (Sun et al.'s
  BV: running weight, stop chosen from the end, weighted residual), ``rrs`` on i.i.d. children
  (SpecInfer's multi-step speculative sampling: children tried in turn against a shrinking residual)
  and its without-replacement rule (``q`` also loses each rejected token: Sequoia, arXiv 2402.12374).
- *This project's statement of a standard rule*: ``rrs`` on K unmerged sampled paths runs on their
  token trie, SpecInfer's algorithm with each path's copy of a token a candidate of its own (so the
  multiplicity of the i.i.d. draws is kept), and on top-k trees treats each deterministic candidate
  as a point mass (accept with ``r(x)``, then zero ``x``); both proven lossless here by enumeration.
- *Reconstructed from an abstract*: ``gbv``. The abstract of Thomas & Pal names greedy multi-path BV
  but gives no algorithm; the selection (the lexicographically greatest of K i.i.d. paths under a
  ``p/q`` token order) and BV on that path's exact law are this project's reconstruction, not the
  paper's pseudo-code, and its figures are not the paper's. It is lossless but not always better than
  one path: on some instances it accepts less than single-path BV (``specblock lp --vocab 2 --length 2
  --drafts 2 --drafter mix``, seed 0, instance 0: GBV 1.609 against BV 1.857).
- *This project's own*: ``seqbv`` (no paper).
- *Partly reconstructed*: ``gds``. The draft (the K-1 most likely tokens, then one sampled) and its
  optimal one-step verification follow Hu et al., "Towards Optimal Multi-draft Speculative Decoding"
  (ICLR 2025), as recalled here, not checked against the paper's text; the sampled draft's law (``q``
  without the top tokens), the order of the checks and the paths' tails (verified by BV) are this
  project's. Its drafts are not i.i.d., so the LP bound for K i.i.d. paths does not bound it.

Each sampling verifier is written as a ``*_law`` function returning a :class:`Decision` (the accepted
nodes and the law of the token to emit); ``VERIFIERS`` wraps each with that one final draw. Both are
read from the registry of ``core.verifiers`` (each verifier's entry points), so a verifier registered
there is found here and in ``real_engine.exact``, which proves it lossless. Nothing larger than
[nodes, vocab] is built, and host syncs are a handful per call (one Bernoulli draw covers a whole path
in ``token`` and ``block``, one more draws the emitted token).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F

from core.errors import InputError
from core.verifiers import Loaded, verifier_spec
from real_engine.tree import DraftTree


class Sampler(Protocol):
    """The source of every random choice a verifier makes."""

    def bernoulli(self, prob: torch.Tensor) -> torch.Tensor:
        """Independent draws, one per element of ``prob``: a bool tensor of its shape."""
        ...

    def categorical(self, weights: torch.Tensor) -> int:
        """One index drawn with probability proportional to the 1-D non-negative ``weights``."""
        ...


class TorchSampler:
    """Draws from a (seeded) ``torch.Generator`` on the tensors' device; ``None`` uses torch's global one."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def bernoulli(self, prob: torch.Tensor) -> torch.Tensor:
        """``U < prob`` elementwise with ``U ~ U[0, 1)``, so prob 0 never and prob 1 always passes."""
        return torch.rand(prob.shape, generator=self.generator, device=prob.device, dtype=prob.dtype) < prob

    def categorical(self, weights: torch.Tensor) -> int:
        """One draw by inverting the float64 cumulative weights (several times faster than
        ``torch.multinomial`` at 128k tokens on CPU); a zero-weight token is never drawn; one host sync."""
        cdf = weights.double().cumsum(0)
        u = torch.rand(1, generator=self.generator, device=cdf.device, dtype=cdf.dtype) * cdf[-1]
        return int(torch.minimum(torch.searchsorted(cdf, u, right=True), torch.searchsorted(cdf, cdf[-1:])))


@dataclass(frozen=True)
class VerifyResult:
    """What one verification emits: the accepted nodes, then one token from the target's law."""

    path: tuple[int, ...]  # accepted node indices, root excluded, root-to-deepest order
    token: int  # the emitted token after the path (correction or bonus)
    bonus: bool  # True when the whole drafted path was accepted


@dataclass(frozen=True)
class Decision:
    """A verifier's outcome before its last draw: the accepted nodes and the law of the emitted token.

    Every verifier ends by drawing one token from ``law``; ``real_engine.exact`` reads the law itself
    instead of enumerating that final draw.
    """

    path: tuple[int, ...]
    law: torch.Tensor  # [V] non-negative weights, not necessarily normalized
    bonus: bool


def _check(name: str, tree: DraftTree, p: torch.Tensor, points: bool = False) -> None:
    """Refuse rows, a draft or a draft law verifier ``name`` cannot read. It needs ``q`` when its spec
    says so (``needs_q``), except on a top-k tree when ``points``: it takes top-k children as point masses."""
    spec = verifier_spec(name)
    needs_q = spec.needs_q and not (points and tree.child_rule == "topk")
    if p.dim() != 2 or p.shape[0] != tree.size:
        raise InputError(f"{name}: p has shape {tuple(p.shape)} for a tree of {tree.size} nodes: "
                         "pass p as [nodes, vocab], one target row per tree node")
    if tree.child_rule == "greedy_draft" and not (spec.greedy or spec.draws == "greedy_draft"):
        raise InputError(f"{name} cannot verify a greedy draft (top tokens, then one sampled): use gds, or "
                         "greedy at temperature 0")
    if needs_q and tree.q is None:
        raise InputError(f"{name} needs the draft law: build the DraftTree with q ([nodes, vocab])")
    if needs_q and tree.q.shape[1] != p.shape[1]:
        raise InputError(f"{name}: q has vocabulary {tree.q.shape[1]} but p has {p.shape[1]}: "
                         "pass p and q over the same vocabulary")


def _children(tree: DraftTree) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(tree.size)]
    for node, parent in enumerate(tree.parents.tolist()[1:], start=1):
        kids[parent].append(node)
    return kids


def _normalize(v: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``v / sum(v)``, or ``fallback`` when ``v`` is all zero (a zero-probability branch; no host sync)."""
    total = v.sum()
    return torch.where(total > 0, v / total, fallback)


def _min_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``min(1, num / den)`` elementwise, 0 where ``num`` is 0 (even when ``den`` is 0 too)."""
    return torch.where(num > 0, num / torch.maximum(num, den), torch.zeros_like(num))


def _without(v: torch.Tensor, token: int) -> torch.Tensor:
    v = v.clone()
    v[token] = 0
    return v


def _residual(target: torch.Tensor, draft: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The law to emit after a rejection, ``normalize([weight * target - draft]_+)`` (``weight`` 1 when
    None; the target itself on a branch of probability zero)."""
    excess = target - draft if weight is None else weight * target - draft
    return _normalize(torch.relu(excess), target)


def _untried(q: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """``q`` without the ``tokens`` already tried, renormalized: the law of the next draw without
    replacement (Sequoia)."""
    return _normalize(q.index_fill(0, torch.tensor(tokens, device=q.device), 0), q)


def _rejected(rule: str, r: torch.Tensor, q: torch.Tensor | None,
              token: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RRS's residual target and draft law after the candidate ``token`` is rejected, per child rule:
    ``r <- normalize([r - q]_+)`` for sampled children (and ``q`` loses ``token`` without replacement);
    ``r`` loses ``token`` for a top-k point mass (``q`` is None)."""
    if q is None:
        return _normalize(_without(r, token), r), None
    return _residual(r, q), (_untried(q, [token]) if rule == "without_replacement" else q)


@dataclass(frozen=True)
class _Path:
    """The rows one path's verification reads: target ``p0`` and draft ``q0`` at the prefix the path
    hangs from, the target at each of its nodes ``p`` [L, V], the draft at each node but the last
    ``q`` [L-1, V], and its tokens ``x`` [L]. ``p`` and ``q`` are views when the nodes are
    consecutive (chains and ``from_paths`` trees), so no [L, V] copy is made."""

    p0: torch.Tensor
    q0: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor
    x: torch.Tensor

    def target(self, i: int) -> torch.Tensor:
        """Target row after ``i`` accepted tokens."""
        return self.p0 if i == 0 else self.p[i - 1]

    def draft(self, i: int) -> torch.Tensor:
        """Draft row after ``i`` accepted tokens (``i < L``)."""
        return self.q0 if i == 0 else self.q[i - 1]

    def at_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Target and draft probability of each drafted token at its prefix, [L] each."""
        first, rest = self.x[:1], self.x[1:, None]
        return (torch.cat([self.p0[first], self.p[:-1].gather(1, rest)[:, 0]]),
                torch.cat([self.q0[first], self.q.gather(1, rest)[:, 0]]))


def _rows(t: torch.Tensor, nodes: list[int]) -> torch.Tensor:
    """``t[nodes]`` for increasing ``nodes``: a view when they are consecutive."""
    if nodes and nodes[-1] - nodes[0] == len(nodes) - 1:
        return t[nodes[0]: nodes[-1] + 1]
    return t[nodes]


def _path(tree: DraftTree, p: torch.Tensor, nodes: list[int], prefix: int = 0) -> _Path:
    """The rows of the path ``nodes`` hanging from node ``prefix``. Top-k children are deterministic
    candidates, so their draft law is a point mass at the drafted token (lossless for any draft)."""
    x = tree.tokens[nodes]
    if tree.child_rule == "topk":
        point = F.one_hot(x, p.shape[1]).to(p.dtype)
        q0 = point[0] if nodes else torch.zeros_like(p[prefix])
        return _Path(p[prefix], q0, _rows(p, nodes), point[1:], x)
    q = tree.q.to(p.dtype)
    return _Path(p[prefix], q[prefix], _rows(p, nodes), _rows(q, nodes[:-1]), x)


def _stop_index(passed: torch.Tensor) -> int:
    """BV's stopping time ``tau = max{i : eta_i <= h_i}``, scanning from the END (0 if none passed).

    The first passing ``i``, or the last before the first failure, is NOT lossless.
    """
    steps = torch.arange(1, passed.numel() + 1, device=passed.device)
    return int((passed.long() * steps).max())


def _token_core(path: _Path, sampler: Sampler) -> tuple[int, torch.Tensor]:
    """Token-level rule: accept ``x_i`` with prob ``min(1, p/q)`` until the first rejection.

    All ``L`` coins are drawn at once (only those up to the first failure matter). Returns the number
    accepted and the law of the emitted token (``[p - q]_+`` normalized, or ``p`` after the last node).
    """
    n = path.x.numel()
    if n == 0:
        return 0, path.p0
    tau = int(sampler.bernoulli(_min_ratio(*path.at_tokens())).long().cumprod(0).sum())
    if tau == n:
        return n, path.p[n - 1]
    return tau, _residual(path.target(tau), path.draft(tau))


def _block_core(path: _Path, sampler: Sampler) -> tuple[int, torch.Tensor]:
    """Block verification of one path (Sun et al. 2025), for any first-position target ``path.p0``
    (a residual law in SeqBV) and any draft law.

    Returns ``tau`` and the law of the emitted token: the bonus (target at the last node) if
    ``tau == L``, else the residual ``normalize([w_tau p - q]_+)`` after ``tau`` tokens (which SeqBV
    hands to the next path).
    """
    n = path.x.numel()
    if n == 0:
        return 0, path.p0
    px, qx = path.at_tokens()
    # w_i = min(1, w_{i-1} p/q) = exp(S_i - max_{j<=i} S_j) with S the running sum of log-ratios.
    log_ratio = torch.log(px) - torch.log(qx.clamp_min(torch.finfo(qx.dtype).tiny))
    running = torch.cat([log_ratio.new_zeros(1), log_ratio.cumsum(0)])
    w = torch.exp(running - running.cummax(0).values)  # [L+1], w[0] = 1
    inner = w[1:n]
    residual_mass = torch.relu(inner[:, None] * path.p[:-1] - path.q).sum(1)
    h = torch.where(inner >= 1, torch.ones_like(inner), residual_mass / (residual_mass + 1 - inner))
    tau = _stop_index(sampler.bernoulli(torch.cat([h, w[n:]])))
    if tau == n:
        return n, path.p[n - 1]
    return tau, _residual(path.target(tau), path.draft(tau), w[tau])


def _first_path(tree: DraftTree) -> list[int]:
    paths = tree.paths()
    return paths[0] if paths else []


def _chains(name: str, tree: DraftTree) -> list[list[int]]:
    """The tree's paths, checked to be unmerged chains of equal length (``DraftTree.from_paths``)."""
    paths = tree.paths() or [[]]
    inner_parents = [parent for parent in tree.parents.tolist()[1:] if parent]
    if len(set(inner_parents)) != len(inner_parents) or len({len(path) for path in paths}) != 1:
        raise InputError(f"{name} verifies K unmerged draft paths of equal length: "
                         "build the tree with DraftTree.from_paths and equal-length paths")
    return paths


def greedy(tree: DraftTree, p: torch.Tensor, sampler: Sampler | None = None) -> VerifyResult:
    """Greedy verification (temperature 0) on any tree: follow the child whose token is the target's
    argmax, emit the argmax where no child matches. ``p`` may be logits. Ties go to the lowest token
    id (``torch.argmax``); among duplicate children the first in index order is followed. No
    randomness: ``sampler`` is accepted for a uniform signature and unused."""
    _check("greedy", tree, p)
    best = p.argmax(-1).tolist()
    tokens, kids = tree.tokens.tolist(), _children(tree)
    node, path = 0, []
    while True:
        match = next((child for child in kids[node] if tokens[child] == best[node]), None)
        if match is None:
            return VerifyResult(tuple(path), best[node], not kids[node])
        node = match
        path.append(node)


def greedy_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler | None = None) -> Decision:
    """Greedy verification as a :class:`Decision` whose law is a point mass at the argmax."""
    result = greedy(tree, p)
    law = torch.zeros_like(p[0])
    law[result.token] = 1
    return Decision(result.path, law, result.bonus)


def token_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> Decision:
    """Token-level speculative sampling on the first path, following the pseudo-code of Leviathan et al.
    (2023, Algorithm 1; Chen et al. 2023 give the same rule)."""
    _check("token", tree, p, points=True)
    nodes = _first_path(tree)
    tau, law = _token_core(_path(tree, p, nodes), sampler)
    return Decision(tuple(nodes[:tau]), law, tau == len(nodes))


def block_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> Decision:
    """Block verification, BV, on the first path, following the algorithm of Sun et al. (ICLR 2025,
    arXiv 2403.10444)."""
    _check("block", tree, p, points=True)
    nodes = _first_path(tree)
    tau, law = _block_core(_path(tree, p, nodes), sampler)
    return Decision(tuple(nodes[:tau]), law, tau == len(nodes))


def _ancestry(parents: list[int], node: int) -> tuple[int, ...]:
    """The nodes from depth 1 down to ``node``."""
    nodes = []
    while node > 0:
        nodes.append(node)
        node = parents[node]
    return tuple(reversed(nodes))


def rrs_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> Decision:
    """Recursive rejection sampling over the token trie of the tree (SpecInfer, Miao et al., arXiv
    2305.09781, its multi-step speculative sampling), with every drafted copy of a prefix kept. The
    per-node rules follow SpecInfer's (i.i.d.) and Sequoia's (without replacement) pseudo-code; the
    trie over unmerged paths and the top-k point-mass rule are this project's statement of them.

    The *live* nodes are those whose tokens spell the accepted prefix (at first the root). The
    candidates are the children of every live node, in index order (path order on
    ``DraftTree.from_paths`` trees), duplicates kept: after accepting ``x`` every sampled path that
    drew ``x`` there offers its next token, each still a draw from ``q`` given the prefix. They are
    tried against a residual ``r`` (initially the target row). ``iid``: accept with ``min(1, r/q)``,
    on rejection ``r <- normalize([r - q]_+)``. ``without_replacement`` (Sequoia, arXiv 2402.12374):
    the same, and ``q`` loses the rejected token; such siblings are distinct, so one node stays live
    and this is Sequoia's rule node by node. ``topk``: each candidate is a point mass, accepted with
    prob ``r(x)``; on rejection ``r`` loses ``x``. Applying the i.i.d. rule to top-k children is lossy.
    On a tree with no repeated sibling (top-k trees, chains) this is per-node RRS. The accepted nodes
    are reported along one live node's ancestry (the first with children, so that ``bonus`` means a
    leaf was reached), and that node's rows stand for the prefix. Continuing down the accepting path
    alone is lossless too but throws the other paths' drafts away; paths drawn as distinct whole
    strings are neither i.i.d. nor Sequoia children, and no rule here verifies them losslessly (both
    measured in ``tests/test_verify_trie.py``).
    """
    rule = tree.child_rule
    _check("rrs", tree, p, points=True)
    tokens, parents, kids = tree.tokens.tolist(), tree.parents.tolist(), _children(tree)
    live = [0]
    while True:
        node = next((u for u in live if kids[u]), live[0])
        candidates = [child for u in live for child in kids[u]]
        if not candidates:
            return Decision(_ancestry(parents, node), p[node], True)
        r = p[node]
        q = None if rule == "topk" else tree.q[node].to(p.dtype)
        for child in candidates:
            x = tokens[child]
            if bool(sampler.bernoulli(r[x] if q is None else _min_ratio(r[x], q[x]))):
                break
            r, q = _rejected(rule, r, q, x)
        else:
            return Decision(_ancestry(parents, node), r, False)
        live = [c for c in candidates if tokens[c] == x]


def _greatest_path(paths: list[list[int]], tokens: list[int], keys: list[list[float]]) -> int:
    """Index of the lexicographically greatest path; at each node tokens are ordered by ``p/q``, ties
    by token id (larger id is greater); identical paths keep the first."""
    best = 0
    for k in range(1, len(paths)):
        for i, (a, b) in enumerate(zip(paths[k], paths[best], strict=True)):
            if tokens[a] != tokens[b]:
                if (keys[k][i], tokens[a]) > (keys[best][i], tokens[b]):
                    best = k
                break
    return best


def _selected_law(path: _Path, drafts: int) -> _Path:
    """``path`` with its draft law replaced by ``q_G``, the law of the greatest of ``drafts`` i.i.d. paths.

    The greatest path starts with ``s`` with probability ``G(s) = (D(s) + M(s))^K - D(s)^K``, where
    ``M(s) = q(s)`` is the path probability of ``s`` and ``D(s)`` that of the paths ordered before
    it (``D(sy) = D(s) + M(s) B(y)``, ``B(y)`` the ``q``-mass ordered before ``y`` after ``s``), so
    ``q_G(y | s) = G(sy) / G(s)``. With ``t = D(s) / (D(s) + M(s))`` (``t = 0`` at the root),
    ``beta = t + (1 - t) B(y)`` and ``alpha = beta + (1 - t) q(y)`` that ratio is
    ``q(y) sum_j alpha^j beta^(K-1-j) / sum_j t^j``: the cancellation-free ``a^K - b^K`` form
    (summed by Horner's rule), with every quantity in [0, 1]. Then ``t(sy) = beta / alpha`` at the
    selected token.
    """
    P = torch.cat([path.p0[None], path.p[:-1]])  # [L, V]: target and draft at each prefix
    Q = torch.cat([path.q0[None], path.q])
    keys = torch.where(Q > 0, P / Q, torch.full_like(Q, float("inf")))
    order = keys.argsort(dim=1, stable=True)  # ascending: ties put the lower token id first
    ordered = Q.gather(1, order)
    before = torch.empty_like(Q).scatter_(1, order, ordered.cumsum(1) - ordered)
    picked_before = before.gather(1, path.x[:, None])[:, 0].tolist()
    picked_q = Q.gather(1, path.x[:, None])[:, 0].tolist()
    ts = [0.0]
    for b, qy in zip(picked_before[:-1], picked_q[:-1], strict=True):
        t = ts[-1]
        beta = t + (1 - t) * b
        ts.append(beta / (beta + (1 - t) * qy))
    t = torch.tensor(ts, dtype=Q.dtype, device=Q.device)[:, None]
    beta = t + (1 - t) * before
    alpha = beta + (1 - t) * Q
    num, beta_power = torch.ones_like(Q), torch.ones_like(Q)
    den, t_power = torch.ones_like(t), torch.ones_like(t)
    for _ in range(drafts - 1):
        beta_power, t_power = beta_power * beta, t_power * t
        num, den = num * alpha + beta_power, den + t_power
    law = Q * num / den
    return _Path(path.p0, law[0], path.p, law[1:], path.x)


def gbv_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> Decision:
    """Greedy multi-path block verification, GBV, as reconstructed here from the abstract of Thomas &
    Pal (arXiv 2602.16961), which names the method but gives no algorithm: not the paper's pseudo-code.

    Of ``K`` i.i.d. paths, select the lexicographically greatest under the ``p/q`` order at each
    node, compute its exact law ``q_G`` and run BV on it with ``q_G`` in place of ``q``: lossless
    because BV is lossless for any draft law. Needs i.i.d. paths (``child_rule == "iid"``). The
    selection can make ``q_G`` a worse draft than ``q``: on some instances GBV accepts less than BV on
    one path (``specblock lp --vocab 2 --length 2 --drafts 2 --drafter mix``, seed 0, instance 0:
    1.609 against 1.857; ``tests/test_lp.py``), so the paper's gain over BV is not claimed for it.
    """
    _check("gbv", tree, p)
    if tree.child_rule != "iid":
        raise InputError(f"gbv needs i.i.d. drafted paths, not child rule {tree.child_rule!r}: "
                         "draft with child_rule='iid' or use rrs/seqbv")
    paths = _chains("gbv", tree)
    tokens = tree.tokens.tolist()
    if paths[0]:
        nodes = torch.tensor(paths, device=p.device)
        prefixes = torch.cat([torch.zeros_like(nodes[:, :1]), nodes[:, :-1]], 1)
        x = tree.tokens[nodes]
        q_x = tree.q[prefixes, x].to(p.dtype)
        keys = torch.where(q_x > 0, p[prefixes, x] / q_x, torch.full_like(q_x, float("inf"))).tolist()
        selected = paths[_greatest_path(paths, tokens, keys)]
    else:
        selected = []
    path = _path(tree, p, selected)
    tau, law = _block_core(_selected_law(path, len(paths)) if selected else path, sampler)
    return Decision(tuple(selected[:tau]), law, tau == len(selected))


def seqbv_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> Decision:
    """Sequential block verification with residual hand-off, SeqBV: this project's own rule, from no
    paper.

    Runs BV on the first unused path that extends the committed prefix ``s``, with the residual ``r``
    as the target at its first position (the target row deeper). If BV stops at ``tau < L`` it
    commits ``tau`` tokens, hands its residual to the next path extending the new prefix, and emits
    from the residual when none is left. The accepted nodes are reported along the last path
    verified, which carries the whole committed prefix. Equal to RRS at ``L = 1``; never worse than
    single-path BV. The first-position draft law follows ``child_rule`` as RRS does (tokens already
    tried at ``s`` are removed for ``without_replacement``; point masses for ``topk``).
    """
    rule = tree.child_rule
    _check("seqbv", tree, p, points=True)
    paths = _chains("seqbv", tree)
    tokens = tree.tokens.tolist()
    strings = [[tokens[node] for node in path] for path in paths]
    remaining, depth, tried = list(range(len(paths))), 0, []
    r = p[0]
    while True:
        m = remaining.pop(0)
        nodes = paths[m][depth:]
        path = replace(_path(tree, p, nodes, paths[m][depth - 1] if depth else 0), p0=r)
        if rule == "without_replacement" and tried:
            path = replace(path, q0=_untried(path.q0, tried))
        tau, law = _block_core(path, sampler)
        if tau == len(nodes):
            return Decision(tuple(paths[m]), law, True)
        if tau:
            depth, tried = depth + tau, []
        tried.append(strings[m][depth])
        remaining = [k for k in remaining if strings[k][:depth] == strings[m][:depth]]
        if not remaining:  # the accepted prefix, as nodes of the last path verified (a tree chain)
            return Decision(tuple(paths[m][:depth]), law, False)
        r = law


def _greedy_draft(q: torch.Tensor, tops: list[int]) -> torch.Tensor | None:
    """The law the last child of a greedy-draft node was drawn from: ``q`` without the other children's
    tokens ``tops``, renormalized; None when no mass is left (the drafter then adds no sampled child, so
    the last child is a top token too). One host sync."""
    rest = q.index_fill(0, torch.tensor(tops, dtype=torch.long, device=q.device), 0) if tops else q
    total = float(rest.sum())
    return rest / total if total > 0 else None


def gds_law(tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> Decision:
    """Greedy draft selection, GDS, after Hu et al., "Towards Optimal Multi-draft Speculative Decoding"
    (ICLR 2025): of the K drafts, K-1 are the most likely tokens of ``q`` (deterministic) and one is
    sampled, with the verification that is optimal for that draft at one step.

    The tree (``child_rule == "greedy_draft"``, ``DraftTree.from_paths``): the first K-1 paths start with
    the top tokens ``T`` of ``q`` at the root, the last path's first token is drawn from ``q'``, ``q``
    without ``T`` renormalized, and every later token from ``q``. Verification: BV along the sampled
    path with ``q'`` as its first draft law; if it accepts nothing, its residual ``r = [p - q']_+``
    (normalized) meets the top tokens as point masses (accept ``t`` with ``r(t)``, else drop ``t``
    from ``r``), and an accepted top token's path is verified by BV from there. At one step the
    acceptance is ``p(T) + sum_{x not in T} min(p(x), q'(x))``: every token of ``T`` is always drafted
    and any other only when sampled, so no lossless verifier of this draft accepts more (checked
    against the LP for this draft law in ``tests/test_verify_gds.py``). With K = 1 it is BV.

    Provenance: the draft (top K-1, then one sampled) and the one-step optimal verification are the
    paper's as recalled here, not checked against its text; the sampled draft's law ``q'``, the order
    of the checks (sampled first: trying the top tokens first never accepts more at one step) and the
    multi-step form (one path under each first token, tails verified by BV, Sun et al.) are this
    project's. The proof of losslessness does not use which tokens ``T`` holds; taking the top tokens
    is what makes it accept much.
    """
    _check("gds", tree, p)
    if tree.child_rule != "greedy_draft":
        raise InputError(f"gds verifies a greedy draft, not child rule {tree.child_rule!r}: draft with "
                         "child_rule='greedy_draft' (top K-1 tokens, then one sampled path) or use rrs/seqbv")
    paths = _chains("gds", tree)
    if not paths[0]:
        return Decision((), p[0], True)
    tokens = tree.tokens.tolist()
    *tops, last = paths
    law = _greedy_draft(tree.q[0].to(p.dtype), [tokens[path[0]] for path in tops])
    r = p[0]
    if law is None:  # no sampled child: every child is a top token
        tops = paths
    else:
        tau, r = _block_core(replace(_path(tree, p, last), q0=law), sampler)
        if tau:
            return Decision(tuple(last[:tau]), r, tau == len(last))
    for path in tops:
        x = tokens[path[0]]
        if bool(sampler.bernoulli(r[x])):
            tau, law = _block_core(_path(tree, p, path[1:], path[0]), sampler)
            return Decision(tuple(path[:1 + tau]), law, tau == len(path) - 1)
        r = _normalize(_without(r, x), r)
    return Decision((), r, False)


Verifier = Callable[[DraftTree, torch.Tensor, Sampler], VerifyResult]
LawFn = Callable[[DraftTree, torch.Tensor, Sampler], Decision]


def _emit(law: LawFn, tree: DraftTree, p: torch.Tensor, sampler: Sampler) -> VerifyResult:
    decision = law(tree, p, sampler)
    return VerifyResult(decision.path, sampler.categorical(decision.law), decision.bonus)


LAWS: Mapping[str, LawFn] = Loaded(lambda spec: spec.load("law"))  # each one's law, up to its final draw
VERIFIERS: Mapping[str, Verifier] = Loaded(  # each verifier, its final draw included
    lambda spec: spec.load("runner") if spec.runner else partial(_emit, spec.load("law")))


def verify(name: str, tree: DraftTree, p: torch.Tensor, sampler: Sampler | None = None) -> VerifyResult:
    """Run verifier ``name`` (a key of ``VERIFIERS``) on ``tree`` with target rows ``p``; the default
    sampler draws from torch's global generator."""
    if name not in VERIFIERS:
        raise InputError(f"unknown verifier {name!r}: use one of {', '.join(VERIFIERS)}")
    return VERIFIERS[name](tree, p, sampler if sampler is not None else TorchSampler())
