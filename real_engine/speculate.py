"""Length policies in the live engine: a policy chooses how much of each draft the target verifies.

``LengthControlled`` wraps any drafter. A drafter that drafts token by token (one with a
``keep_drafting`` hook, as the draft model's chain has) asks before each further token whether the
policy would verify it were it certain, so the chain ends where the policy stops, as in the
simulator; any other drafter drafts as it is configured. Then the drafted nodes are ranked by path
confidence (the product of the drafter's confidences along the path); the observation is built by
``policies.features.length_features`` with the iteration times ``T(0..cap)`` of the same cost
profile the simulator uses, so a policy sees exactly the features it was tuned on; the policy's
``n`` keeps the ``n`` most confident nodes (an ancestor-closed subtree, since a child's path
confidence never exceeds its parent's) and the target verifies that subtree. Trimming depends only
on the draft's laws, never on the target or on a sampled token's own probability, so verification
stays lossless (enumerated exactly in the tests: token-level and block verification on trimmed
sampled chains, RRS on trimmed top-k trees; greedy on any tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from core.cost_profile import CostProfile
from core.errors import InputError
from core.serve_costs import chains_fit, drafting_table, iteration_costs
from policies import check_role
from policies.base import Policy
from policies.features import LENGTH_CAP, SERVE_SLOT_DIM, length_features, serve_features, tree_confidences
from policies.serving import keeps_drafting
from real_engine.drafters.base import Drafter, clock
from real_engine.model import Output
from real_engine.tree import DraftTree
from real_engine.warp import Sampling


def node_confidences(tree: DraftTree, greedy: bool = True) -> np.ndarray:
    """[N] float64: each node's drafter confidence given its parent (root 1.0).

    At temperature 0, or for deterministic (top-k) candidates, it is the drafter's probability of the
    node's token. For sampled children it is the largest probability of the parent's law instead: a
    trimming rule that read the sampled token's own probability would change the law of the draft it
    keeps, and the verifier, which assumes draws from ``q``, would no longer be lossless.
    """
    out = np.ones(tree.size)
    if tree.size == 1:
        return out
    sampled = not greedy and tree.child_rule != "topk"
    conf = getattr(tree, "confidence", None)
    if conf is not None and not sampled:
        return np.clip(conf.double().cpu().numpy(), 0.0, 1.0)
    if tree.q is not None:
        rows = tree.q[tree.parents[1:].to(tree.q.device)]
        picked = (
            rows.max(-1).values if sampled else rows.gather(-1, tree.tokens[1:, None].to(rows.device))[:, 0]
        )
        out[1:] = picked.double().cpu().numpy()
    return np.clip(out, 0.0, 1.0)


def ranked_nodes(tree: DraftTree, greedy: bool = True) -> tuple[list[int], np.ndarray]:
    """Non-root nodes by decreasing path confidence (ties: shallower, then earlier), and those products.

    Every node comes after its parent in this order, so any prefix of it is an ancestor-closed set.
    """
    conf = node_confidences(tree, greedy)
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    products = np.ones(tree.size)
    for i in range(1, tree.size):
        products[i] = products[parents[i]] * conf[i]
    order = sorted(range(1, tree.size), key=lambda i: (-products[i], depths[i], i))
    return order, products[order]


def subtree(tree: DraftTree, nodes: Sequence[int]) -> tuple[DraftTree, list[int]]:
    """The tree of the root and ``nodes`` (ancestor-closed), in the original order, and for each of
    its nodes the original index."""
    keep = [0, *sorted(set(nodes) - {0})]
    index = {old: new for new, old in enumerate(keep)}
    parents = tree.parents.tolist()
    if any(parents[n] not in index for n in keep[1:]):
        raise InputError("a subtree must hold every kept node's parent: keep an ancestor-closed set")
    rows = torch.tensor(keep, device=tree.tokens.device)
    new_parents = torch.tensor([-1, *(index[parents[n]] for n in keep[1:])], device=tree.tokens.device)

    def pick(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[rows.to(x.device)]

    extra = {
        name: pick(getattr(tree, name)) for name in ("confidence", "rank_buckets") if hasattr(tree, name)
    }
    return DraftTree(tree.tokens[rows], new_parents, pick(tree.q), tree.child_rule, **extra), keep


class LengthControlled:
    """A drafter whose proposals a length policy trims before verification (see the module doc).

    ``kind`` names the drafter in the cost profile (``ngram``, ``draft-model``, ``specblock``, ...).
    ``decisions`` records, per iteration, the nodes drafted and the ``n`` the policy chose.
    """

    def __init__(self, drafter: Drafter, policy: Policy, profile: CostProfile, kind: str) -> None:
        check_role(policy, "length", "the length-controlled drafter")
        # T(0..cap) over the context grid, built once (fails early, with the fix, if the profile lacks
        # the drafter); each iteration reads its context's row.
        self.steps_table = profile.step_table(kind, LENGTH_CAP)
        self.drafter, self.policy, self.profile, self.kind = drafter, policy, profile, kind
        self.decisions: list[tuple[int, int]] = []
        if hasattr(drafter, "keep_drafting"):
            drafter.keep_drafting = self.keep_drafting

    @property
    def model_seconds(self) -> float:
        """The wrapped drafter's model time."""
        return self.drafter.model_seconds

    def begin(
        self,
        prompt: torch.Tensor,
        target: Output,
        sampling: Sampling,
        generator: torch.Generator,
        max_length: int,
    ) -> None:
        """Start the wrapped drafter and a fresh episode of the policy (one query, as in the simulator);
        the context is every prompt token but the root."""
        self.drafter.begin(prompt, target, sampling, generator, max_length)
        self.policy.reset()
        self.greedy = sampling.greedy
        self.context = prompt.numel() - 1
        self.device = prompt.device

    def keep_drafting(self, confidences: Sequence[float]) -> bool:
        """Whether the policy would verify more than the chain drafted so far, were the next token certain."""
        if len(confidences) >= LENGTH_CAP:
            return False
        obs = length_features(np.array([*confidences, 1.0]), self.context, self.steps)
        return int(self.policy.act(obs)) > len(confidences)

    def propose(self, max_depth: int) -> DraftTree:
        """Draft, let the policy choose n from the length features, keep the n most confident nodes."""
        self.start = clock(self.device)
        self.steps = self.steps_table(np.float64(self.context))
        if not self.keep_drafting([]):  # nothing would be verified even were the first token certain:
            max_depth = 0  # skip drafting (a plain decoding step)
        tree = self.drafter.propose(max_depth)
        if tree.size == 1:  # nothing drafted: nothing to rank, choose or trim (n = 0)
            self.obs = length_features(np.zeros(0), self.context, self.steps)
            self.n, self.original = 0, [0]
            self.decisions.append((0, 0))
            return tree
        order, products = ranked_nodes(tree, self.greedy)
        self.obs = length_features(tree_confidences(products[:LENGTH_CAP]), self.context, self.steps)
        self.n = min(int(self.policy.act(self.obs)), len(order), LENGTH_CAP)
        self.decisions.append((len(order), self.n))
        pruned, self.original = subtree(tree, order[: self.n])
        return pruned

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Pass the accepted nodes (in the drafter's numbering) on; show the policy the outcome."""
        self.drafter.accept([self.original[i] for i in path], token, target)
        seconds = clock(self.device) - self.start
        self.policy.observe(
            self.obs, self.n, -seconds, {"accepted": len(path), "drafted": self.n, "seconds": seconds}
        )
        self.context += len(path) + 1


PRICED = 64  # contexts ``ServeSteering`` prices at once, from the first it meets: decoding moves on by few


class ServeSteering:
    """A serving policy steering ``real_engine.batch.BatchEngine`` (its ``steer``), as ``SpecServe-v0``
    and ``simulator.rollout.run_serve`` run it. At each iteration ``plan`` builds the serving observation
    of the running requests before they draft (``policies.features.serve_features`` with the cost fields
    of ``profile``: ``core.serve_costs``, drafter ``kind``'s chain drafting); each request's chain then
    drafts while ``keep`` says so (``policies.serving.keeps_drafting``); finally the policy, shown every
    draft, gives each request its length (``__call__``). ``decisions`` records (running requests,
    lengths chosen); ``asked`` counts the questions put to the policy."""

    def __init__(self, policy: Policy, profile: CostProfile, kind: str, max_batch: int) -> None:
        self.policy = check_role(policy, "serving", "the batched engine's steering")
        self.profile, self.max_batch = profile, max_batch
        self.chains = chains_fit(drafting_table(profile, kind, max_batch, LENGTH_CAP))
        self.decisions: list[tuple[int, list[int]]] = []
        self.asked = 0
        self.obs = np.zeros(0)
        self.costs: dict[tuple[int, int], tuple[float, ...]] = {}

    def plan(self, slots: Sequence[Any], waiting: int) -> None:
        """The observation of ``slots`` (``batch.Slot``, in batch order) with ``waiting`` requests queued."""
        rows = np.zeros((self.max_batch, SERVE_SLOT_DIM))
        for i, slot in enumerate(slots):
            rows[i, :3] = (1.0, slot.context, slot.remaining)
            if slot.paths:  # before drafting there is none
                conf = tree_confidences(np.asarray(slot.paths[:LENGTH_CAP], dtype=np.float64))
                rows[i, 3:3 + conf.size] = conf
        key = (len(slots), round(float(np.mean([slot.context for slot in slots]))))
        if key not in self.costs:  # priced whole tokens (as ``iteration_costs`` rounds), PRICED at a time
            running, context = np.meshgrid(np.arange(1, self.max_batch + 1), key[1] + np.arange(PRICED))
            costs = iteration_costs(self.profile, self.chains, running.ravel(), context.ravel())
            for i, (r, c) in enumerate(zip(running.ravel(), context.ravel(), strict=True)):
                self.costs[int(r), int(c)] = costs.at(i)
        self.obs = serve_features(len(slots), waiting, self.costs[key], rows)

    def keep(self, index: int, confidences: Sequence[float]) -> bool:
        """Whether request ``index`` of the planned batch drafts one more position after ``confidences``."""
        self.asked += 1
        return keeps_drafting(self.policy, self.obs, index, confidences)

    def __call__(self, slots: Sequence[Any], waiting: int) -> list[int]:
        """The length of each of ``slots`` (``batch.Slot``, their drafts' path confidences) with ``waiting``
        requests queued."""
        self.plan(slots, waiting)
        self.asked += 1
        lengths = [int(n) for n in np.asarray(self.policy.act(self.obs))[:len(slots)]]
        self.decisions.append((len(slots), lengths))
        return lengths
