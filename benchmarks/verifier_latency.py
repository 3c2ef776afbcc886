"""Verifier latency on a 64-node draft tree at vocabularies 8,192 and 128,000.

Tree verifiers (greedy, rrs, gbv, seqbv) see 8 i.i.d. paths of depth 8 (``DraftTree.from_paths``);
the single-path ones (token, block) a chain of 64. Target and draft rows are random but correlated
(shared logits plus noise), and each drafted token is sampled from its parent's draft row, so the
acceptance lengths, and with them the work of the sequential verifiers, are realistic. Reports the
median wall time over repeats after warm-up and the mean accepted length over those calls (one
fixed draft per shape and vocabulary, so it only shows how far the sequential verifiers walked);
saves ``benchmarks/results/verifier_latency.json``.

    specblock benchmark verifier_latency [--repeats 15] [--device cpu] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import click
import torch

from benchmarks.output import finish, table
from core.errors import InputError
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER, resolve_device
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark
from experiments.report_format import table as md_table
from real_engine.tree import DraftTree
from real_engine.verify import VERIFIERS, TorchSampler

SEED = 0
PATHS, DEPTH, CHAIN = 8, 8, 64
VOCABS = (8_192, 128_000)


def _rows(nodes: int, vocab: int, gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft probabilities sharing most of their logits (float32, as in decoding)."""
    base = 3 * torch.randn(nodes, vocab, generator=gen)
    p = (base + torch.randn(nodes, vocab, generator=gen)).softmax(-1)
    q = (base + torch.randn(nodes, vocab, generator=gen)).softmax(-1)
    return p.to(device), q.to(device)


def _draw(q: torch.Tensor, rows: list[int], gen: torch.Generator) -> list[int]:
    return torch.multinomial(q[rows].cpu(), 1, generator=gen)[:, 0].tolist()


def trees(vocab: int, device: str, gen: torch.Generator) -> dict[str, tuple[DraftTree, torch.Tensor]]:
    """The 8x8 tree and the 64-chain, with target rows; tokens drawn from the parent's draft row."""
    p, q = _rows(1 + PATHS * DEPTH, vocab, gen, device)
    paths = [[] for _ in range(PATHS)]
    for depth in range(DEPTH):
        parents = [0 if depth == 0 else 1 + k * DEPTH + depth - 1 for k in range(PATHS)]
        for path, token in zip(paths, _draw(q, parents, gen), strict=True):
            path.append(token)
    tree = DraftTree.from_paths(0, paths, q)
    cp, cq = _rows(1 + CHAIN, vocab, gen, device)
    chain_tokens = []
    for depth in range(CHAIN):
        chain_tokens += _draw(cq, [depth], gen)
    chain = DraftTree.chain(0, chain_tokens, cq)
    return {"tree": (tree, p), "chain": (chain, cp)}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(name: str, tree: DraftTree, p: torch.Tensor, repeats: int, warmup: int,
            device: str) -> dict[str, float]:
    """Median and spread of one verifier's wall time, and its mean accepted length over the calls."""
    sampler = TorchSampler(torch.Generator(device=device).manual_seed(SEED))
    times, accepted = [], []
    for i in range(warmup + repeats):
        _sync(device)
        start = time.perf_counter()
        result = VERIFIERS[name](tree, p, sampler)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            accepted.append(len(result.path))
    times.sort()
    return {"median_ms": 1e3 * statistics.median(times), "p10_ms": 1e3 * times[len(times) // 10],
            "p90_ms": 1e3 * times[(9 * len(times)) // 10], "mean_accepted": statistics.fmean(accepted)}


@click.command("verifier_latency")
@click.option("--repeats", type=int, default=15, show_default=True, help="Timed calls per verifier.")
@click.option("--warmup", type=int, default=3, show_default=True, help="Untimed calls first.")
@click.option("--device", default="cpu", show_default=True, help="torch device.")
@click.option("--threads", type=int, default=1, show_default=True,
              help="torch CPU threads (on a shared machine a second one waits on a busy core).")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for verifier_latency.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(repeats: int, warmup: int, device: str, threads: int, out: Path, as_json: bool) -> None:
    """Every verifier's latency on a 64-node draft tree at vocabularies 8,192 and 128,000."""
    if repeats < 1 or warmup < 0 or threads < 1:
        raise InputError(f"--repeats {repeats} --warmup {warmup} --threads {threads}: give at least 1 repeat "
                         "and thread, and no negative warm-up")
    device = resolve_device(device)
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(SEED)
    rows = []
    show = table(as_json)
    show(f"{'verifier':8} {'shape':>6} {'vocab':>7} {'median ms':>10} {'p10':>8} {'p90':>8} {'accepted':>9}")
    for vocab in VOCABS:
        shapes = trees(vocab, device, gen)
        for name in VERIFIERS:
            shape = "chain" if name in ("token", "block") else "tree"
            tree, p = shapes[shape]
            if name == "gds":  # it reads only greedy drafts; timed on the same tree, marked as one
                tree = replace(tree, child_rule="greedy_draft")
            row = {"verifier": name, "shape": f"{PATHS}x{DEPTH}" if shape == "tree" else f"chain{CHAIN}",
                   "nodes": tree.size - 1, "vocab": vocab, **measure(name, tree, p, repeats, warmup, device)}
            rows.append(row)
            show(f"{name:8} {row['shape']:>6} {vocab:>7} {row['median_ms']:>10.2f} {row['p10_ms']:>8.2f} "
                 f"{row['p90_ms']:>8.2f} {row['mean_accepted']:>9.2f}")
    config = {"paths": PATHS, "depth": DEPTH, "chain": CHAIN, "vocabs": list(VOCABS), "repeats": repeats,
              "warmup": warmup, "device": device, "threads": threads, "dtype": "float32",
              "rows": "softmax(3 z + z_p), softmax(3 z + z_q), z standard normal"}
    finish(as_json, rows, save_result("verifier_latency", rows, config, SEED, out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _verifier_latency_command(name: str, config: Record) -> str:
    return (f"{benchmark('verifier_latency')} --repeats {config['repeats']} --warmup {config['warmup']}"
            f" --device {config['device']} --threads {config['threads']}")


def _verifier_latency_body(record: Record) -> Lines:
    rows = [[r["verifier"], r["shape"], r["nodes"], f"{r['vocab']:,}", f"{r['median_ms']:.3f}",
             f"{r['p10_ms']:.3f} to {r['p90_ms']:.3f}"] for r in record["results"]]
    return md_table(["verifier", "shape", "nodes", "vocabulary", "median ms", "p10 to p90 ms"], rows)


RENDERERS: dict[str, Renderer] = {
    "verifier_latency": Renderer("Verifier latency", _verifier_latency_command, _verifier_latency_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
