"""What a draft-model chain can gain here at best: the shipped models' forward costs, side by side.

Speculating k tokens with a draft model takes k draft forwards and one target forward over k + 1
tokens, and yields E_k = 1 + a_1 + a_1 a_2 + ... tokens, a_i being the acceptance rate at chain
position i. So with c = (draft forward) / (target step) and v_k = (target forward over k + 1 tokens)
/ (target step), the speedup over plain decoding is at most E_k / (k c + v_k), the loop's own
bookkeeping left out. This times, interleaved in one process (one thread, committed context of 192
tokens, each forward's new tokens dropped again), the target's forward over 1 to 5 tokens and the
draft model's over 1, whole and with its LM head cut to its ``--draft-vocab`` most frequent tokens
(``packed.cut_rows``), and prints that bound for acceptance rates given on the command
line (the bench's alpha by position), for both. Saves ``benchmarks/results/forward_cost.json``.

    .venv/bin/python benchmarks/forward_cost.py [--repeats 1000] [--alpha 0.50,0.45,0.45,0.45]
                                                [--draft-vocab 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from experiments.provenance import save_result
from real_engine.drafters.draft_model import load_vocab
from real_engine.model import load_model
from real_engine.packed import cut_rows

SEED = 0
CONTEXT = 192
MAX_TOKENS = 5
DRAFT = "data/models/draft"


@torch.inference_mode()
def measure(repeats: int, vocab: int) -> dict[str, float]:
    """Median milliseconds of each forward, every kind timed once per round."""
    gen = torch.Generator().manual_seed(SEED)
    models = {"target": load_model("data/models/target"), "draft": load_model(DRAFT)}
    caches = {}
    for name, model in models.items():
        caches[name] = model.new_cache(CONTEXT + MAX_TOKENS)
        model(torch.randint(0, model.args.vocab_size, (1, CONTEXT), generator=gen), cache=caches[name])
        caches[name].commit()
    kinds = [(f"target_{t}", "target", t, None) for t in range(1, MAX_TOKENS + 1)]
    cut = cut_rows(models["draft"].lm_head, load_vocab(DRAFT, vocab))
    kinds += [("draft_1", "draft", 1, None), (f"draft_1_vocab{vocab}", "draft", 1, cut)]
    tokens = {t: torch.randint(0, 8000, (1, t), generator=gen) for t in range(1, MAX_TOKENS + 1)}
    times: dict[str, list[float]] = {key: [] for key, *_ in kinds}
    for round_ in range(repeats + repeats // 10):
        for key, name, t, head in kinds:
            start = time.perf_counter()
            models[name](tokens[t], cache=caches[name], head=head)
            elapsed = time.perf_counter() - start
            caches[name].pending = 0  # drop the new tokens: every forward sees the same context
            if round_ >= repeats // 10:
                times[key].append(elapsed)
    return {key: 1e3 * statistics.median(v) for key, v in times.items()}


def bound(ms: dict[str, float], alphas: list[float], draft: str = "draft_1") -> list[dict[str, float]]:
    """Per chain depth k: expected tokens per iteration and the speedup bound E_k / (k c + v_k), c from
    the ``draft`` forward."""
    step, c = ms["target_1"], ms[draft] / ms["target_1"]
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
    parser.add_argument("--draft-vocab", type=int, default=2048,
                        help="also time the draft forward over this many of its most frequent tokens")
    args = parser.parse_args()
    try:
        alphas = [float(a) for a in args.alpha.split(",")]
    except ValueError:
        parser.error(f"--alpha {args.alpha!r}: give comma-separated rates such as 0.5,0.45")
    if args.repeats < 10 or not alphas or not all(0 <= a <= 1 for a in alphas) or args.draft_vocab < 1:
        parser.error("--repeats must be >= 10, every --alpha rate in [0, 1] and --draft-vocab >= 1")
    torch.set_num_threads(1)
    ms = measure(args.repeats, args.draft_vocab)
    print("median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    bounds = {draft: bound(ms, alphas, draft) for draft in ("draft_1", f"draft_1_vocab{args.draft_vocab}")}
    for draft, rows in bounds.items():
        for r in rows:
            print(f"{draft}, chain depth {r['depth']}: E = {r['expected_tokens']:.2f} tokens, "
                  f"c = {r['c']:.2f}, v = {r['v']:.2f}: speedup at most {r['speedup_bound']:.2f}x")
    save_result("forward_cost", {"median_ms": ms, "bounds": bounds},
                {"repeats": args.repeats, "alpha": alphas, "context": CONTEXT, "threads": 1,
                 "draft_vocab": args.draft_vocab}, SEED)


if __name__ == "__main__":
    main()
