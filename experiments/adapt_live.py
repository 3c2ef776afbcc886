"""Live online adaptation on a stream whose domain mix shifts, and the simulator's prediction of it.

1. **Stream**: held-out prompts of each ``data/prompts/<domain>.jsonl``, its evaluation half first,
   then its calibration half (no prompt is used twice; the stream is long enough that an update's
   cost can pay back, as in the paper's 2K-query streams): ``first`` queries of the first domain
   (code), then ``mixed`` queries taking every domain in turn. Each query generates
   ``max_new_tokens`` tokens, greedy.
2. **Engine**: the SpecBlock drafter loaded afresh for each policy (``never``, ``always`` and
   ``cost_aware_bandit`` with their default parameters) serves the same stream through its own
   ``real_engine.adapt.StreamServer``, one policy after another; updates are waited for before the
   next query and everything is timed on the process CPU clock with one torch thread (the CPU clock
   is what the shipped cost profile uses). The drafter's tree budget equals the simulator's 16
   positions.
3. **Fit**: ``simulator.adaptation.fit_adaptation`` fits the ``AdaptationDynamics`` to the measured tau
   of all three streams, with the acceptance model replayed from the ``never`` stream's iterations,
   and how updates move the drafting time (``head_draft``, ``full_draft``) to each query's recorded
   SpecBlock shapes, costed by the profile relative to the ``never`` stream's mean.
4. **Simulation**: ``AdaptStream`` serves the same domain sequence (one phase per query) with each
   policy, ``seeds`` times, on the shipped CPU profile with the samples this stream reaches re-timed
   right before, between every ``StreamPlan.retime_every`` queries of, and right after that policy's stream,
   all timings pooled (``retime``, ``pooled``, ``stream_samples``; ``StreamPlan.retime_repeats``):
   verification and plain steps, SpecBlock drafting and query starts on the part of the grid the
   stream uses, and (before the stream only) SpecBlock's update
   (``real_engine.profile.specblock_update_samples``) on the ``never`` stream's last buffered queries
   once it has run (synthetic feedback before). Drafting costs the SpecBlock
   series at the shapes the drafter really ran on the ``never`` stream (block forwards and start
   nodes, which its rank head decides: ``SpecBlockDrafter.shapes``), moved by updates as the fitted
   dynamics say; verification costs the tree sizes the replayed iterations verified
   (``verified_shares``); an update is linear in the query windows of the buffer it trains on
   between the one-window and full-buffer times (``CostProfile.update_cost``: the update trains one
   window per buffered query); each query's start costs the prefill at its prompt length
   (``CostProfile.prefill_cost``: the target's prefill and the drafter's begin, with its feedback
   recording). No time measured on the stream enters the prediction (drafting is costed by the
   profile at the recorded shapes); the report adds each policy's shapes beside the engine's time
   per iteration. Per-query means are compared with the engine's.

Writes ``benchmarks/results/<name>.json`` (provenance, per-query rows, fitted dynamics, errors), ``.md``
and ``.png``. Modules: this one (plan, stream, the whole run), ``experiments.adapt_serve`` (the engine's
streams and re-timing), ``experiments.adapt_predict`` (the simulator's prediction) and
``experiments.adapt_report`` (tables and plot). Run: ``specblock adapt-live`` (``--quick`` for a
one-minute smoke run).
"""

from __future__ import annotations

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
from core.names import DOMAINS
from core.paths import RESULTS
from experiments.adapt_plan import StreamPlan
from experiments.adapt_predict import add_draft_ratios, errors, mean_shape, record_of, simulate, summary
from experiments.adapt_report import bracket_ms, decode_ms, markdown, plot
from experiments.adapt_serve import DRAFT, serve, stream_samples, with_samples
from experiments.provenance import save_result
from real_engine.adapt import AdaptConfig
from real_engine.model import load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts
from simulator.adaptation import AdaptationDynamics, adaptation_tau, fit_adaptation
from simulator.replay import TraceReplay

POLICIES = ("never", "always", "cost_aware_bandit")
"""The policies compared by default, with their default parameters (``never`` must always be there: its
stream gives the traces and the drafting shapes the simulator replays)."""
MAX_PROMPT = 192  # prompt tokens kept (each prompt's last ones)


def build_stream(
    prompts: Mapping[str, Sequence[Sequence[int]]], first: int, mixed: int, order: Sequence[str] = DOMAINS
) -> list[tuple[str, list[int]]]:
    """``first`` prompts of ``order[0]``, then ``mixed`` taking the domains of ``order`` in turn; no
    prompt is used twice."""
    taken = dict.fromkeys(order, 0)
    stream = []
    for domain in [order[0]] * first + [order[i % len(order)] for i in range(mixed)]:
        if taken[domain] >= len(prompts[domain]):
            raise InputError(
                f"the stream needs more {domain} prompts than the {len(prompts[domain])} held "
                "out: shorten the stream"
            )
        stream.append((domain, list(prompts[domain][taken[domain]])))
        taken[domain] += 1
    return stream


def default_policies() -> dict[str, dict[str, Any]]:
    """``POLICIES`` by name, as policy-file content with default parameters."""
    return {kind: {"kind": kind, "params": {}} for kind in POLICIES}


def run(
    model_dir: Path,
    drafter_dir: Path,
    profile_path: Path,
    plan: StreamPlan,
    seed: int,
    name: str,
    policies: Mapping[str, Mapping[str, Any]] | None = None,
    results: Path = RESULTS,
) -> dict[str, Any]:
    """The whole experiment (see the module doc) for ``policies`` (name -> policy-file content;
    default ``POLICIES``), written under ``results``; returns the saved result."""
    policies = dict(policies or default_policies())
    if "never" not in policies:
        raise InputError(
            "the adaptation experiment needs the never policy (its stream calibrates the "
            "simulator): include it"
        )

    torch.set_num_threads(1)
    target = load_model(model_dir)
    tokenizer = Tokenizer.load(model_dir)
    count = plan.first + -(-plan.mixed // len(DOMAINS))
    held = [p for part in ("evaluation", "calibration")
            for p in load_prompts(DOMAINS, count, tokenizer.encode, part, MAX_PROMPT)]
    by_domain = {d: [p.tokens for p in held if p.domain == d] for d in DOMAINS}
    stream = build_stream(by_domain, plan.first, plan.mixed)
    adapt = AdaptConfig(clock="cpu", seed=seed)
    rows, traces, drafted, timed = serve(target, drafter_dir, stream, plan, adapt, seed, policies)
    shapes = drafted["never"]
    profile = load_profile(profile_path)
    base_draft = mean_shape(profile, shapes)["draft_ms"]  # what the simulator charges before any update
    for kind in policies:
        add_draft_ratios(rows[kind], drafted[kind], profile, base_draft)
    acceptance = TraceReplay.from_traces(pd.DataFrame(traces))
    domains = list(acceptance.domains)
    survival = acceptance.survival(acceptance.cap)
    base = AdaptationDynamics(head_capacity=adapt.head_capacity, full_capacity=adapt.full_capacity)
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
    lengths = [len(tokens) for _, tokens in stream]
    stream_domains = [d for d, _ in stream]
    result: dict[str, Any] = {
        "stream": stream_domains,
        "policies": {},
        "fit": {
            "dynamics": asdict(fitted),
            "paper": asdict(AdaptationDynamics()),
            "rmse_tau": rmse(fitted),
            "rmse_tau_paper": rmse(base),
        },
        "simulator_profile": costed,
        "acceptance_domains": domains,
    }
    prompt_range = (min(lengths), max(lengths))
    profiles = {kind: with_samples(profile, stream_samples(timed[kind]) if kind in timed else None)
                for kind in policies}
    if timed:
        costed["bracket"] = {kind: bracket_ms(profile, t, shapes) for kind, t in timed.items()}
        costed["retimed"] = {kind: {**p.fits["update"], "windows": dict(p.update_windows),
                                    **{f"{k}_single": v for k, v in p.fits["update_single"].items()},
                                    **decode_ms(p, shapes)}
                             for kind, p in profiles.items()}
        costed["shipped"] = decode_ms(profile, shapes)
    sims = {
        kind: simulate(spec, stream_domains, acceptance, profiles[kind], fitted, plan, prompt_range, seed,
                       shapes)
        for kind, spec in policies.items()
    }
    for kind in policies:
        sim = sims[kind]
        column = {
            key: [r[key] for r in rows[kind]]
            for key in ("tau", "tokens_per_second", "update_seconds", "new_tokens")
        }
        measured = summary(
            stream_domains,
            column["tau"],
            column["tokens_per_second"],
            column["update_seconds"],
            column["new_tokens"],
            plan.first,
        )
        simulated = summary(
            stream_domains,
            sim["tau"],
            sim["tokens_per_second"],
            sim["update_seconds"],
            [plan.max_new_tokens] * len(stream),
            plan.first,
        )
        kinds = [r["update"]["kind"] for r in rows[kind] if r["update"] is not None]
        result["policies"][kind] = {
            "rows": rows[kind],
            "simulated": sim,
            "measured": measured,
            "simulated_summary": simulated,
            "updates": {k: kinds.count(k) for k in ("head", "full")},
            "drafted": mean_shape(profile, drafted[kind]),
            "errors": {key: errors(column[key], sim[key]) for key in ("tau", "tokens_per_second")},
        }
    config = {
        "plan": asdict(plan),
        "model": str(model_dir),
        "drafter": str(drafter_dir),
        "draft": DRAFT,
        "profile": str(profile_path),
        "max_prompt_tokens": MAX_PROMPT,
        "policies": policies,
        "adapt": asdict(adapt),
        "clock": "cpu (process seconds, one torch thread)",
    }
    save_result(name, result, config, seed, directory=results)
    write_text(results / f"{name}.md", markdown(result, config))
    plot(result, results / f"{name}.png", plan.first)
    return result
