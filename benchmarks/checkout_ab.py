"""Decoding speed of two checkouts side by side: did a change to the engine make decoding faster?

A shared machine's speed drifts within minutes by more than a change to the engine usually moves it, so
two runs one after the other cannot tell the change. Here each checkout runs in its own worker process
(its own code and shipped weights, one thread), and every (drafter, prompt) generation runs in both,
alternating, once to warm up and once timed. The result per drafter is the median over prompts of the
paired time ratio (base time over candidate time: above 1 when the candidate is faster), beside each
side's tokens/s, speedup over its own vanilla decoding and tau. Greedy (T = 0) on the last prompts of
each held-out file.

    specblock benchmark checkout_ab BASE [--candidate .] [--drafters vanilla,ngram,...]
        [--domains code] [--prompts 8] [--max-new-tokens 48] [--name checkout_ab]

BASE is another checkout (``git worktree add /tmp/base HEAD~1``, or a clone); both must have the
shipped models. Each side runs ``benchmarks/checkout_worker.py``. Saves ``benchmarks/results/<name>.json``
with both commits.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

from benchmarks import checkout_worker
from benchmarks.output import finish, table
from core.errors import InputError
from core.names import DOMAINS
from core.paths import RESULTS, repo_relative
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag, listed
from experiments.report_format import table as md_table

DRAFTERS = "vanilla,ngram,draft-model,eagle,medusa,specblock"


class Side:
    """One checkout's worker process."""

    def __init__(self, root: Path, prompts: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
        args = [sys.executable, checkout_worker.__file__, str(prompts), ",".join(DOMAINS)]
        self.process = subprocess.Popen(args, cwd=root, env=env, text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)
        if self.process.stdout.readline().strip() != "ready":
            raise click.ClickException(f"the worker in {root} did not start: is it a checkout with shipped "
                                       "models?")

    def run(self, request: str) -> dict[str, float]:
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise click.ClickException(f"a worker stopped on {request!r}")
        return json.loads(line)


def commit(root: Path) -> str | None:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or None


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    tokens = sum(r["tokens"] for r in runs)
    return {"tokens_per_s": tokens / sum(r["seconds"] for r in runs),
            "tau": tokens / sum(r["iterations"] for r in runs)}


@click.command("checkout_ab")
@click.argument("base", type=click.Path(file_okay=False, path_type=Path))
@click.option("--candidate", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The checkout compared with BASE.")
@click.option("--drafters", default=DRAFTERS, show_default=True, help="Comma-separated, vanilla first.")
@click.option("--domains", default="code", show_default=True,
              help=f"Comma-separated, of {','.join(DOMAINS)}.")
@click.option("--prompts", type=int, default=8, show_default=True, help="Last held-out prompts per domain.")
@click.option("--max-new-tokens", type=int, default=48, show_default=True)
@click.option("--name", default="checkout_ab", show_default=True, help="Results file name.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for <name>.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(base: Path, candidate: Path, drafters: str, domains: str, prompts: int, max_new_tokens: int,
            name: str, out: Path, as_json: bool) -> None:
    """Decoding speed of two checkouts side by side, each in its own worker, paired generation by
    generation."""
    names, chosen = drafters.split(","), domains.split(",")
    if not (base / "real_engine").is_dir():
        raise InputError(f"BASE {base} is not a checkout of this project: give its folder")
    unknown = [d for d in chosen if d not in DOMAINS]
    if names[0] != "vanilla" or unknown or min(prompts, max_new_tokens) < 1:
        raise InputError("--drafters must start with vanilla, --domains come from "
                         f"{','.join(DOMAINS)}, --prompts and --max-new-tokens be >= 1")
    sides = [Side(base.resolve(), prompts), Side(candidate.resolve(), prompts)]
    runs: dict[str, list[list[dict[str, float]]]] = {d: [[], []] for d in names}
    for domain in chosen:
        for index in range(prompts):
            for drafter in names:
                request = f"{drafter} {domain} {index} {max_new_tokens}"
                for side in sides:  # warm-up, then the timed pair
                    side.run(request)
                for k, side in enumerate(sides):
                    runs[drafter][k].append(side.run(request))
    vanilla = [summary(runs["vanilla"][k])["tokens_per_s"] for k in (0, 1)]
    rows = []
    show = table(as_json)
    for drafter in names:
        b, c = (summary(runs[drafter][k]) for k in (0, 1))
        ratio = statistics.median(x["seconds"] / y["seconds"] for x, y in zip(*runs[drafter], strict=True))
        rows.append({"drafter": drafter, "candidate_over_base": ratio,
                     "base": {**b, "speedup": b["tokens_per_s"] / vanilla[0]},
                     "candidate": {**c, "speedup": c["tokens_per_s"] / vanilla[1]},
                     "runs": runs[drafter]})
        b, c = rows[-1]["base"], rows[-1]["candidate"]
        show(f"{drafter:12s} base {b['tokens_per_s']:6.1f} tok/s ({b['speedup']:.2f}x, tau {b['tau']:.2f})  "
             f"candidate {c['tokens_per_s']:6.1f} tok/s ({c['speedup']:.2f}x, tau {c['tau']:.2f})  "
             f"candidate {ratio:.2f}x as fast")
    config = {"base": repo_relative(base), "base_commit": commit(base), "candidate_commit": commit(candidate),
              "drafters": names, "domains": chosen, "prompts": prompts, "max_new_tokens": max_new_tokens,
              "threads": 1}
    finish(as_json, rows, save_result(name, rows, config, checkout_worker.SEED, out))


# --- its section of docs/results.md ----------------------------------------------------------------


def _checkout_ab_command(name: str, config: Record) -> str:
    return (f"{benchmark('checkout_ab')} BASE --drafters {listed(config['drafters'])} --domains "
            f"{listed(config['domains'])} --prompts {config['prompts']} --max-new-tokens "
            f"{config['max_new_tokens']}{flag('--name', name, 'checkout_ab')}")


def _checkout_ab_body(record: Record) -> Lines:
    config = record["config"]
    lines = ["Two checkouts alternated prompt by prompt in two worker processes: base "
             f"`{config['base_commit'][:12]}`, candidate `{config['candidate_commit'][:12]}`.", ""]
    rows = [[r["drafter"], f"{r['base']['tokens_per_s']:.1f}", f"{r['candidate']['tokens_per_s']:.1f}",
             f"{r['candidate_over_base']:.2f}x", f"{r['candidate']['tau']:.2f}"] for r in record["results"]]
    return lines + md_table(["drafter", "base tok/s", "candidate tok/s", "candidate / base", "tau"], rows)


RENDERERS: dict[str, Renderer] = {
    "checkout_ab": Renderer("Checkout A/B", _checkout_ab_command, _checkout_ab_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
