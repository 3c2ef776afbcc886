"""The verifier API: greedy on trees, the shape of results, bad input, and the two enumeration paths."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from policies.errors import InputError
from real_engine import exact
from real_engine.tree import DraftTree
from real_engine.verify import VERIFIERS, TorchSampler, verify


def _rows(n: int, vocab: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=gen, dtype=dtype).softmax(-1)


def _paths_tree(rule: str = "iid") -> tuple[DraftTree, torch.Tensor]:
    """Three paths over 4 tokens sharing prefixes, so SeqBV hands residuals along them."""
    paths = [[0, 1, 2], [0, 1, 3], [0, 2, 1]]
    tree = DraftTree.from_paths(3, paths, _rows(10, 4, seed=7), rule)
    return tree, _rows(10, 4, seed=8)


def test_greedy_follows_the_argmax_path() -> None:
    # root -> {5, 7}; 7 -> {2, 4}; 4 -> {1}
    tree = DraftTree(torch.tensor([9, 5, 7, 2, 4, 1]), torch.tensor([-1, 0, 0, 2, 2, 4]))
    logits = torch.zeros(6, 8)
    for node, best in {0: 7, 2: 4, 4: 6}.items():
        logits[node, best] = 3.0
    assert verify("greedy", tree, logits) == verify("greedy", tree, logits, TorchSampler())
    result = verify("greedy", tree, logits)
    assert (result.path, result.token, result.bonus) == ((2, 4), 6, False)
    logits[4] = 0.0
    logits[4, 1] = 3.0  # now the leaf 1 matches: whole path accepted, bonus from the leaf's row
    logits[5, [2, 3]] = 1.0  # a tie: the lowest token id wins
    result = verify("greedy", tree, logits)
    assert (result.path, result.token, result.bonus) == ((2, 4, 5), 2, True)


@pytest.mark.parametrize("name", ["greedy", "token", "block", "rrs", "gbv", "seqbv"])
def test_accepted_nodes_form_a_chain(name: str) -> None:
    """In every outcome the accepted nodes are a root-to-node chain, and bonus means it ends at a leaf."""
    tree, p = _paths_tree()
    parents = tree.parents.tolist()
    leaves = {path[-1] for path in tree.paths()}
    outcomes = list(exact.enumerate_outcomes(lambda s: VERIFIERS[name](tree, p, s)))
    assert sum(prob for prob, _ in outcomes) == pytest.approx(1.0, abs=1e-12)
    # SeqBV hands the residual from path (1, 2, 3) to path (4, 5, 6) after accepting token 0
    assert name != "seqbv" or {(4, 5), (7, 8, 9)} <= {r.path for _, r in outcomes}
    for _, result in outcomes:
        assert [parents[node] for node in result.path] == [0, *result.path][:-1]
        assert result.bonus == (bool(result.path) and result.path[-1] in leaves)


@pytest.mark.parametrize("name", ["token", "block", "rrs", "gbv", "seqbv"])
def test_enumerating_the_final_draw_agrees_with_the_law(name: str) -> None:
    """Enumerating the full verifier (its last categorical too) gives the law ``tree_output_law`` reads."""
    tree, p = _paths_tree()
    tokens = tree.tokens.tolist()
    full: dict[tuple[int, ...], float] = defaultdict(float)
    for prob, result in exact.enumerate_outcomes(lambda s: VERIFIERS[name](tree, p, s)):
        full[(*(tokens[n] for n in result.path), result.token)] += prob
    law = exact.tree_output_law(name, tree, p)
    assert set(full) == set(law)
    assert max(abs(full[o] - law[o]) for o in law) <= 1e-12


def test_seeded_sampler_is_reproducible() -> None:
    tree, p = _paths_tree()
    runs = [[verify(name, tree, p, TorchSampler(torch.Generator().manual_seed(5))) for name in VERIFIERS]
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_vocabulary_128k() -> None:
    """Every verifier runs on a 64-node tree at vocabulary 128,000 and returns a valid chain."""
    vocab, gen = 128_000, torch.Generator().manual_seed(0)
    paths = torch.randint(vocab, (8, 8), generator=gen).tolist()
    p = torch.softmax(torch.randn(65, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(65, vocab, generator=gen) * 3, -1)
    tree = DraftTree.from_paths(1, paths, q)
    chain = DraftTree.chain(1, paths[0], q[:9])
    sampler = TorchSampler(gen)
    for name in VERIFIERS:
        result = verify(name, chain if name in ("token", "block") else tree, p[:9] if name in (
            "token", "block") else p, sampler)
        assert 0 <= result.token < vocab
        assert len(result.path) <= 8


def test_bad_input_raises_input_error() -> None:
    tree, p = _paths_tree()
    with pytest.raises(InputError, match="unknown verifier"):
        verify("nope", tree, p)
    with pytest.raises(InputError, match=r"\[nodes, vocab\]"):
        verify("block", tree, p[:-1])
    with pytest.raises(InputError, match="same vocabulary"):
        verify("rrs", tree, torch.ones(tree.size, 5) / 5)
    with pytest.raises(InputError, match="needs the draft law"):
        verify("token", DraftTree(tree.tokens, tree.parents), p)
    with pytest.raises(InputError, match=r"i\.i\.d\."):
        verify("gbv", DraftTree(tree.tokens, tree.parents, tree.q, "topk"), p)
    merged = DraftTree(torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 1, 1]), _rows(4, 4, 0))
    uneven = DraftTree.from_paths(0, [[1, 2], [3]], _rows(4, 4, 0))
    for name in ("gbv", "seqbv"):
        for bad in (merged, uneven):
            with pytest.raises(InputError, match="from_paths"):
                verify(name, bad, _rows(4, 4, 1))
    inst = Uniform()
    with pytest.raises(InputError, match="unknown verifier"):
        exact.output_distribution("nope", inst)
    with pytest.raises(InputError, match="unknown child rule"):
        exact.expected_accepted("rrs", inst, 1, "sorted")
    with pytest.raises(InputError, match=">= 1"):
        exact.lossless_error("rrs", inst, 0)
    assert exact.lossless_error("rrs", inst, 2) <= 1e-12


class Uniform:
    """p uniform over 3 tokens, q a point mass, drafts of 2 tokens."""

    vocab, length = 3, 2

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return np.full(3, 1 / 3)

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return np.array([0.0, 1.0, 0.0])
