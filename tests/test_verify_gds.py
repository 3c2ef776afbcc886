"""GDS, the greedy draft of Hu et al. (top K-1 tokens, then one sampled path) with its verifier, proven
lossless by exact enumeration of the torch code, optimal for its own draft at one step (against the LP for
that draft law), equal to BV with one draft; a wrong draft law, a wrong point-mass update and a wrong
residual are each caught."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from test_verify_lossless import TableInstance

from core.errors import InputError
from experiments.lp_table import law_of
from real_engine import exact, verify
from simulator import lp
from simulator.instances import random_instance

TOL = 1e-9
RULE = "greedy_draft"
GRID = list(itertools.product((2, 3), (1, 2), (2, 3)))  # V, L, K


@pytest.mark.parametrize(("vocab", "length", "drafts"), GRID)
def test_gds_is_lossless(vocab: int, length: int, drafts: int) -> None:
    """Instances with zeros of both kinds, and without."""
    for zeros in (True, False):
        inst = TableInstance(vocab, length, seed=100 * vocab + 10 * length + drafts, zeros=zeros)
        assert exact.lossless_error("gds", inst, drafts, RULE) <= TOL


def test_greedy_draft_is_the_top_tokens_then_one_sampled() -> None:
    """The drafting process: the root's first K-1 children are q's top tokens, the last is drawn from q
    without them; when those exhaust q's support no sampled child is added."""
    inst = TableInstance(4, 1, seed=3, zeros=False)
    q = inst.q(())
    top = list(np.argsort(-q, kind="stable")[:2])
    law = exact.draft_law(inst, 3, RULE)
    assert sum(prob for prob, _ in law) == pytest.approx(1.0, abs=1e-12)
    for prob, paths in law:
        firsts = [path[0] for path in paths]
        assert firsts[:2] == top and firsts[2] not in top
        assert prob == pytest.approx(q[firsts[2]] / (1 - q[top].sum()), abs=1e-12)
    small = TableInstance(2, 1, seed=1, zeros=False)  # the top two tokens are the whole vocabulary
    order = tuple((int(y),) for y in np.argsort(-small.q(()), kind="stable"))
    assert exact.draft_law(small, 3, RULE) == [(1.0, order)]


def test_one_draft_is_block_verification() -> None:
    for vocab, length in ((3, 2), (2, 3)):
        inst = TableInstance(vocab, length, seed=vocab + length)
        gds, bv = exact.output_distribution("gds", inst, 1, RULE), exact.output_distribution("block", inst, 1)
        assert max(abs(gds.get(o, 0.0) - bv.get(o, 0.0)) for o in set(gds) | set(bv)) <= 1e-12


@pytest.mark.parametrize(("vocab", "drafts"), [(3, 2), (4, 2), (4, 3), (6, 4)])
def test_one_step_gds_reaches_the_bound_of_its_draft(vocab: int, drafts: int) -> None:
    """At L = 1 its acceptance is p(T) + sum_{x not in T} min(p(x), q'(x)), and no lossless verifier of the
    same draft accepts more: the LP over the greedy draft's law has the same optimum."""
    inst = random_instance(vocab, 1, np.random.default_rng(vocab + drafts))
    p, q = inst.p(()), inst.q(())
    top = np.argsort(-q, kind="stable")[:drafts - 1]
    rest = q.copy()
    rest[top] = 0
    closed = p[top].sum() + np.minimum(p, rest / rest.sum())[rest > 0].sum()
    gds = exact.expected_accepted("gds", inst, drafts, RULE)
    assert gds == pytest.approx(closed, abs=1e-12)
    assert gds == pytest.approx(lp.solve_lp(inst, drafts, law=law_of(inst, drafts, RULE)).value, abs=1e-6)


def test_gds_is_bounded_by_the_lp_of_its_draft_not_the_iid_one() -> None:
    """The LP of the greedy draft bounds GDS at L = 2 too; the i.i.d. LP does not (it bounds another
    draft): on this instance GDS accepts more than any verifier of K i.i.d. paths can."""
    inst = random_instance(3, 2, np.random.default_rng(1))
    gds = exact.expected_accepted("gds", inst, 3, RULE)
    assert gds <= lp.solve_lp(inst, 3, law=law_of(inst, 3, RULE)).value + 1e-7
    assert gds > lp.solve_lp(inst, 3).value + 0.05


def _error(inst: TableInstance, drafts: int) -> float:
    return exact.lossless_error("gds", inst, drafts, RULE)


def test_a_wrong_draft_law_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the sampled child as a draw from q itself (not q without the top tokens) is lossy."""
    inst = TableInstance(3, 2, seed=5, zeros=False)
    assert _error(inst, 2) <= TOL
    monkeypatch.setattr(verify, "_greedy_draft", lambda q, tops: q / q.sum())
    assert _error(inst, 2) > 1e-3


def test_keeping_a_rejected_top_token_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A top token rejected as a point mass must leave the residual; keeping it is lossy."""
    inst = TableInstance(3, 2, seed=6, zeros=False)
    monkeypatch.setattr(verify, "_without", lambda v, token: v)
    assert _error(inst, 3) > 1e-3


def test_emitting_from_the_target_after_a_rejection_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    inst = TableInstance(3, 2, seed=7, zeros=False)
    monkeypatch.setattr(verify, "_residual", lambda target, draft, weight=None: target)
    assert _error(inst, 2) > 1e-3


def test_rules_and_drafts_must_match() -> None:
    """GDS refuses drafts that are not greedy; the other sampling verifiers refuse greedy drafts (they would
    read the top tokens as draws from q); greedy verification reads any tree."""
    inst = TableInstance(3, 2, seed=8, zeros=False)
    [(_, paths), *_] = exact.draft_law(inst, 2, RULE)
    greedy_tree, p = exact.draft_tree(inst, paths, RULE)
    iid_tree, _ = exact.draft_tree(inst, paths, "iid")
    with pytest.raises(InputError, match="greedy draft"):
        verify.verify("gds", iid_tree, p)
    for name in ("token", "block", "rrs", "gbv", "seqbv"):
        with pytest.raises(InputError, match="use gds"):
            verify.verify(name, greedy_tree, p)
    assert verify.verify("greedy", greedy_tree, p).token in range(3)


def test_gds_samples_through_the_torch_sampler() -> None:
    """The registered verifier runs with real draws: accepted nodes form a root path of the tree."""
    inst = TableInstance(4, 2, seed=9, zeros=False)
    [(_, paths), *_] = exact.draft_law(inst, 3, RULE)
    tree, p = exact.draft_tree(inst, paths, RULE)
    generator = torch.Generator().manual_seed(0)
    parents = tree.parents.tolist()
    for _ in range(50):
        result = verify.verify("gds", tree, p.float(), verify.TorchSampler(generator))
        assert all(parents[b] == a for a, b in zip((0, *result.path), result.path, strict=False))
        assert 0 <= result.token < 4
