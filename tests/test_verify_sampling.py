"""The verifiers driven by TorchSampler draw from the exact laws that enumeration computes.

Exact enumeration proves the verifier code given its sampler; this checks the real sampler: for a
fixed draft tree over 4 tokens, thousands of seeded calls (one generator), every emitted string's
frequency within 4 standard errors of its exact probability, and no string of probability zero.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from real_engine import exact
from real_engine.tree import DraftTree
from real_engine.verify import VERIFIERS, TorchSampler

VOCAB = 4
CALLS = 2000


def _tree(shape: str, rule: str, seed: int) -> tuple[DraftTree, torch.Tensor]:
    """A fixed tree with random Dirichlet p and q rows (float32, as in real decoding)."""
    gen = torch.Generator().manual_seed(seed)
    if shape == "chain":
        tree = DraftTree.chain(0, [1, 3, 2], child_rule=rule)
    elif shape == "paths":
        tree = DraftTree.from_paths(0, [[1, 2], [1, 3], [2, 0]], child_rule=rule)
    else:  # a merged tree: root -> {1, 2, 0}, 1 -> {3}, 2 -> {1, 0}
        tree = DraftTree(torch.tensor([0, 1, 2, 0, 3, 1, 0]), torch.tensor([-1, 0, 0, 0, 1, 2, 2]),
                         child_rule=rule)
    dirichlet = torch.distributions.Dirichlet(torch.ones(VOCAB))
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))
        p, q = dirichlet.sample((tree.size,)), dirichlet.sample((tree.size,))
    return DraftTree(tree.tokens, tree.parents, q, rule), p


CASES = [("greedy", "chain", "iid"), ("token", "chain", "iid"), ("block", "chain", "iid"),
         ("block", "chain", "topk"), ("rrs", "merged", "iid"), ("rrs", "merged", "without_replacement"),
         ("rrs", "merged", "topk"), ("gbv", "paths", "iid"), ("seqbv", "paths", "iid")]


@pytest.mark.parametrize(("verifier", "shape", "rule"), CASES)
def test_sampled_frequencies_match_exact_law(verifier: str, shape: str, rule: str) -> None:
    tree, p = _tree(shape, rule, seed=len(verifier) + len(shape) + len(rule))
    law = exact.tree_output_law(verifier, DraftTree(tree.tokens, tree.parents, tree.q.double(), rule),
                                p.double())
    sampler = TorchSampler(torch.Generator().manual_seed(1234))
    tokens = tree.tokens.tolist()
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(CALLS):
        result = VERIFIERS[verifier](tree, p, sampler)
        counts[(*(tokens[node] for node in result.path), result.token)] += 1
    assert set(counts) <= {out for out, prob in law.items() if prob > 0}
    for out, prob in law.items():
        se = math.sqrt(prob * (1 - prob) / CALLS)
        assert abs(counts[out] / CALLS - prob) <= 4 * se + 1e-9, (out, counts[out] / CALLS, prob)
    assert len(law) > 1 or verifier == "greedy"
