"""The verification LP, its size estimate, the closed forms and the instances they read."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from scipy.optimize import linprog

from core.errors import InputError
from experiments.lp_table import law_of
from real_engine import exact
from simulator import lp
from simulator.instances import ARInstance, random_instance, step_instance

KNOWN = step_instance([1 / 3, 2 / 3], [2 / 3, 1 / 3], 2)  # the BV paper's example


def _string(length: int, code: int, vocab: int) -> tuple[int, ...]:
    digits = []
    for _ in range(length):
        code, digit = divmod(code, vocab)
        digits.append(digit)
    return tuple(int(d) for d in reversed(digits))


def _verifier_plan(problem: lp.LPProblem, inst: ARInstance, verifier: str, drafts: int,
                   child_rule: str = "iid") -> np.ndarray:
    """A real verifier's law of the emitted string given the draft multiset, over the LP's variables."""
    keys = zip(problem.group.tolist(), problem.out_length.tolist(), problem.out_code.tolist(), strict=True)
    index = {key: i for i, key in enumerate(keys)}
    row = {tuple(ms): g for g, ms in enumerate(problem.multisets.tolist())}
    plan = np.zeros(problem.objective.size)
    for prob, paths in exact.draft_law(inst, drafts, child_rule):
        tree, p = exact.draft_tree(inst, paths, child_rule)
        group = row[tuple(sorted(inst.code(path) for path in paths))]
        for out, weight in exact.tree_output_law(verifier, tree, p).items():
            plan[index[(group, len(out), inst.code(out))]] += prob * weight
    return plan / problem.weight[problem.group]


def test_known_example_token_bv_and_lp():
    assert lp.expected_token(KNOWN) == pytest.approx(10 / 9, abs=1e-12)
    assert lp.expected_block(KNOWN) == pytest.approx(11 / 9, abs=1e-12)
    for solver in lp.SOLVERS:
        result = lp.solve_lp(KNOWN, solver=solver)
        # 11/9, not the 12/9 of the naive coupling LP that ignores the stopping-time structure.
        assert abs(result.value - 11 / 9) < 1e-6
        assert (result.status, result.solver, result.variables) == ("optimal", solver, 24)


def test_bv_attains_the_single_draft_lp():
    rng = np.random.default_rng(7)
    for i in range(24):
        inst = random_instance(2 + i % 2, 1 + i % 3, rng, drafter=("indep", "mix")[i // 12])
        bound = lp.solve_lp(inst).value
        assert abs(lp.expected_block(inst) - bound) < 1e-6
        assert lp.expected_token(inst) <= bound + 1e-9


def test_closed_forms_match_the_torch_verifiers():
    rng = np.random.default_rng(3)
    for vocab, length in ((2, 3), (3, 2)):
        inst = random_instance(vocab, length, rng, drafter="mix")
        assert exact.expected_accepted("token", inst) == pytest.approx(lp.expected_token(inst), abs=1e-12)
        assert exact.expected_accepted("block", inst) == pytest.approx(lp.expected_block(inst), abs=1e-12)


@pytest.mark.parametrize(("vocab", "length", "seed"), [(2, 2, 0), (3, 2, 1), (2, 3, 2)])
def test_lp_bounds_every_multi_draft_verifier(vocab, length, seed):
    inst = random_instance(vocab, length, np.random.default_rng(seed))
    bound = lp.solve_lp(inst, drafts=2).value
    single = lp.solve_lp(inst, drafts=1).value
    assert bound >= single - 1e-7
    for verifier in ("rrs", "seqbv", "gbv"):
        assert exact.expected_accepted(verifier, inst, drafts=2) <= bound + 1e-7


@pytest.mark.parametrize(("verifier", "drafts"), [("block", 1), ("token", 1), ("seqbv", 2), ("rrs", 3)])
def test_lossless_verifiers_are_feasible_points(verifier, drafts):
    """The constraints do not exclude a real lossless verifier, and the objective is its accepted length."""
    inst = random_instance(2, 2, np.random.default_rng(11))
    problem = lp.build_lp(inst, drafts)
    plan = _verifier_plan(problem, inst, verifier, drafts)
    assert np.abs(problem.a_eq @ plan - problem.b_eq).max() < 1e-12
    expected = exact.expected_accepted(verifier, inst, drafts)
    assert problem.objective @ plan == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("drafts", [1, 2])
def test_lp_optimum_satisfies_the_literal_lossless_constraint(drafts):
    """Token-by-token constraints imply sum_k P_out(z^k) p(z_{k+1..}|z^k) = p(z) for all z in V^(L+1)."""
    inst = random_instance(3, 2, np.random.default_rng(5))
    problem = lp.build_lp(inst, drafts)
    res = linprog(-problem.objective, A_eq=problem.a_eq, b_eq=problem.b_eq, bounds=(0, None), method="highs")
    assert res.status == 0
    pi = res.x * problem.weight[problem.group]
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for i in np.nonzero(pi)[0]:
        law[_string(int(problem.out_length[i]), int(problem.out_code[i]), inst.vocab)] += pi[i]
    assert exact.law_error(dict(law), inst) < 1e-9
    assert -res.fun == pytest.approx(lp.solve_lp(inst, drafts).value, abs=1e-6)


def test_the_enumerated_iid_drafts_give_the_iid_law():
    """``merged_law`` of the ordered i.i.d. draft tuples is the LP's own i.i.d. law (its multisets of
    non-zero probability), and so gives the same bound."""
    inst = random_instance(2, 2, np.random.default_rng(4))
    law = lp.merged_law(((prob, [inst.code(path) for path in paths])
                         for prob, paths in exact.draft_law(inst, 2)), 2)
    iid = lp.iid_law(inst, 2)
    kept = iid.weight > 0
    assert np.array_equal(law.multisets, iid.multisets[kept])
    assert np.allclose(law.weight, iid.weight[kept], atol=1e-15)
    assert lp.solve_lp(inst, 2, law=law).value == pytest.approx(lp.solve_lp(inst, 2).value, abs=1e-7)


@pytest.mark.parametrize(("verifier", "rule"), [("rrs", "without_replacement"),
                                                ("seqbv", "without_replacement"), ("gds", "greedy_draft")])
def test_other_draft_laws_admit_and_bound_their_verifiers(verifier, rule):
    """The LP of a draft law other than i.i.d. has the lossless verifiers of those drafts as feasible
    points, at their accepted length, and bounds them."""
    inst = random_instance(3, 2, np.random.default_rng(12))
    law = law_of(inst, 2, rule)
    problem = lp.build_lp(inst, 2, law)
    plan = _verifier_plan(problem, inst, verifier, 2, rule)
    assert np.abs(problem.a_eq @ plan - problem.b_eq).max() < 1e-12
    expected = exact.expected_accepted(verifier, inst, 2, rule)
    assert problem.objective @ plan == pytest.approx(expected, abs=1e-12)
    assert lp.solve_lp(inst, 2, law=law).value >= expected - 1e-7


def test_a_draft_of_too_many_paths_is_refused():
    with pytest.raises(InputError, match="3 paths in a law of 2"):
        lp.merged_law([(1.0, [0, 1, 2])], 2)
    padded = lp.merged_law([(0.5, [3]), (0.5, [1, 2])], 2)  # one path: padded with a copy of it
    assert padded.multisets.tolist() == [[1, 2], [3, 3]] and padded.weight.tolist() == [0.5, 0.5]


def test_gbv_can_accept_less_than_single_path_bv():
    """The example in GBV's docstring: instance 0 of ``specblock lp --vocab 2 --length 2 --drafts 2 --drafter
    mix`` (seed 0). Selecting the greatest path under the p/q order gives it a worse draft law than q."""
    inst = random_instance(2, 2, np.random.default_rng(0), drafter="mix")
    gbv, bv = exact.expected_accepted("gbv", inst, drafts=2), lp.expected_block(inst)
    assert gbv == pytest.approx(1.6091, abs=1e-4) and bv == pytest.approx(1.8565, abs=1e-4)
    assert exact.expected_accepted("seqbv", inst, drafts=2) >= bv  # the other two multi-path rules do not
    assert exact.expected_accepted("rrs", inst, drafts=2) >= bv


def test_highs_and_clarabel_agree_on_multi_draft():
    inst = random_instance(3, 2, np.random.default_rng(2), drafter="mix")
    values = [lp.solve_lp(inst, drafts=2, solver=s).value for s in lp.SOLVERS]
    assert values[0] == pytest.approx(values[1], abs=1e-6)


@pytest.mark.parametrize("drafts", [1, 2, 3])
def test_size_estimate_matches_the_built_problem(drafts):
    rng = np.random.default_rng(0)
    for vocab, length in ((2, 1), (2, 3), (3, 2), (4, 1)):
        problem = lp.build_lp(random_instance(vocab, length, rng), drafts)
        assert lp.lp_size(vocab, length, drafts) == problem.objective.size == problem.a_eq.shape[1]
        assert problem.a_eq.shape[0] == vocab ** (length + 1) - 1 + len(problem.multisets)
        assert len(problem.multisets) == math.comb(vocab**length + drafts - 1, drafts)
    assert lp.lp_size(3, 3, 1) == 324  # the single-draft size at V = 3, L = 3
    assert lp.lp_size(3, 3, 2) == 7290  # 14,256 ordered tuples merged into multisets


def test_multisets_carry_the_probability_of_all_their_orderings():
    inst = random_instance(2, 2, np.random.default_rng(4))
    problem = lp.build_lp(inst, drafts=3)
    assert np.all(np.diff(problem.multisets, axis=1) >= 0)
    assert problem.weight.sum() == pytest.approx(1.0, abs=1e-12)
    assert problem.weight[0] == pytest.approx((inst.q(())[0] * inst.q((0,))[0]) ** 3, abs=1e-15)
    mixed = problem.multisets.tolist().index([0, 0, 1])
    assert problem.weight[mixed] == pytest.approx(3 * (inst.q(())[0] ** 3) * inst.q((0,))[0] ** 2
                                                  * inst.q((0,))[1], abs=1e-15)


def test_too_large_problems_are_refused_before_building():
    inst = random_instance(3, 3, np.random.default_rng(0))
    with pytest.raises(InputError, match="7,290 variables"):
        lp.solve_lp(inst, drafts=2, max_variables=1000)
    with pytest.raises(InputError, match="more than"):
        lp.check_size(1000, 50, 1)
    with pytest.raises(InputError, match="1,642,240"):
        lp.check_size(4, 3, 3)
    with pytest.raises(InputError, match="at least 1 draft"):
        lp.lp_size(2, 2, 0)


def test_bad_solver_settings_are_refused():
    with pytest.raises(InputError, match="unknown LP solver"):
        lp.solve_lp(KNOWN, solver="glpk")
    with pytest.raises(InputError, match="not positive"):
        lp.solve_lp(KNOWN, time_limit=0)


def test_time_limit_raises():
    inst = random_instance(3, 3, np.random.default_rng(1))
    with pytest.raises(lp.LPSolveError, match="time limit"):
        lp.solve_lp(inst, drafts=2, time_limit=1e-9)


def test_highs_falls_back_to_clarabel_on_a_spurious_status(monkeypatch):
    real, calls = lp._solve, []

    def flaky(problem, solver, time_limit):
        calls.append(solver)
        return (math.nan, "infeasible") if solver == "HIGHS" else real(problem, solver, time_limit)

    monkeypatch.setattr(lp, "_solve", flaky)
    result = lp.solve_lp(KNOWN, solver="highs")
    assert calls == ["HIGHS", "CLARABEL"] and result.solver == "CLARABEL"
    assert abs(result.value - 11 / 9) < 1e-6


def test_highs_out_of_time_does_not_fall_back(monkeypatch):
    calls = []

    def slow(problem, solver, time_limit):
        calls.append(solver)
        return math.nan, "user_limit"

    monkeypatch.setattr(lp, "_solve", slow)
    with pytest.raises(lp.LPSolveError, match="HIGHS returned user_limit"):
        lp.solve_lp(KNOWN, solver="HIGHS")
    assert calls == ["HIGHS"]


def test_instances_read_their_tables():
    inst = random_instance(3, 2, np.random.default_rng(9), drafter="mix")
    assert inst.p((2, 1)).tolist() == inst.p_tables[2][2 * 3 + 1].tolist()
    assert inst.q(()).tolist() == inst.q_tables[0][0].tolist()
    assert np.all(inst.q_tables[1] >= 0.6 * inst.p_tables[1] - 1e-15)  # "mix" copies 0.6 of the target
    again = random_instance(3, 2, np.random.default_rng(9), drafter="mix")
    assert all(np.array_equal(a, b) for a, b in zip(inst.p_tables, again.p_tables, strict=True))
    with pytest.raises(InputError, match="outside the vocabulary"):
        inst.p((3,))


@pytest.mark.parametrize(("p", "q", "length", "message"), [
    ([1.0], [1.0], 2, "at least 2 tokens"),
    ([0.5, 0.5], [0.5, 0.5], 0, "at least 1"),
    ([-0.5, 1.5], [0.5, 0.5], 2, "negative"),
    ([0.5, 0.6], [0.5, 0.5], 2, "sums to"),
    ([0.5, 0.5], [0.2, 0.3, 0.5], 2, "3 entries for a vocabulary of 2"),
    ([0.5, float("nan")], [0.5, 0.5], 2, "non-finite"),
])
def test_bad_step_instances_are_refused(p, q, length, message):
    with pytest.raises(InputError, match=message):
        step_instance(p, q, length)


def test_bad_random_instances_are_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="at least 2 tokens"):
        random_instance(1, 2, rng)
    with pytest.raises(InputError, match="unknown drafter"):
        random_instance(2, 2, rng, drafter="oracle")
