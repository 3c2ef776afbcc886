"""What continuous batching buys here, with and without speculation: the batched engine's throughput and
per-token latency by batch size, side by side.

Every round serves the same held-out prompts (the last ``CONTEXT_TOKENS`` tokens of ``--prompts`` per
domain, all submitted at once, ``--tokens`` new tokens each, greedy) through
``real_engine.batch.BatchEngine`` at each batch cap and with each drafter (``none``: vanilla; a shipped
drafter in its deployed shape, one instance per request), the settings in a rotated order each round so
that the machine's drift hits all alike; one torch thread, wall clock. Per setting: tokens/s over the
rounds (all tokens over all seconds) with a 95% bootstrap interval over the rounds, the median time per
output token (a request's seconds from its first token to its last over its further tokens) and to the
first token, and each drafter's speedup over vanilla at the same cap (paired by round). With ``--alone``
each drafter that drafts in lockstep (the draft model's chains) also runs with every request drafting
alone (``BatchEngine(batch_drafting=False)``, "<drafter> alone"): what sharing the draft forwards buys.
Saves ``batch_throughput.json`` and a ``.md`` table beside it.

    specblock benchmark batch_throughput [--batches 1,2,4,8] [--drafters none,specblock] [--alone]
                                         [--prompts 4] [--tokens 32] [--rounds 5] [--out DIR] [--json]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from benchmarks.output import finish, table
from core.errors import InputError
from core.files import write_text
from core.models import TOY
from core.names import DOMAINS, VANILLA, drafter_spec
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.intervals import REPLICATES, interval
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag
from experiments.report_format import interval as md_interval
from experiments.report_format import table as md_table
from real_engine.batch import BatchEngine, Request, Result
from real_engine.decode import make_drafter
from real_engine.model import Transformer, load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts

SEED = 0
CONTEXT_TOKENS = 96
ALONE = " alone"  # a setting's suffix: its requests draft one at a time


def build(name: str, target: Transformer, draft: Transformer | None) -> Any:
    """A fresh shipped drafter ``name`` in its deployed shape (None for vanilla)."""
    if name == VANILLA:
        return None
    spec = drafter_spec(name)
    folder = TOY.drafter_folder(name) if spec.needs_draft_model or spec.trained else None
    return make_drafter(name, target, draft, folder=folder)


def serve(target: Transformer, draft: Transformer | None, prompts: Sequence[list[int]], tokens: int, cap: int,
          setting: str) -> dict[str, float]:
    """One round of one setting (a drafter, ``ALONE`` appended: drafting alone): every prompt submitted at
    once, served to the end."""
    drafter = setting.removesuffix(ALONE)
    engine = BatchEngine(target, max_batch=cap, batch_drafting=drafter == setting)
    for prompt in prompts:
        engine.submit(Request(prompt, tokens, build(drafter, target, draft)))
    began = time.perf_counter()
    results: dict[int, Result] = engine.run()
    seconds = time.perf_counter() - began
    if any(r.error for r in results.values()):
        raise click.ClickException(next(r.error for r in results.values() if r.error))
    done = list(results.values())
    return {"tokens": float(sum(len(r.tokens) for r in done)), "seconds": seconds,
            "tpot_ms": 1e3 * statistics.median((r.finished - r.first_token) / max(len(r.tokens) - 1, 1)
                                               for r in done),
            "ttft_ms": 1e3 * statistics.median(r.first_token - began for r in done),
            "tau": float(np.mean([r.tau for r in done]))}


def summarize(rounds: list[dict[str, float]], seed: int) -> dict[str, Any]:
    """A setting's figures over its rounds, tokens/s with its bootstrap interval over the rounds."""
    tokens = np.array([r["tokens"] for r in rounds])
    seconds = np.array([r["seconds"] for r in rounds])
    index = np.random.default_rng(seed).integers(0, len(rounds), size=(REPLICATES, len(rounds)))
    return {"tokens_per_second": float(tokens.sum() / seconds.sum()),
            "tokens_per_second_ci": interval(tokens[index].sum(1) / seconds[index].sum(1)),
            **{key: float(np.median([r[key] for r in rounds])) for key in ("tpot_ms", "ttft_ms", "tau")},
            "rounds": rounds}


def speedup(rounds: list[dict[str, float]], base: list[dict[str, float]], seed: int) -> dict[str, Any]:
    """tokens/s over the vanilla setting's, paired by round, with its bootstrap interval."""
    rate = np.array([r["tokens"] / r["seconds"] for r in rounds])
    plain = np.array([r["tokens"] / r["seconds"] for r in base])
    index = np.random.default_rng(seed).integers(0, len(rate), size=(REPLICATES, len(rate)))
    return {"speedup": float(rate.mean() / plain.mean()),
            "speedup_ci": interval(rate[index].mean(1) / plain[index].mean(1))}


def markdown(rows: list[dict[str, Any]], command_line: str, prompts: int, tokens: int) -> str:
    """The results table."""
    lines = ["# Continuous batching: throughput and latency by batch size", "",
             f"{prompts} held-out prompts (last {CONTEXT_TOKENS} tokens), all submitted at once, "
             f"{tokens} new tokens each, greedy, one torch thread, wall clock; settings interleaved by "
             "round. [95% CI]: bootstrap over the rounds. Speedup: over vanilla at the same batch cap, "
             "paired by round. A drafter's chains draft in lockstep across requests; \"alone\": each "
             f"request's drafter proposes by itself. Command: `{command_line}`.", "",
             "| batch cap | drafter | tokens/s [95% CI] | speedup [95% CI] | TPOT ms (median) | "
             "TTFT ms (median) | tau |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["tokens_per_second_ci"]
        gain = (f"{r['speedup']:.2f} [{r['speedup_ci'][0]:.2f}, {r['speedup_ci'][1]:.2f}]"
                if "speedup" in r else "1")
        lines.append(f"| {r['batch']} | {r['drafter']} | {r['tokens_per_second']:.1f} "
                     f"[{low:.1f}, {high:.1f}] | {gain} | {r['tpot_ms']:.2f} | {r['ttft_ms']:.1f} | "
                     f"{r['tau']:.2f} |")
    return "\n".join(lines) + "\n"


def _ints(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: give positive integers separated by commas, e.g. 1,2,4,8")
    return out


@click.command("batch_throughput")
@click.option("--batches", default="1,2,4,8", show_default=True, help="Batch caps, comma-separated.")
@click.option("--drafters", default="none,specblock", show_default=True,
              help="Drafters (none: vanilla), comma-separated; each in its deployed shape.")
@click.option("--alone", is_flag=True,
              help="Also run each drafter that drafts in lockstep with every request drafting alone.")
@click.option("--prompts", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Held-out prompts per domain.")
@click.option("--tokens", type=click.IntRange(2, 512), default=32, show_default=True,
              help="New tokens per request.")
@click.option("--rounds", type=click.IntRange(2, 100), default=5, show_default=True,
              help="Interleaved rounds of every setting.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for batch_throughput.json and .md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(batches: str, drafters: str, alone: bool, prompts: int, tokens: int, rounds: int, out: Path,
            as_json: bool) -> None:
    """Throughput and per-token latency of the batched engine by batch cap, with and without a drafter."""
    caps, names = _ints(batches), tuple(drafters.split(","))
    try:
        specs = [drafter_spec(name) for name in names if name != VANILLA]
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None
    if VANILLA not in names:
        raise click.BadParameter(f"--drafters {drafters!r} lacks none: vanilla is the speedups' baseline")
    torch.set_num_threads(1)
    target = load_model(TOY.target)
    draft = load_model(TOY.draft_model) if any(spec.needs_draft_model for spec in specs) else None
    tokenizer = Tokenizer.load(TOY.target, target.args.vocab_size, target.args.eos_token_id)
    held = [p.tokens for p in load_prompts(DOMAINS, prompts, tokenizer.encode, "evaluation", CONTEXT_TOKENS)]
    lockstep = [name for name in names if alone and getattr(build(name, target, draft), "batch_key", None)]
    settings = [(cap, name) for cap in caps for name in (*names, *(n + ALONE for n in lockstep))]
    measured: dict[tuple[int, str], list[dict[str, float]]] = {s: [] for s in settings}
    serve(target, draft, held[:1], 2, 1, names[-1])  # one-time costs
    for r in range(rounds):
        for cap, name in settings[r % len(settings):] + settings[:r % len(settings)]:
            measured[(cap, name)].append(serve(target, draft, held, tokens, cap, name))
    show = table(as_json)
    rows = []
    for cap, name in settings:
        row = {"batch": cap, "drafter": name, **summarize(measured[(cap, name)], SEED)}
        if name != VANILLA:
            row.update(speedup(measured[(cap, name)], measured[(cap, VANILLA)], SEED))
        rows.append(row)
        show(f"batch {cap:2d} {name:10s} {row['tokens_per_second']:7.1f} tokens/s  "
             f"TPOT {row['tpot_ms']:6.2f} ms  tau {row['tau']:.2f}")
    command_line = (f"specblock benchmark batch_throughput --batches {batches} --drafters {drafters}"
                    f"{' --alone' if alone else ''} --prompts {prompts} --tokens {tokens} --rounds {rounds}")
    config = {"batches": list(caps), "drafters": list(names), "alone": lockstep,
              "prompts_per_domain": prompts, "tokens": tokens,
              "rounds": rounds, "context_tokens": CONTEXT_TOKENS, "target": TOY.target.name, "threads": 1,
              "replicates": REPLICATES}
    saved = save_result("batch_throughput", {"settings": rows}, config, SEED, out)
    md = out / "batch_throughput.md"
    write_text(md, markdown(rows, command_line, len(held), tokens))
    finish(as_json, rows, saved, md)


# --- its section of docs/results.md ----------------------------------------------------------------


def _batch_throughput_command(name: str, config: Record) -> str:
    batches = ",".join(map(str, config["batches"]))
    return (f"{benchmark('batch_throughput')}{flag('--batches', batches, '1,2,4,8')}"
            f"{flag('--drafters', ','.join(config['drafters']), 'none,specblock')}"
            f"{' --alone' if config.get('alone') else ''}"
            f"{flag('--prompts', config['prompts_per_domain'], 4)}{flag('--tokens', config['tokens'], 32)}"
            f"{flag('--rounds', config['rounds'], 5)}")


def _batch_throughput_body(record: Record) -> Lines:
    rows = [[r["batch"], r["drafter"], md_interval(r["tokens_per_second"], r["tokens_per_second_ci"], ".1f"),
             md_interval(r["speedup"], r["speedup_ci"], ".2f") if "speedup" in r else "1",
             f"{r['tpot_ms']:.2f}", f"{r['ttft_ms']:.1f}", f"{r['tau']:.2f}"]
            for r in record["results"]["settings"]]
    return ["The batched engine (continuous batching), every prompt submitted at once; speedup over vanilla "
            "at the same batch cap, paired by round [95% CI over the rounds]. A drafter's chains draft in "
            "lockstep across requests; \"alone\": each request's drafter proposes by itself.", "",
            *md_table(["batch cap", "drafter", "tokens/s", "speedup", "TPOT ms", "TTFT ms", "tau"], rows)]


RENDERERS: dict[str, Renderer] = {
    "batch_throughput": Renderer("Continuous batching: throughput by batch size", _batch_throughput_command,
                                 _batch_throughput_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
