"""One prepared check for a machine with an NVIDIA GPU that has only torch, numpy and safetensors.

In one run of a few minutes it

(a) prints torch, CUDA and the GPU's name;
(b) decodes a few synthetic prompts (seeded random tokens and the target's own greedy continuation,
    so no tokenizer is needed) with the shipped target of ``data/models``, greedily, without and with
    n-gram lookup, the shipped draft model (a plain chain, the staged chain with lookup proposals it
    deploys on CPU, and a top-k tree), SpecBlock and EAGLE drafters: the tokens must be equal; it reports
    tokens/s, tau and the speedup over vanilla decoding in the same run;
(c) builds a Llama-3.1-8B-shape decoder (hidden 4096, 32 layers, 32 heads, 8 KV heads, MLP 14336,
    vocabulary 128256) with seeded random bf16 weights created on the GPU, with the project's own
    SpecBlock and EAGLE drafters built for it, and times, as ``specblock profile`` does
    (``real_engine.profile``: round-robin repeats, synchronize-then-clock), the target's verify step
    for 1..128 tree nodes at 512 and 2048 cached tokens, its vanilla step, SpecBlock drafting for
    M = 1, 2, 3 block forwards from 1..8 start positions, EAGLE drafting for depths 1..8, and a
    head-only and a full SpecBlock update (backward and AdamW step);
(d) runs a drafter update on a side ``torch.cuda.Stream`` while the target verifies on the default
    stream, timed with CUDA events, and reports how much of the shorter side was hidden (overlap) and
    whether the verify results stayed the same;
(e) writes the cost profile (schema 1 of ``core.cost_profile``, as plain JSON: this machine cannot
    import the simulator) and a results JSON with the GPU's name, under ``$OUT`` when it is set,
    else under ``data/profiles/`` and ``benchmarks/results/``.

A section that fails is reported in the results (``errors``) and the others still run; the exit
code is then 1. ``--device cpu --tiny`` runs every section with tiny shapes in seconds (no streams on
a CPU), which is how the test suite runs it end to end and loads the profile it writes.

    specblock gpu-check [--json]                        # where the project is installed
    python -m experiments.gpu_check                     # on a bare GPU machine (torch, numpy, safetensors)
    python -m experiments.gpu_check --device cpu --tiny --out DIR
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from core.errors import InputError
from core.files import write_json
from core.models import SMOLLM2, models_home
from core.names import registry
from core.paths import MODELS, PROFILES, RESULTS, repo_relative
from experiments.gpu_real import real_checkpoint
from experiments.provenance import save_result
from real_engine import profile as prof
from real_engine.decode import MAX_TREE_NODES, generate, make_drafter, prefill
from real_engine.drafters.eagle import TreeShape, load_eagle, new_eagle
from real_engine.drafters.specblock import SpecBlock, load_specblock
from real_engine.drafters.unroll import unroll
from real_engine.model import ModelArgs, Transformer, load_model
from real_engine.timing import Bench, make_timer
from real_engine.tree import DraftTree
from real_engine.verify import TorchSampler
from real_engine.verify import verify as verify_tree

LLAMA_8B = ModelArgs(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                     max_position_embeddings=8192)
TINY_ARGS = ModelArgs(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
SHIPPED_DRAFTERS = {"ngram": ("ngram", {}), "draft-model chain 4": ("draft-model", {"depth": 4}),
                    "draft-model staged lookup": ("draft-model", {"depth": 8, "staged": 1, "lookup": 3}),
                    "draft-model tree": ("draft-model", {"depth": 4, "width": 4, "budget": 16}),
                    "specblock": ("specblock", {}), "eagle": ("eagle", {})}


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """What one run measures: the 8B shape on a GPU, or tiny shapes for a CPU test."""

    name: str
    args: ModelArgs
    grid: prof.ProfileGrid  # verify, vanilla and drafting grid (its draft-model fields unused)
    eagle: TreeShape  # top-k and kept nodes of the EAGLE tree (its depth varies over the grid)
    update_tokens: int  # sequence length of one drafter update
    prompts: int  # synthetic prompts for the shipped models
    new_tokens: int  # tokens each of them decodes


FULL = CheckPlan("llama31_8b_shape", LLAMA_8B,
            prof.ProfileGrid(nodes=(1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128),
                             contexts=(512, 2048), draft_tokens=(), tree_depths=(), tree_widths=(),
                             tree_budget=1, specblock_starts=(1, 2, 4, 8), specblock_blocks=(1, 2, 3),
                             eagle_depths=tuple(range(1, 9)), draft_context=512, update_batch=(1, 512),
                             repeats=5, warmup=2),
            TreeShape(8, 10, 60), update_tokens=512, prompts=4, new_tokens=64)
TINY = CheckPlan("tiny_check", TINY_ARGS,
            prof.ProfileGrid(nodes=(1, 2, 4, 8), contexts=(16, 32), draft_tokens=(), tree_depths=(),
                             tree_widths=(), tree_budget=1, specblock_starts=(1, 2),
                             specblock_blocks=(1, 2, 3), eagle_depths=(1, 2, 3), draft_context=16,
                             update_batch=(1, 32), repeats=2, warmup=1),
            TreeShape(3, 2, 6), update_tokens=32, prompts=1, new_tokens=8)


REAL_DRAFTERS = {"ngram": ("ngram", {}), "draft-model chain 4": ("draft-model", {"depth": 4}),
                 "specblock": ("specblock", {}), "eagle": ("eagle", {}), "medusa": ("medusa", {})}
"""The real model's drafters, each at its deployed shape."""
REAL = dataclasses.replace(
    FULL, name="smollm2_135m",
    grid=prof.ProfileGrid(nodes=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), contexts=(256, 1024), draft_tokens=(),
                          tree_depths=(), tree_widths=(), tree_budget=1, specblock_starts=(1, 2, 4, 8),
                          specblock_blocks=(1, 2, 3), eagle_depths=tuple(range(1, 9)), draft_context=256,
                          update_batch=(1, 256), repeats=5, warmup=2),
    eagle=TreeShape(8, 4, 32), update_tokens=256)
"""The real model's check on a GPU (its args come from its checkpoint)."""
REAL_TINY = dataclasses.replace(TINY, name="real_tiny")


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create floating tensors in ``dtype`` inside the block (so big models are never made in float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def environment(device: torch.device) -> dict[str, Any]:
    """(a) torch, CUDA and the device."""
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available(), "device": prof.device_name(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                    memory_gib=round(props.total_memory / 2**30, 1))
    return info


def synthetic_prompts(target: Transformer, count: int, seed: int) -> list[list[int]]:
    """Seeded random tokens followed by the target's own greedy continuation of them."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        start = torch.randint(1, target.args.vocab_size, (8,), generator=gen).tolist()
        prompts.append(start + list(generate(target, start, max_new_tokens=40).tokens))
    return prompts


def shipped(device: torch.device, plan: CheckPlan, models: Path, seed: int) -> dict[str, Any]:
    """(b) Greedy decoding with each shipped drafter must equal vanilla decoding; tokens/s and speedup."""
    if not (models / "target" / "config.json").is_file():
        return {"skipped": f"no shipped target in {models}"}
    target = load_model(models / "target", torch.float32, device)
    return decoding(target, models, SHIPPED_DRAFTERS, plan, seed)


def decoding(target: Transformer, models: Path, drafters: dict[str, tuple[str, dict[str, Any]]],
             plan: CheckPlan, seed: int) -> dict[str, Any]:
    """Greedy decoding of synthetic prompts with each of ``drafters`` (label -> registered drafter and
    options) trained for ``target`` in ``models`` and with none: tokens/s, tau, speedup, and whether the
    tokens equal vanilla's; a drafter that cannot be built is skipped with the reason."""
    device, dtype = target.lm_head.weight.device, target.lm_head.weight.dtype
    has_draft = (models / "draft" / "config.json").is_file()
    draft = load_model(models / "draft", dtype, device) if has_draft else None
    prompts = synthetic_prompts(target, plan.prompts, seed)
    configs: dict[str, Callable[[], Any] | None] = {"vanilla": lambda: None}
    skipped = {}
    for name, (kind, options) in drafters.items():
        def factory(kind: str = kind, options: dict = options) -> Any:
            folder = None if registry[kind].needs_draft_model else models / registry[kind].folder
            return make_drafter(kind, target, draft, folder=folder, **options)

        try:
            factory()
            configs[name] = factory
        except InputError as err:
            skipped[name] = str(err)
    runs: dict[str, list[Any]] = {name: [] for name in configs}
    for i, prompt in enumerate(prompts):
        for name, factory in configs.items():
            if i == 0:  # warm-up: kernels, caches and allocator
                generate(target, prompt, drafter=factory(), max_new_tokens=plan.new_tokens, seed=seed)
            runs[name].append(generate(target, prompt, drafter=factory(), max_new_tokens=plan.new_tokens,
                                       seed=seed))
    base = runs["vanilla"]
    rows = []
    for name, gens in runs.items():
        tokens = sum(g.stats.new_tokens for g in gens)
        seconds = sum(g.stats.seconds for g in gens)
        equal = [g.tokens == b.tokens for g, b in zip(gens, base, strict=True)]
        first = [next((k for k, (x, y) in enumerate(zip(g.tokens, b.tokens, strict=False)) if x != y), None)
                 for g, b in zip(gens, base, strict=True)]
        iterations = sum(g.stats.iterations for g in gens)
        rows.append({"name": name, "equal": all(equal), "first_mismatch": first, "seconds": seconds,
                     "tokens_per_second": tokens / seconds, "tau": tokens / iterations})
    vanilla = rows[0]["tokens_per_second"]
    for row in rows:
        row["speedup"] = row["tokens_per_second"] / vanilla
    return {"dtype": str(dtype).removeprefix("torch."), "prompts": len(prompts),
            "new_tokens": plan.new_tokens, "configs": rows, "skipped": skipped,
            "all_equal": all(r["equal"] for r in rows)}


def real_model(device: torch.device, plan: CheckPlan, source: Path, drafters: Path, dest: Path,
               seed: int) -> dict[str, Any]:
    """(f) The real model (``source``: its checkpoint folder, GGUF or parts manifest, converted into
    ``dest``, ``gpu_real.real_checkpoint``) in bfloat16 on a GPU: greedy decoding with every drafter
    trained for it (``drafters``; in 16 bits a near-tie may part an output from vanilla's, so the share
    of equal outputs is the figure), and its cost profile with its own SpecBlock and EAGLE drafters
    where they are trained (else random ones of their shape)."""
    folder = real_checkpoint(source, dest)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_model(folder, dtype, device)
    decoded = decoding(target, drafters, REAL_DRAFTERS, plan, seed)
    trained = {kind: (drafters / kind / "config.json").is_file() for kind in ("specblock", "eagle")}
    specblock = (load_specblock(drafters / "specblock", target) if trained["specblock"]
                 else SpecBlock.for_target(target, seed=seed).eval())
    eagle = (load_eagle(drafters / "eagle", target)[0] if trained["eagle"]
             else new_eagle(target, seed=seed).eval())
    data = profile(plan, device, dtype, target, specblock, eagle, seed)
    for kind in ("specblock", "eagle"):
        weights = "trained for it" if trained[kind] else "random weights: timing only"
        data["models"]["drafters"][kind] = f"{kind} for {folder.name} ({weights})"
    return {"checkpoint": str(folder), "decoding": decoded, "profile": data}


def random_target(plan: CheckPlan, device: torch.device, dtype: torch.dtype, seed: int
                  ) -> tuple[Transformer, SpecBlock, Any]:
    """The target of ``plan``'s shape and its SpecBlock and EAGLE drafters, seeded random weights
    created on ``device`` in ``dtype`` directly."""
    torch.manual_seed(seed)
    with default_dtype(dtype), torch.device(device):
        target = Transformer(plan.args).to(dtype).eval()
        specblock = SpecBlock.for_target(target, seed=seed).eval()
        eagle = new_eagle(target, seed=seed).eval()
    return target, specblock, eagle


def specblock_update(net: SpecBlock, kind: str, tokens: int, seed: int) -> Callable[[], torch.Tensor]:
    """One step of a ``head`` (LM and rank heads) or ``full`` update of a copy of ``net``: the training
    forward (``unroll``, 2 blocks from every 8th position), cross-entropy, backward, AdamW; it never
    waits for the device (so it can run behind the target on a side stream) and returns the loss."""
    train = copy.deepcopy(net).train()
    for name, param in train.named_parameters():
        param.requires_grad_(kind == "full" or name.startswith(("lm_head", "rank_head")))
    optimizer = torch.optim.AdamW([p for p in train.parameters() if p.requires_grad], lr=1e-5)
    device, c = net.lm_head.weight.device, net.config
    gen = torch.Generator(device=device).manual_seed(seed)
    sequence = torch.randint(0, c.vocab_size, (1, tokens), device=device, generator=gen)
    features = torch.randn(1, tokens, 3 * c.target_hidden, device=device, generator=gen,
                           dtype=net.lm_head.weight.dtype)
    starts = torch.arange(0, tokens - 2 * c.block_size, 8, device=device)
    start_slots = torch.full((1, starts.numel()), c.block_size - 1, device=device)
    labels = torch.randint(0, c.vocab_size, (1, 2, starts.numel(), c.block_size), device=device,
                           generator=gen)

    def step() -> torch.Tensor:
        logits = unroll(train, sequence, features, starts, start_slots).logits
        loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def profile(plan: CheckPlan, device: torch.device, dtype: torch.dtype, target: Transformer,
            specblock: SpecBlock, eagle: Any, seed: int) -> dict[str, Any]:
    """(c) The cost profile of ``plan``'s target and drafters on this device (schema 1, plain JSON)."""
    timer = make_timer(device)
    bench = Bench(timer, plan.grid.repeats, plan.grid.warmup)
    verify, vanilla = prof.verify_samples(target, plan.grid, bench, seed)
    nets = {"specblock": specblock, "eagle": (eagle, plan.eagle)}
    series = prof.draft_samples(target, nets, plan.grid, bench, seed)
    bench.run()
    updates = Bench(timer, plan.grid.repeats, plan.grid.warmup)
    seconds = {kind: updates.add(specblock_update(specblock, kind, plan.update_tokens, seed), inference=False)
               for kind in ("head", "full")}
    updates.run()
    name = prof.model_name(target, None)
    return {
        "schema_version": 1, "device": prof.device_name(device), "dtype": str(dtype).removeprefix("torch."),
        "models": {"target": f"Llama-3.1-8B shape, {name}" if plan is FULL else name,
                   "drafters": {"ngram": "n-gram prompt lookup (no model)",
                                "specblock": "SpecBlock for this target (random weights: timing only)",
                                "eagle": "EAGLE layer for this target (random weights: timing only)"}},
        "block_size": specblock.config.block_size,
        "draft_shapes": {k: one.shape for k, one in series.items() if one.shape},
        "derived_from": None,
        "samples": {"verify": verify, "vanilla": vanilla, "draft": {k: one.rows for k, one in series.items()},
                    "update": seconds},
        "measurement": {"grid": dataclasses.asdict(plan.grid), "clock": "wall (synchronize, then clock)",
                        "torch": torch.__version__, "seed": seed, "check": "experiments.gpu_check",
                        "update_model": f"SpecBlock drafter, {plan.update_tokens}-token training step"},
    }


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Median milliseconds of a profile's series (read without the simulator)."""
    def ms(rows: list[dict], *keys: str) -> dict[str, float]:
        return {"/".join(str(r[k]) for k in keys): 1e3 * statistics.median(r["seconds"]) for r in rows}

    s = data["samples"]
    return {"verify_nodes/context": ms(s["verify"], "nodes", "context"),
            "vanilla_context": ms(s["vanilla"], "context"),
            "specblock_starts/blocks": ms(s["draft"]["specblock"], "starts", "blocks"),
            "eagle_depth": ms(s["draft"]["eagle"], "depth"),
            "update": {k: 1e3 * statistics.median(v) for k, v in s["update"].items()}}


def event_seconds(fn: Callable[[], Any], stream: torch.cuda.Stream) -> float:
    """Seconds ``fn`` takes on ``stream``, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def overlap_jobs(plan: CheckPlan, target: Transformer, specblock: SpecBlock, seed: int
                 ) -> tuple[Callable[[], tuple[tuple[int, ...], int]], Callable[[], torch.Tensor]]:
    """The two jobs of (d): the target's verify step of a 32-node chain at the largest context, and a
    full update of a copy of ``specblock``.

    The verify step is the decode loop's (tree forward, greedy verification, cache compaction) without
    its ``clock`` calls, which would wait for the stream between verify steps; CUDA events time it.
    """
    device = target.lm_head.weight.device
    context, nodes = plan.grid.contexts[-1], min(32, max(plan.grid.nodes))
    gen = torch.Generator().manual_seed(seed)
    cache = target.new_cache(context + 1 + MAX_TREE_NODES)
    sampler = TorchSampler(torch.Generator(device=device).manual_seed(seed))
    tree = DraftTree.chain(1, torch.randint(1, plan.args.vocab_size, (nodes - 1,), generator=gen))
    tokens, positions = tree.tokens.to(device)[None], tree.positions(context).to(device)
    with torch.inference_mode():
        prefill(target, cache, torch.randint(1, plan.args.vocab_size, (context,), generator=gen).to(device))

    @torch.inference_mode()
    def verify() -> tuple[tuple[int, ...], int]:
        result = verify_tree("greedy", tree, target(tokens, positions, cache).logits[0], sampler)
        cache.keep([0, *result.path])
        cache.truncate(context)
        return result.path, result.token

    return verify, specblock_update(specblock, "full", plan.update_tokens, seed)


def overlap(plan: CheckPlan, target: Transformer, specblock: SpecBlock, seed: int) -> dict[str, Any]:
    """(d) A full drafter update on a side stream while the target verifies on the default stream:
    how much of the shorter side the concurrency hid, and whether the verify results stayed the same."""
    device = target.lm_head.weight.device
    if device.type != "cuda":
        return {"skipped": "CUDA streams need a GPU"}
    verify, update = overlap_jobs(plan, target, specblock, seed)
    main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    for _ in range(2):  # warm-up
        verify()
        event_seconds(update, side)
    expected = verify()
    verify_alone = statistics.median(event_seconds(verify, main) for _ in range(5))
    update_alone = statistics.median(event_seconds(update, side) for _ in range(3))
    count = max(1, round(update_alone / verify_alone))
    torch.cuda.synchronize(device)
    start, end_main, end_side = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record(main)
    side.wait_event(start)
    with torch.cuda.stream(side):
        update()
        end_side.record(side)
    outcomes = [verify() for _ in range(count)]
    end_main.record(main)
    torch.cuda.synchronize(device)
    together = max(start.elapsed_time(end_main), start.elapsed_time(end_side)) / 1e3
    sequential = update_alone + count * verify_alone
    return {"context": plan.grid.contexts[-1], "verify_seconds": verify_alone, "update_seconds": update_alone,
            "verifies": count, "sequential_seconds": sequential, "concurrent_seconds": together,
            "overlap": (sequential - together) / min(update_alone, count * verify_alone),
            "verify_unchanged": all(o == expected for o in outcomes)}


def slug(text: str) -> str:
    """A file-name form of a device name."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def check(device: str | None = None, tiny: bool = False, out: Path | None = None, models: Path = MODELS,
          seed: int = 0, real: Path | None = None, real_drafters: Path = SMOLLM2.drafters,
          work: Path | None = None) -> dict[str, Any]:
    """Run every section on ``device`` (None: cuda when available, else cpu) and write the profiles and
    the results under ``out`` (None: ``$OUT`` when set, else the shipped folders); the results, whose
    ``errors`` name each section that failed. With ``real`` (a checkpoint folder, GGUF or parts
    manifest of SmolLM2), also the real model's section, converted into ``work`` (default: where
    converted models live, so that its draft model finds the target's embeddings). InputError when
    ``tiny`` has no folder to write to."""
    out = out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if tiny and out is None:
        raise InputError("--tiny writes a test profile: give --out DIR (or set $OUT)")
    chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    plan = TINY if tiny else FULL
    dtype = torch.bfloat16 if chosen.type == "cuda" else torch.float32
    results: dict[str, Any] = {"plan": plan.name, "errors": {}, "seconds": {}}
    name = f"{slug(prof.device_name(chosen))}_{plan.name}"
    profile_path = (out or PROFILES) / f"{name}.json"
    built: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        built["models"] = random_target(plan, chosen, dtype, seed)
        data = profile(plan, chosen, dtype, *built["models"], seed)
        write_json(profile_path, data)
        return {"path": repo_relative(profile_path), "dtype": data["dtype"], "milliseconds": summary(data)}

    def build_real(source: Path) -> dict[str, Any]:
        real_plan = REAL_TINY if tiny else REAL
        dest = work or models_home() / SMOLLM2.name
        found = real_model(chosen, real_plan, source, real_drafters, dest, seed)
        path = (out or PROFILES) / f"{slug(prof.device_name(chosen))}_{real_plan.name}.json"
        write_json(path, found["profile"])
        return {**found, "profile": repo_relative(path), "milliseconds": summary(found["profile"])}

    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "environment": lambda: environment(chosen),
        "shipped": lambda: shipped(chosen, plan, models, seed),
        "profile": build,
        "overlap": lambda: overlap(plan, built["models"][0], built["models"][1], seed),
        **({"real_model": lambda: build_real(real)} if real is not None else {}),
    }
    config = {"device": str(chosen), "plan": plan.name, "dtype": str(dtype), "models": repo_relative(models),
              "real_model": None if real is None else str(real)}
    for section, run in sections.items():
        start = time.perf_counter()
        print(f"[gpu_check] {section}...", file=sys.stderr, flush=True)
        try:
            results[section] = run()
        except Exception as exc:  # a check reports every section it could run, and why the others failed
            traceback.print_exc()
            results["errors"][section] = f"{type(exc).__name__}: {exc}"
        results["seconds"][section] = time.perf_counter() - start
        outcome = results.get(section, results["errors"].get(section))
        print(f"[gpu_check] {section}: {outcome}", file=sys.stderr, flush=True)
        save_result("gpu_check", results, config, seed, directory=out or RESULTS)
    return results


def main(argv: list[str] | None = None) -> int:
    """The bare GPU machine's entry point (argparse: it has no click): ``check``; 1 when a section failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="torch device [default: cuda if available, else cpu]")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (seconds, for tests on a CPU)")
    parser.add_argument("--out", type=Path, default=None, help="folder for both files [default: $OUT]")
    parser.add_argument("--models", type=Path, default=MODELS, help="shipped models folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real-model", type=Path, default=None,
                        help="SmolLM2: its checkpoint folder, GGUF or .parts.json [default: not checked]")
    parser.add_argument("--real-drafters", type=Path, default=SMOLLM2.drafters,
                        help="the drafters trained for it [default: data/models/smollm2-135m]")
    parser.add_argument("--work", type=Path, default=None,
                        help="where it is converted [default: runs/models/smollm2-135m]")
    args = parser.parse_args(argv)
    try:
        results = check(args.device, args.tiny, args.out, args.models, args.seed, args.real_model,
                        args.real_drafters, args.work)
    except InputError as err:
        parser.error(str(err))
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
