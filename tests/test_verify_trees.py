"""RRS and token-level verification (and BV on the first path) proven lossless by exact enumeration on the
branching trees the engine builds: deterministic top-k children, sampled children (i.i.d. and without
replacement), uneven depths, and trees trimmed to a budget by the engine's own ``best_subtree`` and by
``LengthControlled``'s ranking. A wrong child rule and a wrong residual update are each shown caught.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_verify_lossless import TableInstance

from core.errors import InputError
from real_engine import exact, verify
from real_engine.speculate import ranked_nodes, subtree
from real_engine.tree import best_subtree, expand_topk

TOL = 1e-9
RULES = ("iid", "without_replacement", "topk")
SHAPES = {
    "binary": (((), ()), ((), ())),  # two children of the root, two grandchildren under each
    "uneven": ((((),), ()), (), ((),)),  # leaves at depths 3, 2, 1 and 2
    "wide": (((),), (), ((),), ()),  # four children of the root, two with one child each
}
VOCABS = (2, 3, 4)


def shaped_error(verifier: str, inst: TableInstance, shape: exact.Shape, drafted: str,
                 label: str | None = None) -> float:
    """Distance from the target of ``verifier`` on every tree of ``shape`` drafted under the rule
    ``drafted``, each marked with ``label`` (default: the rule it was drafted with)."""
    rows = exact._Rows(inst)
    law = exact.mixture_law(verifier, ((prob, *exact.shaped_tree(inst, drafted_tree, label or drafted, rows))
                                       for prob, drafted_tree in exact.shaped_law(inst, shape, drafted)))
    return exact.law_error(law, inst)


def instances() -> list[TableInstance]:
    """Length-3 instances for every vocabulary, with zeros (both kinds) and without (V <= 3: at V = 4 the
    zero-free trees are many)."""
    return [TableInstance(vocab, 3, seed=10 * vocab + zeros, zeros=bool(zeros))
            for vocab in VOCABS for zeros in (1, 0) if zeros or vocab <= 3]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("verifier", ["rrs", "token", "block"])
def test_branching_trees_are_lossless(verifier: str, rule: str) -> None:
    """Every shape, V in {2, 3, 4}: with i.i.d. children RRS also meets repeated siblings, whose subtrees
    it merges (the trie rule)."""
    for inst in instances():
        for name, shape in SHAPES.items():
            error = shaped_error(verifier, inst, shape, rule)
            assert error <= TOL, (name, inst.vocab, error)


def test_iid_branching_trees_repeat_siblings() -> None:
    """The i.i.d. trees above do hold repeated siblings with children, so RRS's merge of live nodes runs."""
    inst = instances()[2]  # V = 3 with zeros
    repeated = 0
    for _, drafted in exact.shaped_law(inst, SHAPES["binary"], "iid"):
        (a, kids_a), (b, kids_b) = drafted
        repeated += a == b and bool(kids_a) and bool(kids_b)
    assert repeated > 0


def grown_topk_tree(inst: TableInstance, width: int, budget: int) -> tuple[exact.Weighted, list[int]]:
    """A top-``width`` tree grown to the instance's length from ``q`` with the engine's ``expand_topk``, cut
    to its ``budget`` most likely nodes by ``best_subtree``; also each kept node's depth."""
    parents, tokens, scores, prefixes = [-1], [0], [0.0], [()]
    laws, frontier = {}, [0]
    for _ in range(inst.length):
        rows = [torch.as_tensor(inst.q(prefixes[node])) for node in frontier]
        laws.update(zip(frontier, rows, strict=True))
        probs, ids = torch.stack(rows).topk(width, dim=-1)
        frontier = expand_topk(frontier, probs, ids, parents, tokens, scores)
        prefixes += [(*prefixes[parents[node]], tokens[node]) for node in frontier]
    tree, index = best_subtree(parents, tokens, scores, laws, budget, "cpu")
    order = sorted(index, key=index.get)
    p = torch.stack([torch.as_tensor(inst.p(prefixes[node])) for node in order])
    return (1.0, tree, p), [len(prefixes[node]) for node in order]


@pytest.mark.parametrize("verifier", ["rrs", "token", "block"])
def test_budget_trimmed_topk_trees_are_lossless(verifier: str) -> None:
    """Top-2 and top-3 trees of depth 3 trimmed to 2..9 nodes, as the draft model's and EAGLE's trees are:
    uneven depths and partly expanded nodes included."""
    depths = set()
    for inst in instances():
        for width in (2, 3):
            for budget in range(2, 10):
                draft, node_depths = grown_topk_tree(inst, min(width, inst.vocab), budget)
                depths.add(tuple(sorted(set(node_depths[1:]))))
                error = exact.law_error(exact.mixture_law(verifier, [draft]), inst)
                assert error <= TOL, (inst.vocab, width, budget, error)
    assert (1, 2, 3) in depths and (1, 2) in depths


def trimmed(drafts: list[exact.Weighted], budget: int) -> list[exact.Weighted]:
    """Each tree cut to its ``budget`` most confident nodes as ``LengthControlled`` cuts sampled drafts."""
    out = []
    for prob, tree, p in drafts:
        order, _ = ranked_nodes(tree, greedy=False)
        pruned, keep = subtree(tree, order[:budget])
        out.append((prob, pruned, p[keep]))
    return out


@pytest.mark.parametrize("rule", ["iid", "without_replacement"])
@pytest.mark.parametrize("verifier", ["rrs", "token", "block"])
def test_budget_trimmed_sampled_trees_are_lossless(verifier: str, rule: str) -> None:
    """Sampled branching trees and three sampled paths, trimmed to 2..5 nodes: uneven chains whose RRS
    candidates come from paths of different lengths."""
    for inst in (TableInstance(3, 3, seed=5), TableInstance(3, 2, seed=6, zeros=False)):
        rows = exact._Rows(inst)
        trees = [(prob, *exact.shaped_tree(inst, drafted, rule, rows))
                 for prob, drafted in exact.shaped_law(inst, SHAPES["binary"], rule)]
        paths = [(prob, *exact.draft_tree(inst, drafted, rule, rows))
                 for prob, drafted in exact.draft_law(inst, 3, rule)]
        for drafts in (trees, paths):
            for budget in range(2, 6):
                error = exact.law_error(exact.mixture_law(verifier, trimmed(drafts, budget)), inst)
                assert error <= TOL, (inst.vocab, budget, error)


@pytest.mark.parametrize(("drafted", "label"), [("topk", "iid"), ("without_replacement", "iid")])
def test_a_wrong_child_rule_is_caught(drafted: str, label: str) -> None:
    """RRS told the wrong child rule of a branching tree (the i.i.d. residual on top-k candidates or on
    children drawn without replacement) is lossy, and the enumeration says so."""
    inst = TableInstance(3, 2, seed=4, zeros=False)
    assert shaped_error("rrs", inst, SHAPES["binary"], drafted) <= TOL
    assert shaped_error("rrs", inst, SHAPES["binary"], drafted, label) > 1e-3


def test_forgetting_sequoias_draft_update_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without replacement ``q`` must lose each rejected token; an RRS that keeps ``q`` is lossy."""
    inst = TableInstance(3, 2, seed=4, zeros=False)
    monkeypatch.setattr(verify, "_untried", lambda q, tokens: q)
    assert shaped_error("rrs", inst, SHAPES["binary"], "without_replacement") > 1e-3


def _keeps_the_residual(rule, r, q, token):
    return r, q


def _unnormalized(rule, r, q, token):
    if q is None:
        return r.index_fill(0, torch.tensor([token]), 0), None
    return torch.relu(r - q), q


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("wrong", [_keeps_the_residual, _unnormalized])
def test_a_wrong_residual_update_is_caught(monkeypatch: pytest.MonkeyPatch, wrong, rule: str) -> None:
    """RRS whose rejection leaves the residual as it was, or does not renormalize it, is lossy on
    branching trees under every child rule."""
    inst = TableInstance(3, 2, seed=4, zeros=False)
    assert shaped_error("rrs", inst, SHAPES["binary"], rule) <= TOL
    monkeypatch.setattr(verify, "_rejected", wrong)
    assert shaped_error("rrs", inst, SHAPES["binary"], rule) > 1e-3


@pytest.mark.parametrize("rule", ["iid", "without_replacement"])
def test_emitting_from_the_target_after_a_token_rejection_is_caught(monkeypatch: pytest.MonkeyPatch,
                                                                     rule: str) -> None:
    """Token-level verification on a branching tree must emit from ``[p - q]_+`` after a rejection."""
    inst = TableInstance(3, 2, seed=4, zeros=False)
    assert shaped_error("token", inst, SHAPES["binary"], rule) <= TOL
    monkeypatch.setattr(verify, "_residual", lambda target, draft, weight=None: target)
    assert shaped_error("token", inst, SHAPES["binary"], rule) > 1e-3


def test_a_shape_deeper_than_the_instance_is_refused() -> None:
    with pytest.raises(InputError, match="drafts past the instance's length 1"):
        exact.shaped_law(TableInstance(2, 1, seed=0), SHAPES["binary"])
    with pytest.raises(InputError, match="unknown child rule 'sorted'"):
        exact.shaped_law(TableInstance(2, 2, seed=0), SHAPES["binary"], "sorted")
    assert np.isclose(sum(w for w, _ in exact.shaped_law(TableInstance(3, 3, seed=1), SHAPES["uneven"])), 1.0)
