"""Exact evaluation of the real verifiers by enumerating every random choice they make.

``EnumeratingSampler`` stands in for ``TorchSampler``: it replays a script of choices and, at each new
choice point, takes the first outcome and records the others. ``enumerate_outcomes`` re-executes a
verifier call depth-first until every outcome of non-zero probability has been seen, so what is
proven is the torch code in ``real_engine.verify`` itself, not a copy of its math.

On top of it: the exact law of the emitted string ``x^j y`` of a verifier on a small autoregressive
instance, summed over every draft the drafting process can produce, its expected accepted length,
and its distance from losslessness. Drafting processes (``drafts = K`` paths of ``inst.length``
tokens hanging from the root, as ``DraftTree.from_paths`` builds them):

- ``iid``: K i.i.d. paths from ``q``;
- ``without_replacement``: the root's K children drawn from ``q`` without replacement (fewer when
  ``q`` has fewer than K tokens of non-zero probability), each continued by one path from ``q``;
- ``topk``: the root's children are the top-K tokens of ``q`` (ties to the lower id), each continued
  by one path from ``q``;
- ``greedy_draft``: the root's children are the top K-1 tokens of ``q`` (ties to the lower id), then one
  drawn from ``q`` without them (none when no mass is left), each continued by one path from ``q``
  (Hu et al.'s greedy draft, verified by ``gds``).

Single-path verifiers (``greedy``, ``token``, ``block``) verify the first of the K paths.

Branching trees, as the engine's tree drafters build them, are enumerated by shape (``shaped_law``):
a shape lists the shapes of the root's children (``()`` is a leaf), and a node's children are drawn
from ``q`` after its prefix under the child rule, then each grows its own shape; ``shaped_tree``
numbers the nodes depth first, as the engine's trees are. ``mixture_law`` sums a verifier's law over
any list of weighted trees, so a test can also trim or relabel the trees in between. Everything runs
in float64.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

import numpy as np
import torch

from core.errors import InputError
from real_engine.tree import CHILD_RULES, DraftTree
from real_engine.verify import LAWS, VERIFIERS, Sampler

Law = dict[tuple[int, ...], float]
Paths = tuple[tuple[int, ...], ...]
Shape = tuple["Shape", ...]  # the shapes of a node's children, in drafting order; () is a leaf
Drafted = tuple[tuple[int, "Drafted"], ...]  # a node's children: each token with its own children
Weighted = tuple[float, DraftTree, torch.Tensor]  # a draft tree's probability, the tree, its target rows
T = TypeVar("T")


class Instance(Protocol):
    """A small autoregressive target ``p`` and drafter ``q`` over ``vocab`` tokens, drafts of ``length``.

    ``p(prefix)`` and ``q(prefix)`` are next-token distributions after ``prefix`` (relative to the
    start); ``p`` is read for prefixes up to ``length`` tokens, ``q`` up to ``length - 1``.
    """

    vocab: int
    length: int

    def p(self, prefix: tuple[int, ...]) -> np.ndarray: ...

    def q(self, prefix: tuple[int, ...]) -> np.ndarray: ...


class EnumeratingSampler:
    """A sampler that replays ``script`` (one option index per choice point), then takes option 0 of
    each new choice point and queues the other options, with their probabilities, in ``pending``."""

    def __init__(self, script: tuple[int, ...] = (), prob: float = 1.0) -> None:
        self.script = script
        self.prob = prob  # probability of every choice made so far
        self.made: list[int] = []
        self.pending: list[tuple[tuple[int, ...], float]] = []

    def _choose(self, options: list[tuple[object, float]]) -> object:
        step = len(self.made)
        if step < len(self.script):
            index = self.script[step]
        else:
            index = 0
            self.pending += [((*self.made, alt), self.prob * weight)
                             for alt, (_, weight) in enumerate(options) if alt]
            self.prob *= options[0][1]
        self.made.append(index)
        return options[index][0]

    def bernoulli(self, prob: torch.Tensor) -> torch.Tensor:
        """Branches into every bool vector of non-zero probability."""
        probs = [min(max(x, 0.0), 1.0) for x in prob.reshape(-1).tolist()]
        sides = [[(v, w) for v, w in ((True, x), (False, 1.0 - x)) if w > 0] for x in probs]
        options = [(tuple(v for v, _ in combo), math.prod(w for _, w in combo)) for combo in
                   itertools.product(*sides)]
        return torch.tensor(self._choose(options), dtype=torch.bool, device=prob.device).reshape(prob.shape)

    def categorical(self, weights: torch.Tensor) -> int:
        """Branches into every index of non-zero weight."""
        w = weights.tolist()
        total = sum(w)
        if not total > 0:
            raise ValueError("categorical weights sum to zero: the verifier reached an impossible branch")
        return self._choose([(i, x / total) for i, x in enumerate(w) if x > 0])


def enumerate_outcomes(run: Callable[[Sampler], T]) -> Iterator[tuple[float, T]]:
    """Every outcome of ``run(sampler)`` with its probability, by depth-first re-execution."""
    stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    while stack:
        sampler = EnumeratingSampler(*stack.pop())
        result = run(sampler)
        stack += sampler.pending
        yield sampler.prob, result


def tree_output_law(verifier: str, tree: DraftTree, p: torch.Tensor) -> Law:
    """Exact law of the emitted string (accepted tokens, then the emitted token) for one draft tree.

    Enumerates the verifier's choices up to its final draw (``verify.LAWS``) and reads the law of
    that draw exactly, which saves one re-execution per possible emitted token.
    """
    decide = LAWS[verifier]
    tokens = tree.tokens.tolist()
    law: Law = defaultdict(float)
    for prob, decision in enumerate_outcomes(lambda sampler: decide(tree, p, sampler)):
        accepted = tuple(tokens[node] for node in decision.path)
        weights = decision.law.tolist()
        total = sum(weights)
        for y, weight in enumerate(weights):
            if weight > 0:
                law[(*accepted, y)] += prob * weight / total
    return dict(law)


def _continuations(inst: Instance, prefix: tuple[int, ...],
                   length: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every ``length``-token continuation of ``prefix`` drawn from ``q``, with non-zero probability."""
    if length == 0:
        return [(1.0, ())]
    q = inst.q(prefix)
    return [(float(q[y]) * prob, (y, *rest)) for y in range(inst.vocab) if q[y] > 0
            for prob, rest in _continuations(inst, (*prefix, y), length - 1)]


def _top(q: np.ndarray, count: int) -> tuple[int, ...]:
    """The ``count`` most likely tokens of ``q``, ties to the lower id."""
    return tuple(int(y) for y in np.argsort(-q, kind="stable")[:count])


def _child_draws(q: np.ndarray, count: int, child_rule: str) -> list[tuple[float, tuple[int, ...]]]:
    """Every ordered choice of ``count`` children of a node whose draft law is ``q``, under
    ``child_rule``, with its probability (fewer children without replacement when ``q`` has fewer
    tokens of non-zero probability; no sampled child in a greedy draft when its top tokens hold all of
    ``q``'s mass)."""
    if child_rule == "topk":
        return [(1.0, _top(q, count))]
    if child_rule == "greedy_draft":
        top = _top(q, count - 1)
        rest = [y for y in range(len(q)) if q[y] > 0 and y not in top]
        mass = float(sum(q[y] for y in rest))
        return [(float(q[y]) / mass, (*top, y)) for y in rest] if rest else [(1.0, top)]
    seqs = [(1.0, ())]
    for _ in range(count):
        grown = []
        for prob, seq in seqs:
            rest = [y for y in range(len(q)) if q[y] > 0 and (child_rule == "iid" or y not in seq)]
            mass = float(sum(q[y] for y in rest))
            grown += [(prob * float(q[y]) / mass, (*seq, y)) for y in rest] if rest else [(prob, seq)]
        seqs = grown
    return seqs


def draft_law(inst: Instance, drafts: int = 1, child_rule: str = "iid") -> list[tuple[float, Paths]]:
    """Every draft (a tuple of paths) the drafting process can produce, with its probability."""
    length = inst.length
    if child_rule == "iid":
        singles = _continuations(inst, (), length)
        return [(float(np.prod([w for w, _ in combo])), tuple(path for _, path in combo))
                for combo in itertools.product(singles, repeat=drafts)]
    out = []
    for prob, firsts in _child_draws(inst.q(()), drafts, child_rule):
        tails = [_continuations(inst, (x,), length - 1) for x in firsts]
        out += [(prob * float(np.prod([w for w, _ in combo])),
                 tuple((x, *tail) for x, (_, tail) in zip(firsts, combo, strict=True)))
                for combo in itertools.product(*tails)]
    return out


class _Rows:
    """float64 torch rows of ``p`` and ``q`` per prefix, computed once."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.cache: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}

    def get(self, which: str, prefix: tuple[int, ...]) -> torch.Tensor:
        key = (which, prefix)
        if key not in self.cache:
            law = getattr(self.inst, which)(prefix)
            self.cache[key] = torch.as_tensor(np.asarray(law, dtype=np.float64))
        return self.cache[key]


def draft_tree(inst: Instance, paths: Paths, child_rule: str = "iid",
               rows: _Rows | None = None) -> tuple[DraftTree, torch.Tensor]:
    """The draft tree of ``paths`` (root token 0) with its ``q`` rows, and the target rows ``p``.

    Leaves get a zero ``q`` row: no verifier reads the draft law at a node without children.
    """
    rows = rows or _Rows(inst)
    prefixes = [()] + [path[: i + 1] for path in paths for i in range(len(path))]
    leaf = torch.zeros(inst.vocab, dtype=torch.float64)
    q = torch.stack([rows.get("q", s) if len(s) < inst.length else leaf for s in prefixes])
    p = torch.stack([rows.get("p", s) for s in prefixes])
    return DraftTree.from_paths(0, [list(path) for path in paths], q, child_rule), p


def _depth(shape: Shape) -> int:
    return 1 + max(map(_depth, shape)) if shape else 0


def shaped_law(inst: Instance, shape: Shape, child_rule: str = "iid") -> list[tuple[float, Drafted]]:
    """Every draft tree of ``shape`` the drafting process can produce, with its probability: the
    children of the node after prefix ``s`` are drawn from ``q(s)`` under ``child_rule``."""
    if child_rule not in CHILD_RULES:
        raise InputError(f"unknown child rule {child_rule!r}: use one of {', '.join(CHILD_RULES)}")
    if _depth(shape) > inst.length:
        raise InputError(f"a shape of depth {_depth(shape)} drafts past the instance's length "
                         f"{inst.length}: use a shallower shape or a longer instance")

    def grow(prefix: tuple[int, ...], shape: Shape) -> list[tuple[float, Drafted]]:
        if not shape:
            return [(1.0, ())]
        out = []
        for prob, firsts in _child_draws(inst.q(prefix), len(shape), child_rule):
            subtrees = [grow((*prefix, x), sub) for x, sub in zip(firsts, shape[:len(firsts)], strict=True)]
            out += [(prob * math.prod(w for w, _ in combo),
                     tuple((x, kids) for x, (_, kids) in zip(firsts, combo, strict=True)))
                    for combo in itertools.product(*subtrees)]
        return out

    return grow((), shape)


def shaped_tree(inst: Instance, drafted: Drafted, child_rule: str = "iid",
                rows: _Rows | None = None) -> tuple[DraftTree, torch.Tensor]:
    """The draft tree of ``drafted`` (root token 0, nodes depth first, each node's children in drafting
    order) marked with ``child_rule``, with its ``q`` rows (zero at depth ``inst.length``) and the target
    rows ``p``."""
    rows = rows or _Rows(inst)
    tokens, parents, prefixes = [0], [-1], [()]

    def add(node: int, children: Drafted) -> None:
        for x, kids in children:
            tokens.append(x)
            parents.append(node)
            prefixes.append((*prefixes[node], x))
            add(len(tokens) - 1, kids)

    add(0, drafted)
    leaf = torch.zeros(inst.vocab, dtype=torch.float64)
    q = torch.stack([rows.get("q", s) if len(s) < inst.length else leaf for s in prefixes])
    p = torch.stack([rows.get("p", s) for s in prefixes])
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), q, child_rule), p


def mixture_law(verifier: str, drafts: Iterable[Weighted]) -> Law:
    """Law of the emitted string when the draft is each ``(probability, tree, p)`` of ``drafts``."""
    law: Law = defaultdict(float)
    for prob, tree, p in drafts:
        for out, prob_out in tree_output_law(verifier, tree, p).items():
            law[out] += prob * prob_out
    return dict(law)


def _check(verifier: str, inst: Instance, drafts: int, child_rule: str) -> None:
    if verifier not in VERIFIERS:
        raise InputError(f"unknown verifier {verifier!r}: use one of {', '.join(VERIFIERS)}")
    if child_rule not in CHILD_RULES:
        raise InputError(f"unknown child rule {child_rule!r}: use one of {', '.join(CHILD_RULES)}")
    if drafts < 1 or inst.length < 1 or inst.vocab < 1:
        raise InputError(f"exact evaluation needs drafts, length and vocab >= 1 (got {drafts}, "
                         f"{inst.length}, {inst.vocab}): pass positive sizes")


def output_distribution(verifier: str, inst: Instance, drafts: int = 1, child_rule: str = "iid") -> Law:
    """Law of the emitted string ``x^j y`` over every draft of ``drafts`` paths (see the module doc)."""
    _check(verifier, inst, drafts, child_rule)
    rows = _Rows(inst)
    return mixture_law(verifier, ((prob, *draft_tree(inst, paths, child_rule, rows))
                                  for prob, paths in draft_law(inst, drafts, child_rule)))


def expected_accepted(verifier: str, inst: Instance, drafts: int = 1, child_rule: str = "iid") -> float:
    """Expected number of accepted draft tokens (the emitted token not counted)."""
    return sum(prob * (len(out) - 1) for out, prob in output_distribution(verifier, inst, drafts,
                                                                          child_rule).items())


def law_error(law: Law, inst: Instance) -> float:
    """Max over ``z`` in ``V^(L+1)`` of ``|sum_k P_out(z^k) p(z_{k+1..L+1} | z^k) - p(z)|``: emit from
    ``law``, continue from the target, and compare with the target; mass on strings of other
    lengths counts as error too."""
    top = inst.length + 1
    stray = sum(prob for out, prob in law.items() if not 1 <= len(out) <= top)

    def walk(prefix: tuple[int, ...], emitted: float, target: float) -> float:
        if len(prefix) == top:
            return abs(emitted - target)
        p = [float(x) for x in inst.p(prefix)]
        return max(walk((*prefix, y), emitted * p[y] + law.get((*prefix, y), 0.0), target * p[y])
                   for y in range(inst.vocab))

    return max(stray, walk((), 0.0, 1.0))


def lossless_error(verifier: str, inst: Instance, drafts: int = 1, child_rule: str = "iid") -> float:
    """Distance of the verifier's output, continued by the target, from the target's own law."""
    return law_error(output_distribution(verifier, inst, drafts, child_rule), inst)
