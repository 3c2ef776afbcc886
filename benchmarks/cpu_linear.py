"""CPU matrix kernels behind a verify forward: torch's default linear, oneDNN's and FBGEMM's prepacked ones.

A speculative step pays for verifying T tokens at once; on a GPU that costs about what one token does,
on a CPU it does not (a verify's cost over a plain step: ``benchmarks/results/forward_cost.json``), and
that ratio decides whether any drafter can win. This measures, for the shipped target's weight shapes
(the LM head and the layers' projections) and T = 1, 2, 5, 17 rows, the median time of ``F.linear`` (MKL
here), of oneDNN's linear on a weight prepacked for that row count
(``torch.ops.mkldnn._linear_pointwise``, what inductor's CPU freezing uses) and of the engine's
``real_engine.packed.Linear`` (FBGEMM, fp16 weights), side by side in one run; saves
``benchmarks/results/cpu_linear.json``.

    specblock benchmark cpu_linear [--repeats 200] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import click
import torch
import torch.nn.functional as F

from benchmarks.output import finish, table
from core.errors import InputError
from core.models import TOY
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark
from experiments.report_format import table as md_table
from real_engine.model import load_model
from real_engine.packed import Linear, use_half

SEED = 0
ROWS = (1, 2, 5, 17)
ONEDNN = torch.ops.mkldnn._linear_pointwise  # linear on a weight prepacked by _reorder_linear_weight


def median_us(fn: Callable[[], object], repeats: int) -> float:
    """Median wall microseconds of ``fn`` after ``repeats // 10`` warm-up calls."""
    for _ in range(max(repeats // 10, 1)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


@torch.inference_mode()
def measure(shapes: dict[str, tuple[int, int]], repeats: int) -> list[dict[str, object]]:
    """One row per (weight, T): microseconds of each kernel, and the default's over each prepacked one."""
    gen = torch.Generator().manual_seed(SEED)
    rows = []
    for name, (out_features, in_features) in shapes.items():
        weight = torch.randn(out_features, in_features, generator=gen)
        fbgemm = use_half(Linear(in_features, out_features, bias=False), {"weight": weight.half()})
        fbgemm.weight.copy_(weight)
        for t in ROWS:
            x = torch.randn(t, in_features, generator=gen)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, t)
            default = median_us(lambda x=x, w=weight: F.linear(x, w), repeats)
            onednn = median_us(lambda x=x, p=packed: ONEDNN(x, p, None, "none", [], ""), repeats)
            half = median_us(lambda x=x, f=fbgemm: f(x), repeats)
            rows.append({"weight": name, "shape": [out_features, in_features], "rows": t,
                         "linear_us": default, "onednn_prepacked_us": onednn, "ratio": default / onednn,
                         "fbgemm_fp16_us": half, "fbgemm_ratio": default / half})
    return rows


@click.command("cpu_linear")
@click.option("--repeats", type=int, default=200, show_default=True, help="Timed calls per kernel and shape.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch intra-op threads.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for cpu_linear.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(repeats: int, threads: int, out: Path, as_json: bool) -> None:
    """torch's default linear against oneDNN's and FBGEMM's prepacked ones, at the target's weight shapes."""
    if repeats < 1 or threads < 1:
        raise InputError(f"--repeats {repeats} --threads {threads}: give 1 or more of each")
    torch.set_num_threads(threads)
    a = load_model(TOY.target).args
    shapes = {"lm_head": (a.vocab_size, a.hidden_size),
              "up_proj": (a.intermediate_size, a.hidden_size),
              "down_proj": (a.hidden_size, a.intermediate_size),
              "q_proj": (a.num_attention_heads * a.head_dim, a.hidden_size)}
    rows = measure(shapes, repeats)
    show = table(as_json)
    for r in rows:
        show(f"{r['weight']:>9} T={r['rows']:>2}: linear {r['linear_us']:7.1f} us, "
             f"oneDNN prepacked {r['onednn_prepacked_us']:7.1f} us ({r['ratio']:.2f}x), "
             f"FBGEMM fp16 {r['fbgemm_fp16_us']:7.1f} us ({r['fbgemm_ratio']:.2f}x)")
    finish(as_json, rows, save_result("cpu_linear", rows, {"repeats": repeats, "threads": threads,
                                                           "rows": list(ROWS), "shapes": shapes}, SEED, out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _cpu_linear_command(name: str, config: Record) -> str:
    return f"{benchmark('cpu_linear')} --repeats {config['repeats']} --threads {config['threads']}"


def _cpu_linear_body(record: Record) -> Lines:
    rows = [[r["weight"], "x".join(map(str, r["shape"])), r["rows"], f"{r['linear_us']:.0f}",
             f"{r['fbgemm_fp16_us']:.0f}", f"{r['fbgemm_ratio']:.2f}x"] for r in record["results"]]
    return md_table(["weight", "shape", "rows", "fp32 linear us", "packed fp16 us", "faster by"], rows)


RENDERERS: dict[str, Renderer] = {
    "cpu_linear": Renderer("Packed half-precision linears on CPU", _cpu_linear_command, _cpu_linear_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
