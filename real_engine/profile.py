"""Measure what one decoding iteration costs on this device and write it as a cost profile.

Every timing runs the engine's own code on the running device: the target's verify step
(``decode.speculative_step``: forward of a chain of ``nodes`` tokens, greedy verification, cache
compaction) over a grid of tree sizes and context lengths, its vanilla step over the contexts (in runs
of ``VANILLA_RUN`` consecutive steps, as vanilla decoding keeps its caches warm), each
available drafter's ``propose`` + ``accept`` (one iteration's drafting, the first half of the first
path accepted) per shape of what it drafts (a draft-model chain by tokens and its top-k tree by depth
and width, EAGLE's dynamic tree by depth, SpecBlock by block forwards and start positions; the settings
each series holds fixed go to ``draft_shapes``), and a head-only and a full drafter update: the
SpecBlock drafter's online update as ``real_engine.adapt`` runs it, on synthetic buffers filled to
capacity, when SpecBlock is profiled, else one next-token step of the draft model. Timings run
round-robin (``Bench``): after warm-up rounds, every round calls each configuration once, so repeats
spread over the whole run and target and drafter calls alternate as in the decode loop; the profile
stores every repeat and ``core.cost_profile`` takes their median. The clock is the wall clock, or on a
CPU the process's CPU seconds (``--clock cpu``: what other jobs on a shared machine do barely
moves it). Drafters whose weights are not shipped are timed with seeded random weights of the
shipped shape (timing does not depend on the values) and their model names say so. The result is
the JSON of ``core.cost_profile`` (schema 1) plus a ``measurement`` block recording how it was
measured. The module imports with torch, numpy and safetensors alone (``experiments.gpu_check`` runs
it on a bare GPU machine), so the SpecBlock update, which needs the training code, loads only where it
is timed.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from core.cost_profile import profile_from_json
from core.errors import InputError
from core.files import write_json
from core.names import registry
from real_engine.batch import BatchEngine, Request
from real_engine.decode import GREEDY, MAX_TREE_NODES, prefill, speculative_step, vanilla_step
from real_engine.drafter_profiles import DraftSeries
from real_engine.drafters.base import Drafter, prompt_rows
from real_engine.drafters.draft_model import DraftModelDrafter
from real_engine.drafters.specblock import SpecBlockDrafter
from real_engine.feedback import FeedbackDrafter
from real_engine.kv_cache import KVCache
from real_engine.model import Output, Transformer
from real_engine.steering import ScriptedDrafter, steering_samples
from real_engine.timing import Bench, make_timer, random_tokens
from real_engine.tree import DraftTree
from real_engine.update_profile import NEW_TOKENS, specblock_update_samples, update_samples
from real_engine.verify import TorchSampler


@dataclass(frozen=True)
class ProfileGrid:
    """The measurement grid of a profile: what to measure and how often."""

    nodes: tuple[int, ...]  # verify forward sizes, root included
    contexts: tuple[int, ...]  # tokens in the KV cache
    draft_tokens: tuple[int, ...]  # draft-model chain lengths
    tree_depths: tuple[int, ...]  # draft-model top-k tree levels
    tree_widths: tuple[int, ...]  # its frontier width and children per expanded node
    tree_budget: int  # nodes kept in the draft-model tree
    specblock_starts: tuple[int, ...]
    specblock_blocks: tuple[int, ...]
    eagle_depths: tuple[int, ...]
    draft_context: int  # context at which drafters are timed
    update_batch: tuple[int, int]  # (sequences, tokens) of one update step
    repeats: int
    warmup: int
    prefill_tokens: tuple[int, ...] = (32, 64, 128, 256, 512)  # prompt lengths of a query's start
    batch_requests: tuple[int, ...] = (1, 2, 4, 8)  # requests in one batched verify forward
    batch_nodes: tuple[int, ...] = (1, 4, 9)  # tokens of each of them, root included


FULL = ProfileGrid(nodes=(1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128),
            contexts=(32, 128, 256, 512, 1024), draft_tokens=tuple(range(1, 17)),
            tree_depths=(2, 3, 4, 6, 8), tree_widths=(2, 3, 4), tree_budget=16,
            specblock_starts=(1, 2, 4, 8), specblock_blocks=(1, 2, 3, 4),
            eagle_depths=(1, 2, 3, 4, 5, 6, 7, 8), draft_context=256, update_batch=(8, 256), repeats=7,
            warmup=2)
QUICK = ProfileGrid(nodes=(1, 4, 16), contexts=(16, 64), draft_tokens=(1, 2, 4), tree_depths=(2, 4),
             tree_widths=(2,), tree_budget=8, specblock_starts=(1, 2), specblock_blocks=(1, 2),
             eagle_depths=(1, 2), draft_context=32, update_batch=(2, 32), repeats=3, warmup=1,
             prefill_tokens=(16, 64), batch_requests=(1, 3), batch_nodes=(1, 4))


def device_name(device: torch.device) -> str:
    """A readable name of ``device`` (the GPU's name, or the CPU's model)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


def model_name(model: Transformer, folder: str | Path | None) -> str:
    """``folder-name (type, layers x hidden)``: enough to tell shipped models and shapes apart."""
    a = model.args
    where = Path(folder).name if folder is not None else "random weights"
    return (f"{where} ({a.model_type}, {a.num_hidden_layers} layers x {a.hidden_size} hidden, "
            f"vocab {a.vocab_size})")


def _contexts(grid: ProfileGrid, model: Transformer) -> tuple[int, ...]:
    """The grid's contexts that leave room for the largest tree within the model's positions."""
    limit = model.args.max_position_embeddings - max(grid.nodes) - 1
    kept = tuple(c for c in grid.contexts if c <= limit)
    if not kept:
        need = min(grid.contexts) + max(grid.nodes) + 1
        raise InputError(f"the model's context ({model.args.max_position_embeddings}) is too short for the "
                         f"profile grid: use a model with at least {need} positions or --quick")
    return kept


VANILLA_RUN = 8
"""Consecutive vanilla steps per timed sample: vanilla decoding runs step after step, so its caches stay
warm, while a verify step follows drafting (here: the other jobs). Timed alone among the other jobs, a
vanilla step found its caches cold and cost more than in decoding, which made every drafter look
better in the simulator than in the engine (the shipped fidelity test caught it)."""


def warm_step(model: Transformer, context: int, nodes: int = 1, seed: int = 0) -> Callable[[], None]:
    """One untimed step of ``model`` at ``context`` cached tokens (a verify of a ``nodes``-token chain, or
    a plain step for 1): the prelude that lets a timed job find the caches as the decode loop leaves them
    (a drafter runs right after the target verified a draft, a verify right after the drafter ran, which
    costs more than right after a job of their own kind)."""
    device = model.lm_head.weight.device
    gen = torch.Generator().manual_seed(seed)
    vocab = model.args.vocab_size
    cache = model.new_cache(context + nodes)
    with torch.inference_mode():
        prefill(model, cache, random_tokens(context, vocab, gen).to(device))
    sampler = TorchSampler(torch.Generator(device=device).manual_seed(seed))
    tree = DraftTree.chain(int(random_tokens(1, vocab, gen)), random_tokens(nodes - 1, vocab, gen))

    def step() -> None:
        if nodes == 1:
            vanilla_step(model, cache, int(tree.tokens[0]), GREEDY, sampler)
        else:
            speculative_step(model, cache, tree, "greedy", GREEDY, sampler)
        cache.truncate(context)

    return step


@torch.inference_mode()
def verify_samples(model: Transformer, grid: ProfileGrid, bench: Bench, seed: int = 0,
                   before: Callable[[], Any] | None = None) -> tuple[list[dict], list[dict]]:
    """Rows of ``samples.verify`` (a chain of ``nodes`` tokens at each context, each after ``before``,
    untimed: the drafter's step, as in the loop) and ``samples.vanilla``, timed when ``bench`` runs."""
    device = model.lm_head.weight.device
    gen = torch.Generator().manual_seed(seed)
    sampler = TorchSampler(torch.Generator(device=device).manual_seed(seed))
    vocab = model.args.vocab_size
    verify, vanilla = [], []
    for context in _contexts(grid, model):
        cache = model.new_cache(context + 1 + MAX_TREE_NODES)
        prefill(model, cache, random_tokens(context, vocab, gen).to(device))
        for nodes in grid.nodes:
            tree = DraftTree.chain(int(random_tokens(1, vocab, gen)), random_tokens(nodes - 1, vocab, gen))

            def step(tree: DraftTree = tree, cache: KVCache = cache, context: int = context) -> None:
                speculative_step(model, cache, tree, "greedy", GREEDY, sampler)
                cache.truncate(context)

            verify.append({"nodes": nodes, "context": context, "seconds": bench.add(step, before=before)})

        def plain(cache: KVCache = cache, context: int = context) -> None:
            for _ in range(VANILLA_RUN):
                vanilla_step(model, cache, int(random_tokens(1, vocab, gen)), GREEDY, sampler)
                cache.truncate(context)

        vanilla.append({"context": context, "seconds": bench.add(plain, per=VANILLA_RUN)})
    return verify, vanilla


def batch_verify_samples(model: Transformer, grid: ProfileGrid, bench: Bench, seed: int = 0,
                         before: Callable[[], None] | None = None) -> list[dict]:
    """Rows of ``samples.batch_verify``: one iteration of ``real_engine.batch.BatchEngine`` over
    ``requests`` requests at the context, each verifying a chain of ``nodes`` tokens that costs nothing to
    draft (the packed forward, each request's verification, cache and bookkeeping: the engine's own work),
    timed when ``bench`` runs. As the engine runs them: a batch of plain steps (1 node each)
    ``VANILLA_RUN`` times back to back, a batch that verifies drafts right after ``before`` (the drafter's
    step); each sample starts from the same context."""
    vocab, gen = model.args.vocab_size, torch.Generator().manual_seed(seed)
    device = model.lm_head.weight.device
    rows = []
    for context in _contexts(grid, model):
        for requests, nodes in ((r, n) for r in grid.batch_requests for n in grid.batch_nodes):
            runs = VANILLA_RUN if nodes == 1 else 1
            engine = BatchEngine(model, max_batch=requests)
            for _ in range(requests):
                drafter = None if nodes == 1 else ScriptedDrafter(nodes - 1, vocab, device)
                engine.submit(Request(random_tokens(context + 1, vocab, gen).tolist(), runs * nodes + 1,
                                      drafter))
            engine.step()  # admits (prefills) every request

            def start(engine: BatchEngine = engine, context: int = context) -> None:
                for state in engine.running.values():
                    state.cache.truncate(context)
                    state.result.tokens.clear()
                if before is not None:
                    before()

            def step(engine: BatchEngine = engine, runs: int = runs) -> None:
                for _ in range(runs):
                    engine.step()

            rows.append({"requests": requests, "nodes": nodes, "context": context,
                         "seconds": bench.add(step, per=runs, before=start)})
    return rows


class _Session:
    """A drafter started on a random context of the target, stepped with synthetic verdicts."""

    def __init__(self, target: Transformer, drafter: Drafter, context: int, room: int, seed: int) -> None:
        self.device = target.lm_head.weight.device
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab, self.room, self.seed = target.args.vocab_size, room, seed
        self.prompt = random_tokens(context, self.vocab, self.gen).to(self.device)
        with torch.inference_mode():
            cache = target.new_cache(context)
            self.out = prefill(target, cache, self.prompt[:-1], prompt_rows(drafter))
        self.drafter = drafter
        self.begin()

    def begin(self) -> None:
        """Start the drafter afresh on the prompt (its model has run none of it)."""
        self.drafter.begin(self.prompt, self.out, GREEDY,
                           torch.Generator(device=self.device).manual_seed(self.seed),
                           self.prompt.numel() + self.room)

    @torch.inference_mode()
    def step(self, depth: int) -> None:
        """One iteration's drafting: propose, then accept the first half of the first path."""
        self.settle(self.drafter.propose(depth))

    def settle(self, tree: DraftTree) -> None:
        """Accept the first half of ``tree``'s first path and a random token after it."""
        paths = tree.paths()
        path = tuple(paths[0][:len(paths[0]) // 2]) if paths else ()
        rows = Output(*(x[:, :len(path) + 1] for x in self.out))
        self.drafter.accept(path, int(random_tokens(1, self.vocab, self.gen)), rows)


def batch_draft_samples(target: Transformer, draft: Transformer, grid: ProfileGrid, bench: Bench,
                        seed: int = 0, vocab: torch.Tensor | None = None) -> list[dict]:
    """Rows of ``samples.batch_draft``: ``requests`` draft-model chains of ``tokens`` positions, each on its
    own context, drafted in lockstep as the batched engine drafts them (one request: alone), each then
    accepting half its chain (drafting the token ids ``vocab``, None: every token); timed when ``bench``
    runs, right after a target verify as in the engine."""
    context = min(grid.draft_context, _contexts(grid, target)[-1])
    room = (grid.repeats + grid.warmup) * 33  # each step commits at most 17 tokens (16 deep, bonus)
    before = warm_step(target, context, 4, seed)
    rows = []
    for requests, tokens in ((r, k) for r in grid.batch_requests for k in grid.draft_tokens):
        sessions = [_Session(target, DraftModelDrafter(draft, "chain", tokens, vocab=vocab), context, room,
                             seed + i)
                    for i in range(requests)]

        @torch.inference_mode()
        def step(sessions: list[_Session] = sessions, tokens: int = tokens) -> None:
            drafters = [s.drafter for s in sessions]
            trees = (DraftModelDrafter.propose_together(drafters, [tokens] * len(drafters))
                     if len(drafters) > 1 else [drafters[0].propose(tokens)])
            for session, tree in zip(sessions, trees, strict=True):
                session.settle(tree)

        rows.append({"requests": requests, "tokens": tokens, "seconds": bench.add(step, before=before)})
    return rows


def draft_backlog_samples(target: Transformer, draft: Transformer, grid: ProfileGrid, bench: Bench,
                          seed: int = 0, vocab: torch.Tensor | None = None) -> list[dict]:
    """Rows of ``samples.draft_backlog``: a one-position proposal of a draft-model chain started on a
    prompt of ``tokens`` + 1 tokens, so that it first runs the ``tokens`` its model has not (a request's first
    proposal), then accepting it; for one token and each of ``grid.prefill_tokens``, timed when ``bench``
    runs, right after a target verify as in the engine."""
    limit = min(target.args.max_position_embeddings, draft.args.max_position_embeddings) - 2
    verified = warm_step(target, min(grid.draft_context, _contexts(grid, target)[-1]), 4, seed)
    rows = []
    for tokens in sorted({1, *(n for n in grid.prefill_tokens if n <= limit)}):
        session = _Session(target, DraftModelDrafter(draft, "chain", 1, vocab=vocab), tokens + 1, 2, seed)

        def start(session: _Session = session) -> None:
            verified()
            session.begin()

        rows.append({"tokens": tokens, "seconds": bench.add(lambda s=session: s.step(1), before=start)})
    return rows


@dataclass
class _Timer:
    """The ``DraftTimer`` drafters' series time with: sessions at the draft context, after a verify."""

    target: Transformer
    grid: ProfileGrid
    bench: Bench
    seed: int
    recording: bool

    def __post_init__(self) -> None:
        self.context = min(self.grid.draft_context, _contexts(self.grid, self.target)[-1])
        self.room = (self.grid.repeats + self.grid.warmup) * 33  # a step commits at most 17 tokens
        self.before = warm_step(self.target, self.context, 4, self.seed)  # drafting follows a verify

    def run(self, drafter: Drafter, depth: int) -> list[float]:
        session = _Session(self.target, drafter, self.context, self.room, self.seed)
        return self.bench.add(lambda: session.step(depth), before=self.before)


def draft_samples(target: Transformer, nets: dict[str, Any], grid: ProfileGrid, bench: Bench, seed: int = 0,
                  recording: bool = False) -> dict[str, DraftSeries]:
    """Each registered drafter's series (``DraftSeries``: rows of ``samples.draft`` and ``draft_trees``, its
    ``draft_shapes`` entry), timed when ``bench`` runs: every drafter with a profiler whose model is in
    ``nets`` (kind -> its model or net; for a drafter drafting with the draft model, it and the token ids
    it drafts, None: every token) or that needs none.
    With ``recording``, drafters draft as a stream that adapts online runs them (feedback recorded)."""
    timer = _Timer(target, grid, bench, seed, recording)
    out = {}
    for kind, spec in registry.items():
        profiler = spec.load("profile") if spec.profile else None
        needs = profiler is not None and (spec.needs_draft_model or profiler.fresh is not None)
        if profiler is not None and (kind in nets or not needs):
            out[kind] = profiler.series(target, nets.get(kind), timer)
    return out


def prefill_samples(target: Transformer, net: Any | None, grid: ProfileGrid, bench: Bench, seed: int = 0
                    ) -> list[dict]:
    """Rows of ``samples.prefill``: a query's start as ``decode.generate`` runs it (its caches, the
    target's prefill of the prompt and, given the SpecBlock ``net``, the begin of the drafter the engine
    adapts online, recording feedback) for each of ``grid.prefill_tokens``; timed when ``bench`` runs."""
    device, gen = target.lm_head.weight.device, torch.Generator().manual_seed(seed)
    limit = target.args.max_position_embeddings - NEW_TOKENS
    rows = []
    for tokens in (n for n in grid.prefill_tokens if n <= limit):
        prompt = random_tokens(tokens, target.args.vocab_size, gen).to(device)
        drafter = None if net is None else FeedbackDrafter(SpecBlockDrafter(net))

        def start(prompt: torch.Tensor = prompt, drafter: FeedbackDrafter | None = drafter) -> None:
            max_length = prompt.numel() + NEW_TOKENS
            cache = target.new_cache(max_length + (MAX_TREE_NODES if drafter is not None else 0))
            out = prefill(target, cache, prompt[:-1], prompt_rows(drafter))
            if drafter is not None:
                drafter.begin(prompt, out, GREEDY, torch.Generator(device=device).manual_seed(seed),
                              max_length)

        rows.append({"tokens": tokens, "seconds": bench.add(start)})
    return rows


def feature_drafters(target: Transformer, models_dir: Path | None = None, seed: int = 0
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """The registered drafters with a model of their own for ``target``: trained weights from
    ``models_dir/<folder>`` (the target's own drafters folder, ``ModelSpec.drafters``; None: none) when
    present and fitting this target, else seeded random weights of the shipped shape.

    Returns (kind -> what its profiler's series needs, kind -> the model name for the profile).
    """
    nets, names = {}, {}
    for kind, spec in registry.items():
        profiler = spec.load("profile") if spec.profile else None
        if profiler is None or profiler.fresh is None:
            continue
        folder = None if models_dir is None else models_dir / spec.folder
        try:
            loaded = None if folder is None or profiler.load is None else profiler.load(target, folder)
        except (InputError, OSError, RuntimeError):  # absent, or made for another target
            loaded = None
        if loaded is None or folder is None:
            nets[kind] = profiler.fresh(target, seed)
            names[kind] = f"{kind} (random weights of the shipped shape: timing only)"
        else:
            nets[kind], names[kind] = loaded, f"{folder.name} (trained weights)"
    return nets, names


def measure(target: Transformer, *, target_name: str, draft: Transformer | None = None,
            draft_name: str | None = None, grid: ProfileGrid = FULL, feature: bool = True,
            dtype: str = "float32", threads: int | None = None, clock_kind: str = "wall", seed: int = 0,
            models_dir: Path | None = None, between: Callable[[int], Any] | None = None,
            estimator: str = "mean", draft_vocab: torch.Tensor | None = None) -> dict[str, Any]:
    """The profile of ``target`` on ``grid`` (and ``draft``; n-gram always; SpecBlock, EAGLE and Medusa
    when ``feature``, from ``models_dir``) as a JSON-ready dict, validated by ``core.cost_profile``;
    ``between(k)`` runs after the k-th timed round of the decoding samples (``Bench.run``); ``estimator``
    (mean: the loop's expected cost, which pays its slow iterations too; median: robust to a burst of
    load on a shared machine) reads the repeats; ``draft_vocab``, the token ids the draft model drafts
    (None: every token), as the drafter it is timed for drafts them."""
    device = target.lm_head.weight.device
    timer = make_timer(device, clock_kind)
    bench = Bench(timer, grid.repeats, grid.warmup)
    updates = Bench(timer, min(grid.repeats, 3), min(grid.warmup, 1))  # an update takes seconds

    context = min(grid.draft_context, _contexts(grid, target)[-1])
    drafting = None if draft is None else warm_step(draft, context, seed=seed)  # what a verify follows
    verify, vanilla = verify_samples(target, grid, bench, seed, drafting)
    nets: dict[str, Any] = {}
    names: dict[str, str] = {}
    if draft is not None:
        kinds = [kind for kind, spec in registry.items() if spec.needs_draft_model]
        nets.update(dict.fromkeys(kinds, (draft, draft_vocab)))
        names.update(dict.fromkeys(kinds, draft_name or model_name(draft, None)))
    if feature:
        more, more_names = feature_drafters(target, models_dir, seed)
        nets.update(more)
        names.update(more_names)
    update_model = draft if draft is not None else target
    series = draft_samples(target, nets, grid, bench, seed)
    names = {kind: names.get(kind, registry[kind].summary) for kind in series}
    windows: dict[str, int] = {}
    single: dict[str, list[float]] = {}
    prefill_rows = prefill_samples(target, nets.get("specblock"), grid, bench, seed)
    if "specblock" in nets:  # the drafter the engine adapts online
        update_rows, single, windows = specblock_update_samples(target, nets["specblock"], grid.update_batch,
                                                                updates, seed)
        update_name = (f"specblock: {names['specblock']}, real_engine.adapt.update_drafter on full and "
                       "one-window buffers")
    else:
        update_rows = update_samples(update_model, grid.update_batch, updates, seed)
        update_name = (f"{'draft model' if draft is not None else 'target'}: "
                       f"{draft_name if draft is not None else target_name}, one next-token step")
    samples = {"verify": verify, "vanilla": vanilla, "update": update_rows,
               "draft": {kind: one.rows for kind, one in series.items()},
               **({"update_single": single} if single else {}),
               **({"prefill": prefill_rows} if prefill_rows else {}),
               "steering": steering_samples(target, grid.draft_tokens, grid.draft_context, bench, seed),
               "batch_verify": batch_verify_samples(target, grid, bench, seed, drafting),
               **({"batch_draft": batch_draft_samples(target, draft, grid, bench, seed, draft_vocab),
                   "draft_backlog": draft_backlog_samples(target, draft, grid, bench, seed, draft_vocab)}
                  if draft is not None else {}),
               "draft_trees": {kind: one.trees for kind, one in series.items() if one.trees}}
    bench.run(between)  # decoding jobs interleave with each other as target and drafter do in the loop
    updates.run()  # apart: a training step's memory traffic would evict what decoding keeps cached
    data = {
        "schema_version": 1,
        "device": device_name(device),
        "dtype": dtype,
        "models": {"target": target_name, "drafters": names},
        "block_size": next((one.block_size for one in series.values() if one.block_size), None),
        "draft_shapes": {kind: one.shape for kind, one in series.items() if one.shape},
        "derived_from": None,
        "estimator": estimator,
        **({"update_windows": windows} if windows else {}),
        "samples": samples,
    }

    profile = profile_from_json(data)
    return {**profile.to_json(), "measurement": {
        "grid": asdict(grid), "clock": clock_kind, "threads": threads or torch.get_num_threads(),
        "torch": torch.__version__, "seed": seed,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "update_model": update_name,
        "draft_vocab": None if draft is None or draft_vocab is None else int(draft_vocab.numel()),
        "verify": "greedy verify step of a chain (tree forward, verification, cache compaction)",
        "draft": "one iteration's propose + accept at the draft context; the first half of the first "
                 "path accepted"}}


def check_remeasurable(data: dict[str, Any]) -> dict[str, Any]:
    """The ``measurement`` of a profile whose SpecBlock updates ``remeasure_updates`` can re-time;
    InputError for one derived from a paper or measured without SpecBlock."""
    measured = data.get("measurement") if isinstance(data, dict) else None
    if not isinstance(measured, dict) or "specblock" not in data.get("models", {}).get("drafters", {}):
        raise InputError("this profile has no measured SpecBlock updates to re-time: run specblock profile "
                         "without --only-updates")
    return measured


def remeasure_updates(data: dict[str, Any], target: Transformer, *, grid: ProfileGrid = FULL,
                      seed: int = 0, models_dir: Path | None = None) -> dict[str, Any]:
    """``data`` (a profile ``measure`` wrote for ``target``) with the SpecBlock update samples timed again as
    ``measure`` times them, on its clock, everything else kept; ``measurement["updates"]`` says when (an
    update's code changes more often than the decoding it is costed beside)."""
    measured = check_remeasurable(data)
    nets, _ = feature_drafters(target, models_dir, seed)
    updates = Bench(make_timer(target.lm_head.weight.device, measured["clock"]), min(grid.repeats, 3),
                    min(grid.warmup, 1))
    rows, single, windows = specblock_update_samples(target, nets["specblock"], grid.update_batch, updates,
                                                     seed)
    updates.run()
    kept = {k: v for k, v in data.items() if k != "measurement"}
    profile = profile_from_json({**kept, "fits": None, "update_windows": windows,
                                 "samples": {**data["samples"], "update": rows, "update_single": single}})
    return {**profile.to_json(), "measurement": {**measured, "updates": {
        "torch": torch.__version__, "seed": seed, "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}}}


def save(data: dict[str, Any], path: str | Path) -> Path:
    """Validate and write a measured profile atomically."""
    profile_from_json({k: v for k, v in data.items() if k != "measurement"})
    return write_json(path, data)


def summary(data: dict[str, Any], context: float = 256.0) -> dict[str, Any]:
    """Headline numbers of a profile at ``context``: milliseconds of vanilla, verify at 2/9/17/65 nodes,
    a 4-token draft of each drafter (and a depth-4, width-2 draft-model tree), and the two updates on their
    full buffers and, where measured, on one query's window (the same buffer for both)."""
    profile = profile_from_json({k: v for k, v in data.items() if k != "measurement"})
    ms = {"vanilla": 1e3 * float(profile.vanilla_seconds(context))}
    for nodes in (2, 9, 17, 65):
        ms[f"verify_{nodes}"] = 1e3 * float(profile.verify_seconds(nodes, context))
    for kind in sorted(profile.drafters):
        ms[f"draft_{kind}_4"] = 1e3 * profile.chain_draft_seconds(kind, 4)
    for kind in profile.draft_trees:
        ms[f"draft_{kind}_tree_4x2"] = 1e3 * float(profile.draft_seconds(kind, depth=4, width=2))
    ms.update({f"update_{k}": 1e3 * profile.update_seconds(k) for k in ("head", "full")})
    ms.update({f"update_one_window_{k}": 1e3 * s for k, s in profile.fits.get("update_single", {}).items()})
    return {"device": profile.device, "context": context, "milliseconds": ms}
