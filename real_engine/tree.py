"""A draft tree: the unit a drafter proposes and a verifier checks in one target forward.

Node 0 is the root: the last committed token, whose key/value is not yet in the cache. Every other
node is a drafted token whose parent has a smaller index (topological order). ``q[i]`` is the
drafter's distribution at node ``i``, the law its children were drafted from; ``child_rule`` says
how: ``"iid"`` (independent draws, duplicates allowed), ``"without_replacement"`` (Sequoia),
``"topk"`` (deterministic top-k candidates, as EAGLE and Medusa trees are), or ``"greedy_draft"`` (the
greedy draft of Hu et al., ICLR 2025: a node's children but the last are the top tokens of ``q``, the
last is drawn from ``q`` without them; a node with one child draws it from ``q``).

Two optional per-node annotations feed traces and length policies: ``confidence[i]``, the drafter's
probability of node ``i``'s token under its parent's law (its plain softmax at temperature 0, where
``q`` is a point mass; the warped ``q`` otherwise; 1 at the root), and ``rank_buckets[i]``, the
SpecBlock rank head's bucket for the slot that drafted node ``i`` (-1 at the root).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from core.errors import InputError

CHILD_RULES = ("iid", "without_replacement", "topk", "greedy_draft")


@dataclass(frozen=True)
class DraftTree:
    """Tokens and parents of a draft tree (root at index 0), with the draft law at each node."""

    tokens: torch.Tensor  # [N] long
    parents: torch.Tensor  # [N] long, parents[0] == -1, parents[i] < i
    q: torch.Tensor | None = None  # [N, V] draft distribution at each node; None for greedy-only use
    child_rule: str = "iid"
    depths: torch.Tensor = field(init=False)  # [N] long, root depth 0
    confidence: torch.Tensor | None = None  # [N] float, node's probability under its parent's law
    rank_buckets: torch.Tensor | None = None  # [N] long, SpecBlock rank bucket per node, -1 where none

    def __post_init__(self) -> None:
        n = self.tokens.numel()
        if self.tokens.dim() != 1 or self.parents.shape != self.tokens.shape or n < 1:
            raise InputError("a draft tree needs 1-D tokens and parents of equal length >= 1")
        if self.child_rule not in CHILD_RULES:
            raise InputError(f"unknown child rule {self.child_rule!r}: use one of {', '.join(CHILD_RULES)}")
        parents = self.parents.tolist()
        if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise InputError("tree parents must satisfy parents[0] == -1 and 0 <= parents[i] < i")
        if self.q is not None and self.q.shape[0] != n:
            raise InputError(f"q has {self.q.shape[0]} rows for a tree of {n} nodes: give one row per node")
        for name in ("confidence", "rank_buckets"):
            value = getattr(self, name)
            if value is not None and value.shape != (n,):
                raise InputError(f"{name} has shape {tuple(value.shape)} for a tree of {n} nodes: "
                                 "give one value per node")
        depths = [0] * n
        for i in range(1, n):
            depths[i] = depths[parents[i]] + 1
        object.__setattr__(self, "depths", torch.tensor(depths, dtype=torch.long, device=self.tokens.device))

    @property
    def size(self) -> int:
        """Number of nodes, root included."""
        return self.tokens.numel()

    def children(self, node: int) -> list[int]:
        """Children of ``node`` in drafting order."""
        return [i for i, p in enumerate(self.parents.tolist()) if p == node]

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node paths (root excluded), one per leaf, in leaf order."""
        parents = self.parents.tolist()
        is_parent = set(parents)
        out = []
        for leaf in range(1, self.size):
            if leaf in is_parent:
                continue
            path = [leaf]
            while parents[path[-1]] > 0:
                path.append(parents[path[-1]])
            out.append(path[::-1])
        return out

    def mask(self) -> torch.Tensor:
        """[N, N] bool: entry (i, j) is True iff node j is node i or one of its ancestors."""
        n = self.size
        mask = torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        parents = self.parents.tolist()
        for i in range(1, n):
            mask[i] |= mask[parents[i]]
        return mask

    def positions(self, context_length: int) -> torch.Tensor:
        """Position ids: each node's depth plus the context length (the root's position)."""
        return self.depths + context_length

    @classmethod
    def chain(cls, root: int, tokens: list[int] | torch.Tensor, q: torch.Tensor | None = None,
              child_rule: str = "iid", confidence: torch.Tensor | None = None) -> DraftTree:
        """A single path ``root -> tokens[0] -> tokens[1] ...``."""
        toks = torch.as_tensor([root, *torch.as_tensor(tokens).tolist()], dtype=torch.long)
        parents = torch.arange(-1, toks.numel() - 1, dtype=torch.long)
        return cls(toks, parents, q, child_rule, confidence)

    @classmethod
    def from_paths(cls, root: int, paths: list[list[int]], q: torch.Tensor | None = None,
                   child_rule: str = "iid", confidence: torch.Tensor | None = None) -> DraftTree:
        """K independent paths hanging from one root, unmerged (so their multiplicity is kept).

        ``q`` and ``confidence``, if given, have one row per node in node order: root, then path 0's
        nodes, then path 1's, and so on.
        """
        tokens, parents = [root], [-1]
        for path in paths:
            prev = 0
            for tok in path:
                tokens.append(int(tok))
                parents.append(prev)
                prev = len(tokens) - 1
        return cls(torch.tensor(tokens), torch.tensor(parents), q, child_rule, confidence)


def best_order(parents: list[int], scores: list[float],
               budget: int) -> tuple[list[int], dict[int, list[int]]]:
    """The root and the ``budget`` best-scored nodes of a grown tree (ancestor-closed when a child never
    outscores its parent; ties go to the lower index), in depth-first order with siblings in creation
    order (most likely first, as trees grow), and each kept node's kept children."""
    best = sorted(range(1, len(parents)), key=lambda n: (-scores[n], n))[:budget]
    children: dict[int, list[int]] = {n: [] for n in (0, *best)}
    for n in sorted(best):
        children[parents[n]].append(n)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children[node]))
    return order, children


def best_subtree(parents: list[int], tokens: list[int], scores: list[float], laws: dict[int, torch.Tensor],
                 budget: int, device: torch.device | str, child_rule: str = "topk"
                 ) -> tuple[DraftTree, dict[int, int]]:
    """The ``budget`` most likely nodes of a tree grown by ``expand_topk`` (an ancestor-closed set: a
    child's score never exceeds its parent's) as a ``DraftTree`` (top-k candidates, or ``iid`` for a
    chain sampled from the laws), renumbered depth first with the
    most likely sibling first (so ``paths()[0]`` is the most likely path); each node's law from
    ``laws`` where it keeps children (zero elsewhere) and its confidence ``exp(score - parent score)``.
    Also returns the old -> new index of the kept nodes."""
    order, children = best_order(parents, scores, budget)
    index = {old: new for new, old in enumerate(order)}
    zero = torch.zeros_like(laws[0])
    confidence = [1.0, *(math.exp(scores[n] - scores[parents[n]]) for n in order[1:])]
    tree = DraftTree(torch.tensor([tokens[n] for n in order], device=device),
                     torch.tensor([index.get(parents[n], -1) for n in order], device=device),
                     torch.stack([laws[n] if n in laws and children[n] else zero for n in order]), child_rule,
                     torch.tensor(confidence, device=device))
    return tree, index


def expand_topk(frontier: list[int], probs: torch.Tensor, ids: torch.Tensor, parents: list[int],
                tokens: list[int], scores: list[float]) -> list[int]:
    """Append each frontier node's top-k children (``probs``/``ids`` rows, one per frontier node) to a
    growing tree, with cumulative log-probability scores; zero-probability candidates are skipped.

    Returns the new nodes' indices. The EAGLE-2 style trees of the draft model and of the EAGLE
    drafter both grow this way.
    """
    created = []
    for parent, ps, ts in zip(frontier, probs.log().tolist(), ids.tolist(), strict=True):
        for logp, tok in zip(ps, ts, strict=True):
            if logp > float("-inf"):
                created.append(len(tokens))
                parents.append(parent)
                tokens.append(tok)
                scores.append(scores[parent] + logp)
    return created
