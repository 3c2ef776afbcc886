"""Verifier latency on a 64-node draft tree at vocabularies 8,192 and 128,000.

Tree verifiers (greedy, rrs, gbv, seqbv) see 8 i.i.d. paths of depth 8 (``DraftTree.from_paths``);
the single-path ones (token, block) a chain of 64. Target and draft rows are random but correlated
(shared logits plus noise), and each drafted token is sampled from its parent's draft row, so the
acceptance lengths, and with them the work of the sequential verifiers, are realistic. Reports the
median wall time over repeats after warm-up and the mean accepted length over those calls (one
fixed draft per shape and vocabulary, so it only shows how far the sequential verifiers walked);
saves ``benchmarks/results/verifier_latency.json``.

    .venv/bin/python benchmarks/verifier_latency.py [--repeats 15] [--device cpu] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from experiments.provenance import save_result
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


def main() -> None:
    """Measure every verifier at each vocabulary, print a table, save the rows with provenance."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (on a shared machine a second one waits on a busy core)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(SEED)
    rows = []
    print(f"{'verifier':8} {'shape':>6} {'vocab':>7} {'median ms':>10} {'p10':>8} {'p90':>8} {'accepted':>9}")
    for vocab in VOCABS:
        shapes = trees(vocab, args.device, gen)
        for name in VERIFIERS:
            shape = "chain" if name in ("token", "block") else "tree"
            tree, p = shapes[shape]
            row = {"verifier": name, "shape": f"{PATHS}x{DEPTH}" if shape == "tree" else f"chain{CHAIN}",
                   "nodes": tree.size - 1, "vocab": vocab,
                   **measure(name, tree, p, args.repeats, args.warmup, args.device)}
            rows.append(row)
            print(f"{name:8} {row['shape']:>6} {vocab:>7} {row['median_ms']:>10.2f} {row['p10_ms']:>8.2f} "
                  f"{row['p90_ms']:>8.2f} {row['mean_accepted']:>9.2f}", flush=True)
    config = {"paths": PATHS, "depth": DEPTH, "chain": CHAIN, "vocabs": list(VOCABS), "repeats": args.repeats,
              "warmup": args.warmup, "device": args.device, "threads": args.threads, "dtype": "float32",
              "rows": "softmax(3 z + z_p), softmax(3 z + z_q), z standard normal"}
    path = save_result("verifier_latency", rows, config, SEED)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
