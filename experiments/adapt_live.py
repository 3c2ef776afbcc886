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
3. **Fit**: ``simulator.acceptance.fit_adaptation`` fits the ``AdaptationDynamics`` to the measured tau
   of all three streams, with the acceptance model replayed from the ``never`` stream's iterations,
   and how updates move the drafting time (``head_draft``, ``full_draft``) to each query's recorded
   SpecBlock shapes, costed by the profile relative to the ``never`` stream's mean.
4. **Simulation**: ``AdaptStream`` serves the same domain sequence (one phase per query) with each
   policy, ``seeds`` times, on the shipped CPU profile with the samples this stream reaches re-timed
   right before, between every ``Plan.retime_every`` queries of, and right after that policy's stream,
   all timings pooled (``retime``, ``pooled``, ``stream_samples``; ``Plan.retime_repeats``):
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
and ``.png``. Run: ``python -m experiments.adapt_live`` (``--quick`` for a one-minute smoke run).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from core.errors import InputError
from core.files import atomic_write, write_text
from core.paths import CPU_PROFILE, MODELS, RESULTS, TARGET
from experiments.cli import SEED
from policies.adaptation import ACTIONS, SKIP

POLICIES = ("never", "always", "cost_aware_bandit")
"""The policies compared by default, with their default parameters (``never`` must always be there: its
stream gives the traces and the drafting shapes the simulator replays)."""
DOMAINS = ("code", "tests", "prose", "text")
DRAFT = {"blocks": 2, "starts": 4, "budget": 16}  # the deployed tree; budget = the simulator's positions
MAX_PROMPT = 192  # prompt tokens kept (each prompt's last ones)
RETIME = {"nodes": (1, 2, 3, 4, 5, 6, 8, 12, 17), "contexts": (64, 128, 256), "specblock_starts": (1, 2, 4),
          "specblock_blocks": (1, 2, 3), "prefill_tokens": (32, 64, 128, 256), "warmup": 1}
"""What ``retime`` changes in the profile's full grid: the part of it this stream's trees, contexts and
prompts reach (the full grid's update batch and drafting context kept)."""
DECODING = ("verify", "vanilla", "prefill")  # decoding samples ``retime`` times (with SpecBlock drafting)
REPLACED = (*DECODING, "update", "update_single")  # samples ``retime`` replaces whole


@dataclass(frozen=True)
class Plan:
    """Stream size, query length and simulator repetitions."""

    first: int  # queries of the first domain only
    mixed: int  # queries of the mixed phase (domains in turn)
    max_new_tokens: int
    sim_seeds: int
    retime_repeats: int  # rounds of ``retime`` before and after each policy's stream (0: the profile)
    retime_every: int = 0  # one round of decoding re-timed between every this many queries (0: none)


DEFAULT_PLAN = Plan(first=16, mixed=192, max_new_tokens=48, sim_seeds=32, retime_repeats=3, retime_every=16)
QUICK_PLAN = Plan(first=4, mixed=8, max_new_tokens=24, sim_seeds=4, retime_repeats=1)


def log(message: str) -> None:
    """Progress on stderr."""
    print(message, file=sys.stderr, flush=True)


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


def retime(target: Any, net: Any, repeats: int, seed: int, feedback: Sequence[Any] | None = None,
           updates: bool = True) -> dict[str, Any]:
    """The cost profile's samples of what the stream runs, timed now as ``real_engine.profile`` times
    them (CPU clock): verification and plain steps, SpecBlock drafting (recording feedback, as the
    stream's drafter does) and query starts on ``RETIME``
    (``repeats`` rounds each), and with ``updates`` the SpecBlock updates (``repeats`` rounds) on
    ``feedback`` (served queries' ``Feedback``; synthetic when None)."""
    from dataclasses import replace

    from real_engine import profile as prof

    grid = replace(prof.FULL, **RETIME, repeats=repeats)
    timer = prof.make_timer(target.lm_head.weight.device, "cpu")
    decode = prof.Bench(timer, repeats, grid.warmup)
    verify, vanilla = prof.verify_samples(target, grid, decode, seed)
    draft, _ = prof.draft_samples(target, {"specblock": net}, grid, decode, seed, recording=True)
    prefill = prof.prefill_samples(target, net, grid, decode, seed)
    timed = {"verify": verify, "vanilla": vanilla, "draft": {"specblock": draft["specblock"]},
             "prefill": prefill}
    if updates:
        bench = prof.Bench(timer, repeats, 0)
        full, single, windows = prof.specblock_update_samples(target, net, grid, bench, seed, feedback)
        timed.update(update=full, update_single=single, update_windows=windows)
    decode.run()
    if updates:
        bench.run()
    return timed


def pooled(before: Mapping[str, Any], *others: Mapping[str, Any]) -> dict[str, Any]:
    """``before``'s samples with the decoding samples of ``others`` (``retime`` without updates) added:
    every timing of each grid point counts (``core.cost_profile`` pools a point's rows; medians)."""
    out = {**before, "draft": {"specblock": before["draft"]["specblock"]
                               + [row for t in others for row in t["draft"]["specblock"]]}}
    out.update({key: before[key] + [row for t in others for row in t[key]] for key in DECODING})
    return out


def with_samples(profile: Any, timed: Mapping[str, Any] | None) -> Any:
    """``profile`` with the samples ``retime`` measured in place of its own (its other drafters' kept);
    itself for None."""
    from core.cost_profile import profile_from_json

    if timed is None:
        return profile
    data = {**profile.to_json(), "fits": None, "update_windows": dict(timed["update_windows"])}
    samples = {**data["samples"], **{key: timed[key] for key in REPLACED}}
    samples["draft"] = {**samples["draft"], **timed["draft"]}
    return profile_from_json({**data, "samples": samples})


def serve(
    target: Any,
    drafter_dir: Path,
    stream: Sequence[tuple[str, list[int]]],
    plan: Plan,
    config: Any,
    seed: int,
    policies: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], dict[str, list[dict[str, float]]],
           dict[str, dict[str, dict[str, list[float]]]]]:
    """Each policy's rows on ``stream`` (``config``: an ``AdaptConfig``; ``policies``: name -> policy-file
    content), the ``never`` stream's iterations as trace rows, each policy's drafting shapes, and the
    profile samples ``retime`` measured right before (``"before"``, updates included: after the ``never``
    stream they train on that stream's last buffered queries), between every ``plan.retime_every``
    queries of (``"during"``, one round of decoding each) and right after (``"after"``, decoding only)
    each policy's stream (``plan.retime_repeats`` > 0).

    The policies serve the stream one after another, each with its own drafter, as a deployment runs
    one policy: taking turns query by query made the ``never`` stream's queries about 9% slower than
    its profile predicted (the other policies' updates evict what decoding keeps cached). The samples
    are re-timed before each stream because this shared machine's speed drifts: the same one-window
    head update took 0.98 to 1.5 s within half an hour, and decoding ran 7 to 11% faster than a
    profile measured an hour before; a timing right before a 4-minute stream once caught a moment 30%
    faster than the stream ran, and one after it a moment 10% slower, hence timings after and during
    it (between queries, when no update runs). Synthetic feedback makes an update
    slower than the stream's own (a one-window head update 1.17 s against 0.97 s on the stream), hence
    the recorded feedback."""
    from policies.base import make_policy
    from real_engine.adapt import StreamServer
    from real_engine.decode import generate
    from real_engine.drafters.specblock import SpecBlockDrafter, load_specblock
    from real_engine.trace import iteration_row

    traces: list[dict[str, Any]] = []
    counts: dict[int, int] = {}

    def keep(query: int, iteration: Any) -> None:
        counts[query] = counts.get(query, 0) + 1
        traces.append(iteration_row(iteration, query, stream[query][0], "specblock", counts[query] - 1))

    warm = SpecBlockDrafter(load_specblock(drafter_dir, target), **DRAFT)
    generate(target, stream[0][1], drafter=warm, max_new_tokens=plan.max_new_tokens)  # one-time costs
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in policies}
    drafters, timed = {}, {}
    feedback = None  # the never stream's last buffered queries, once it has run
    began = time.perf_counter()
    for kind, spec in policies.items():
        drafters[kind] = drafter = SpecBlockDrafter(load_specblock(drafter_dir, target), **DRAFT)
        drafter.shapes = []  # record what the drafter runs
        server = StreamServer(target, drafter, [d for d, _ in stream],
                              make_policy(spec["kind"], spec["params"], seed=seed), config=config,
                              max_new_tokens=plan.max_new_tokens, seed=seed,
                              on_iteration=keep if kind == "never" else None)
        if plan.retime_repeats > 0:  # the drafter as the server runs it (an adapting one drafts every token)
            timed[kind] = {"before": retime(target, drafter.net, plan.retime_repeats, seed, feedback),
                           "during": []}
            log(f"[{time.perf_counter() - began:5.0f} s] {kind}: profile samples re-timed")
        for index, (domain, prompt) in enumerate(stream):
            if plan.retime_repeats > 0 and plan.retime_every and index and index % plan.retime_every == 0:
                timed[kind]["during"].append(retime(target, drafter.net, 1, seed, updates=False))
            before = len(drafter.shapes)
            r = server.serve(index, domain, prompt)
            r["proposals"] = len(drafter.shapes) - before  # this query's entries of the shapes
            rows[kind].append(r)
            log(f"[{time.perf_counter() - began:5.0f} s] {kind} {index:3d} {domain:5s} tau {r['tau']:.2f} "
                f"{r['action']}")
        server.close()
        if plan.retime_repeats > 0:  # bracket the stream: the machine's speed drifts within minutes
            timed[kind]["after"] = retime(target, drafter.net, plan.retime_repeats, seed,
                                          updates=False)
            log(f"[{time.perf_counter() - began:5.0f} s] {kind}: decoding re-timed after the stream")
        if kind == "never":  # it never trains, so its full buffer holds its last queries' feedback
            feedback = [f for f, _ in server.adapter.full.drain()]
    return rows, traces, {kind: d.shapes for kind, d in drafters.items()}, timed


def record_of(rows: Sequence[Mapping[str, Any]], domains: Sequence[str]) -> Any:
    """An engine stream as ``simulator.acceptance.AdaptRecord`` (domain order ``domains``)."""
    from simulator.acceptance import AdaptRecord

    share = np.zeros((len(rows), len(domains)))
    action, fill = np.full(len(rows), SKIP), np.zeros(len(rows))
    for i, row in enumerate(rows):
        update = row["update"]
        if update is not None:
            action[i], fill[i] = ACTIONS.index(update["kind"]), update["fill"]
            for domain, value in update["shares"].items():
                share[i, domains.index(domain)] = value
    column = {key: np.array([r[key] for r in rows]) for key in ("tau", "reverted", "checkpoint")}
    domain = np.array([domains.index(r["domain"]) for r in rows])
    draft = np.array([r["draft_ratio"] for r in rows]) if all("draft_ratio" in r for r in rows) else None
    return AdaptRecord(domain, column["tau"], action, fill, share, column["reverted"], column["checkpoint"],
                       draft)


def simulate(
    spec: Mapping[str, Any],
    stream_domains: Sequence[str],
    acceptance: Any,
    profile: Any,
    dynamics: Any,
    plan: Plan,
    prompt_tokens: tuple[int, int],
    seed: int,
    shapes: Sequence[Mapping[str, float]],
) -> dict[str, list[float]]:
    """``AdaptStream``'s per-query means over ``plan.sim_seeds`` streams of the policy ``spec``
    (policy-file content), drafting costed at the recorded SpecBlock ``shapes``."""
    from policies.base import make_policy
    from simulator.envs import AdaptStreamEnv

    env = AdaptStreamEnv(
        profile=profile,
        acceptance=acceptance,
        drafter="specblock",
        draft_length=acceptance.cap,
        tokens_per_query=plan.max_new_tokens,
        prompt_tokens=prompt_tokens,
        phases=[(1, {d: 1.0}) for d in stream_domains],
        dynamics=dynamics,
        draft_shape=list(shapes),
    )
    q = len(stream_domains)
    tau, tps, update, updated = (np.zeros((plan.sim_seeds, q)) for _ in range(4))
    for s in range(plan.sim_seeds):
        policy = make_policy(spec["kind"], spec["params"], seed=seed)
        obs, _ = env.reset(seed=seed * 1000 + s)
        for i in range(q):
            action = policy.act(obs)
            next_obs, reward, _, _, info = env.step(action)
            policy.observe(obs, action, reward, info)
            if getattr(policy, "should_revert", lambda: False)():
                env.revert()
                policy.acknowledge_revert()
            if getattr(policy, "checkpoint_good", False):
                env.checkpoint()
            tau[s, i], tps[s, i] = info["tau"], info["tokens_per_second"]
            update[s, i], updated[s, i] = info["update_seconds"], info["updated"]
            obs = next_obs
    return {
        "tau": tau.mean(0).tolist(),
        "tokens_per_second": tps.mean(0).tolist(),
        "update_seconds": update.mean(0).tolist(),
        "update_rate": updated.mean(0).tolist(),
    }


def add_draft_ratios(rows: Sequence[dict[str, Any]], shapes: Sequence[Mapping[str, float]], profile: Any,
                     base_ms: float) -> None:
    """Set each row's ``draft_ratio``: the profile's mean drafting time at the shapes its query ran (its
    ``proposals`` entries of ``shapes``, in order) over ``base_ms``."""
    start = 0
    for row in rows:
        mine = shapes[start:start + row["proposals"]]
        start += row["proposals"]
        row["draft_ratio"] = mean_shape(profile, mine)["draft_ms"] / base_ms if mine else 1.0


def mean_shape(profile: Any, shapes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean block forwards and start nodes of recorded SpecBlock shapes, and the profile's mean drafting
    milliseconds at them."""
    out = {k: float(np.mean([s[k] for s in shapes])) for k in ("blocks", "starts")}
    out["draft_ms"] = 1e3 * float(np.mean([profile.draft_seconds("specblock", **s) for s in shapes]))
    return out


def summary(
    domains: Sequence[str],
    tau: Sequence[float],
    tps: Sequence[float],
    update: Sequence[float],
    tokens: Sequence[int],
    first: int,
) -> dict[str, float]:
    """Stream figures: tokens/s with updates charged, mean tau, and tau on the shifted domains (those
    after the first phase's) in the first and the second half of the mixed phase."""
    seconds = [n / r for n, r in zip(tokens, tps, strict=True)]
    mixed = len(domains) - first
    shifted = [i for i in range(first, len(domains)) if domains[i] != domains[0]]
    early = [tau[i] for i in shifted if i < first + mixed // 2]
    late = [tau[i] for i in shifted if i >= first + mixed // 2]
    return {
        "tokens_per_second": sum(tokens) / (sum(seconds) + sum(update)),
        "tau": float(np.mean(tau)),
        "shifted_tau_early": float(np.mean(early)) if early else float("nan"),
        "shifted_tau_late": float(np.mean(late)) if late else float("nan"),
        "update_seconds": float(sum(update)),
    }


def errors(measured: Sequence[float], simulated: Sequence[float]) -> dict[str, float]:
    """Mean absolute relative error per query and the relative error of the means (sim / measured - 1)."""
    m, s = np.asarray(measured, dtype=float), np.asarray(simulated, dtype=float)
    return {
        "per_query_mape": float(np.mean(np.abs(s / m - 1.0))),
        "mean_error": float(s.mean() / m.mean() - 1.0),
    }


def markdown(result: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The results table."""
    lines = [
        "# Live online adaptation vs the simulator (AdaptStream)",
        "",
        f"Stream: {config['plan']['first']} code queries, then {config['plan']['mixed']} mixed "
        f"(domains in turn), {config['plan']['max_new_tokens']} new tokens each, greedy; SpecBlock "
        f"drafter `{config['drafter']}` (tree: {config['draft']}); CPU clock, one torch thread. "
        "Shifted tau: the non-code queries of the first vs the second half of the mixed phase. "
        "Tokens/s charge update seconds.",
        "",
        "| policy | tokens/s | sim | tau | sim | shifted tau early -> late | sim | updates (head/full) | "
        "update s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, entry in result["policies"].items():
        m, s = entry["measured"], entry["simulated_summary"]
        lines.append(
            f"| {kind} | {m['tokens_per_second']:.1f} | {s['tokens_per_second']:.1f} | {m['tau']:.3f} | "
            f"{s['tau']:.3f} | {m['shifted_tau_early']:.3f} -> {m['shifted_tau_late']:.3f} | "
            f"{s['shifted_tau_early']:.3f} -> {s['shifted_tau_late']:.3f} | {entry['updates']['head']}/"
            f"{entry['updates']['full']} | {m['update_seconds']:.1f} |"
        )
    lines += ["", "Drafting per policy: the shapes each policy's drafter ran (its rank head decides them, "
              "and updates retrain it), the profile's drafting time at them, and the engine's time per "
              "iteration.",
              "", "| policy | block forwards | start nodes | profile draft ms | engine ms/iter |",
              "|---|---|---|---|---|"]
    for kind, entry in result["policies"].items():
        d, rows = entry["drafted"], entry["rows"]
        per_iteration = sum(r["query_seconds"] for r in rows) / sum(r["iterations"] for r in rows)
        lines.append(f"| {kind} | {d['blocks']:.2f} | {d['starts']:.2f} | {d['draft_ms']:.2f} | "
                     f"{1e3 * per_iteration:.2f} |")
    fit = result["fit"]
    lines += [
        "",
        "Simulator error (sim / measured - 1; per-query MAPE of the seed-averaged prediction; no factor "
        "fitted to the measured speed). Drafting is costed at the SpecBlock shapes the `never` stream "
        f"ran (mean {result['simulator_profile']['draft_shape']['blocks']:.2f} block forwards, "
        f"{result['simulator_profile']['draft_shape']['starts']:.2f} start nodes per later block); "
        + update_text(result["simulator_profile"]),
        "",
        *([text, ""] if (text := retime_text(result["simulator_profile"])) else []),
        "| policy | tau MAPE | tau mean | tokens/s MAPE | tokens/s mean |",
        "|---|---|---|---|---|",
    ]
    for kind, entry in result["policies"].items():
        e = entry["errors"]
        lines.append(
            f"| {kind} | {e['tau']['per_query_mape']:.1%} | {e['tau']['mean_error']:+.1%} | "
            f"{e['tokens_per_second']['per_query_mape']:.1%} | "
            f"{e['tokens_per_second']['mean_error']:+.1%} |"
        )
    lines += [
        "",
        "Fitted `AdaptationDynamics` (paper defaults in brackets): "
        + ", ".join(
            f"{k} {fit['dynamics'][k]:.3g} [{fit['paper'][k]:.3g}]"
            for k in ("headroom", "head_reach", "head_rate", "full_rate", "query_noise", "head_draft",
                      "full_draft")
        )
        + f"; tau RMSE {fit['rmse_tau']:.3f} (fitted) vs {fit['rmse_tau_paper']:.3f} (paper defaults).",
        "",
    ]
    return "\n".join(lines)


def decode_ms(profile: Any, shapes: Sequence[Mapping[str, float]], context: float = 256.0
              ) -> dict[str, float]:
    """A profile's decoding at a glance: a plain step and a 9-node verify at ``context``, drafting at the
    recorded ``shapes`` and a 128-token query start, in milliseconds."""
    return {"vanilla_ms": 1e3 * float(profile.vanilla_seconds(context)),
            "verify9_ms": 1e3 * float(profile.verify_seconds(9, context)),
            "draft_ms": mean_shape(profile, shapes)["draft_ms"],
            "prefill128_ms": 1e3 * float(profile.prefill_cost(128))}


def stream_samples(timed: Mapping[str, Any]) -> dict[str, Any]:
    """The samples a policy's stream is simulated with: every timing of ``serve``'s ``timed[kind]``
    (before, during and after the stream) pooled."""
    return pooled(timed["before"], *timed["during"], timed["after"])


def bracket_ms(profile: Any, timed: Mapping[str, Any], shapes: Sequence[Mapping[str, float]]
               ) -> dict[str, dict[str, float]]:
    """``decode_ms`` of ``profile`` with the samples re-timed before, during (pooled) and after a stream
    (``timed``: ``serve``'s ``{"before", "during", "after"}``; the updates are timed before only)."""
    before = timed["before"]
    sides = {"before": before, "during": {**before, **pooled(*timed["during"])} if timed["during"] else None,
             "after": {**before, **timed["after"]}}
    return {side: decode_ms(with_samples(profile, t), shapes) for side, t in sides.items() if t is not None}


def retime_text(costed: Mapping[str, Any]) -> str:
    """The re-timed decoding beside the shipped profile's, for the report ('' when nothing was re-timed)."""
    if not costed.get("retimed"):
        return ""
    rows = {"shipped profile": costed["shipped"]}
    for kind, sides in costed.get("bracket", {}).items():
        rows.update({f"{kind} {side}": t for side, t in sides.items()})
    return ("Decoding re-timed right before, between every few queries of (during) and right after each "
            "policy's stream, all timings pooled (ms: plain step and 9-node verify at context 256, drafting "
            "at the `never` stream's shapes, a 128-token query start): "
            + "; ".join(f"{name} {t['vanilla_ms']:.2f} / {t['verify9_ms']:.2f} / {t['draft_ms']:.2f} / "
                        f"{t['prefill128_ms']:.1f}" for name, t in rows.items()) + ".")


def update_text(costed: Mapping[str, Any]) -> str:
    """How the simulator charged updates, for the report."""
    retimed = costed.get("retimed")
    if retimed:
        timings = "; ".join(f"{kind} {t['head_single']:.2f} / {t['head']:.2f} s head on "
                            f"{t['windows']['head']} windows, {t['full_single']:.2f} / {t['full']:.2f} s "
                            f"full on {t['windows']['full']}" for kind, t in retimed.items())
        return ("updates linear in the buffered query windows between one window and the full buffer, at "
                "the profile's update samples re-timed right before each policy's stream, on the `never` "
                f"stream's last queries once it has run (one window / full buffer: {timings}).")
    seconds, windows = costed["update_seconds"], costed.get("update_windows")
    single = costed.get("update_single")
    if windows and single:
        return (f"updates linear in the buffered query windows, from the profile's one-window time "
                f"({single['head']:.2f} s head, {single['full']:.2f} s full) to its full-buffer time "
                f"({seconds['head']:.2f} s for {windows['head']} windows, {seconds['full']:.2f} s for "
                f"{windows['full']}).")
    if windows:
        head, full = (seconds[k] / windows[k] for k in ("head", "full"))
        return (f"updates at the profile's time per buffered query window ({head:.2f} s head, {full:.2f} s "
                "full) times the windows in the buffer.")
    return (f"updates at the profile's full-buffer times ({seconds['head']:.2f} s head, "
            f"{seconds['full']:.2f} s full) times the buffer's fill.")


def plot(result: Mapping[str, Any], path: Path, first: int) -> None:
    """Tau and tokens/s per query, measured vs simulated, one column per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(result["policies"])
    fig, axes = plt.subplots(2, len(kinds), figsize=(5 * len(kinds), 6.5), sharex=True, squeeze=False)
    for col, kind in enumerate(kinds):
        entry = result["policies"][kind]
        rows, sim = entry["rows"], entry["simulated"]
        x = np.arange(len(rows))
        for ax, key, label in ((axes[0, col], "tau", "tau"), (axes[1, col], "tokens_per_second", "tokens/s")):
            ax.plot(x, [r[key] for r in rows], "o-", ms=3, lw=1, label="engine")
            ax.plot(x, sim[key], "-", lw=2, alpha=0.8, label="simulator (fitted)")
            for i, r in enumerate(rows):
                if r["update"] is not None:
                    color = "tab:green" if r["update"]["kind"] == "head" else "tab:red"
                    ax.axvline(i, color=color, alpha=0.15)
            ax.axvline(first - 0.5, color="k", ls="--", lw=1)
            ax.set_ylabel(label)
        axes[0, col].set_title(f"{kind} (green: head, red: full update)")
        axes[1, col].set_xlabel("query (dashed: code-only -> mixed)")
        axes[0, col].legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def run(
    model_dir: Path,
    drafter_dir: Path,
    profile_path: Path,
    plan: Plan,
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
    import pandas as pd
    import torch

    from core.cost_profile import load_profile, profile_measurement
    from experiments.provenance import save_result
    from real_engine.adapt import AdaptConfig
    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer
    from real_engine.trace import load_prompts
    from simulator.acceptance import AdaptationDynamics, TraceReplay, adaptation_tau, fit_adaptation

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


@click.command()
@click.option(
    "--model",
    "model_dir",
    type=click.Path(path_type=Path),
    default=TARGET,
    show_default=True,
    help="Target model folder.",
)
@click.option(
    "--drafter",
    "drafter_dir",
    type=click.Path(path_type=Path),
    default=MODELS / "specblock",
    show_default=True,
    help="SpecBlock drafter folder (save_specblock).",
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(path_type=Path),
    default=CPU_PROFILE,
    show_default=True,
    help="CPU cost profile the simulator starts from.",
)
@click.option("--quick", is_flag=True, help="A one-minute smoke run (12 short queries, 4 simulated streams).")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--name", default=None, help="Result file name [adapt_live; adapt_live_quick with --quick].")
def main(
    model_dir: Path, drafter_dir: Path, profile_path: Path, quick: bool, seed: int, name: str | None
) -> None:
    """Run the live adaptation experiment and write benchmarks/results/<name>.{json,md,png}."""
    name = name or ("adapt_live_quick" if quick else "adapt_live")
    try:
        result = run(model_dir, drafter_dir, profile_path, QUICK_PLAN if quick else DEFAULT_PLAN, seed, name)
    except InputError as err:
        raise click.UsageError(str(err)) from None
    for kind, entry in result["policies"].items():
        m, s = entry["measured"], entry["simulated_summary"]
        log(
            f"{kind}: {m['tokens_per_second']:.1f} tok/s (sim {s['tokens_per_second']:.1f}), "
            f"tau {m['tau']:.3f} (sim {s['tau']:.3f}), "
            f"shifted {m['shifted_tau_early']:.3f} -> {m['shifted_tau_late']:.3f}"
        )
    log(f"wrote {RESULTS / name}.json, .md, .png")


if __name__ == "__main__":
    main()
