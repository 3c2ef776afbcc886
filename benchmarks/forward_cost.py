"""What a draft-model chain can gain here at best: the shipped models' forward costs, side by side.

Speculating k tokens with a draft model takes k draft forwards and one target forward over k + 1
tokens, and yields E_k = 1 + a_1 + a_1 a_2 + ... tokens, a_i being the acceptance rate at chain
position i. So with c = (draft forward) / (target step) and v_k = (target forward over k + 1 tokens)
/ (target step), the speedup over plain decoding is at most E_k / (k c + v_k), the loop's own
bookkeeping left out. This times, interleaved in one process (one thread, committed context of 192
tokens, each forward's new tokens dropped again), the target's forward over 1 to 5 tokens and the
draft model's over 1, and prints that bound for acceptance rates given on the command line (the
bench's alpha by position). Saves ``benchmarks/results/forward_cost.json``.

    .venv/bin/python benchmarks/forward_cost.py [--repeats 1000] [--alpha 0.50,0.45,0.45,0.45]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from experiments.provenance import save_result
from real_engine.model import load_model

SEED = 0
CONTEXT = 192
MAX_TOKENS = 5


@torch.inference_mode()
def measure(repeats: int) -> dict[str, float]:
    """Median milliseconds of each forward, every kind timed once per round."""
    gen = torch.Generator().manual_seed(SEED)
    models = {"target": load_model("data/models/target"), "draft": load_model("data/models/draft")}
    caches = {}
    for name, model in models.items():
        caches[name] = model.new_cache(CONTEXT + MAX_TOKENS)
        model(torch.randint(0, model.args.vocab_size, (1, CONTEXT), generator=gen), cache=caches[name])
        caches[name].commit()
    kinds = [("target", t) for t in range(1, MAX_TOKENS + 1)] + [("draft", 1)]
    tokens = {k: torch.randint(0, 8000, (1, k[1]), generator=gen) for k in kinds}
    times: dict[tuple[str, int], list[float]] = {k: [] for k in kinds}
    for round_ in range(repeats + repeats // 10):
        for kind in kinds:
            name = kind[0]
            start = time.perf_counter()
            models[name](tokens[kind], cache=caches[name])
            elapsed = time.perf_counter() - start
            caches[name].pending = 0  # drop the new tokens: every forward sees the same context
            if round_ >= repeats // 10:
                times[kind].append(elapsed)
    return {f"{name}_{t}": 1e3 * statistics.median(v) for (name, t), v in times.items()}


def bound(ms: dict[str, float], alphas: list[float]) -> list[dict[str, float]]:
    """Per chain depth k: expected tokens per iteration and the speedup bound E_k / (k c + v_k)."""
    step, c = ms["target_1"], ms["draft_1"] / ms["target_1"]
    rows, expected, run = [], 1.0, 1.0
    for k in range(1, min(len(alphas), MAX_TOKENS - 1) + 1):
        run *= alphas[k - 1]
        expected += run
        v = ms[f"target_{k + 1}"] / step
        rows.append({"depth": k, "expected_tokens": expected, "c": c, "v": v,
                     "speedup_bound": expected / (k * c + v)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1000)
    parser.add_argument("--alpha", default="0.50,0.45,0.45,0.45",
                        help="acceptance rate by chain position (default: the draft model's on code)")
    args = parser.parse_args()
    try:
        alphas = [float(a) for a in args.alpha.split(",")]
    except ValueError:
        parser.error(f"--alpha {args.alpha!r}: give comma-separated rates such as 0.5,0.45")
    if args.repeats < 10 or not alphas or not all(0 <= a <= 1 for a in alphas):
        parser.error("--repeats must be >= 10 and every --alpha rate in [0, 1]")
    torch.set_num_threads(1)
    ms = measure(args.repeats)
    print("median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    rows = bound(ms, alphas)
    for r in rows:
        print(f"chain depth {r['depth']}: E = {r['expected_tokens']:.2f} tokens, c = {r['c']:.2f}, "
              f"v = {r['v']:.2f}: speedup at most {r['speedup_bound']:.2f}x")
    save_result("forward_cost", {"median_ms": ms, "bound": rows},
                {"repeats": args.repeats, "alpha": alphas, "context": CONTEXT, "threads": 1}, SEED)


if __name__ == "__main__":
    main()
