"""SpecBlock's rank head and the tree it shapes: where the target's token ranks in the draft law, how
many children to draft there, and which nodes the next block starts from (:class:`BucketTree`).

The target's token at a draft position ranks ``r`` in the draft distribution (1 = the draft's argmax;
ties count in the token's favour). Ranks fall into four buckets by ``EDGES = (1, 4, 10)``:

    bucket 0: r == 1        -> 1 child   (continue the chain)
    bucket 1: 2 <= r <= 4   -> 4 children (branch)
    bucket 2: 5 <= r <= 10  -> 10 children (branch wide)
    bucket 3: r > 10        -> 0 children (give up: stop this branch)

The :class:`RankHead` predicts the bucket from the drafter's detached hidden state and a 15-number
summary of the draft distribution (:func:`summary`); both inputs are detached, so the rank loss never
changes token prediction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from real_engine.packed import Linear
from real_engine.tree import DraftTree, best_order

EDGES = (1, 4, 10)  # last rank of buckets 0, 1, 2; bucket 3 is everything above
CHILDREN = (1, 4, 10, 0)  # children drafted per predicted bucket
BUCKETS = len(EDGES) + 1
TOP = 10  # log-probabilities in the summary
SUMMARY_DIM = TOP + 3 + 2


def summary(logits: torch.Tensor) -> torch.Tensor:
    """The 15-number summary ``psi`` of each draft law (``logits`` [..., V], V >= 10) -> [..., 15].

    Columns: the top-10 log-probabilities in decreasing order (0-9); three gaps at the bucket edges,
    ``lp1 - lp2``, ``lp4 - lp5`` and ``lp1 - lp10`` (10-12); the top-1 probability ``exp(lp1)``, the
    cumulative mass of the top-1 set (13); the entropy in nats (14).
    """
    logp = logits.float().log_softmax(-1)
    top = logp.topk(TOP, dim=-1).values
    gaps = torch.stack((top[..., 0] - top[..., 1], top[..., 3] - top[..., 4], top[..., 0] - top[..., 9]), -1)
    entropy = -(logp.exp() * logp).nan_to_num().sum(-1, keepdim=True)
    return torch.cat((top, gaps, top[..., :1].exp(), entropy), dim=-1)


def rank_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """1-based rank of ``tokens`` ([...] long) in ``logits`` ([..., V]): one plus the count of strictly
    more likely tokens."""
    chosen = logits.gather(-1, tokens.unsqueeze(-1))
    return (logits > chosen).sum(-1) + 1


def bucket_of(ranks: torch.Tensor, edges: tuple[int, ...] = EDGES) -> torch.Tensor:
    """Bucket index of each rank: the number of edges the rank exceeds (0 .. len(edges))."""
    return torch.bucketize(ranks, torch.tensor(edges, device=ranks.device), right=False)


def rank_belief(rank: int, probs: list[float], edges: tuple[int, ...] = EDGES) -> float:
    """``P(the target's token ranks rank)`` from a slot's bucket probabilities ``probs``: its bucket's
    probability over the bucket's ranks (1, 3 and 6 for the default edges; 0 past the last edge)."""
    bucket = next((b for b, edge in enumerate(edges) if rank <= edge), len(edges))
    if bucket == len(edges):
        return 0.0
    return probs[bucket] / (edges[bucket] - (edges[bucket - 1] if bucket else 0))


class RankHead(nn.Module):
    """A two-layer MLP from (detached hidden, detached 15-number summary) to bucket logits."""

    def __init__(self, hidden_size: int, width: int = 128, buckets: int = BUCKETS) -> None:
        super().__init__()
        self.up = Linear(hidden_size + SUMMARY_DIM, width)
        self.down = Linear(width, buckets)

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Bucket logits [..., buckets]; gradients stop at ``hidden`` and ``logits``."""
        x = torch.cat((hidden.detach().float(), summary(logits.detach())), dim=-1)
        return self.down(F.silu(self.up(x.to(self.up.weight.dtype))))


class BucketTree:
    """A draft tree grown block by block from rank-head buckets (host-side bookkeeping).

    A block started at node ``u`` walks its slots in order: slot ``k`` drafts the top
    ``children[bucket_k]`` tokens of its law as children of the current chain node, and the most
    likely child becomes the chain node for slot ``k + 1``; the other children are side branches.
    A bucket with 0 children marks the chain node *stopped* and ends the block. Node scores are path
    log-probabilities under the draft (temperature 1). The rank head chooses the next block's starts
    (the paper's rule): each node carries the rank head's belief that its path is the target's, the
    product over the path of ``P(the target's token has the child's rank)``, its slot's bucket
    probability shared evenly over the ranks of that bucket (:func:`rank_belief`); the starts are the
    leaves of the block just drafted (chain ends and side branches) with the highest belief that are
    neither stopped nor at the depth cap. :meth:`build` keeps the ``budget`` best nodes by score.
    """

    def __init__(self, root: int, max_depth: int, children: tuple[int, ...] = CHILDREN,
                 edges: tuple[int, ...] = EDGES) -> None:
        self.max_depth, self.children, self.edges = max_depth, children, edges
        self.tokens, self.parents, self.scores, self.depths = [root], [-1], [0.0], [0]
        self.origin = [-1]  # the slot whose law drafted each node (-1: the root)
        self.buckets = [-1]  # the bucket that slot predicted (-1: the root)
        self.beliefs = [1.0]  # the rank head's belief that the path to each node is the target's
        self.expanded_by: dict[int, int] = {}  # node -> the slot whose law drafted its children
        self.stopped: set[int] = set()

    def extend(self, node: int, slots: list[int], buckets: list[int], top_logp: list[list[float]],
               top_ids: list[list[int]], probs: list[list[float]] | None = None) -> list[int]:
        """Run one block's slots from ``node``; ``top_logp``/``top_ids`` hold each slot's best tokens in
        decreasing order (at least ``max(children)``), ``probs`` each slot's bucket probabilities (default:
        certain of its bucket). Returns the nodes created."""
        created = []
        probs = probs or [[float(b == i) for i in range(len(self.children))] for b in buckets]
        for slot, bucket, logps, ids, p in zip(slots, buckets, top_logp, top_ids, probs, strict=True):
            count = self.children[bucket]
            if self.depths[node] >= self.max_depth:
                break
            if count == 0:
                self.stopped.add(node)
                break
            self.expanded_by[node] = slot
            first = len(self.tokens)
            for rank, (logp, tok) in enumerate(zip(logps[:count], ids[:count], strict=True), start=1):
                created.append(len(self.tokens))
                self.beliefs.append(self.beliefs[node] * rank_belief(rank, p, self.edges))
                self.tokens.append(tok)
                self.parents.append(node)
                self.scores.append(self.scores[node] + logp)
                self.depths.append(self.depths[node] + 1)
                self.origin.append(slot)
                self.buckets.append(bucket)
            node = first
        return created

    def starts(self, created: list[int], count: int) -> list[int]:
        """Up to ``count`` start nodes for the next block: the leaves among ``created`` that are not
        stopped and not at the depth cap, by the rank head's belief (ties: score, then index)."""
        expanded = set(self.expanded_by)
        leaves = [n for n in created if n not in expanded and n not in self.stopped
                  and self.depths[n] < self.max_depth]
        return sorted(leaves, key=lambda n: (-self.beliefs[n], -self.scores[n], n))[:count]

    def path(self, node: int) -> list[int]:
        """The nodes from depth 1 down to ``node``."""
        out = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def build(self, budget: int, laws: torch.Tensor, child_rule: str = "topk",
              confidence_laws: torch.Tensor | None = None) -> DraftTree:
        """The ``budget`` best nodes (ancestor-closed: a child never outscores its parent, and ties go
        to the lower index) renumbered depth first with the most likely child first, so ``paths()[0]``
        is the greedy chain. ``laws`` ([slots, V]) are the slots' warped laws; a node's ``q`` row is
        the law of the slot that expanded it, zero when none of its children is kept. A node's
        confidence is its token's probability under its slot's row of ``confidence_laws`` (default
        ``laws``; the plain softmax at temperature 0), its rank bucket that slot's bucket."""
        order, kids = best_order(self.parents, self.scores, budget)
        index = {old: new for new, old in enumerate(order)}
        none = laws.shape[0]
        rows = [self.expanded_by[n] if kids[n] else none for n in order]
        q = torch.cat((laws, laws.new_zeros(1, laws.shape[1])))[torch.tensor(rows, device=laws.device)]
        device = laws.device
        tokens = torch.tensor([self.tokens[n] for n in order], device=device)
        own = laws if confidence_laws is None else confidence_laws
        slots = torch.tensor([self.origin[n] for n in order[1:]], dtype=torch.long, device=device)
        confidence = torch.cat((torch.ones(1, device=device), own[slots, tokens[1:]].float()))
        parents = torch.tensor([index.get(self.parents[n], -1) for n in order], device=device)
        buckets = torch.tensor([self.buckets[n] for n in order], device=device)
        return DraftTree(tokens, parents, q, child_rule, confidence, buckets)
