"""Every verifier is lossless, proven by exact enumeration of the real torch code (real_engine.exact).

Instances are random Dirichlet targets and drafters over tiny vocabularies, with zeros on purpose:
``q`` zero where ``p`` is positive and ``p`` zero where ``q`` is positive. The checker itself is
shown able to fail: a wrong BV stopping rule, a wrong RRS child rule, and GBV and SeqBV with a wrong
selection law or a wrong residual are all flagged lossy (branching trees: ``test_verify_trees.py``; GDS's
greedy draft: ``test_verify_gds.py``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from real_engine import exact, verify

TOL = 1e-9
DRAFT_CAP = {"iid": 729, "without_replacement": 729, "topk": 256, "greedy_draft": 729}  # most drafts per cell


class TableInstance:
    """Random ``p`` and ``q`` per prefix (Dirichlet(1)), with zeros: at the root ``q`` has a zero
    where ``p`` is positive and (``vocab >= 3``) ``p`` a zero where ``q`` is positive; deeper
    prefixes get either kind with probability 1/2 each."""

    def __init__(self, vocab: int, length: int, seed: int, zeros: bool = True) -> None:
        rng = np.random.default_rng(seed)
        self.vocab, self.length = vocab, length
        self.table: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        for n in range(length + 1):
            for prefix in itertools.product(range(vocab), repeat=n):
                p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
                if zeros and vocab > 1:
                    a, b = rng.choice(vocab, 2, replace=False)
                    if n == 0 or rng.random() < 0.5:
                        q[a] = 0.0
                    if (n == 0 and vocab >= 3) or (n > 0 and rng.random() < 0.5 and q[a] > 0):
                        p[b] = 0.0
                self.table[prefix] = (p / p.sum(), q / q.sum())

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.table[prefix][0]

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.table[prefix][1]


class FixedInstance:
    """The same ``p`` and ``q`` after every prefix."""

    def __init__(self, p: list[float], q: list[float], length: int) -> None:
        self.vocab, self.length = len(p), length
        self._p, self._q = np.array(p), np.array(q)

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._p

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._q


def _drafts(vocab: int, length: int, drafts: int, rule: str) -> int:
    """Upper bound on the number of drafts the rule can produce."""
    return {"topk": 1, "greedy_draft": vocab}.get(rule, vocab**drafts) * vocab ** ((length - 1) * drafts)


CASES = [("token", rule) for rule in ("iid", "without_replacement", "topk")] + \
        [("block", rule) for rule in ("iid", "without_replacement", "topk")] + \
        [("rrs", rule) for rule in ("iid", "without_replacement", "topk")] + \
        [("gbv", "iid")] + \
        [("seqbv", rule) for rule in ("iid", "without_replacement", "topk")] + \
        [("gds", "greedy_draft")]
GRID = [(v, l, k) for v in (2, 3, 4) for l in (1, 2, 3) for k in (1, 2, 3)]


@pytest.mark.parametrize(("verifier", "rule"), CASES)
def test_lossless_by_enumeration(verifier: str, rule: str) -> None:
    """Error <= 1e-9 over V in {2,3,4}, L in {1,2,3}, K in {1,2,3}, every cell whose draft count
    is at most 729 (256 for top-k drafting, whose point-mass rule branches most). Left out, for the
    time budget: V=3 (L,K)=(3,3) and V=4 (L,K)=(3,3); for i.i.d. and without-replacement drafting
    also V=4 (L,K) in {(2,3),(3,2)}. Every verifier still sees L=3 with K=3 (at V=2)."""
    covered = [cell for cell in GRID if _drafts(*cell, rule) <= DRAFT_CAP[rule]]
    assert {l for _, l, _ in covered} == {1, 2, 3} and {k for _, _, k in covered} == {1, 2, 3}
    for vocab, length, drafts in covered:
        inst = TableInstance(vocab, length, seed=100 * vocab + 10 * length + drafts)
        error = exact.lossless_error(verifier, inst, drafts, rule)
        assert error <= TOL, (vocab, length, drafts, error)


def test_instances_have_both_kinds_of_zero() -> None:
    """The instances above really contain q = 0 < p and p = 0 < q (else the zero cases go untested)."""
    rows = [TableInstance(v, 2, seed=s).table.values() for v in (2, 3, 4) for s in range(3)]
    pairs = [(p, q) for table in rows for p, q in table]
    assert any(((q == 0) & (p > 0)).any() for p, q in pairs)
    assert any(((p == 0) & (q > 0)).any() for p, q in pairs)


def _forward_first_pass(passed: torch.Tensor) -> int:
    hits = passed.nonzero()
    return int(hits[0, 0]) + 1 if len(hits) else 0


def _last_before_first_failure(passed: torch.Tensor) -> int:
    return int(passed.long().cumprod(0).sum())


@pytest.mark.parametrize("wrong_rule", [_forward_first_pass, _last_before_first_failure])
def test_wrong_bv_stopping_rule_is_flagged(monkeypatch: pytest.MonkeyPatch, wrong_rule) -> None:
    """BV must take tau = max{i : eta_i <= h_i}; other stopping rules are lossy and the check says so."""
    inst = TableInstance(3, 3, seed=7, zeros=False)
    assert exact.lossless_error("block", inst) <= TOL
    monkeypatch.setattr(verify, "_stop_index", wrong_rule)
    assert exact.lossless_error("block", inst) > 1e-3


@pytest.mark.parametrize("drafted", ["topk", "without_replacement"])
def test_iid_rule_on_other_children_is_flagged(drafted: str) -> None:
    """The i.i.d. RRS rule applied to top-k (or without-replacement) children is lossy."""
    inst = TableInstance(3, 2, seed=3, zeros=False)
    law: dict[tuple[int, ...], float] = {}
    for prob, paths in exact.draft_law(inst, 2, drafted):
        tree, p = exact.draft_tree(inst, paths, "iid")
        for out, prob_out in exact.tree_output_law("rrs", tree, p).items():
            law[out] = law.get(out, 0.0) + prob * prob_out
    assert exact.law_error(law, inst) > 1e-3
    assert exact.lossless_error("rrs", inst, 2, drafted) <= TOL


def test_known_figure() -> None:
    """Sun et al.'s example: p = (1/3, 2/3), q = (2/3, 1/3), L = 2: token-level 10/9, BV 11/9."""
    inst = FixedInstance([1 / 3, 2 / 3], [2 / 3, 1 / 3], 2)
    assert exact.expected_accepted("token", inst) == pytest.approx(10 / 9, abs=1e-12)
    assert exact.expected_accepted("block", inst) == pytest.approx(11 / 9, abs=1e-12)


def _token_closed_form(inst: TableInstance) -> float:
    total = 0.0
    for i in range(1, inst.length + 1):
        for x in itertools.product(range(inst.vocab), repeat=i):
            total += np.prod([min(inst.p(x[:j])[x[j]], inst.q(x[:j])[x[j]]) for j in range(i)])
    return total


def _bv_closed_form(inst: TableInstance) -> float:
    """sum_i sum_{x^i} min_{0<=j<=i} q(x^j) p(x_{j+1..i} | x^j)."""
    total = 0.0
    for i in range(1, inst.length + 1):
        for x in itertools.product(range(inst.vocab), repeat=i):
            p = [inst.p(x[:k])[x[k]] for k in range(i)]
            q = [inst.q(x[:k])[x[k]] for k in range(i)]
            total += min(np.prod(q[:j]) * np.prod(p[j:]) for j in range(i + 1))
    return total


@pytest.mark.parametrize(("vocab", "length"), [(2, 3), (3, 1), (3, 2), (3, 3), (4, 2)])
def test_closed_forms(vocab: int, length: int) -> None:
    """Exact expected accepted length matches the token-level and BV closed forms,
    also with two drafts (the single-path verifiers use the first)."""
    for zeros in (False, True):
        inst = TableInstance(vocab, length, seed=vocab + length, zeros=zeros)
        bv = _bv_closed_form(inst)
        assert exact.expected_accepted("token", inst) == pytest.approx(_token_closed_form(inst), abs=1e-12)
        assert exact.expected_accepted("block", inst) == pytest.approx(bv, abs=1e-12)
        if length < 3:
            assert exact.expected_accepted("block", inst, 2) == pytest.approx(bv, abs=1e-12)


@pytest.mark.parametrize("rule", ["iid", "without_replacement", "topk"])
def test_seqbv_equals_rrs_at_length_one(rule: str) -> None:
    for vocab, drafts in [(3, 2), (4, 3)]:
        inst = TableInstance(vocab, 1, seed=vocab + drafts)
        seq = exact.output_distribution("seqbv", inst, drafts, rule)
        rec = exact.output_distribution("rrs", inst, drafts, rule)
        assert max(abs(seq.get(o, 0.0) - rec.get(o, 0.0)) for o in set(seq) | set(rec)) <= 1e-12


def test_seqbv_at_least_single_path_bv() -> None:
    for seed, (vocab, length) in enumerate([(2, 3), (3, 2), (4, 2)]):
        inst = TableInstance(vocab, length, seed=seed, zeros=seed % 2 == 0)
        seq = exact.expected_accepted("seqbv", inst, 2)
        assert seq >= exact.expected_accepted("block", inst, 2) - 1e-12
        assert seq > exact.expected_accepted("block", inst, 1) + 1e-6  # a second path helps here


def test_greedy_matches_the_argmax_chain() -> None:
    """Against an argmax-deterministic target, greedy emits exactly the target's greedy chain."""
    base = TableInstance(3, 3, seed=11, zeros=False)
    point = TableInstance(3, 3, seed=11, zeros=False)
    for prefix, (p, q) in base.table.items():
        point.table[prefix] = (np.eye(3)[int(np.argmax(p))], q)
    chain: tuple[int, ...] = ()
    for _ in range(4):
        chain = (*chain, int(np.argmax(point.p(chain))))
    for drafts in (1, 2):
        law = exact.output_distribution("greedy", point, drafts)
        assert all(out == chain[: len(out)] for out in law)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        assert exact.lossless_error("greedy", point, drafts) <= TOL
    assert exact.lossless_error("greedy", base) > 1e-2  # and lossy against a stochastic target


def _unweighted_residual(target: torch.Tensor, draft: torch.Tensor, weight=None) -> torch.Tensor:
    excess = torch.relu(target - draft)
    return excess / excess.sum() if excess.sum() > 0 else target


_SELECTED_LAW = verify._selected_law
_BLOCK_CORE = verify._block_core


def _hands_off_the_target(path, sampler):
    """BV that, stopping short, hands on the target row at the stop instead of its residual."""
    tau, law = _BLOCK_CORE(path, sampler)
    return tau, law if tau == path.x.numel() else path.target(tau)


GBV_MUTANTS = {
    "selection: q, not the selected path's law": ("_selected_law", lambda path, drafts: path),
    "selection: the law of one draft more": ("_selected_law",
                                              lambda path, drafts: _SELECTED_LAW(path, drafts + 1)),
    "residual: BV's without its weight": ("_residual", _unweighted_residual),
}
SEQBV_MUTANTS = {
    "selection: tried tokens kept in q": ("without_replacement", "_untried", lambda q, tokens: q),
    "residual: BV's without its weight": ("iid", "_residual", _unweighted_residual),
    "residual: the target row handed on": ("iid", "_block_core", _hands_off_the_target),
}


@pytest.mark.parametrize(("name", "wrong"), GBV_MUTANTS.values(), ids=list(GBV_MUTANTS))
def test_gbv_mutants_are_flagged(monkeypatch: pytest.MonkeyPatch, name: str, wrong) -> None:
    """GBV with a wrong law for the selected path, or a wrong residual, is lossy and the check says so.
    Here the residuals have several positive tokens: where one alone is positive (often at V <= 3), the
    normalized residual is that token whatever the weight, and such a mutant is invisible."""
    inst = TableInstance(4, 2, seed=2, zeros=False)
    assert exact.lossless_error("gbv", inst, 2) <= TOL
    monkeypatch.setattr(verify, name, wrong)
    assert exact.lossless_error("gbv", inst, 2) > 1e-3


@pytest.mark.parametrize(("rule", "name", "wrong"), SEQBV_MUTANTS.values(), ids=list(SEQBV_MUTANTS))
def test_seqbv_mutants_are_flagged(monkeypatch: pytest.MonkeyPatch, rule: str, name: str, wrong) -> None:
    """SeqBV with a wrong first-position law for the next path, or a wrong residual, is lossy (on an
    instance whose residuals have several positive tokens, as for GBV)."""
    inst = TableInstance(4, 2, seed=2, zeros=False)
    assert exact.lossless_error("seqbv", inst, 2, rule) <= TOL
    monkeypatch.setattr(verify, name, wrong)
    assert exact.lossless_error("seqbv", inst, 2, rule) > 1e-3
