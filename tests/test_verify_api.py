"""The verifier API: greedy on trees, the shape of results, bad input, and the two enumeration paths."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from core.errors import InputError
from real_engine import exact
from real_engine import verify as verifiers
from real_engine.tree import DraftTree, best_subtree, expand_topk
from real_engine.verify import VERIFIERS, TorchSampler, VerifyResult, verify


def _rows(n: int, vocab: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=gen, dtype=dtype).softmax(-1)


READS = {"gds": "greedy_draft"}  # the drafts a verifier reads, where not i.i.d. paths


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


@pytest.mark.parametrize("name", ["greedy", "token", "block", "rrs", "gbv", "seqbv", "gds"])
def test_accepted_nodes_form_a_chain(name: str) -> None:
    """In every outcome the accepted nodes are a root-to-node chain, and bonus means it ends at a leaf."""
    tree, p = _paths_tree(READS.get(name, "iid"))
    parents = tree.parents.tolist()
    leaves = {path[-1] for path in tree.paths()}
    outcomes = list(exact.enumerate_outcomes(lambda s: VERIFIERS[name](tree, p, s)))
    assert sum(prob for prob, _ in outcomes) == pytest.approx(1.0, abs=1e-12)
    # SeqBV hands the residual from path (1, 2, 3) to path (4, 5, 6) after accepting token 0
    assert name != "seqbv" or {(4, 5), (7, 8, 9)} <= {r.path for _, r in outcomes}
    for _, result in outcomes:
        assert [parents[node] for node in result.path] == [0, *result.path][:-1]
        assert result.bonus == (bool(result.path) and result.path[-1] in leaves)


@pytest.mark.parametrize("name", ["token", "block", "rrs", "gbv", "seqbv", "gds"])
def test_enumerating_the_final_draw_agrees_with_the_law(name: str) -> None:
    """Enumerating the full verifier (its last categorical too) gives the law ``tree_output_law`` reads."""
    tree, p = _paths_tree(READS.get(name, "iid"))
    tokens = tree.tokens.tolist()
    full: dict[tuple[int, ...], float] = defaultdict(float)
    for prob, result in exact.enumerate_outcomes(lambda s: VERIFIERS[name](tree, p, s)):
        full[(*(tokens[n] for n in result.path), result.token)] += prob
    law = exact.tree_output_law(name, tree, p)
    assert set(full) == set(law)
    assert max(abs(full[o] - law[o]) for o in law) <= 1e-12


def test_seeded_sampler_is_reproducible() -> None:
    trees = {name: _paths_tree(READS.get(name, "iid")) for name in VERIFIERS}
    runs = [[verify(name, *trees[name], TorchSampler(torch.Generator().manual_seed(5))) for name in VERIFIERS]
            for _ in range(2)]
    assert runs[0] == runs[1]


def _pointed_tree(vocab: int, gen: torch.Generator) -> tuple[DraftTree, torch.Tensor, list[int], int]:
    """Eight 8-token i.i.d.-drafted paths, a random ``q``, and a target ``p`` that is a point mass along the
    third path and then on one more token: a lossless verifier must emit exactly that string, and each
    of them accepts the whole path (``p(x) = 1 >= q(x)`` at every node). Also the third path's nodes."""
    paths = torch.randint(vocab, (8, 8), generator=gen).tolist()
    q = torch.softmax(torch.randn(65, vocab, generator=gen) * 3, -1)
    p = torch.softmax(torch.randn(65, vocab, generator=gen) * 3, -1)
    end = int(torch.randint(vocab, (1,), generator=gen))
    nodes = [0, *range(17, 25)]  # the root and the third path's nodes
    for node, token in zip(nodes, [*paths[2], end], strict=True):
        p[node] = torch.nn.functional.one_hot(torch.tensor(token), vocab).float()
    return DraftTree.from_paths(1, paths, q), p, nodes, end


@pytest.mark.parametrize("name", ["token", "block", "rrs", "gbv", "seqbv"])
def test_vocabulary_128k_emits_the_only_string_a_point_mass_target_allows(name: str) -> None:
    """At vocabulary 128,000 every sampling verifier accepts the one path the target allows and emits the
    target's next token (a verifier accepting nothing, or emitting from the wrong row, fails)."""
    tree, p, nodes, end = _pointed_tree(128_000, torch.Generator().manual_seed(0))
    if name in ("token", "block"):  # single-path verifiers: the third path alone, as a chain
        tree, p = DraftTree.chain(1, tree.tokens[nodes[1:]], tree.q[nodes]), p[nodes]
        nodes = list(range(9))
    result = verify(name, tree, p, TorchSampler(torch.Generator().manual_seed(1)))
    assert (result.path, result.token, result.bonus) == (tuple(nodes[1:]), end, True)


def test_greedy_at_vocabulary_128k_follows_the_argmax_down_another_path() -> None:
    vocab, gen = 128_000, torch.Generator().manual_seed(0)
    tree, _, _, _ = _pointed_tree(vocab, gen)
    logits = torch.randn(65, vocab, generator=gen)
    tokens = tree.tokens.tolist()
    nodes = [0, *range(17, 22)]  # the root, then the first five nodes of the third path
    for node, child in itertools.pairwise(nodes):
        logits[node, tokens[child]] = 100.0
    result = verify("greedy", tree, logits)
    assert (result.path, result.bonus) == (tuple(nodes[1:]), False)
    assert result.token == int(logits[21].argmax()) != tokens[22]


def test_bad_input_raises_input_error() -> None:
    tree, p = _paths_tree()
    with pytest.raises(InputError, match=r"unknown verifier 'nope': use one of greedy, token, block, rrs, "
                                         r"gbv, seqbv, gds$"):
        verify("nope", tree, p)
    with pytest.raises(InputError, match=r"\[nodes, vocab\]"):
        verify("block", tree, p[:-1])
    with pytest.raises(InputError, match="same vocabulary"):
        verify("rrs", tree, torch.ones(tree.size, 5) / 5)
    with pytest.raises(InputError, match="needs the draft law"):
        verify("token", DraftTree(tree.tokens, tree.parents), p)
    with pytest.raises(InputError, match=r"i\.i\.d\. .*'topk': draft with child_rule='iid' or use "
                                         r"rrs/seqbv$"):
        verify("gbv", DraftTree(tree.tokens, tree.parents, tree.q, "topk"), p)
    merged = DraftTree(torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 1, 1]), _rows(4, 4, 0))
    uneven = DraftTree.from_paths(0, [[1, 2], [3]], _rows(4, 4, 0))
    for name in ("gbv", "seqbv"):
        for bad in (merged, uneven):
            with pytest.raises(InputError, match=f"^{name} verifies K unmerged draft paths of equal length: "
                               "build the tree with DraftTree.from_paths"):
                verify(name, bad, _rows(4, 4, 1))
    inst = Uniform()
    with pytest.raises(InputError, match="unknown verifier"):
        exact.output_distribution("nope", inst)
    with pytest.raises(InputError, match="unknown child rule"):
        exact.expected_accepted("rrs", inst, 1, "sorted")
    with pytest.raises(InputError, match=">= 1"):
        exact.lossless_error("rrs", inst, 0)
    assert exact.lossless_error("rrs", inst, 2) <= 1e-12


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_bad_input_names_the_verifier(name: str) -> None:
    tree, p = _paths_tree()
    with pytest.raises(InputError, match=rf"^{name}: p has shape \(9, 4\) for a tree of 10 nodes"):
        verify(name, tree, p[:-1])
    topk = DraftTree(tree.tokens, tree.parents, None, "topk")
    if name == "greedy":
        return
    with pytest.raises(InputError, match=f"^{name} needs the draft law"):
        verify(name, DraftTree(tree.tokens, tree.parents), p, TorchSampler())
    with pytest.raises(InputError, match=f"^{name}: q has vocabulary 4 but p has 5"):
        verify(name, tree, torch.ones(tree.size, 5) / 5, TorchSampler())
    if name not in ("gbv", "gds"):  # top-k children are point masses: no draft law needed
        assert len(verify(name, topk, p, TorchSampler()).path) <= 3


@pytest.mark.parametrize("rule", ["iid", "topk"])
@pytest.mark.parametrize("name", list(VERIFIERS))
def test_a_root_only_tree_emits_from_the_root_row(name: str, rule: str) -> None:
    """Nothing drafted: every verifier accepts nothing, calls the root a whole path (it is a leaf) and
    emits from the target's root row, with its own sampler when none is given."""
    if name in ("gbv", "gds") and rule == "topk":
        return
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    q = torch.full((1, 4), 0.25, dtype=torch.float64)
    tree = DraftTree(torch.tensor([3]), torch.tensor([-1]), q, READS.get(name, rule))
    assert verify(name, tree, p) == VerifyResult((), 2, True)
    assert exact.tree_output_law(name, tree, p) == {(2,): 1.0}
    assert exact.LAWS[name](tree, p, TorchSampler()).bonus is True


@pytest.mark.parametrize(("parents", "first"), [([-1, 0, 0, 1, 2, 4], [1, 3]), ([-1, 0, 0, 2, 1, 3], [1, 4])])
@pytest.mark.parametrize("name", ["token", "block"])
def test_single_path_verifiers_read_a_first_path_that_skips_nodes(name: str, parents: list,
                                                                  first: list) -> None:
    """On a merged tree whose first path is nodes (1, 3) or (1, 4), token and block verification give the
    law they give on that path drafted as a chain with its own rows."""
    tree = DraftTree(torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor(parents), _rows(6, 4, seed=11))
    p = _rows(6, 4, seed=12)
    assert tree.paths()[0] == first
    path = [0, *first]
    chain = DraftTree(tree.tokens[path], torch.tensor([-1, 0, 1]), tree.q[path])
    want = exact.tree_output_law(name, chain, p[path])
    got = exact.tree_output_law(name, tree, p)
    assert set(got) == set(want) and max(abs(got[o] - want[o]) for o in want) <= 1e-12


def test_the_torch_sampler_compares_and_inverts_uniforms_of_the_laws_own_precision() -> None:
    """``bernoulli`` is U < prob with U in prob's dtype; ``categorical`` inverts the float64 cumulative
    weights (unnormalized) at U times their total: the same draws as those formulas from the same seed."""
    prob = torch.rand(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = TorchSampler(torch.Generator().manual_seed(1)).bernoulli(prob)
    uniform = torch.rand(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(got, uniform < prob)
    weights = torch.arange(1, 1001, dtype=torch.float32)  # total 500,500: far from 1
    sampler, again = TorchSampler(torch.Generator().manual_seed(2)), torch.Generator().manual_seed(2)
    cdf = weights.double().cumsum(0)
    for _ in range(50):
        u = torch.rand(1, generator=again, dtype=torch.float64) * cdf[-1]
        assert sampler.categorical(weights) == int(torch.searchsorted(cdf, u, right=True))


class Fixed:
    """The same p and q after every prefix, drafts of one token."""

    vocab, length = 3, 1
    P, Q = np.array([0.4, 0.35, 0.25]), np.array([0.1, 0.2, 0.7])

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.P

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.Q


@pytest.mark.parametrize("rule", ["iid", "without_replacement"])
def test_rrs_accepts_at_the_rate_its_rule_gives(rule: str) -> None:
    """Acceptance, which losslessness cannot see: one level, two children; P(accept) worked out from RRS's
    formulas (Sequoia's q loses a rejected token) equals the real code's, enumerated."""
    p, q = Fixed.P, Fixed.Q
    residual = np.maximum(p - q, 0.0) / np.maximum(p - q, 0.0).sum()
    want = 0.0
    for x1, x2 in itertools.product(range(3), repeat=2):
        if rule == "iid":
            prob, second = q[x1] * q[x2], q
        elif x2 == x1:
            continue
        else:
            second = np.where(np.arange(3) == x1, 0.0, q) / (1 - q[x1])
            prob = q[x1] * second[x2]
        first = min(1.0, p[x1] / q[x1])
        want += prob * (first + (1 - first) * min(1.0, residual[x2] / second[x2]))
    assert exact.expected_accepted("rrs", Fixed(), 2, rule) == pytest.approx(want, abs=1e-12)


def test_expand_topk_skips_impossible_candidates_and_best_subtree_keeps_laws_and_confidences() -> None:
    """Grow root -> {5, 7} (probabilities 0.6, 0.4; a third candidate has probability 0), then 5 -> {2}
    (0.5): the budget-3 subtree keeps 5, 7 and 2 with their conditional confidences, the laws of the
    nodes that keep children, zero rows at the leaves, and top-k children unless told otherwise."""
    parents, tokens, scores = [-1], [9], [0.0]
    created = expand_topk([0], torch.tensor([[0.6, 0.4, 0.0]]), torch.tensor([[5, 7, 3]]), parents, tokens,
                          scores)
    assert created == [1, 2] and tokens == [9, 5, 7]
    assert expand_topk([1], torch.tensor([[0.5]]), torch.tensor([[2]]), parents, tokens, scores) == [3]
    assert parents == [-1, 0, 0, 1]
    assert scores == pytest.approx([0.0, math.log(0.6), math.log(0.4), math.log(0.3)])
    laws = {n: torch.full((10,), float(n + 1)) for n in range(4)}
    tree, index = best_subtree(parents, tokens, scores, laws, 3, "cpu")
    assert index == {0: 0, 1: 1, 3: 2, 2: 3}  # depth first, the likelier sibling first
    assert tree.tokens.tolist() == [9, 5, 2, 7] and tree.parents.tolist() == [-1, 0, 1, 0]
    assert tree.child_rule == "topk"
    assert tree.confidence.tolist() == pytest.approx([1.0, 0.6, 0.5, 0.4])
    assert tree.q[:, 0].tolist() == [1.0, 2.0, 0.0, 0.0]  # leaves 2 and 7 draft nothing
    assert best_subtree(parents, tokens, scores, laws, 3, "cpu", "iid")[0].child_rule == "iid"


def test_chains_and_paths_carry_their_confidences_and_list_their_leaves() -> None:
    confidence = torch.tensor([1.0, 0.9, 0.8])
    chain = DraftTree.chain(4, [5, 6], confidence=confidence)
    assert chain.confidence is confidence and chain.paths() == [[1, 2]]
    tree = DraftTree.from_paths(4, [[5], [6, 7]], confidence=torch.tensor([1.0, 0.7, 0.6, 0.5]))
    assert tree.confidence.tolist() == pytest.approx([1.0, 0.7, 0.6, 0.5])
    assert tree.paths() == [[1], [2, 3]]  # node 1 is a leaf too
    assert DraftTree(torch.tensor([4]), torch.tensor([-1])).paths() == []  # the root alone has no path
    assert tree.mask().tolist() == [[True, False, False, False], [True, True, False, False],
                                    [True, False, True, False], [True, False, True, True]]


BAD_TREES = [
    ([[1, 2]], [[-1, 0]], {}, "a draft tree needs 1-D tokens and parents of equal length >= 1"),
    ([1, 2], [-1, 0, 0], {}, "a draft tree needs 1-D tokens and parents of equal length >= 1"),
    ([], [], {}, "a draft tree needs 1-D tokens and parents of equal length >= 1"),
    ([1, 2], [-1, 0], {"child_rule": "sorted"},
     "unknown child rule 'sorted': use one of iid, without_replacement, topk, greedy_draft"),
    ([1, 2], [0, 0], {}, r"tree parents must satisfy parents\[0\] == -1 and 0 <= parents\[i\] < i"),
    ([1, 2], [-1, 1], {}, r"tree parents must satisfy parents\[0\] == -1 and 0 <= parents\[i\] < i"),
    ([1, 2], [-1, 0], {"q": torch.zeros(3, 5)}, "q has 3 rows for a tree of 2 nodes: give one row per node"),
    ([1, 2], [-1, 0], {"confidence": torch.ones(3)},
     r"confidence has shape \(3,\) for a tree of 2 nodes: give one value per node"),
    ([1, 2], [-1, 0], {"rank_buckets": torch.ones(2, 1)},
     r"rank_buckets has shape \(2, 1\) for a tree of 2 nodes: give one value per node"),
]


@pytest.mark.parametrize(("tokens", "parents", "extra", "message"), BAD_TREES)
def test_a_bad_draft_tree_says_what_is_wrong(tokens: list, parents: list, extra: dict, message: str) -> None:
    with pytest.raises(InputError, match=f"^{message}$"):
        DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), **extra)


@pytest.mark.parametrize("drafts", [2, 3])
def test_gbv_first_position_law_is_that_of_the_greatest_of_k_draws(drafts: int) -> None:
    """GBV's draft law at the first position is the law of the greatest of K i.i.d. draws from q, tokens
    ordered by p/q and then by id: (F_<(y) + q(y))^K - F_<(y)^K with F_< the q-mass ordered before y.
    Here p equals q on 60 of 64 tokens, so ratios tie and only the id order separates them."""
    gen = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(64, generator=gen, dtype=torch.float64), -1)
    p = q.clone()
    p[[0, 1, 2, 3]] = torch.tensor([0.0, 0.0, q[2] + q[0], q[3] + q[1]], dtype=torch.float64)
    keys = [(float(p[y] / q[y]), y) for y in range(64)]
    before = {y: sum(float(q[z]) for z in range(64) if keys[z] < keys[y]) for y in range(64)}
    want = torch.tensor([(before[y] + float(q[y])) ** drafts - before[y] ** drafts for y in range(64)],
                        dtype=torch.float64)
    tree = DraftTree.from_paths(7, [[5]] * drafts, torch.cat([q[None], torch.zeros(drafts, 64)]))
    rows = torch.cat([p[None], torch.full((drafts, 64), 1 / 64, dtype=torch.float64)])
    law = verifiers._selected_law(verifiers._path(tree, rows, [1]), drafts).q0
    torch.testing.assert_close(law, want, rtol=1e-12, atol=1e-15)


class Uniform:
    """p uniform over 3 tokens, q a point mass, drafts of 2 tokens."""

    vocab, length = 3, 2

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return np.full(3, 1 / 3)

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return np.array([0.0, 1.0, 0.0])
