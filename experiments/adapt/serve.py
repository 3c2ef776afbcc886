"""The live half of ``experiments.adapt.live``: each policy's engine stream, and the cost profile's samples
re-timed right before, during and after it (this shared machine's speed drifts within minutes)."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.cost_profile import UPDATE_KINDS, profile_from_json
from policies.base import make_policy
from real_engine import profile as prof
from real_engine.adapt import update_drafter
from real_engine.decode import generate
from real_engine.drafters.specblock import SpecBlockDrafter, load_specblock, with_draft_vocab
from real_engine.feedback import FeedbackDrafter
from real_engine.stream_server import StreamServer
from real_engine.timing import Bench, make_timer
from real_engine.trace import iteration_row
from real_engine.update_profile import specblock_update_samples

if TYPE_CHECKING:
    from experiments.adapt.plan import StreamPlan

DRAFT = {"blocks": 2, "starts": 4, "budget": 16}  # the deployed tree; budget = the simulator's positions
RETIME = {"nodes": (1, 2, 3, 4, 5, 6, 8, 12, 17), "contexts": (64, 128, 256), "specblock_starts": (1, 2, 4),
          "specblock_blocks": (1, 2, 3), "prefill_tokens": (32, 64, 128, 256), "warmup": 1}
"""What ``retime`` changes in the profile's full grid: the part of it this stream's trees, contexts and
prompts reach (the full grid's update batch and drafting context kept)."""
DECODING = ("verify", "vanilla", "prefill")  # decoding samples ``retime`` times (with SpecBlock drafting)
REPLACED = (*DECODING, "update", "update_single")  # samples ``retime`` replaces whole


def log(message: str) -> None:
    """Progress on stderr."""
    print(message, file=sys.stderr, flush=True)


def retime(target: Any, net: Any, repeats: int, seed: int, feedback: Sequence[Any] | None = None,
           updates: bool = True, clock: str = "cpu", decoding: bool = True) -> dict[str, Any]:
    """The cost profile's samples of what the stream runs, timed now as ``real_engine.profile`` times
    them (on ``clock``: ``"cpu"``, or ``"thread"`` while an update may train beside): with ``decoding``,
    verification and plain steps, SpecBlock drafting (recording feedback, as the stream's drafter does)
    and query starts on ``RETIME`` (``repeats`` rounds each), and with ``updates`` the SpecBlock updates
    (``repeats`` rounds) on ``feedback`` (served queries' ``Feedback``; synthetic when None)."""
    grid = replace(prof.FULL, **RETIME, repeats=repeats)
    timer = make_timer(target.lm_head.weight.device, clock)
    decode = Bench(timer, repeats, grid.warmup)
    timed: dict[str, Any] = {}
    if decoding:
        verify, vanilla = prof.verify_samples(target, grid, decode, seed)
        draft = prof.draft_samples(target, {"specblock": net}, grid, decode, seed, recording=True)
        prefill = prof.prefill_samples(target, net, grid, decode, seed)
        timed.update(verify=verify, vanilla=vanilla, draft={"specblock": draft["specblock"].rows},
                     prefill=prefill)
    if updates:
        bench = Bench(timer, repeats, 0)
        full, single, windows = specblock_update_samples(target, net, grid.update_batch, bench, seed,
                                                         feedback)
        timed.update(update=full, update_single=single, update_windows=windows)
    decode.run()
    if updates:
        bench.run()
    return timed


def overlap_slowdown(target: Any, drafter_dir: Path, query: tuple[str, list[int], int],
                     feedback: Sequence[Any], config: Any, repeats: int) -> dict[str, Any]:
    """How much slower decoding runs beside a training update of each kind: ``query`` (domain, prompt, new
    tokens) served by a fresh adapting drafter on the wall clock alone, beside one-window head updates
    and beside one-window full updates looping on ``config.trainer_core`` (each on the positions its
    buffer takes from the first of ``feedback``, served queries' ``Feedback``), interleaved ``repeats``
    times; per kind the ratio of the medians (a head update's short steps hold the interpreter lock
    more of the time than a full one's), and every timing."""
    drafter = FeedbackDrafter(SpecBlockDrafter(load_specblock(drafter_dir, target), **DRAFT), config.top_k)
    with_draft_vocab(drafter.net, None)  # as an adapting drafter drafts
    data = {kind: [(f, list(f.signals(kind))) for f in feedback if f.signals(kind)][:1]
            for kind in UPDATE_KINDS}
    domain, prompt, tokens = query
    stop = threading.Event()

    def train(kind: str) -> None:
        os.sched_setaffinity(0, {config.trainer_core})
        while not stop.is_set():
            update_drafter(drafter.net, data[kind], kind, config)

    def decode() -> float:
        began = time.perf_counter()
        generate(target, prompt, drafter=drafter, max_new_tokens=tokens)
        drafter.take(domain)
        return time.perf_counter() - began

    times: dict[str, list[float]] = {"alone": [], **{kind: [] for kind in UPDATE_KINDS}}
    decode()  # one-time costs
    for _ in range(repeats):
        times["alone"].append(decode())
        for kind in UPDATE_KINDS:
            stop.clear()
            trainer = threading.Thread(target=train, args=(kind,), name="slowdown", daemon=True)
            trainer.start()
            times[kind].append(decode())
            stop.set()
            trainer.join()
    alone = statistics.median(times["alone"])
    return {"slowdown": {kind: max(statistics.median(times[kind]) / alone, 1.0) for kind in UPDATE_KINDS},
            "seconds": times}


def pooled(before: Mapping[str, Any], *others: Mapping[str, Any]) -> dict[str, Any]:
    """``before``'s samples with the decoding samples of ``others`` (``retime`` without updates) added:
    every timing of each grid point counts (``core.cost_profile`` pools a point's rows; medians)."""
    out = {**before, "draft": {"specblock": before["draft"]["specblock"]
                               + [row for t in others for row in t["draft"]["specblock"]]}}
    out.update({key: before[key] + [row for t in others for row in t[key]] for key in DECODING})
    return out


def with_samples(profile: Any, timed: Mapping[str, Any] | None) -> Any:
    """``profile`` with the samples ``retime`` measured in place of its own (its other drafters' kept, and
    its update samples where ``retime`` timed none); itself for None."""
    if timed is None:
        return profile
    data = {**profile.to_json(), "fits": None}
    if "update_windows" in timed:  # a stream that never trains times no update: the profile's stay
        data["update_windows"] = dict(timed["update_windows"])
    samples = {**data["samples"], **{key: timed[key] for key in REPLACED if key in timed}}
    samples["draft"] = {**samples["draft"], **timed["draft"]}
    return profile_from_json({**data, "samples": samples})


def serve(
    target: Any,
    drafter_dir: Path,
    stream: Sequence[tuple[str, list[int], int]],
    plan: StreamPlan,
    config: Any,
    seed: int,
    policies: Mapping[str, Mapping[str, Any]],
    overlap: bool = False,
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], dict[str, list[dict[str, float]]],
           dict[str, dict[str, dict[str, list[float]]]], list[Any]]:
    """Each policy's rows on ``stream`` ((domain, prompt, new tokens) per query; ``config``: an
    ``AdaptConfig``; ``policies``: name -> policy-file content), the ``never`` stream's iterations as
    trace rows, each policy's drafting shapes, the profile samples ``retime`` measured right before
    (``"before"``, updates included but for the ``never`` stream, which trains none: after it they train on
    its last buffered queries), between every ``plan.retime_every`` queries of (``"during"``, one round of
    decoding each, at the first query boundary no update trains at: ``"at"`` lists those query indices)
    and right after (``"after"``, decoding only) each policy's stream (``plan.retime_repeats`` > 0), and
    the ``never`` stream's last buffered queries (``Feedback``). With ``overlap`` updates train beside
    decoding (``StreamServer``) on ``config.trainer_core``, and the samples are timed on the decoding
    thread's CPU clock (the process's would count the trainer's work: twice the decoding time).

    The policies serve the stream one after another, each with its own drafter, as a deployment runs
    one policy: taking turns query by query made the ``never`` stream's queries slower than its profile
    predicted (the other policies' updates evict what decoding keeps cached). The samples are re-timed
    before each stream because a shared machine's speed drifts, both between a profile and a stream and
    within one stream, so one timing right before a stream can catch an unrepresentative moment; hence
    timings after and during it too (between queries, when no update runs). Synthetic feedback makes an
    update slower than the stream's own, hence the recorded feedback. The drift each run saw is in its
    results file (each policy's ``machine_speed``; docs/results.md, "Live online adaptation")."""
    traces: list[dict[str, Any]] = []
    counts: dict[int, int] = {}

    def keep(query: int, iteration: Any) -> None:
        counts[query] = counts.get(query, 0) + 1
        traces.append(iteration_row(iteration, query, stream[query][0], "specblock", counts[query] - 1))

    clock = "thread" if overlap else "cpu"  # the decoding thread's own seconds, whatever the trainer does
    warm = SpecBlockDrafter(load_specblock(drafter_dir, target), **DRAFT)
    generate(target, stream[0][1], drafter=warm, max_new_tokens=stream[0][2])  # one-time costs
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in policies}
    drafters, timed = {}, {}
    feedback = None  # the never stream's last buffered queries, once it has run
    last: dict[str, Any] = {}  # the decoding samples timed right after the previous stream
    began = time.perf_counter()
    for kind, spec in policies.items():
        drafters[kind] = drafter = SpecBlockDrafter(load_specblock(drafter_dir, target), **DRAFT)
        drafter.shapes = []  # record what the drafter runs
        server = StreamServer(target, drafter, [q[0] for q in stream],
                              make_policy(spec["kind"], spec["params"], seed=seed), config=config,
                              seed=seed, overlap=overlap,
                              on_iteration=keep if kind == "never" else None)
        if plan.retime_repeats > 0:  # the drafter as the server runs it (an adapting one drafts every token)
            # a policy of kind never charges no update: timing them (on synthetic feedback before any
            # stream has run) would only add minutes to the experiment. Decoding was timed moments ago,
            # right after the previous stream: those samples serve as this stream's "before" too
            before = retime(target, drafter.net, plan.retime_repeats, seed, feedback,
                            updates=spec["kind"] != "never", clock=clock, decoding=not last)
            timed[kind] = {"before": {**last, **before}, "during": [], "at": []}
            log(f"[{time.perf_counter() - began:5.0f} s] {kind}: profile samples re-timed")
        due = plan.retime_every or len(stream)
        for index, (domain, prompt, new_tokens) in enumerate(stream):
            # beside an update the decoding thread's own seconds count the trainer's contention too, which
            # the simulator charges as the overlap slowdown: re-time at the first boundary it is idle
            if plan.retime_repeats > 0 and index >= due and not server.adapter.training:
                timed[kind]["during"].append(retime(target, drafter.net, 1, seed, updates=False, clock=clock))
                timed[kind]["at"].append(index)
                due = (index // plan.retime_every + 1) * plan.retime_every
            before = len(drafter.shapes)
            server.max_new_tokens = new_tokens  # this query's length (read by serve)
            r = server.serve(index, domain, prompt)
            r["proposals"] = len(drafter.shapes) - before  # this query's entries of the shapes
            rows[kind].append(r)
            log(f"[{time.perf_counter() - began:5.0f} s] {kind} {index:4d} {domain:5s} tau {r['tau']:.2f} "
                f"{r['action']}")
        server.close(rows[kind][-1] if rows[kind] else None)
        if plan.retime_repeats > 0:  # bracket the stream: the machine's speed drifts within minutes
            timed[kind]["after"] = retime(target, drafter.net, plan.retime_repeats, seed, clock=clock,
                                          updates=False)
            log(f"[{time.perf_counter() - began:5.0f} s] {kind}: decoding re-timed after the stream")
            last = timed[kind]["after"]
        if kind == "never":  # it never trains, so its buffers hold its last queries' feedback
            queries = {id(f): f for buffer in (server.adapter.full, server.adapter.head)
                       for f, _ in buffer.drain()}
            feedback = list(queries.values())
    return rows, traces, {kind: d.shapes for kind, d in drafters.items()}, timed, feedback or []


def machine_speed(profile: Any, timed: Mapping[str, Any], cost: Callable[[Any], float], queries: int
                  ) -> dict[str, list[float]]:
    """How the machine's speed moved over a stream of ``queries``: at each re-timing of ``serve``'s
    ``timed[kind]`` (query position ``at``: 0 before the stream, ``queries`` after it) the ``cost`` of
    ``profile`` with that re-timing's samples over its ``cost`` with all of them pooled (> 1: slower)."""
    before = timed["before"]
    points = [before, *({**before, **t} for t in timed["during"]), {**before, **timed["after"]}]
    base = cost(with_samples(profile, stream_samples(timed)))
    factor = [cost(with_samples(profile, t)) / base for t in points]
    return {"at": [0, *timed["at"], queries], "factor": factor}


def stream_samples(timed: Mapping[str, Any]) -> dict[str, Any]:
    """The samples a policy's stream is simulated with: every timing of ``serve``'s ``timed[kind]``
    (before, during and after the stream) pooled."""
    return pooled(timed["before"], *timed["during"], timed["after"])
