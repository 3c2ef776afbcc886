"""What a draft-model chain can gain here at best: the shipped models' forward costs, side by side.

Speculating k tokens with a draft model takes k draft forwards and one target forward over k + 1
tokens, and yields E_k = 1 + a_1 + a_1 a_2 + ... tokens, a_i being the acceptance rate at chain
position i. So with c = (draft forward) / (target step) and v_k = (target forward over k + 1 tokens)
/ (target step), the speedup over plain decoding is at most E_k / (k c + v_k), the loop's own
bookkeeping left out. This times, interleaved in one process (one thread, committed context of 192
tokens, each forward's new tokens dropped again), the target's forward over 1 to 5 tokens and the
draft model's over 1, whole and with its LM head cut to its ``--draft-vocab`` most frequent tokens
(``packed.cut_rows``), and prints that bound for acceptance rates given on the command
line (the bench's alpha by position), for both. It also times each model's matrix products alone, on
inputs of a single-token step's shapes: their share of the step says how much of it is arithmetic and
how much per-call overhead, which a smaller model's forward cannot shed. Saves
``benchmarks/results/forward_cost.json``.

    specblock benchmark forward_cost [--repeats 1000] [--alpha 0.50,0.45,0.45,0.45] [--draft-vocab 2048]
                                     [--target DIR] [--draft DIR] [--tag forward_cost]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import click
import torch

from benchmarks.output import finish, table
from core.errors import InputError
from core.models import TOY
from core.paths import RESULTS, repo_relative
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag, listed
from experiments.report_format import table as md_table
from real_engine.drafters.vocab import load_vocab
from real_engine.model import Transformer, load_model
from real_engine.packed import Linear, cut_rows

SEED = 0
CONTEXT = 192
MAX_TOKENS = 5


def products(model: Transformer, gen: torch.Generator) -> Callable[[], None]:
    """The matrix products of one single-token step of ``model`` alone (each layer's query/key/value,
    output, gate/up and down products, then the LM head), on random inputs of their shapes: what is
    left of a step once everything but its arithmetic is taken away."""
    a = model.args
    calls = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        calls += [(attn.qkv, a.hidden_size), (attn.o_proj, a.num_attention_heads * a.head_dim),
                  (mlp.gate_up, a.hidden_size), (mlp.down_proj, a.intermediate_size)]
    calls.append((model.lm_head, a.hidden_size))
    inputs = [(fn, torch.randn(1, 1, width, generator=gen)) for fn, width in calls]

    def run() -> None:
        for fn, x in inputs:
            fn(x)
    return run


@torch.inference_mode()
def measure(repeats: int, vocab: int, target: Path, draft: Path) -> dict[str, float]:
    """Median milliseconds of each forward (and of each model's products alone), every kind timed once
    per round."""
    gen = torch.Generator().manual_seed(SEED)
    models = {"target": load_model(target), "draft": load_model(draft)}
    caches = {}
    for name, model in models.items():
        caches[name] = model.new_cache(CONTEXT + MAX_TOKENS)
        model(torch.randint(0, model.args.vocab_size, (1, CONTEXT), generator=gen), cache=caches[name])
        caches[name].commit()
    tokens = {t: torch.randint(0, 8000, (1, t), generator=gen) for t in range(1, MAX_TOKENS + 1)}

    def forward(name: str, t: int, head: Linear | None = None) -> Callable[[], None]:
        def run() -> None:
            models[name](tokens[t], cache=caches[name], head=head)
            caches[name].pending = 0  # drop the new tokens: every forward sees the same context
        return run

    kinds = {f"target_{t}": forward("target", t) for t in range(1, MAX_TOKENS + 1)}
    kinds["draft_1"] = forward("draft", 1)
    cut = cut_rows(models["draft"].lm_head, load_vocab(draft, vocab))
    kinds[f"draft_1_vocab{vocab}"] = forward("draft", 1, cut)
    kinds |= {f"{name}_products": products(model, gen) for name, model in models.items()}
    times: dict[str, list[float]] = {key: [] for key in kinds}
    for round_ in range(repeats + repeats // 10):
        for key, run in kinds.items():
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
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


@click.command("forward_cost")
@click.option("--repeats", type=int, default=1000, show_default=True, help="Timed rounds (at least 10).")
@click.option("--target", type=click.Path(file_okay=False, path_type=Path), default=TOY.target,
              show_default="data/models/target", help="Target checkpoint folder.")
@click.option("--draft", type=click.Path(file_okay=False, path_type=Path), default=TOY.draft_model,
              show_default="data/models/draft", help="Draft model folder.")
@click.option("--tag", default="forward_cost", show_default=True, help="Results file name (TAG.json).")
@click.option("--alpha", default="0.50,0.45,0.45,0.45", show_default=True,
              help="Acceptance rate by chain position (default: the draft model's on code).")
@click.option("--draft-vocab", type=int, default=2048, show_default=True,
              help="Also time the draft forward over this many of its most frequent tokens.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for TAG.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(repeats: int, target: Path, draft: Path, tag: str, alpha: str, draft_vocab: int, out: Path,
            as_json: bool) -> None:
    """The shipped models' forward costs, and the speedup bound of a draft-model chain they allow."""
    try:
        alphas = [float(a) for a in alpha.split(",")]
    except ValueError:
        raise InputError(f"--alpha {alpha!r}: give comma-separated rates such as 0.5,0.45") from None
    if repeats < 10 or not alphas or not all(0 <= a <= 1 for a in alphas) or draft_vocab < 1:
        raise InputError("--repeats must be >= 10, every --alpha rate in [0, 1] and --draft-vocab >= 1")
    torch.set_num_threads(1)
    ms = measure(repeats, draft_vocab, target, draft)
    show = table(as_json)
    show("median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    shares = {name: ms[f"{name}_products"] / ms[f"{name}_1"] for name in ("target", "draft")}
    show("share of a single-token step that is matrix products: "
         + ", ".join(f"{name} {share:.2f}" for name, share in shares.items()))
    bounds = {name: bound(ms, alphas, name) for name in ("draft_1", f"draft_1_vocab{draft_vocab}")}
    for name, rows in bounds.items():
        for r in rows:
            show(f"{name}, chain depth {r['depth']}: E = {r['expected_tokens']:.2f} tokens, "
                 f"c = {r['c']:.2f}, v = {r['v']:.2f}: speedup at most {r['speedup_bound']:.2f}x")
    results = {"median_ms": ms, "products_share": shares, "bounds": bounds}
    config = {"repeats": repeats, "alpha": alphas, "context": CONTEXT, "threads": 1,
              "draft_vocab": draft_vocab, "target": repo_relative(target), "draft": repo_relative(draft)}
    finish(as_json, results, save_result(tag, results, config, SEED, out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _forward_cost_command(name: str, config: Record) -> str:
    return (f"{benchmark('forward_cost')} --repeats {config['repeats']} --target {config['target']}"
            f" --draft {config['draft']} --alpha {listed(config['alpha'])}"
            f"{flag('--tag', name, 'forward_cost')}")


def _forward_cost_body(record: Record) -> Lines:
    result = record["results"]
    ms, share = result["median_ms"], result["products_share"]
    lines = [f"Median milliseconds per forward (context {record['config']['context']}): "
             + ", ".join(f"{key} {value:.3f}" for key, value in ms.items())
             + f". Matrix products' share of a step: target {share['target']:.2f}, "
             f"draft {share['draft']:.2f}.",
             "", "Speedup bound of a draft chain (c: a draft forward over a target step; v: a verify over a "
             "step):", ""]
    rows = [[drafter, b["depth"], f"{b['expected_tokens']:.3f}", f"{b['c']:.3f}", f"{b['v']:.3f}",
             f"{b['speedup_bound']:.3f}"] for drafter, bounds in result["bounds"].items() for b in bounds]
    return lines + md_table(["draft forward", "depth", "expected tokens", "c", "v", "speedup bound"], rows)


RENDERERS: dict[str, Renderer] = {
    "forward_cost": Renderer("Forward cost and the draft chain's speedup bound", _forward_cost_command,
                             _forward_cost_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
