"""Engine benchmark: our decode step against ``transformers``', tree verification cost against node count,
and the decode loop's overhead share in speculative decoding.

Run: ``specblock benchmark engine [--quick] [--threads 1]``; writes
``benchmarks/results/engine.json``. Other processes share this CPU, so each comparison runs side by
side, interleaved round by round, and the figures kept are medians and ratios of medians.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import torch

from benchmarks.output import finish, table
from core.errors import InputError
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag, pairs
from experiments.report_format import table as md_table
from real_engine.decode import generate, make_drafter, prefill
from real_engine.model import ModelArgs, Transformer, load_model, save_model
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

TARGET = ModelArgs(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048)
DRAFT = ModelArgs(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048)


def random_model(args: ModelArgs, seed: int) -> Transformer:
    """A seeded random model with weights of a trained model's scale (std 0.02, unit norms)."""
    torch.manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    return model.eval()


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TARGET.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def hf_loop(hf: torch.nn.Module, prompt: torch.Tensor, n: int) -> tuple[float, list[int]]:
    """Seconds per token of a greedy decode loop on ``transformers``' own cache, and the tokens."""
    out = hf(prompt[None], use_cache=True)
    past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    emitted = [int(token)]
    start = time.perf_counter()
    for _ in range(n - 1):
        out = hf(token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        emitted.append(int(token))
    return (time.perf_counter() - start) / (n - 1), emitted


@torch.inference_mode()
def hf_generate(hf: torch.nn.Module, prompt: torch.Tensor, n: int) -> float:
    """Seconds per decoded token of ``model.generate`` (greedy), prefill removed by differencing."""
    def run(count: int) -> float:
        start = time.perf_counter()
        hf.generate(prompt[None], max_new_tokens=count, min_new_tokens=count, do_sample=False,
                    attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long), pad_token_id=0)
        return time.perf_counter() - start
    return (run(n) - run(1)) / (n - 1)


def ours(model: Transformer, prompt: torch.Tensor, n: int) -> tuple[float, list[int]]:
    """Seconds per token of our vanilla greedy loop (prefill excluded), and the tokens."""
    out = generate(model, prompt, max_new_tokens=n + 1)
    # The first new token comes from the step that runs the last prompt token; drop it like hf_loop.
    return (out.stats.seconds - out.stats.prefill_seconds) / (n + 1), list(out.tokens[:n])


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median of each timing over ``rounds`` rounds, the runs alternating within each round."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def decode_step(rounds: int, new_tokens: int, show: Callable[[str], None]) -> list[dict[str, Any]]:
    """Our decode step against transformers' (manual cache loop and generate), fp32 and bf16."""
    from transformers import AutoModelForCausalLM  # optional (the test extra): this comparison alone

    rows = []
    base = random_model(TARGET, seed=0)
    prompt = tokens(128, seed=1)
    with tempfile.TemporaryDirectory() as folder:
        save_model(base, folder, dtype=torch.float32)
        for dtype in (torch.float32, torch.bfloat16):
            model = load_model(folder, dtype=dtype)
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
            _, ours_tokens = ours(model, prompt, new_tokens)
            _, hf_tokens = hf_loop(hf, prompt, new_tokens)
            times = interleaved({
                "ours": lambda m=model: ours(m, prompt, new_tokens)[0],
                "transformers_loop": lambda h=hf: hf_loop(h, prompt, new_tokens)[0],
                "transformers_generate": lambda h=hf: hf_generate(h, prompt, new_tokens),
            }, rounds)
            row = {"benchmark": "decode_step", "dtype": str(dtype).removeprefix("torch."),
                   "context": prompt.numel(), "new_tokens": new_tokens,
                   **{f"{k}_ms": 1e3 * v for k, v in times.items()},
                   "ratio_vs_loop": times["ours"] / times["transformers_loop"],
                   "ratio_vs_generate": times["ours"] / times["transformers_generate"],
                   "greedy_tokens_match": ours_tokens == hf_tokens}
            show(str(row))
            rows.append(row)
    return rows


def random_tree(size: int, seed: int) -> DraftTree:
    """A random tree of ``size`` nodes (each node's parent uniform among earlier nodes)."""
    gen = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, size)]
    return DraftTree(tokens(size, seed), torch.tensor(parents))


@torch.inference_mode()
def tree_verify(rounds: int, show: Callable[[str], None], context: int = 256) -> list[dict[str, Any]]:
    """Target forward time over a draft tree of 1..128 nodes after ``context`` committed tokens."""
    model = random_model(TARGET, seed=0)
    cache = model.new_cache(context + 256)
    prefill(model, cache, tokens(context, seed=2))
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    trees = {n: random_tree(n, seed=n) for n in sizes}

    def run(tree: DraftTree) -> float:
        start = time.perf_counter()
        mask = tree.mask() if tree.size > 1 else None
        model(tree.tokens[None], tree.positions(cache.length), cache, mask)
        cache.keep([0])
        elapsed = time.perf_counter() - start
        cache.truncate(context)
        return elapsed

    times = interleaved({n: lambda t=trees[n]: run(t) for n in sizes}, rounds)
    mask_ms = {n: 1e3 * statistics.median(_time(trees[n].mask) for _ in range(rounds)) for n in sizes}
    rows = [{"benchmark": "tree_verify", "nodes": n, "context": context, "forward_ms": 1e3 * times[n],
             "relative_to_one_node": times[n] / times[1], "mask_build_ms": mask_ms[n]} for n in sizes]
    for row in rows:
        show(str(row))
    return rows


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def overhead(prompts: int, new_tokens: int, show: Callable[[str], None]) -> list[dict[str, Any]]:
    """Overhead share (wall time outside model forwards) of vanilla and speculative decoding."""
    target, draft = random_model(TARGET, seed=0), random_model(DRAFT, seed=5)
    configs = [("none", {}, "greedy", 0.0), ("draft-model", {"depth": 4}, "greedy", 0.0),
               ("draft-model", {"depth": 4}, "block", 1.0),
               ("draft-model", {"paths": 4, "depth": 4}, "seqbv", 1.0),
               ("draft-model", {"width": 4, "budget": 16, "depth": 4}, "rrs", 1.0),
               ("ngram", {"depth": 4}, "greedy", 0.0)]
    rows = []
    for name, shape, verifier, temperature in configs:
        keys = ("seconds", "overhead_seconds", "draft_seconds", "new_tokens", "iterations")
        totals = dict.fromkeys(keys, 0.0)
        for i in range(prompts):
            drafter = make_drafter(name, target, draft, **shape)
            stats = generate(target, tokens(64, seed=10 + i), drafter=drafter, verifier=verifier,
                             sampling=Sampling(temperature), max_new_tokens=new_tokens, seed=i).stats
            for key in totals:
                totals[key] += getattr(stats, key)
        row = {"benchmark": "overhead", "drafter": name, "shape": shape, "verifier": verifier,
               "temperature": temperature, "overhead_share": totals["overhead_seconds"] / totals["seconds"],
               "draft_share": totals["draft_seconds"] / totals["seconds"],
               "tau": totals["new_tokens"] / totals["iterations"],
               "tokens_per_second": totals["new_tokens"] / totals["seconds"]}
        show(str(row))
        rows.append(row)
    return rows


@click.command("engine")
@click.option("--quick", is_flag=True, help="Fewer rounds and tokens: a smoke run of well under a minute.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch intra-op threads.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for engine.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(quick: bool, threads: int, out: Path, as_json: bool) -> None:
    """Our decode step against transformers', tree verification cost, and the decode loop's overhead."""
    if threads < 1:
        raise InputError(f"--threads {threads} is invalid: give 1 or more")
    torch.set_num_threads(threads)
    show = table(as_json)
    # Many short interleaved rounds: the medians then resist the load swings of a shared machine.
    rounds, new_tokens = (2, 16) if quick else (12, 32)
    rows = [*decode_step(rounds, new_tokens, show), *tree_verify(rounds, show),
            *overhead(2 if quick else 4, 2 * new_tokens, show)]
    config = {"target": TARGET.to_hf(), "draft": DRAFT.to_hf(), "rounds": rounds, "new_tokens": new_tokens,
              "threads": threads, "quick": quick,
              "target_parameters": sum(p.numel() for p in random_model(TARGET, 0).parameters())}
    finish(as_json, rows, save_result("engine", rows, config, seed=0, directory=out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _engine_command(name: str, config: Record) -> str:
    quick = " --quick" if config["quick"] else ""
    return f"{benchmark('engine')}{quick}{flag('--threads', config['threads'], 1)}"


def _engine_body(record: Record) -> Lines:
    config, rows = record["config"], record["results"]
    of = {kind: [r for r in rows if r["benchmark"] == kind]
          for kind in ("decode_step", "tree_verify", "overhead")}
    lines = [f"A random-weight target of {config['target_parameters']:,} parameters; decode: "
             f"{config['new_tokens']} new tokens.", ""]
    lines += md_table(
        ["dtype", "ours ms", "transformers loop ms", "transformers generate ms", "greedy match"],
        [[r["dtype"], f"{r['ours_ms']:.1f}", f"{r['transformers_loop_ms']:.1f}",
          f"{r['transformers_generate_ms']:.1f}", "yes" if r["greedy_tokens_match"] else "no"]
         for r in of["decode_step"]])
    lines += ["", *md_table(["tree nodes", "verify forward ms", "over one node"],
                            [[r["nodes"], f"{r['forward_ms']:.1f}", f"{r['relative_to_one_node']:.2f}"]
                             for r in of["tree_verify"]])]
    return [*lines, "", *md_table(
        ["drafter", "shape", "verifier", "T", "loop overhead share", "draft share"],
        [[r["drafter"], pairs(r["shape"]) or "-", r["verifier"], f"{r['temperature']:g}",
          f"{r['overhead_share']:.3f}", f"{r['draft_share']:.3f}"] for r in of["overhead"]])]


RENDERERS: dict[str, Renderer] = {
    "engine": Renderer("Engine against transformers", _engine_command, _engine_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
