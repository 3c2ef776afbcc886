"""Live online adaptation on a stream whose domain mix shifts, and the simulator's prediction of it.

1. **Stream** (the paper's shape): ``plan.queries`` queries over the model's prompt domains
   (``experiments.cli.model_domains``) in phases (``phase_counts``): the first serves ``plan.shift``
   queries, the later ones share the rest equally. Over the shipped family's four domains, two phases
   of equal shares of the stream: before the shift ``FIRST_MIX`` (mostly code and tests), after it the
   rest of each domain's share (mostly prose and text), so the drafter first adapts to one mix, then the
   mix changes. Over another model's domains (the real model's ``chat`` and ``code``), each domain alone
   in turn and then the first again (chat, then code, then back to chat), so the drafter adapts to the
   second domain and is then measured on the first again. Each phase's order is a seeded shuffle; each
   query generates a length drawn from ``plan.min_new_tokens..plan.max_new_tokens`` (48 to 64) with the
   seed, greedy. Prompts are each domain's held-out ones in the model's prompt sets, in order
   (evaluation half, then calibration half; chat rows through the model's chat template), reused in
   order when the stream needs more (``result["prompts"]`` records the distinct prompts per domain).
   The shifted domains (``shifted_queries``: those the second phase serves more than the first) are
   measured early and late within the second phase (``result["mix"]``).
2. **Engine**: the SpecBlock drafter loaded afresh for each policy (``POLICIES``: never, always with head
   updates, always with full updates, epsilon-greedy and the cost-aware bandit, default parameters)
   serves the same stream through its own ``real_engine.stream_server.StreamServer``, one policy after
   another; updates are waited for before the next query and everything is timed on the process CPU
   clock with one torch thread (the CPU clock is what the shipped cost profile uses), or with
   ``overlap`` updates train beside decoding on their own core, queries are timed on the wall clock and
   re-timing on the decoding thread's CPU clock, and ``overlap_slowdown`` measures how much slower a
   query runs beside each kind of update. The drafter's tree budget equals the simulator's 16 positions.
3. **Fit**: ``simulator.adaptation.fit_adaptation`` fits the ``AdaptationDynamics`` to the measured tau
   of all the streams, with the acceptance model replayed from the ``never`` stream's iterations,
   and how updates move the tree cost (``head_draft``, ``full_draft``) to each query's recorded
   SpecBlock shapes and verified tree nodes, costed by the ``never`` stream's re-timed profile
   relative to that stream's mean (``add_draft_ratios``).
4. **Simulation**: ``AdaptStream`` serves the same domain sequence (one phase per query) with each
   policy, ``seeds`` times, on the shipped CPU profile with the samples this stream reaches re-timed
   right before, between every ``StreamPlan.retime_every`` queries of, and right after that policy's
   stream, all timings pooled (``retime``, ``pooled``, ``stream_samples``; ``StreamPlan.retime_repeats``):
   verification and plain steps, SpecBlock drafting and query starts on the part of the grid the
   stream uses, and (before the stream only) SpecBlock's update
   (``real_engine.update_profile.specblock_update_samples``) on the ``never`` stream's last buffered queries
   once it has run (synthetic feedback before). Drafting costs the SpecBlock
   series at the shapes the drafter really ran on the ``never`` stream (block forwards and start
   nodes, which its rank head decides: ``SpecBlockDrafter.shapes``), moved by updates as the fitted
   dynamics say; verification costs the tree sizes the replayed iterations verified
   (``verified_shares``); an update is linear in the query windows of the buffer it trains on
   between the one-window and full-buffer times (``CostProfile.update_cost``: the update trains one
   window per buffered query); each query's start costs the prefill at its prompt length
   (``CostProfile.prefill_cost``: the target's prefill and the drafter's begin, with its feedback
   recording). AdaptStream's queries all generate the stream's mean length (it takes one length); the
   stream's tokens/s weighs each query's simulated rate by its real length. The machine's speed moves
   within a stream (each policy's ``machine_speed`` in the results file), so each query's simulated
   seconds are scaled by it: an iteration's cost at that policy's re-timing nearest before and after the
   query (interpolated) over its cost at all re-timings pooled (``adapt_serve.machine_speed``,
   ``adapt_predict.at_machine_speed``); the re-timings between queries wait for a boundary where no update
   trains (beside one, the decoding thread's own seconds count the trainer's contention, which the overlap
   slowdown already charges). No time measured on the stream's queries enters the prediction (drafting is
   costed by the profile at the recorded shapes); the report adds each policy's shapes beside the engine's
   time per iteration. Per-query means are compared with the engine's.
5. **Figures** (``result["figures"]``, what ``specblock adapt-live --json`` prints): per policy the
   stream's tokens/s (update seconds charged) with a 95% bootstrap interval over its queries
   (resampled within each domain, ``experiments.intervals``), tau, updates by kind, seconds spent
   training and the simulator's tokens/s with its error; the fidelity error is the median over
   policies of |simulated / measured - 1|. The policies serve in turn while the machine drifts, so
   with re-timing each also gets its tokens/s at the ``never`` stream's machine speed: each query's
   seconds divided by the machine's slowness there over the ``never`` stream's (re-timed, not
   measured on the queries): a comparison at one speed, labelled as an adjustment.

Writes ``benchmarks/results/<name>.json`` (provenance, per-query rows, fitted dynamics, errors), ``.md``,
``.png`` and ``<name>_traces.parquet`` (the ``never`` stream's iterations: the acceptance the simulator
replayed, which ``benchmarks/adapt_breakeven.py`` maps adaptation on). Modules: this one (plan, stream,
the whole run), ``experiments.adapt.serve`` (the engine's streams and re-timing),
``experiments.adapt.predict`` (the simulator's prediction) and ``experiments.adapt.report`` (tables and
plot). Run: ``specblock adapt-live`` (``--quick`` for the
16-query stream).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from core.cost_profile import load_profile, profile_measurement
from core.errors import InputError
from core.files import write_text
from core.models import TOY
from core.names import DOMAINS
from core.paths import RESULTS, repo_relative
from experiments.adapt.plan import StreamPlan
from experiments.adapt.predict import (
    add_draft_ratios,
    at_machine_speed,
    errors,
    mean_shape,
    record_of,
    simulate,
    speed_factors,
    summary,
    tree_nodes,
)
from experiments.adapt.report import bracket_ms, decode_ms, markdown, plot
from experiments.adapt.serve import (
    DRAFT,
    machine_speed,
    overlap_slowdown,
    serve,
    stream_samples,
    with_samples,
)
from experiments.intervals import REPLICATES, interval, ratio_of_sums, resamples
from experiments.provenance import save_result
from real_engine.adapt import AdaptConfig, usable_cores
from real_engine.model import load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts
from simulator.adaptation import AdaptationDynamics, adaptation_tau, fit_adaptation
from simulator.replay import TraceReplay
from simulator.traces import save_traces

POLICIES: dict[str, dict[str, Any]] = {
    "never": {"kind": "never", "params": {}},
    "always_head": {"kind": "always", "params": {"update": "head"}},
    "always_full": {"kind": "always", "params": {"update": "full"}},
    "epsilon_greedy": {"kind": "epsilon-greedy", "params": {}},
    "cost_aware_bandit": {"kind": "cost-aware-bandit", "params": {}},
}
"""The policies compared by default, by name, as policy-file content (``never`` must always be there: its
stream gives the traces and the drafting shapes the simulator replays)."""
FIRST_MIX = dict(zip(DOMAINS, (0.4, 0.4, 0.1, 0.1), strict=True))
"""Over the shipped family's domains, each one's share of the queries before the shift; after it each
domain takes the rest of its equal share of the stream (with the shift halfway: 0.1, 0.1, 0.4, 0.4)."""
MAX_PROMPT = 192  # prompt tokens kept (each prompt's last ones)


def phase_counts(plan: StreamPlan, domains: Sequence[str] = DOMAINS) -> list[dict[str, int]]:
    """Queries of each domain in each phase of the stream: the first phase serves ``plan.shift`` queries,
    the later ones share the rest equally (the earlier ones taking the remainder). Over the shipped
    family's domains (``FIRST_MIX``'s) two phases: ``FIRST_MIX`` of the shift (largest remainders), then
    the rest of each domain's equal share of the stream; over any other ``domains`` each alone in turn,
    then the first again (chat, then code, then chat)."""
    if set(domains) == set(FIRST_MIX):
        return _mixed_phases(plan)
    if len(domains) < 2:
        raise InputError(f"a shifting stream needs two domains and the prompt sets hold {len(domains)} "
                         f"({', '.join(domains)}): add another domain's <domain>.jsonl")
    turns = [*domains, domains[0]]
    later, rest = len(turns) - 1, plan.queries - plan.shift
    if rest < later:
        raise InputError(f"a shift after {plan.shift} of {plan.queries} queries leaves fewer than one query "
                         f"for each of the {later} phases after it: shift earlier")
    lengths = [plan.shift] + [rest // later + (i < rest % later) for i in range(later)]
    return [{d: n if d == turn else 0 for d in domains} for turn, n in zip(turns, lengths, strict=True)]


def _mixed_phases(plan: StreamPlan) -> list[dict[str, int]]:
    """The shipped family's two phases: ``FIRST_MIX`` of ``plan.shift`` (largest remainders), then the rest
    of each domain's quarter of the stream."""
    if plan.queries % len(FIRST_MIX):
        raise InputError(f"a stream of {plan.queries} queries over the domains {', '.join(FIRST_MIX)}: "
                         f"give a multiple of {len(FIRST_MIX)} queries (equal shares)")
    raw = {d: FIRST_MIX[d] * plan.shift for d in FIRST_MIX}
    first = {d: int(v) for d, v in raw.items()}
    for d in sorted(FIRST_MIX, key=lambda d: first[d] - raw[d])[:plan.shift - sum(first.values())]:
        first[d] += 1
    share = plan.queries // len(FIRST_MIX)
    if any(n > share for n in first.values()):
        raise InputError(f"a shift after {plan.shift} of {plan.queries} queries leaves a domain more than "
                         "its quarter before it: shift earlier")
    return [first, {d: share - first[d] for d in FIRST_MIX}]


def shifted_queries(phases: Sequence[Mapping[str, int]]) -> dict[str, Any]:
    """What the stream shifts to: the domains the second phase serves more than the first (``shifted``),
    and the second phase's queries, ``[start, end)`` (``queries``), whose first and second halves measure
    them early and late after the shift."""
    start = sum(phases[0].values())
    return {"shifted": [d for d in phases[0] if phases[1][d] > phases[0][d]],
            "queries": [start, start + sum(phases[1].values())]}


def build_stream(prompts: Mapping[str, Sequence[Sequence[int]]], plan: StreamPlan, seed: int
                 ) -> list[tuple[str, list[int], int]]:
    """(domain, prompt, new tokens) per query over the domains of ``prompts`` (in its order): each phase
    of ``phase_counts`` in a seeded order, each domain's prompts in order (reused from the first once all
    are taken), lengths drawn from the plan's range."""
    rng = np.random.default_rng(seed)
    domains = [d for counts in phase_counts(plan, tuple(prompts)) for d in rng.permutation(
        [d for d in counts for _ in range(counts[d])]).tolist()]
    lengths = rng.integers(plan.min_new_tokens, plan.max_new_tokens + 1, size=len(domains))
    taken = dict.fromkeys(prompts, 0)
    stream = []
    for domain, length in zip(domains, lengths, strict=True):
        if not prompts[domain]:
            raise InputError(f"no {domain} prompts held out: add evaluation or calibration rows to the "
                             f"model's {domain}.jsonl")
        stream.append((domain, list(prompts[domain][taken[domain] % len(prompts[domain])]), int(length)))
        taken[domain] += 1
    return stream


def default_policies() -> dict[str, dict[str, Any]]:
    """``POLICIES`` by name, as policy-file content (a copy the caller may extend)."""
    return {name: {"kind": spec["kind"], "params": dict(spec["params"])} for name, spec in POLICIES.items()}


def figures(domains: Sequence[str], rows: Sequence[Mapping[str, Any]], simulated: Mapping[str, float],
            seed: int, slowness: np.ndarray | None = None) -> dict[str, Any]:
    """One policy's stream figures: tokens/s with update seconds charged and its 95% bootstrap interval
    over the queries (resampled within each domain), tau, updates by kind, seconds spent training, and
    the simulator's tokens/s and tau (``simulated``: its ``summary``) with the tokens/s error. With
    ``slowness`` (each query's machine slowness over the ``never`` stream's, from the re-timings) also
    the tokens/s at the ``never`` stream's machine speed: an adjustment for drift, not a measurement."""
    tokens = np.array([r["new_tokens"] for r in rows], dtype=float)
    spent = tokens / np.array([r["tokens_per_second"] for r in rows]) + np.array(
        [r["update_seconds"] for r in rows])
    kinds = [kind for r in rows for kind in r["trained"]]
    measured = float(tokens.sum() / spent.sum())
    index = resamples(domains, REPLICATES, seed)
    replicates = ratio_of_sums(tokens, spent, index)
    adjusted = {} if slowness is None else {
        "tokens_per_second_at_never_speed": float(tokens.sum() / (spent / slowness).sum()),
        "tokens_per_second_at_never_speed_ci": interval(ratio_of_sums(tokens, spent / slowness, index))}
    return {
        **adjusted,
        "tokens_per_second": measured,
        "tokens_per_second_ci": interval(replicates),
        "tau": float(np.mean([r["tau"] for r in rows])),
        "updates": {k: kinds.count(k) for k in ("head", "full")},
        "update_seconds": float(sum(r["train_seconds"] for r in rows)),
        "simulated_tokens_per_second": simulated["tokens_per_second"],
        "simulated_error": simulated["tokens_per_second"] / measured - 1.0,
        "simulated_tau": simulated["tau"],
    }


def run(
    model_dir: Path,
    drafter_dir: Path,
    profile_path: Path,
    plan: StreamPlan,
    seed: int,
    name: str,
    policies: Mapping[str, Mapping[str, Any]] | None = None,
    results: Path = RESULTS,
    overlap: bool = False,
    prompts: Path = TOY.prompts,
    model: str | None = None,
    domains: Sequence[str] = DOMAINS,
    dtype: str = "float32",
) -> dict[str, Any]:
    """The whole experiment (see the module doc) for ``policies`` (name -> policy-file content;
    default ``POLICIES``), written under ``results``; returns the saved result. With ``overlap`` updates
    train beside decoding: the trainer on this process's last core, decoding on the others, queries
    timed on the wall clock (``StreamServer``; the simulator with ``AdaptStream``'s ``overlap``). The
    stream serves ``domains`` (the model's: ``experiments.cli.model_domains``), its prompts from the
    prompt sets in ``prompts`` (the model's); ``model`` names the model in the results (default: its
    folder)."""
    policies = dict(policies or default_policies())
    if "never" not in policies:
        raise InputError(
            "the adaptation experiment needs the never policy (its stream calibrates the "
            "simulator): include it"
        )
    phases = phase_counts(plan, domains)  # a plan the domains cannot take is refused before any loading

    torch.set_num_threads(1)
    target = load_model(model_dir, getattr(torch, dtype))
    tokenizer = Tokenizer.load(model_dir)
    count = max(sum(counts[d] for counts in phases) for d in domains)  # every query of a domain at most
    held = [p for part in ("evaluation", "calibration")
            for p in load_prompts(domains, count, tokenizer.encode, part, MAX_PROMPT, folder=prompts,
                                  chat_encode=tokenizer.chat_encoder())]
    by_domain = {d: [p.tokens for p in held if p.domain == d] for d in domains}
    stream = build_stream(by_domain, plan, seed)
    cores = sorted(usable_cores())
    if overlap and len(cores) < 2:
        raise InputError(f"training beside decoding needs two cores; this process may use {cores}: "
                         "run without --overlap")
    adapt = AdaptConfig(clock="wall", trainer_core=cores[-1], seed=seed) if overlap else AdaptConfig(
        clock="cpu", seed=seed)
    if overlap:  # decoding (this thread) off the trainer's core; Linux: pid 0 is this thread
        os.sched_setaffinity(0, set(cores[:-1]))
    try:
        rows, traces, drafted, timed, feedback = serve(target, drafter_dir, stream, plan, adapt, seed,
                                                       policies, overlap)
        beside = overlap_slowdown(target, drafter_dir, stream[0], feedback, adapt,
                                  max(3, 3 * plan.retime_repeats)) if overlap else None
    finally:
        if overlap:
            os.sched_setaffinity(0, set(cores))
    shapes = drafted["never"]
    profile = load_profile(profile_path)
    profiles = {kind: with_samples(profile, stream_samples(timed[kind]) if kind in timed else None)
                for kind in policies}
    # tree costs in one unit, the never stream's machine: the shipped profile prices verification and
    # drafting in other proportions than this machine's at the time of the streams
    reference = profiles["never"]
    base_draft = mean_shape(reference, shapes)["draft_ms"]  # what the simulator charges before any update
    prompt_lengths = [len(tokens) for _, tokens, _ in stream]
    lengths = [n for _, _, n in stream]
    context = float(np.mean(prompt_lengths) + np.mean(lengths) / 2)  # as AdaptStream costs a query's steps
    for kind in policies:
        add_draft_ratios(rows[kind], drafted[kind], reference, base_draft, tree_nodes(rows["never"]), context)
    acceptance = TraceReplay.from_traces(pd.DataFrame(traces))
    save_traces(pd.DataFrame(traces), results / f"{name}_traces.parquet")  # the map's acceptance too
    domains = list(acceptance.domains)
    survival = acceptance.survival(acceptance.cap)
    signals = {kind: sum(r[f"{kind}_signals"] for r in rows["never"]) for kind in ("head", "full")}
    head_share = signals["head"] / max(signals["head"] + signals["full"], 1)  # the engine's routing
    base = AdaptationDynamics(head_capacity=adapt.head_capacity, full_capacity=adapt.full_capacity,
                              head_share=head_share)
    records = [record_of(rows[kind], domains) for kind in policies]
    fitted = fit_adaptation(survival, records, base)

    def rmse(dynamics: AdaptationDynamics) -> float:
        residual = np.concatenate([adaptation_tau(dynamics, survival, r) - r.tau for r in records])
        return float(np.sqrt(np.mean(residual**2)))

    costed = {"draft_shape": mean_shape(profile, shapes),
              "update_seconds": {k: profile.update_seconds(k) for k in ("head", "full")},
              "update_windows": dict(profile.update_windows),
              "update_single": dict(profile.fits.get("update_single", {})),
              "update_model": profile_measurement(profile_path).get("update_model")}
    stream_domains = [d for d, _, _ in stream]
    shift = shifted_queries(phases)
    result: dict[str, Any] = {
        "stream": stream_domains,
        "new_tokens": lengths,
        "prompts": {d: len(by_domain[d]) for d in domains},
        "mix": {"phases": phases, **shift},
        "policies": {},
        "fit": {
            "dynamics": asdict(fitted),
            "paper": asdict(AdaptationDynamics()),
            "rmse_tau": rmse(fitted),
            "rmse_tau_paper": rmse(base),
        },
        "simulator_profile": costed,
        "acceptance_domains": domains,
        "signals": {**signals, "head_share": head_share},
        "overlap": beside,
        # what a prediction is re-computed from, beside the rows, the fit and the traces file
        "timed": timed,
        "never_shapes": shapes,
    }
    if timed:
        trained = [kind for kind, t in timed.items() if "update" in t["before"]]  # never's times none
        costed["bracket"] = {kind: bracket_ms(profile, t, shapes) for kind, t in timed.items()}
        costed["retimed"] = {kind: {**p.fits["update"], "windows": dict(p.update_windows),
                                    **{f"{k}_single": v for k, v in p.fits["update_single"].items()},
                                    **decode_ms(p, shapes)}
                             for kind, p in profiles.items() if kind in trained}
        costed["shipped"] = decode_ms(profile, shapes)
    sim_tokens = round(float(np.mean(lengths)))  # AdaptStream takes one query length: the stream's mean
    sims = {
        kind: simulate(spec, stream_domains, acceptance, profiles[kind], fitted, plan, sim_tokens,
                       (min(prompt_lengths), max(prompt_lengths)), seed, shapes,
                       None if beside is None else beside["slowdown"])
        for kind, spec in policies.items()
    }
    nodes = tree_nodes(rows["never"])

    def step_seconds(p: Any) -> float:  # an iteration at the never stream's trees, shapes and context
        return float(p.verify_seconds(nodes, context)) + mean_shape(p, shapes)["draft_ms"] / 1e3

    speeds = {kind: machine_speed(profile, t, step_seconds, len(stream)) for kind, t in timed.items()}
    slowness = {kind: speed_factors(speeds[kind], len(stream)) * step_seconds(profiles[kind])
                / step_seconds(profiles["never"]) for kind in speeds}
    sims = {kind: at_machine_speed(sim, speeds[kind]) if kind in speeds else sim
            for kind, sim in sims.items()}
    out: dict[str, Any] = {}
    for kind in policies:
        sim = sims[kind]
        keys = ("tau", "tokens_per_second", "update_seconds", "new_tokens")
        column = {key: [r[key] for r in rows[kind]] for key in keys}
        measured = summary(stream_domains, *(column[key] for key in keys), shift["queries"], shift["shifted"])
        simulated = summary(stream_domains, sim["tau"], sim["tokens_per_second"], sim["update_seconds"],
                            lengths, shift["queries"], shift["shifted"])
        out[kind] = {**figures(stream_domains, rows[kind], simulated, seed, slowness.get(kind)),
                     "shifted_tau_early": measured["shifted_tau_early"],
                     "shifted_tau_late": measured["shifted_tau_late"]}
        result["policies"][kind] = {
            "rows": rows[kind],
            "simulated": sim,
            "measured": measured,
            "simulated_summary": simulated,
            "updates": out[kind]["updates"],
            "drafted": mean_shape(profile, drafted[kind]),
            "machine_speed": speeds.get(kind),
            "errors": {key: errors(column[key], sim[key]) for key in ("tau", "tokens_per_second")},
        }
    fidelity = float(np.median([abs(f["simulated_error"]) for f in out.values()]))
    result["figures"] = {"policies": out, "fidelity_error": fidelity}
    config = {
        "plan": asdict(plan),
        "model": model or repo_relative(model_dir),
        "model_dir": repo_relative(model_dir),
        "drafter": repo_relative(drafter_dir),
        "prompts_dir": repo_relative(prompts),
        "draft": DRAFT,
        "profile": repo_relative(profile_path),
        "max_prompt_tokens": MAX_PROMPT,
        "policies": policies,
        "adapt": asdict(adapt),
        "clock": (f"wall clock with both cores busy: training beside decoding on core {adapt.trainer_core}, "
                  f"decoding on {cores[:-1]}, one torch thread each" if overlap
                  else "CPU clock (process seconds), one torch thread, updates waited for"),
    }
    save_result(name, result, config, seed, directory=results)
    write_text(results / f"{name}.md", markdown(result, config))
    plot(result, results / f"{name}.png")
    return result
