"""How fast the engine decodes a real model on this machine, and where the time goes.

For each dtype and context, interleaved round by round (a shared machine drifts, so every figure is
compared only with figures of the same round):

- this engine's vanilla greedy decoding against ``transformers``' ``generate`` on the same checkpoint
  folder and dtype, seconds per decoded token (prefill removed by differencing a long and a one-token
  run, for both alike);
- the memory bandwidth, measured in the same round two ways: a 1 GiB copy (bytes copied over its time,
  the usual "copy bandwidth") and a 1 GiB read-only sum (the rate a decode step's weight stream could
  reach at best); the *bandwidth fraction* is the bytes a decode step must read (every linear's
  weights as the kernel reads them, and the KV cache at that context) over its time, over each;
- what verifying a draft of 4, 8, 16 and 32 nodes costs against one plain step;
- a per-op table of one step (torch's profiler), so a reader sees where the time beyond the weight
  stream goes.

Run: ``specblock benchmark model_speed --model smollm2-135m``; writes
``benchmarks/results/model_speed.json`` and ``.md``. Intervals are 95% bootstrap intervals over rounds.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from benchmarks.output import finish, table
from core.errors import InputError
from core.files import write_text
from core.models import DEFAULT_MODEL, ModelSpec
from core.names import DTYPES
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER, model_option
from experiments.intervals import interval
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, flag, listed
from experiments.report_format import interval as md_interval
from experiments.report_format import table as md_table
from real_engine.decode import generate
from real_engine.model import Transformer, load_model
from real_engine.packed import Linear
from real_engine.profile import warm_step
from real_engine.timing import random_tokens

GIB = 2**30
TREE_NODES = (4, 8, 16, 32)
REPLICATES = 2000


def bandwidth() -> dict[str, float]:
    """Bytes per second of a 1 GiB float32 copy (bytes copied / time) and of a 1 GiB read-only sum."""
    src = torch.ones(GIB // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = time.perf_counter()
    dst.copy_(src)
    copy = time.perf_counter() - start
    src.sum()
    start = time.perf_counter()
    src.sum()
    read = time.perf_counter() - start
    return {"copy": GIB / copy, "read": GIB / read}


def step_bytes(model: Transformer, context: int, cache_element: int) -> dict[str, int]:
    """Bytes one decode step at ``context`` reads: every linear's weights as its kernel reads them (packed
    fp16 or 2-byte weights at 2 bytes, float32 at 4; the tied embedding once, as the LM head) and the
    keys and values of the cache."""
    weights = 0
    for module in model.modules():
        if isinstance(module, Linear):
            half = module.packs_half and module.weight.dtype is torch.float32
            weights += module.weight.numel() * (2 if half else module.weight.element_size())
    a = model.args
    cache = 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim * context * cache_element
    return {"weights": weights, "kv_cache": cache, "total": weights + cache}


@torch.inference_mode()
def ours_seconds(model: Transformer, prompt: torch.Tensor, n: int) -> float:
    """Seconds per decoded token of this engine's vanilla greedy loop (prefill removed by differencing)."""
    def run(count: int) -> float:
        start = time.perf_counter()
        generate(model, prompt, max_new_tokens=count, eos_id=None)
        return time.perf_counter() - start
    return (run(n) - run(1)) / (n - 1)


@torch.inference_mode()
def hf_seconds(hf: torch.nn.Module, prompt: torch.Tensor, n: int) -> float:
    """Seconds per decoded token of ``transformers``' greedy ``generate`` (prefill removed alike)."""
    mask = torch.ones(1, prompt.numel(), dtype=torch.long)

    def run(count: int) -> float:
        start = time.perf_counter()
        hf.generate(prompt[None], attention_mask=mask, max_new_tokens=count, min_new_tokens=count,
                    do_sample=False, pad_token_id=0)
        return time.perf_counter() - start
    return (run(n) - run(1)) / (n - 1)


def op_table(model: Transformer, context: int, steps: int = 8, rows: int = 12) -> list[dict[str, Any]]:
    """The ops of one plain step at ``context`` by their own CPU time per step (torch's profiler; its own
    overhead inflates the many small ops a little), the largest ``rows`` and the rest as ``other``."""
    from torch.profiler import ProfilerActivity, profile  # only when the table is drawn

    step = warm_step(model, context)
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.key_averages():
        totals[event.key][0] += event.self_cpu_time_total / 1e3 / steps
        totals[event.key][1] += event.count / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    whole = sum(ms for ms, _ in totals.values())
    out = [{"op": name, "ms_per_step": ms, "calls_per_step": calls, "share": ms / whole}
           for name, (ms, calls) in ranked[:rows]]
    rest = ranked[rows:]
    other = sum(ms for _, (ms, _) in rest)
    out.append({"op": "other", "ms_per_step": other, "calls_per_step": sum(c for _, (_, c) in rest),
                "share": other / whole})
    return out


def _interval(values: list[float], seed: int) -> list[float]:
    """95% bootstrap interval of the mean of ``values`` (one per round)."""
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(REPLICATES, data.size))].mean(axis=1)
    return interval(means)


def _summary(values: list[float], seed: int) -> dict[str, Any]:
    return {"mean": statistics.fmean(values), "ci": _interval(values, seed), "rounds": values}


def measure(spec: ModelSpec, dtypes: tuple[str, ...], contexts: tuple[int, ...], new_tokens: int,
            rounds: int, hf: bool, show: Any) -> dict[str, Any]:
    """Every figure of the module docstring, per dtype and context."""
    folder = spec.require().target
    models = {d: load_model(folder, getattr(torch, d)) for d in dtypes}
    peers = {}
    if hf:
        from transformers import AutoModelForCausalLM  # optional: the test extra

        peers = {d: AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, d)).eval()
                 for d in dtypes}
    vocab = next(iter(models.values())).args.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = {c: random_tokens(c, vocab, gen) for c in contexts}
    steps = {(d, c, n): warm_step(m, c, n)
             for d, m in models.items() for c in contexts for n in (1, *TREE_NODES)}
    samples: dict[tuple, list[float]] = defaultdict(list)
    for r in range(rounds):
        bw = bandwidth()
        samples[("bandwidth", "copy")].append(bw["copy"])
        samples[("bandwidth", "read")].append(bw["read"])
        for d in dtypes:
            for c in contexts:
                ours = ours_seconds(models[d], prompts[c], new_tokens)
                samples[("ours", d, c)].append(ours)
                if hf:
                    samples[("hf", d, c)].append(hf_seconds(peers[d], prompts[c], new_tokens))
                for n in (1, *TREE_NODES):
                    step = steps[(d, c, n)]
                    step()
                    start = time.perf_counter()
                    for _ in range(4):
                        step()
                    samples[("verify", d, c, n)].append((time.perf_counter() - start) / 4)
                samples[("copy_bw", d, c)].append(bw["copy"])
                samples[("read_bw", d, c)].append(bw["read"])
        show(f"round {r + 1}/{rounds}: copy {bw['copy'] / 1e9:.1f} GB/s, read {bw['read'] / 1e9:.1f} GB/s")
    rows = []
    for d in dtypes:
        model = models[d]
        cache_element = model.new_cache(1).k.element_size()
        for c in contexts:
            nbytes = step_bytes(model, c, cache_element)
            ours = samples[("ours", d, c)]
            plain = samples[("verify", d, c, 1)]

            def fraction(kind: str, ours: list[float] = ours, d: str = d, c: int = c,
                         total: int = nbytes["total"]) -> list[float]:
                return [total / s / bw for s, bw in zip(ours, samples[(kind, d, c)], strict=True)]

            row: dict[str, Any] = {
                "dtype": d, "context": c, "bytes_per_token": nbytes,
                "ours_tokens_per_second": _summary([1 / s for s in ours], 1),
                "ours_ms_per_token": _summary([1e3 * s for s in ours], 2),
                "bandwidth_fraction_copy": _summary(fraction("copy_bw"), 3),
                "bandwidth_fraction_read": _summary(fraction("read_bw"), 4),
                "verify_over_step": {str(n): _summary([v / s for v, s in zip(
                    samples[("verify", d, c, n)], plain, strict=True)], 5 + n) for n in TREE_NODES},
                "step_ms": _summary([1e3 * s for s in plain], 6),
                "ops": op_table(model, c),
            }
            if hf:
                theirs = samples[("hf", d, c)]
                row["hf_tokens_per_second"] = _summary([1 / s for s in theirs], 7)
                row["speedup_over_hf"] = _summary([t / o for t, o in zip(theirs, ours, strict=True)], 8)
            rows.append(row)
            show(_line(row))
    return {"rows": rows, "bandwidth": {k: _summary(samples[("bandwidth", k)], 9) for k in ("copy", "read")}}


def _line(row: dict[str, Any]) -> str:
    hf = (f"; transformers {row['hf_tokens_per_second']['mean']:.1f} tok/s, ours "
          f"{row['speedup_over_hf']['mean']:.2f}x" if "hf_tokens_per_second" in row else "")
    return (f"{row['dtype']:>8} ctx {row['context']:>5}: {row['ours_tokens_per_second']['mean']:.1f} tok/s, "
            f"{row['bandwidth_fraction_copy']['mean']:.0%} of copy bandwidth, "
            f"{row['bandwidth_fraction_read']['mean']:.0%} of read bandwidth{hf}; verify 16 nodes "
            f"{row['verify_over_step']['16']['mean']:.2f}x a step")


def _ci(summary: Record, fmt: str = ".1f", scale: float = 1.0) -> str:
    """A summary's mean with its 95% interval, each divided by ``scale``."""
    return md_interval(summary["mean"] / scale, [c / scale for c in summary["ci"]], fmt)


def markdown(results: dict[str, Any], config: dict[str, Any]) -> str:
    """The report: speed and bandwidth per dtype and context, verify cost by draft size, per-op tables."""
    bw = results["bandwidth"]
    lines = [f"# Engine speed on {config['model']}", "",
             f"Vanilla greedy decoding, {config['new_tokens']} new tokens after a context of random tokens, "
             f"{config['threads']} threads, {config['rounds']} interleaved rounds; 95% bootstrap intervals "
             f"over rounds. Bandwidth in the same rounds: 1 GiB copy {_ci(bw['copy'], scale=1e9)} GB/s, "
             f"1 GiB read-only sum {_ci(bw['read'], scale=1e9)} GB/s.", "",
             "| dtype | context | ours tok/s | transformers tok/s | ours / transformers | MB read per token "
             "| fraction of copy bandwidth | fraction of read bandwidth |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["rows"]:
        hf = row.get("hf_tokens_per_second")
        lines.append(f"| {row['dtype']} | {row['context']} | {_ci(row['ours_tokens_per_second'])} | "
                     f"{_ci(hf) if hf else '-'} | "
                     f"{_ci(row['speedup_over_hf'], '.2f') if hf else '-'} | "
                     f"{row['bytes_per_token']['total'] / 1e6:.0f} | "
                     f"{_ci(row['bandwidth_fraction_copy'], '.2f')} | "
                     f"{_ci(row['bandwidth_fraction_read'], '.2f')} |")
    lines += ["", "Verifying a draft of n nodes (the root and n tokens in one forward) over one plain step:",
              "", "| dtype | context | step ms | " + " | ".join(f"{n} nodes" for n in TREE_NODES) + " |",
              "|---|---:|---:|" + "---:|" * len(TREE_NODES)]
    for row in results["rows"]:
        cells = " | ".join(_ci(row["verify_over_step"][str(n)], ".2f") for n in TREE_NODES)
        lines.append(f"| {row['dtype']} | {row['context']} | {_ci(row['step_ms'], '.2f')} | {cells} |")
    for row in results["rows"]:
        head = f"One step's ops, {row['dtype']} at context {row['context']} (torch profiler, self time):"
        lines += ["", head, "", "| op | ms per step | calls per step | share |", "|---|---:|---:|---:|"]
        lines += [f"| `{op['op']}` | {op['ms_per_step']:.3f} | {op['calls_per_step']:.0f} | "
                  f"{op['share']:.1%} |" for op in row["ops"]]
    return "\n".join(lines) + "\n"


def _ints(value: str, flag: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise InputError(f"{flag} {value!r}: give positive integers separated by commas")
    return out


@click.command("model_speed")
@model_option(default=DEFAULT_MODEL)
@click.option("--dtypes", default="float32,bfloat16", show_default=True,
              help=f"Dtypes to run, among {', '.join(DTYPES)}.")
@click.option("--contexts", default="128,1024", show_default=True, help="Context lengths (tokens).")
@click.option("--new-tokens", type=click.IntRange(2, 4096), default=32, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--threads", type=click.IntRange(1, 256), default=2, show_default=True)
@click.option("--hf/--no-hf", default=True, show_default=True, help="Also run transformers' generate.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for model_speed.json and .md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(model: ModelSpec, dtypes: str, contexts: str, new_tokens: int, rounds: int, threads: int,
            hf: bool, out: Path, as_json: bool) -> None:
    """Vanilla decoding speed, bandwidth fraction, verify cost and per-op table on a real model."""
    chosen = tuple(dict.fromkeys(d.strip() for d in dtypes.split(",") if d.strip()))
    bad = [d for d in chosen if d not in DTYPES]
    if not chosen or bad:
        raise InputError(f"--dtypes {dtypes!r}: use some of {', '.join(DTYPES)}")
    torch.set_num_threads(threads)
    show = table(as_json)
    with torch.inference_mode():
        results = measure(model, chosen, _ints(contexts, "--contexts"), new_tokens, rounds, hf, show)
    config = {"model": model.name, "dtypes": list(chosen), "contexts": list(_ints(contexts, "--contexts")),
              "new_tokens": new_tokens, "rounds": rounds, "threads": threads, "hf": hf}
    saved = save_result("model_speed", results, config, seed=0, directory=out)
    report = write_text(out / "model_speed.md", markdown(results, config))
    finish(as_json, results["rows"], saved, report)


# --- its section of docs/results.md ----------------------------------------------------------------


def _model_speed_command(name: str, config: Record) -> str:
    return (f"specblock benchmark model_speed --model {config['model']} --dtypes {listed(config['dtypes'])} "
            f"--contexts {listed(config['contexts'])}{flag('--new-tokens', config['new_tokens'], 32)}"
            f"{flag('--rounds', config['rounds'], 5)}{flag('--threads', config['threads'], 2)}")


def _model_speed_body(record: Record) -> Lines:
    results = record["results"]
    bw = results["bandwidth"]
    copy, read = (_ci(bw[k], scale=1e9) for k in ("copy", "read"))
    lines = [f"Vanilla greedy decoding; bandwidth measured in the same rounds: a 1 GiB copy {copy} GB/s "
             f"(bytes copied over time), a 1 GiB read-only sum {read} GB/s. The fraction "
             "is the bytes a step must read (weights as its kernels read them, and the KV cache) over its "
             "time, over each.", ""]
    rows = []
    for r in results["rows"]:
        hf = r.get("hf_tokens_per_second")
        rows.append([r["dtype"], r["context"], _ci(r["ours_tokens_per_second"], ".1f"),
                     _ci(hf, ".1f") if hf else "-", _ci(r["speedup_over_hf"], ".2f") if hf else "-",
                     f"{r['bytes_per_token']['total'] / 1e6:.0f}", _ci(r["bandwidth_fraction_copy"], ".2f"),
                     _ci(r["bandwidth_fraction_read"], ".2f"), _ci(r["verify_over_step"]["16"], ".2f")])
    return [*lines, *md_table(["dtype", "context", "ours tok/s", "transformers tok/s", "ours / transformers",
                            "MB per token", "of copy bandwidth", "of read bandwidth",
                            "16-node verify / step"],
                           rows)]


RENDERERS: dict[str, Renderer] = {
    "model_speed": Renderer("Engine speed and memory bandwidth", _model_speed_command,
                            _model_speed_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
