"""Fitting the simulator's adaptation dynamics to engine streams, and the live experiment's helpers."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os

import numpy as np
import pytest

from core.cost_profile import load_profile
from core.errors import InputError
from core.names import DOMAINS
from core.paths import CPU_PROFILE, MODELS, PAPER_PROFILE, TARGET
from experiments.adapt.live import build_stream, phase_counts, shifted_queries
from experiments.adapt.plan import DEFAULT_PLAN, QUICK_PLAN, StreamPlan, result_name
from experiments.adapt.predict import add_draft_ratios, mean_shape, record_of, summary, tree_nodes
from experiments.adapt.report import RENDERERS, phase_text, update_text
from policies.adaptation import FULL, HEAD, SKIP
from real_engine.adapt import usable_cores
from simulator.adaptation import (
    AdaptationDynamics,
    AdaptRecord,
    adaptation_draft,
    adaptation_tau,
    fit_adaptation,
    level_rates,
)

RATES = np.array([[0.7] * 8, [0.4] * 8])
SURVIVAL = np.hstack([np.ones((2, 1)), np.cumprod(RATES, axis=1)])  # P(accepted >= i), i = 0..8


def stream(seed: int, queries: int = 80) -> AdaptRecord:
    """Domains in turn; a head update every 4th query, a full update every 10th, on mixed buffers."""
    rng = np.random.default_rng(seed)
    action = np.full(queries, SKIP)
    action[4::4], action[10::10] = HEAD, FULL
    share = rng.dirichlet([1.0, 1.0], size=queries)
    fill = rng.uniform(0.5, 1.0, queries)
    no = np.zeros(queries, bool)
    return AdaptRecord(np.arange(queries) % 2, np.ones(queries), action, fill, share, no, no)


def test_adaptation_tau_follows_updates_reverts_and_checkpoints() -> None:
    dyn = AdaptationDynamics(headroom=0.5, head_rate=1.0, full_rate=1.0, harm_probability=0.0)
    base = 1.0 + SURVIVAL[:, 1:].sum(axis=1)
    idle = AdaptRecord(np.array([0, 1]), np.ones(2), np.full(2, SKIP), np.zeros(2), np.zeros((2, 2)),
                       np.zeros(2, bool), np.zeros(2, bool))
    assert np.allclose(adaptation_tau(dyn, SURVIVAL, idle), base)
    # a full update on a code-only buffer moves code halfway to its floor (rate 1, fill 1) and leaves prose
    one = np.array([[1.0, 0.0]] * 4)
    record = AdaptRecord(np.array([0, 1, 0, 0]), np.ones(4), np.array([FULL, SKIP, SKIP, SKIP]), np.ones(4),
                         one, np.array([False, False, True, False]), np.zeros(4, bool))
    tau = adaptation_tau(dyn, SURVIVAL, record)
    assert tau[0] == pytest.approx(1.0 + level_rates(SURVIVAL[0], 0.5)) and tau[0] > base[0]
    assert tau[1] == pytest.approx(base[1]) and tau[2] == pytest.approx(tau[0])
    assert tau[3] == pytest.approx(base[0])  # reverted after query 2 to the never-checkpointed start
    kept = dataclasses.replace(record, checkpoint=np.array([True, False, False, False]))
    assert adaptation_tau(dyn, SURVIVAL, kept)[3] == pytest.approx(tau[0])
    # a window closed early by query 0's update measured the drafter from before it: that one is kept
    before = dataclasses.replace(kept, previous=np.array([True, False, False, False]))
    assert adaptation_tau(dyn, SURVIVAL, before)[3] == pytest.approx(base[0])
    wider = dataclasses.replace(dyn, full_draft=2.0)  # the full update doubles the drafting time
    assert adaptation_draft(wider, kept)[3] == 2.0 and adaptation_draft(wider, before)[3] == 1.0
    harmful = dataclasses.replace(dyn, harm_probability=1.0)
    assert adaptation_tau(harmful, SURVIVAL, record)[0] < base[0]


def test_fit_adaptation_recovers_the_dynamics() -> None:
    truth = AdaptationDynamics(headroom=0.3, head_reach=0.5, head_rate=0.4, full_rate=0.7)
    rng = np.random.default_rng(3)
    records = []
    for seed in range(3):
        r = stream(seed)
        tau = adaptation_tau(truth, SURVIVAL, r) * np.exp(0.01 * rng.standard_normal(len(r.tau)))
        records.append(dataclasses.replace(r, tau=tau))
    fitted = fit_adaptation(SURVIVAL, records, headroom_starts=(0.1,))
    for name, tolerance in (("headroom", 0.03), ("full_rate", 0.05), ("head_reach", 0.1), ("head_rate", 0.1)):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), abs=tolerance), name
    for r in records:  # head reach and rate trade off a little; the predicted stream does not move
        assert np.abs(adaptation_tau(fitted, SURVIVAL, r) - adaptation_tau(truth, SURVIVAL, r)).max() < 0.03
    assert fitted.query_noise == pytest.approx(0.01, abs=0.005)
    assert fitted.head_capacity == AdaptationDynamics().head_capacity  # what is not fitted stays
    with pytest.raises(InputError):
        fit_adaptation(SURVIVAL, [])


def test_stream_has_equal_domain_shares_a_shifting_mix_and_seeded_lengths() -> None:
    prompts = {d: [[i, j] for j in range(3)] for i, d in enumerate(DOMAINS)}
    plan = StreamPlan(queries=40, shift=20, min_new_tokens=48, max_new_tokens=64, sim_seeds=1,
                      retime_repeats=0)
    stream_ = build_stream(prompts, plan, seed=0)
    domains = [d for d, _, _ in stream_]
    assert all(domains.count(d) == 10 for d in DOMAINS)  # equal shares of the whole stream
    before, after = domains[:20], domains[20:]
    assert [before.count(d) for d in DOMAINS] == [8, 8, 2, 2]  # FIRST_MIX, then the rest of each share
    assert [after.count(d) for d in DOMAINS] == [2, 2, 8, 8]
    assert [list(c.items()) for c in phase_counts(plan)] == [list(zip(DOMAINS, n, strict=True))
                                                             for n in ([8, 8, 2, 2], [2, 2, 8, 8])]
    assert shifted_queries(phase_counts(plan)) == {"shifted": ["prose", "text"], "queries": [20, 40]}
    lengths = [n for _, _, n in stream_]
    assert min(lengths) >= 48 and max(lengths) <= 64 and len(set(lengths)) > 5
    assert build_stream(prompts, plan, seed=0) == stream_ != build_stream(prompts, plan, seed=1)
    code = [t for d, t, _ in stream_ if d == "code"]
    assert code[:4] == [[0, 0], [0, 1], [0, 2], [0, 0]]  # in order, reused once all are taken
    with pytest.raises(InputError, match="give a multiple of 4 queries"):
        phase_counts(dataclasses.replace(plan, queries=42))
    with pytest.raises(InputError, match="shift earlier"):
        phase_counts(dataclasses.replace(plan, shift=36))
    assert QUICK_PLAN.queries == 2 * QUICK_PLAN.shift < DEFAULT_PLAN.queries == 2000  # the paper's, smaller
    assert (QUICK_PLAN.min_new_tokens, QUICK_PLAN.max_new_tokens) == (DEFAULT_PLAN.min_new_tokens,
                                                                      DEFAULT_PLAN.max_new_tokens) == (48, 64)


TOY_QUICK_STREAM = (["code", "tests", "tests", "prose", "tests", "code", "code", "text", "text", "prose",
                     "text", "prose", "text", "tests", "code", "prose"],
                    [52, 61, 59, 48, 54, 62, 57, 48, 61, 60, 62, 50, 49, 62, 48, 57])
"""The quick plan's toy stream at seed 0 (domains, new tokens) as the committed results were built."""
TOY_PAPER_STREAM = "6b1d44a8e06aea16d066ea747d65a1fc4a60f56a6d97f70dfefec4dcd4b5f7fd"
"""SHA-256 of the paper plan's toy domain sequence at seed 0 (JSON), that of ``adapt_live_overlap``."""


def test_the_toy_stream_is_the_one_the_committed_results_served() -> None:
    prompts = {d: [[i, j] for j in range(3)] for i, d in enumerate(DOMAINS)}
    quick = build_stream(prompts, QUICK_PLAN, seed=0)
    assert ([d for d, _, _ in quick], [n for _, _, n in quick]) == TOY_QUICK_STREAM
    domains = [d for d, _, _ in build_stream(prompts, DEFAULT_PLAN, seed=0)]
    assert hashlib.sha256(json.dumps(domains).encode()).hexdigest() == TOY_PAPER_STREAM
    assert result_name("toy-16m", quick=True, overlap=True) == "adapt_live_quick_overlap"


def test_two_domains_stream_the_first_then_the_second_then_the_first_again() -> None:
    prompts = {"chat": [[1, j] for j in range(5)], "code": [[2, j] for j in range(2)]}
    plan = StreamPlan(queries=16, shift=8, min_new_tokens=4, max_new_tokens=6, sim_seeds=1, retime_repeats=0)
    phases = phase_counts(plan, tuple(prompts))
    assert phases == [{"chat": 8, "code": 0}, {"chat": 0, "code": 4}, {"chat": 4, "code": 0}]
    stream_ = build_stream(prompts, plan, seed=0)
    assert [d for d, _, _ in stream_] == ["chat"] * 8 + ["code"] * 4 + ["chat"] * 4
    assert [t for d, t, _ in stream_ if d == "code"] == [[2, 0], [2, 1], [2, 0], [2, 1]]  # reused in order
    assert shifted_queries(phases) == {"shifted": ["code"], "queries": [8, 12]}
    assert phase_text(phases) == "queries 1-8: chat 100%; queries 9-12: code 100%; queries 13-16: chat 100%"
    # the later phases share the rest equally, the earlier ones taking the remainder; no multiple needed
    odd = phase_counts(dataclasses.replace(plan, queries=11, shift=4), ("chat", "code"))
    assert [sum(c.values()) for c in odd] == [4, 4, 3] and [c["code"] for c in odd] == [0, 4, 0]
    # early and late: the shifted domain's queries in the halves of its own phase, not of the return
    figures = summary([d for d, _, _ in stream_], list(range(16)), [10] * 16, [0] * 16, [10] * 16, [8, 12],
                      ["code"])
    assert (figures["shifted_tau_early"], figures["shifted_tau_late"]) == (8.5, 10.5)
    assert result_name("smollm2-135m", quick=True, overlap=False) == "adapt_live_smollm2-135m_quick"
    config = {"plan": dataclasses.asdict(QUICK_PLAN), "model": "smollm2-135m"}
    command = RENDERERS["adapt_live"].command("adapt_live_smollm2-135m_quick", config)
    assert command == "specblock adapt-live --model smollm2-135m --quick"


@pytest.mark.parametrize(("queries", "shift", "domains", "message"), [
    (16, 15, ("chat", "code"), "fewer than one query for each of the 2 phases after it: shift earlier"),
    (16, 8, ("chat",), "a shifting stream needs two domains"),
    (18, 8, DOMAINS, "give a multiple of 4 queries"),
    (16, 16, ("chat", "code"), "give a shift between 0 and the query count"),
])
def test_bad_stream_plans_are_refused_in_one_line(queries: int, shift: int, domains: tuple[str, ...],
                                                  message: str) -> None:
    with pytest.raises(InputError, match=message) as error:
        phase_counts(StreamPlan(queries=queries, shift=shift, min_new_tokens=4, max_new_tokens=6, sim_seeds=1,
                                retime_repeats=0), domains)
    assert "\n" not in str(error.value)


def test_stream_record_and_summary() -> None:
    rows = [{"domain": "code", "tau": 1.5, "update": None, "reverted": False, "checkpoint": True,
             "checkpoint_previous": False},
            {"domain": "prose", "tau": 2.0, "reverted": True, "checkpoint": False,
             "checkpoint_previous": False,
             "update": {"kind": "full", "fill": 0.5, "shares": {"prose": 0.25, "code": 0.75}}}]
    record = record_of(rows, ["code", "prose"])
    assert record.domain.tolist() == [0, 1] and record.action.tolist() == [SKIP, FULL]
    assert record.fill.tolist() == [0.0, 0.5] and record.share.tolist() == [[0, 0], [0.75, 0.25]]
    assert record.revert.tolist() == [False, True] and record.checkpoint.tolist() == [True, False]
    figures = summary(["code", "prose", "prose", "code", "text", "prose"], [1, 7, 2, 9, 3, 5],
                      [10, 10, 10, 10, 10, 10], [0, 0, 0, 0, 6, 0], [10] * 6, window=(2, 6),
                      shifted=("prose", "text"))
    assert figures["shifted_tau_early"] == 2 and figures["shifted_tau_late"] == 4  # code is not shifted
    assert figures["tokens_per_second"] == pytest.approx(60 / 12)


def test_drafting_shapes_and_update_costs_are_reported_as_costed() -> None:
    shapes = [{"starts": 1, "blocks": 2}, {"starts": 1, "blocks": 2}]
    assert mean_shape(load_profile(PAPER_PROFILE), shapes) == pytest.approx(
        {"blocks": 2.0, "starts": 1.0, "draft_ms": 7.0})  # the paper's SpecBlock M=2 drafting time
    seconds = {"head": 4.0, "full": 32.0}
    assert "window (1.00 s head, 2.00 s full)" in update_text(
        {"update_seconds": seconds, "update_windows": {"head": 4, "full": 16}})
    assert "full-buffer times (4.00 s head, 32.00 s full)" in update_text({"update_seconds": seconds})
    assert "one-window time (1.50 s head, 3.00 s full)" in update_text(
        {"update_seconds": seconds, "update_windows": {"head": 4, "full": 16},
         "update_single": {"head": 1.5, "full": 3.0}})


def test_head_updates_can_converge_on_a_worse_drafter() -> None:
    worse = AdaptationDynamics(headroom=0.5, head_reach=-1.0, head_rate=1.0, full_rate=1.0,
                               harm_probability=0.0)
    base = 1.0 + SURVIVAL[0, 1:].sum()
    code = np.array([[1.0, 0.0]] * 3)
    heads = AdaptRecord(np.zeros(3, int), np.ones(3), np.full(3, HEAD), np.ones(3), code, np.zeros(3, bool),
                        np.zeros(3, bool))
    tau = adaptation_tau(worse, SURVIVAL, heads)
    assert tau[0] == pytest.approx(1.0 + level_rates(SURVIVAL[0], 1.5)) and tau[0] < base  # moved to 1 + 0.5
    after_full = dataclasses.replace(heads, action=np.array([FULL, HEAD, SKIP]))
    tau = adaptation_tau(worse, SURVIVAL, after_full)
    assert tau[0] > base and tau[1] == pytest.approx(1.0 + level_rates(SURVIVAL[0], 1.5))  # gain given back
    with pytest.raises(InputError, match="head_reach"):
        AdaptationDynamics(head_reach=-1.5)


def test_fit_adaptation_recovers_how_updates_move_the_drafting_time() -> None:
    truth = AdaptationDynamics(headroom=0.3, head_reach=0.5, head_rate=0.4, full_rate=0.7, head_draft=1.3,
                               full_draft=0.8)
    records = []
    for seed in range(3):
        r = stream(seed)
        records.append(dataclasses.replace(r, tau=adaptation_tau(truth, SURVIVAL, r),
                                           draft=adaptation_draft(truth, r)))
    fitted = fit_adaptation(SURVIVAL, records, headroom_starts=(0.1,))
    assert fitted.head_draft == pytest.approx(1.3, abs=0.02)
    assert fitted.full_draft == pytest.approx(0.8, abs=0.02)
    record = records[0]
    assert adaptation_draft(truth, record)[:4].tolist() == [1.0] * 4  # nothing moves before the first update
    reverted = dataclasses.replace(record, revert=np.arange(len(record.tau)) == 4)
    assert adaptation_draft(truth, reverted)[5] == 1.0  # back to the drafter as profiled
    no_draft = fit_adaptation(SURVIVAL, [dataclasses.replace(r, draft=None) for r in records],
                              headroom_starts=(0.1,))
    assert no_draft.head_draft == 1.0 and no_draft.full_draft == 1.0


def test_each_query_gets_the_tree_cost_ratio_of_its_own_shapes_and_trees() -> None:
    paper = load_profile(PAPER_PROFILE)
    one, two = {"starts": 1, "blocks": 1}, {"starts": 1, "blocks": 2}
    rows = [{"proposals": 2, "domain": "code", "tau": 1.0, "update": None, "reverted": False,
             "checkpoint": False, "checkpoint_previous": False, "tree_nodes": 9.0, "iterations": 4},
            {"proposals": 1, "domain": "code", "tau": 1.0, "update": None, "reverted": False,
             "checkpoint": False, "checkpoint_previous": False, "tree_nodes": 15.0, "iterations": 2}]
    base = mean_shape(paper, [one])["draft_ms"]
    assert tree_nodes(rows) == pytest.approx(11.0)  # per iteration, not per query
    add_draft_ratios(rows, [one, one, two], paper, base, 9.0, 300.0)
    assert rows[0]["draft_ratio"] == pytest.approx(1.0)
    wider = paper.verify_seconds(15.0, 300.0) - paper.verify_seconds(9.0, 300.0)
    assert wider > 0  # a larger tree costs its verify forward more, charged in units of drafting time
    drafting = paper.draft_seconds("specblock", **two)
    assert rows[1]["draft_ratio"] == pytest.approx((drafting + wider) * 1e3 / base)
    assert record_of(rows, ["code"]).draft.tolist() == [r["draft_ratio"] for r in rows]


def test_samples_retimed_before_a_stream_replace_the_profiles(llama_dir) -> None:
    from experiments.adapt.report import retime_text
    from experiments.adapt.serve import retime, with_samples
    from real_engine.drafters.specblock import SpecBlock
    from real_engine.model import load_model

    target = load_model(llama_dir)
    timed = retime(target, SpecBlock.for_target(target, seed=0), repeats=1, seed=0)
    assert set(timed["update"]) == set(timed["update_single"]) == {"head", "full"}
    # a stream right after another reuses the decoding timed after it and times its updates alone
    assert set(retime(target, SpecBlock.for_target(target, seed=0), repeats=1, seed=0, decoding=False)) == {
        "update", "update_single", "update_windows"}
    paper = load_profile(PAPER_PROFILE)
    assert with_samples(paper, None) is paper
    retimed = with_samples(paper, timed)
    assert retimed.update_seconds("full") == timed["update"]["full"][0]
    assert retimed.update_windows == timed["update_windows"]
    row = timed["vanilla"][0]
    assert retimed.vanilla_seconds(row["context"]) == pytest.approx(row["seconds"][0])
    [drafted] = [r["seconds"] for r in timed["draft"]["specblock"] if (r["starts"], r["blocks"]) == (2, 2)]
    assert retimed.draft_seconds("specblock", starts=2, blocks=2) == pytest.approx(float(np.median(drafted)))
    assert retimed.draft_seconds("eagle", depth=3) == paper.draft_seconds("eagle", depth=3)  # kept
    assert retimed.prefill_cost(32) > 0 == paper.prefill_cost(32)
    one = timed["update_single"]["head"][0]
    assert retimed.update_cost("head", fill=0.2, windows=1.0) == pytest.approx(one)
    # the never stream's re-timing times no update: the profile's update samples stay
    decoding = with_samples(paper, {k: v for k, v in timed.items() if not k.startswith("update")})
    assert decoding.update_seconds("full") == paper.update_seconds("full")
    assert decoding.update_windows == paper.update_windows
    assert decoding.vanilla_seconds(row["context"]) == retimed.vanilla_seconds(row["context"])
    never = {"head": 4.0, "full": 30.0, "head_single": 1.0, "full_single": 2.0,
             "windows": {"head": 4, "full": 16}}
    glance = {"vanilla_ms": 5.0, "verify9_ms": 8.0, "draft_ms": 9.0, "prefill128_ms": 40.0}
    costed = {"update_seconds": {}, "retimed": {"never": {**never, **glance}}, "shipped": glance}
    assert "(one window / full buffer: never 1.00 / 4.00 s head on 4 windows, 2.00 / 30.00 s full on 16)" \
        in update_text(costed)
    assert "shipped profile 5.00 / 8.00 / 9.00 / 40.0" in retime_text(costed)
    assert retime_text({"update_seconds": {}}) == ""
    slow = {**glance, "vanilla_ms": 6.0}
    bracketed = retime_text({**costed, "bracket": {"never": {"before": glance, "after": slow}}})
    assert "never before 5.00 / 8.00" in bracketed and "never after 6.00 / 8.00" in bracketed


def test_a_stream_bracketed_by_two_timings_costs_their_pooled_median(llama_dir) -> None:
    from experiments.adapt.report import bracket_ms, decode_ms
    from experiments.adapt.serve import pooled, retime, stream_samples, with_samples
    from real_engine.drafters.specblock import SpecBlock
    from real_engine.model import load_model

    target = load_model(llama_dir)
    net = SpecBlock.for_target(target, seed=0)
    before = retime(target, net, repeats=1, seed=0)
    after = retime(target, net, repeats=2, seed=0, updates=False)
    assert "update" not in after
    both = pooled(before, after)
    assert both["update"] is before["update"]  # the updates are timed once, before the stream
    paper = load_profile(PAPER_PROFILE)
    context = before["vanilla"][0]["context"]
    seconds = [s for t in (before, after) for row in t["vanilla"] if row["context"] == context
               for s in row["seconds"]]
    assert len(seconds) == 3
    assert with_samples(paper, both).vanilla_seconds(context) == pytest.approx(float(np.median(seconds)))
    shapes = [{"starts": 1.0, "blocks": 1.0}]
    sides = bracket_ms(paper, {"before": before, "during": [], "after": after}, shapes)
    assert sides["before"] == decode_ms(with_samples(paper, before), shapes)
    # After the stream: its own decoding timings, the updates timed before it (none are timed after).
    assert sides["after"] == decode_ms(with_samples(paper, {**before, **after}), shapes) != sides["before"]
    # Timings between queries count beside the two around the stream; each side is reported on its own.
    during = [retime(target, net, repeats=1, seed=0, updates=False) for _ in range(2)]
    timed = {"before": before, "during": during, "after": after}
    pooled_all = stream_samples(timed)
    assert len([s for row in pooled_all["vanilla"] if row["context"] == context for s in row["seconds"]]) == 5
    assert bracket_ms(paper, timed, shapes)["during"] == decode_ms(
        with_samples(paper, {**before, **pooled(*during)}), shapes)


def test_machine_speed_is_each_retimings_cost_over_the_pooled_one(llama_dir) -> None:
    from experiments.adapt.serve import machine_speed, retime, stream_samples, with_samples
    from real_engine.drafters.specblock import SpecBlock
    from real_engine.model import load_model

    target = load_model(llama_dir)
    net = SpecBlock.for_target(target, seed=0)
    before = retime(target, net, repeats=1, seed=0)
    during = retime(target, net, repeats=1, seed=0, updates=False)
    slow = {**during, "vanilla": [{**row, "seconds": [3 * s for s in row["seconds"]]}
                                  for row in during["vanilla"]]}
    after = retime(target, net, repeats=1, seed=0, updates=False)
    paper = load_profile(PAPER_PROFILE)
    context = before["vanilla"][0]["context"]

    def cost(p) -> float:
        return float(p.vanilla_seconds(context))

    timed = {"before": before, "during": [during, slow], "at": [3, 6], "after": after}
    speed = machine_speed(paper, timed, cost, 10)
    assert speed["at"] == [0, 3, 6, 10]
    base = cost(with_samples(paper, stream_samples(timed)))
    assert speed["factor"][0] == pytest.approx(cost(with_samples(paper, before)) / base)
    assert speed["factor"][2] == pytest.approx(3 * speed["factor"][1])  # the slow moment, three times dearer
    assert speed["factor"][3] == pytest.approx(cost(with_samples(paper, {**before, **after})) / base)


def test_simulated_queries_run_at_the_machine_speed_between_retimings() -> None:
    from experiments.adapt.predict import at_machine_speed

    simulated = {"tau": [2.0] * 4, "tokens_per_second": [100.0] * 4}
    out = at_machine_speed(simulated, {"at": [0, 4], "factor": [1.0, 2.0]})
    assert out["tokens_per_second"] == pytest.approx([100 / 1.125, 100 / 1.375, 100 / 1.625, 100 / 1.875])
    assert out["tau"] == simulated["tau"]
    assert at_machine_speed(simulated, {"at": [0, 2, 4], "factor": [1.0, 1.0, 1.0]}) == simulated


FIGURES = ("tokens_per_second", "tokens_per_second_ci", "tau", "updates", "update_seconds",
           "simulated_tokens_per_second", "simulated_error", "simulated_tau", "shifted_tau_early",
           "shifted_tau_late")


@pytest.mark.slow
@pytest.mark.parametrize(("overlap", "domains", "retime"),
                         [(False, DOMAINS, 0), (True, DOMAINS, 0), (False, ("prose", "code"), 1)])
def test_a_tiny_stream_gives_every_policy_its_figures(tmp_path, overlap: bool,
                                                      domains: tuple[str, ...], retime: int) -> None:
    """The shipped target and SpecBlock drafter (a random one never fills the head buffer) on 8 queries,
    updates waited for or trained beside decoding on their own core; over the four domains, or over two
    as a real model's stream (the first, the second, the first again), its samples re-timed."""
    from experiments.adapt.live import POLICIES, run

    if overlap and len(usable_cores()) < 2:
        pytest.skip("training beside decoding needs two cores")
    plan = StreamPlan(queries=8, shift=4, min_new_tokens=4, max_new_tokens=6, sim_seeds=2,
                      retime_repeats=retime)
    result = run(TARGET, MODELS / "specblock", CPU_PROFILE, plan, 0, "tiny", results=tmp_path,
                 overlap=overlap, domains=domains)
    assert (result["overlap"] is not None) == overlap and os.sched_getaffinity(0) == usable_cores()
    assert len(result["mix"]["phases"]) == (2 if domains == DOMAINS else 3)
    if domains != DOMAINS:
        assert result["stream"] == ["prose"] * 4 + ["code"] * 2 + ["prose"] * 2
        assert result["mix"]["shifted"] == ["code"] and set(result["acceptance_domains"]) == set(domains)
        assert "queries 5-6: code 100%" in (tmp_path / "tiny.md").read_text()
    if overlap:
        beside = result["overlap"]
        assert set(beside["slowdown"]) == {"head", "full"} and min(beside["slowdown"].values()) >= 1.0
        assert all(len(beside["seconds"][k]) == 3 for k in ("alone", "head", "full"))
    assert 0 <= result["signals"]["head_share"] <= 1
    if retime:  # updates re-timed before each training policy's stream; the never stream trains none
        assert list(result["simulator_profile"]["retimed"]) == list(POLICIES)[1:]
        bracket = result["simulator_profile"]["bracket"]
        assert set(bracket) == set(POLICIES)
        for first, then in itertools.pairwise(POLICIES):  # decoding timed once between two streams
            steps = ("vanilla_ms", "verify9_ms", "prefill128_ms")  # drafting: at each stream's own shapes
            assert [bracket[then]["before"][k] for k in steps] == [bracket[first]["after"][k] for k in steps]
    figures = result["figures"]
    assert list(POLICIES) == ["never", "always_head", "always_full", "epsilon_greedy", "cost_aware_bandit"]
    assert list(figures["policies"]) == list(POLICIES)
    for name, f in figures["policies"].items():
        adjusted = {"tokens_per_second_at_never_speed", "tokens_per_second_at_never_speed_ci"}
        assert set(f) == set(FIGURES) | (adjusted if retime else set()), name
        low, high = f["tokens_per_second_ci"]
        assert low <= f["tokens_per_second"] <= high, name
        rows = result["policies"][name]["rows"]
        assert [r["new_tokens"] for r in rows] == result["new_tokens"]  # each query its own length
        assert sum(f["updates"].values()) == sum(len(r["trained"]) for r in rows), name
        assert f["update_seconds"] == pytest.approx(sum(r["train_seconds"] for r in rows))
        assert overlap or all(r["update_seconds"] == r["train_seconds"] for r in rows)
        assert not overlap or all(r["update_seconds"] == 0 for r in rows)
        assert f["simulated_error"] == pytest.approx(
            f["simulated_tokens_per_second"] / f["tokens_per_second"] - 1)
    updates = {name: f["updates"] for name, f in figures["policies"].items()}
    assert updates["never"] == {"head": 0, "full": 0}
    assert updates["always_head"]["full"] == 0 < updates["always_head"]["head"]
    assert updates["always_full"]["head"] == 0 < updates["always_full"]["full"]
    errors = sorted(abs(f["simulated_error"]) for f in figures["policies"].values())
    assert figures["fidelity_error"] == pytest.approx(errors[2])  # the median of five
    assert sorted(result["new_tokens"]) != [4] * 8 and set(result["new_tokens"]) <= {4, 5, 6}
    assert all((tmp_path / f"tiny.{suffix}").is_file() for suffix in ("json", "md", "png"))


def test_the_live_stream_loads_the_target_in_the_given_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from experiments.adapt import live

    class Loaded(Exception):
        pass

    def fake(folder: object, dtype: torch.dtype = torch.float32) -> None:
        raise Loaded(dtype)

    monkeypatch.setattr(live, "load_model", fake)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(Loaded) as caught:
            live.run(TARGET, MODELS / "specblock", CPU_PROFILE, QUICK_PLAN, 0, "x", dtype="bfloat16")
    finally:
        torch.set_num_threads(threads)  # the stream pins one thread before it loads
    assert caught.value.args[0] is torch.bfloat16
