"""Acceptance models: the paper-derived default, sampling vs its exact law, fitting, replay, adaptation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_traces import tree_rows

from core.errors import InputError
from policies.features import tree_confidences
from simulator.adaptation import AdaptationDynamics, level_rates
from simulator.parametric import (
    PAPER_DOMAINS,
    ParametricAcceptance,
    default_acceptance,
    paper_rates,
    synthetic_traces,
)
from simulator.positions import positions
from simulator.replay import TraceReplay


@pytest.fixture(scope="module")
def model() -> ParametricAcceptance:
    return default_acceptance()


@pytest.fixture(scope="module")
def traces(model):
    return synthetic_traces(model, queries=160, iterations=40, seed=3)


def test_default_matches_the_paper_per_position_rates(model):
    survival = model.survival(16)
    rates = survival[:, 1:] / survival[:, :-1]
    for row, name in enumerate(model.domains):
        np.testing.assert_allclose(rates[row], paper_rates() ** PAPER_DOMAINS[name], atol=1e-9)
    code = rates[model.domains.index("code")]
    assert code[0] == pytest.approx(0.82) and code[7] == pytest.approx(0.544)


def test_sampled_acceptance_follows_the_exact_law(model):
    rng = np.random.default_rng(0)
    domain = np.repeat(np.arange(len(model.domains)), 20_000)
    draws = model.sample(rng, domain)
    assert draws.confidences.shape == (domain.size, 16) and np.all(draws.drafted == 16)
    for n in (1, 4, 8, 16):
        accepted = draws.accepted(np.full(domain.size, n))
        assert accepted.max() <= n
        exact = model.survival(n)[:, 1:].sum(axis=1)
        for d in range(len(model.domains)):
            mine = accepted[domain == d]
            assert abs(mine.mean() - exact[d]) < 5 * mine.std() / np.sqrt(mine.size) + 1e-9


def test_sampling_is_deterministic_under_a_seed(model):
    domain = np.arange(64) % 4
    a = model.sample(np.random.default_rng(5), domain)
    b = model.sample(np.random.default_rng(5), domain)
    np.testing.assert_array_equal(a.confidences, b.confidences)
    np.testing.assert_array_equal(a.accepted_all, b.accepted_all)


def test_fit_recovers_the_generating_model(model, traces):
    fitted = ParametricAcceptance.fit(positions(traces))
    order = [model.domains.index(d) for d in fitted.domains]
    np.testing.assert_allclose(fitted.survival(16), model.survival(16)[order], atol=0.03)
    np.testing.assert_allclose(fitted.mu[:, :8], model.mu[order, :8], atol=0.1)
    np.testing.assert_allclose(fitted.shared_sd, 1.0, atol=0.1)
    np.testing.assert_allclose(fitted.own_sd, 0.75, atol=0.05)
    np.testing.assert_allclose(fitted.calib_b[:, :6], 1.0, atol=0.25)


def test_fit_learns_a_miscalibrated_drafter(model):
    overconfident = ParametricAcceptance(model.domains, model.depth, model.mu, model.shared_sd, model.own_sd,
                                         np.full(model.mu.shape, -1.0), np.full(model.mu.shape, 0.8))
    table = positions(synthetic_traces(overconfident, queries=120, iterations=40, seed=5))
    fitted = ParametricAcceptance.fit(table)
    assert np.all(fitted.calib_a[:, :4] < -0.5)
    empirical = [[np.mean(table.chain_accepted[table.domain == d] >= i) for i in range(9)]
                 for d in range(len(fitted.domains))]
    np.testing.assert_allclose(fitted.survival(8), empirical, atol=0.01)
    order = [overconfident.domains.index(d) for d in fitted.domains]
    np.testing.assert_allclose(fitted.survival(8), overconfident.survival(8)[order], atol=0.035)


def test_replay_draws_recorded_rows_of_the_requested_domain(traces):
    replay = TraceReplay.from_traces(traces)
    assert replay.by_length is None  # chains: accepted = min(accepted_all, n)
    domain = np.full(500, replay.domains.index("prose"))
    draws = replay.sample(np.random.default_rng(1), domain)
    table = positions(traces)
    recorded = {row.tobytes() for row in table.confidences[table.domain == table.domains.index("prose")]}
    assert all(row.tobytes() in recorded for row in draws.confidences)
    survival = replay.survival(8)
    prose = traces[traces["domain"] == "prose"]
    per_row = prose.groupby("query_id")["accepted"].transform(lambda a: (a + 1).mean())  # text per row
    expected = np.average(np.minimum(prose["accepted"], 8) >= 3, weights=per_row)  # uniform text positions
    assert survival[replay.domains.index("prose"), 3] == pytest.approx(expected)


def test_tree_positions_rank_nodes_by_path_confidence():
    table = positions(tree_rows())
    products = np.array([0.6, 0.3, 0.6 * 0.9, 0.3 * 0.5])
    np.testing.assert_allclose(table.confidences[1, :4], tree_confidences(products))
    np.testing.assert_allclose(table.confidences[0, :3], [0.9, 0.8, 0.5])
    # ranks by product: node0 0.6, node2 0.54, node1 0.3, node3 0.15; the accepted path is node1 -> node3
    replay = TraceReplay(table)
    by_length = replay.by_length[np.argsort(np.argsort(table.domain, kind="stable"))]
    np.testing.assert_array_equal(by_length[1, :6], [0, 0, 0, 1, 2, 2])
    np.testing.assert_array_equal(by_length[0, :5], [0, 1, 2, 2, 2])


def test_updates_move_levels_toward_their_ceiling_with_diminishing_returns():
    dyn = AdaptationDynamics(harm_probability=0.0)
    rng = np.random.default_rng(0)
    level = np.ones((2, 3))
    share = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    steps = []
    for _ in range(30):
        new = dyn.updated(rng, level, np.array([True, False]), np.ones(2), share)
        steps.append(level - new)
        level = new
    assert level[0, 0] == pytest.approx(1 - dyn.headroom)  # full reaches the whole headroom
    assert level[1, 0] == pytest.approx(1 - dyn.head_reach * dyn.headroom, abs=1e-4)  # head: only part
    assert np.all(level[:, 2] == 1.0) and level[0, 1] == 1.0  # domains absent from the buffer: unchanged
    assert np.all(np.diff(np.array(steps)[:, 0, 0]) <= 0)  # each update gains less than the one before


def test_transfer_reaches_every_domain_and_small_head_updates_overfit():
    rng = np.random.default_rng(0)
    share = np.array([[1.0, 0.0]])
    alike = AdaptationDynamics(harm_probability=0.0, transfer=1.0, full_rate=1.0)
    level = alike.updated(rng, np.ones((1, 2)), np.array([True]), np.ones(1), share)
    assert level[0, 0] == pytest.approx(level[0, 1]) and level[0, 1] < 1.0  # absent from the buffer, moved
    half = replace(alike, transfer=0.5).updated(rng, np.ones((1, 2)), np.array([True]), np.ones(1), share)
    assert level[0, 1] < half[0, 1] < 1.0
    overfit = AdaptationDynamics(harm_probability=0.0, head_reach=1.0, head_overfit=1.5, head_rate=1.0)
    level = np.ones((2, 1))
    for _ in range(200):  # converge: a head update on a full buffer vs one on a tenth of it
        level = overfit.updated(rng, level, np.array([False, False]), np.array([1.0, 0.1]), np.ones((2, 1)))
    assert level[0, 0] == pytest.approx(1 - overfit.headroom, abs=1e-6)
    assert level[1, 0] == pytest.approx(1 - overfit.headroom * (1.0 - 1.5 * 0.9), abs=1e-6)
    assert level[1, 0] > 1.0  # a head retrained on few positions ends worse than the profiled drafter


def test_full_updates_scale_the_drafting_ratio_and_head_updates_pull_it():
    dyn = AdaptationDynamics(head_draft=1.5, full_draft=1.1)
    head = dyn.updated_draft(np.ones(1), np.array([False]), np.array([0.5]))
    assert head[0] == pytest.approx(1.25)  # half the gap to head_draft
    full = dyn.updated_draft(head, np.array([True]), np.array([1.0]))
    assert full[0] == pytest.approx(1.25 * 1.1)  # scaled: the head's widening kept
    assert dyn.updated_draft(full, np.array([True]), np.array([0.5]))[0] == pytest.approx(1.25 * 1.1 * 1.05)


def test_harmful_updates_raise_the_level():
    dyn = AdaptationDynamics(harm_probability=1.0)
    level = dyn.updated(np.random.default_rng(0), np.ones((1, 2)), np.array([True]), np.ones(1),
                        np.array([[1.0, 0.0]]))
    assert level[0, 0] > 1.0 and level[0, 1] == 1.0


def test_default_headroom_matches_the_papers_adaptation_gain(model):
    survival = model.survival(8)
    before = level_rates(survival, np.ones(len(model.domains)))
    after = level_rates(survival, np.full(len(model.domains), 1 - AdaptationDynamics().headroom))
    np.testing.assert_allclose(before, survival[:, 1:].sum(axis=1))
    assert 0.22 <= np.mean(after - before) <= 0.30


def test_bad_dynamics_are_refused():
    with pytest.raises(InputError, match="headroom"):
        AdaptationDynamics(headroom=1.5)
    with pytest.raises(InputError, match="capacities"):
        AdaptationDynamics(head_capacity=0)
