"""The multi-draft study: every verifier's expected accepted length against the LP bound, by K, V and L.

For K = 1..4 draft paths of length L over V tokens it reports, exactly (``experiments.lp_table``, STUDY
columns): token-level and block verification on one path (closed forms), RRS on the paths' token trie
with i.i.d. paths and without replacement, SeqBV, GBV and GDS (exact enumeration of the torch verifiers),
and three LP bounds: for K i.i.d. paths (``lp``, the bound of every column drafted i.i.d.), for RRS's
drafts without replacement (``lp_wor``) and for GDS's greedy draft (``lp_gds``). A verifier's gap is its
own draft law's bound minus its value; ``gbv_below_bv`` counts the instances where GBV accepts less than
single-path BV.

Two sources of instances (``simulator.instances.ARInstance``):

- ``random``: Dirichlet(1) targets at every prefix with an independent Dirichlet(1) drafter
  (``random_instance(..., "indep")``), the same instances for every K of a (V, L) cell.
- ``real``: the shipped target and draft model at recorded contexts. A context is an evaluation prompt
  of ``data/prompts/<domain>.jsonl`` (its last 96 tokens), extended by the target's first ``offset``
  greedy tokens. After a prefix ``s`` of the instance, symbol ``i`` stands for the target's ``i``-th
  most likely token at the real context the prefix spells (context, then the tokens of ``s``); ``p``
  and ``q`` there are the target's and the draft model's next-token laws (softmax of the float32
  logits, temperature 1) restricted to those V tokens and renormalized. So every prefix carries the
  models' own laws at its real context, cut to the target's top V.

Means come with 95% bootstrap intervals over the instances (resampled within each domain for real
laws). Saves ``multidraft.json`` (``multidraft_quick.json`` with ``--quick``) with a ``.md`` table and a
``.png`` plot beside it. The full grid takes CPU minutes, shared by ``--workers`` processes;
``--quick`` seconds.

    specblock benchmark multidraft [--quick] [--workers 2] [--out DIR] [--json]
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from benchmarks.output import finish, table
from core.files import atomic_write, write_text
from core.models import TOY
from core.names import DOMAINS
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.intervals import REPLICATES, interval, resamples
from experiments.lp_table import STUDY, evaluate_verifiers
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark
from experiments.report_format import table as md_table
from real_engine.decode import generate, prefill
from real_engine.model import Transformer, load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts
from real_engine.tree import DraftTree
from simulator.instances import ARInstance, random_instance
from simulator.lp import LPSolveError

SEED = 0
CONTEXT_TOKENS = 96  # each prompt's last tokens: the context the real laws are read at
TREE_ROOM = 64  # cache positions past a context for an instance's prefix tree (21 nodes at V = 4, L = 2)
BOUND_OF = {"token": "lp", "block": "lp", "rrs": "lp", "seqbv": "lp", "gbv": "lp", "rrs_wor": "lp_wor",
            "gds": "lp_gds"}
"""Each verifier's bound: the LP of the law its drafts are drawn from."""
VERIFIERS = tuple(BOUND_OF)
TIE = 1e-9  # GBV counts as below BV only by more than this
# (V, L, Ks) per source. (4, 2) stops at K = 3: K = 4 would walk 65,536 ordered draft tuples per verifier.
FULL = {"random": ((4, 1, (1, 2, 3, 4)), (8, 1, (1, 2, 3, 4)), (3, 2, (1, 2, 3, 4)), (4, 2, (1, 2, 3)),
                   (2, 3, (1, 2, 3, 4))),
        "real": ((4, 1, (1, 2, 3, 4)), (8, 1, (1, 2, 3, 4)), (3, 2, (1, 2, 3, 4)), (4, 2, (1, 2, 3)))}
QUICK = {"random": ((4, 1, (1, 2, 3, 4)), (3, 2, (1, 2))), "real": ((4, 1, (1, 2, 3, 4)), (3, 2, (1, 2)))}
SETTINGS = {False: {"instances": 6, "domains": DOMAINS, "offsets": (0, 16)},
            True: {"instances": 2, "domains": DOMAINS[:1], "offsets": (0,)}}
"""Random instances per (V, L); the domains whose first evaluation prompt gives real contexts, and the
greedy offsets each prompt is read at."""


class Context:
    """A recorded context with both models' key/value caches filled up to its last token, so each
    instance read there costs a forward over its prefix tree only (tree attention, as verification runs)."""

    def __init__(self, domain: str, tokens: list[int], models: tuple[Transformer, Transformer]) -> None:
        self.domain, self.tokens, self.models = domain, tokens, models
        self.caches = [model.new_cache(len(tokens) + TREE_ROOM) for model in models]
        for model, cache in zip(models, self.caches, strict=True):
            prefill(model, cache, torch.tensor(tokens[:-1]))

    def laws(self, which: int, tree: DraftTree) -> torch.Tensor:
        """Next-token laws ([nodes, vocabulary], float32 softmax) of model ``which`` (0 the target, 1 the
        draft model) at every node of ``tree``, whose root is the context's last token."""
        model, cache = self.models[which], self.caches[which]
        logits = model(tree.tokens[None], positions=tree.positions(len(self.tokens) - 1), cache=cache,
                       tree_mask=tree.mask()).logits[0]
        cache.commit(0)  # the committed context stays as it was
        return logits.float().softmax(-1)


@torch.no_grad()
def contexts(target: Transformer, draft: Transformer, domains: tuple[str, ...],
             offsets: tuple[int, ...]) -> list[Context]:
    """Each real context: the first evaluation prompt of each domain (its last ``CONTEXT_TOKENS``
    tokens) followed by the target's first ``offset`` greedy tokens, for each offset."""
    tokenizer = Tokenizer.load(TOY.target, target.args.vocab_size)
    out = []
    for prompt in load_prompts(domains, 1, tokenizer.encode, part="evaluation", max_tokens=CONTEXT_TOKENS):
        ids = list(prompt.tokens)
        greedy = generate(target, ids, max_new_tokens=max(offsets)).tokens if max(offsets) else ()
        out += [Context(prompt.domain, [*ids, *greedy[:offset]], (target, draft)) for offset in offsets]
    return out


@torch.no_grad()
def real_instance(context: Context, vocab: int, length: int) -> ARInstance:
    """The instance of ``vocab`` symbols and ``length`` positions read at ``context`` (see the module doc):
    the prefix tree grown depth by depth from the target's top ``vocab`` tokens (a target forward per
    depth), then one draft-model forward over the whole tree."""
    tokens, parents, levels, tops = [context.tokens[-1]], [-1], [[0]], []
    for depth in range(length + 1):
        tree = DraftTree(torch.tensor(tokens), torch.tensor(parents))
        top = context.laws(0, tree)[levels[depth]].topk(vocab, dim=-1).indices  # symbol i: the i-th likeliest
        tops.append(top)
        if depth < length:
            level = []
            for node, row in zip(levels[depth], top.tolist(), strict=True):
                for token in row:
                    level.append(len(tokens))
                    tokens.append(token)
                    parents.append(node)
            levels.append(level)
    tables = []
    for which in (0, 1):
        full = context.laws(which, tree)
        rows = [full[level].gather(1, top).double() for level, top in zip(levels, tops, strict=True)]
        tables.append(tuple((r / r.sum(1, keepdim=True)).numpy() for r in rows))
    return ARInstance(vocab, length, *tables)


Build = Callable[[int, int], ARInstance]  # an instance of (V, L)


def seeded(index: int) -> Build:
    """Random instance ``index`` of a (V, L) cell (the same for every K): seeded by (SEED, V, L, index)."""
    return lambda vocab, length: random_instance(vocab, length,
                                                 np.random.default_rng([SEED, vocab, length, index]))


def summarize(values: list[dict[str, float]], labels: tuple[str, ...]) -> dict[str, Any]:
    """Mean and 95% bootstrap interval of every column and every verifier's gap to its bound, the mean
    excess of rrs_wor and gds over the i.i.d. bound, and how often GBV falls below BV."""
    index = resamples(labels, REPLICATES, SEED)

    def stat(column: np.ndarray) -> dict[str, Any]:
        return {"mean": float(column.mean()), "ci": interval(column[index].mean(axis=1))}

    data = {c: np.array([v[c] for v in values]) for c in STUDY}
    below = int(np.sum(data["gbv"] < data["block"] - TIE))
    return {"instances": len(values),
            "value": {c: stat(data[c]) for c in STUDY},
            "gap": {v: stat(data[BOUND_OF[v]] - data[v]) for v in VERIFIERS},
            "over_iid_bound": {v: stat(data[v] - data["lp"]) for v in ("rrs_wor", "gds")},
            "gbv_below_bv": {"count": below, "share": below / len(values)},
            "per_instance": [{c: v[c] for c in STUDY} for v in values]}


def pool(workers: int) -> Executor:
    """``workers`` processes, one torch thread each (spawned: torch is not fork-safe); one worker runs in
    this process instead."""
    if workers == 1:
        return ThreadPoolExecutor(1)
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=torch.set_num_threads, initargs=(1,))


def run_grid(grid: dict[str, tuple], builds: dict[str, list[tuple[str, Build]]], workers: int,
             show: Callable[[str], None]) -> list[dict[str, Any]]:
    """One summary per (source, V, L, K) of ``grid``; ``builds[source]`` gives (label, build(V, L)) per
    instance. Every (instance, K) is evaluated on its own, so the figures do not depend on ``workers``."""
    rows = []
    with pool(workers) as executor:
        submitted = []
        for source, cells in grid.items():
            for vocab, length, drafts_list in cells:
                labels, insts = zip(*((label, build(vocab, length)) for label, build in builds[source]),
                                    strict=True)
                submitted += [((source, vocab, length, drafts), labels,
                               [executor.submit(evaluate_verifiers, inst, drafts, STUDY) for inst in insts])
                              for drafts in drafts_list]
        for (source, vocab, length, drafts), labels, futures in submitted:
            try:
                values = [future.result() for future in futures]
            except LPSolveError as exc:
                executor.shutdown(cancel_futures=True)
                raise click.ClickException(f"{source} V={vocab} L={length} K={drafts}: {exc}") from None
            row = {"source": source, "vocab": vocab, "length": length, "drafts": drafts,
                   **summarize(values, labels)}
            rows.append(row)
            mean = {c: row["value"][c]["mean"] for c in STUDY}
            show(f"{source:6} {vocab:>2} {length:>2} {drafts:>2} "
                 + " ".join(f"{mean[c]:7.4f}" for c in STUDY)
                 + f" {row['gbv_below_bv']['count']:>3}/{row['instances']}")
    return rows


def overall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per source, over every multi-draft cell (K >= 2): GBV below BV, and GDS past the i.i.d. bound."""
    out = {}
    for source in sorted({r["source"] for r in rows}):
        cells = [r for r in rows if r["source"] == source and r["drafts"] >= 2]
        pairs = [i for r in cells for i in r["per_instance"]]
        below = sum(i["gbv"] < i["block"] - TIE for i in pairs)
        out[source] = {"instances": len(pairs), "gbv_below_bv": below,
                       "gbv_below_bv_share": below / len(pairs),
                       "gds_over_lp": sum(i["gds"] > i["lp"] + TIE for i in pairs),
                       "gds_at_own_bound": sum(abs(i["gds"] - i["lp_gds"]) <= 1e-6 for i in pairs)}
    return out


def figure(value: float, sign: str = "") -> str:
    """Four decimals, with the LP solver's tolerance (|x| < 5e-5) written as zero."""
    return f"{0.0 if abs(value) < 5e-5 else value:{sign}.4f}"


LABELS = {"lp": "LP (iid)", "lp_wor": "LP (w/o repl.)", "lp_gds": "LP (greedy)",
          "token": "token", "block": "BV", "rrs": "RRS", "rrs_wor": "RRS w/o repl.", "seqbv": "SeqBV",
          "gbv": "GBV", "gds": "GDS"}


# a bound dashed, in its verifier's colour
COLORS = {"lp": "k", "lp_wor": "C6", "lp_gds": "C9", "token": "C0", "block": "C4", "rrs": "C5",
          "rrs_wor": "C6", "seqbv": "C1", "gbv": "C8", "gds": "C9"}


def markdown(result: dict[str, Any], command: str) -> str:
    """The means, then every verifier's gap to its bound, one row per (source, V, L, K)."""
    rows = result["cells"]
    lines = [f"# Multi-draft verification against the LP bound (`{command}`)", "",
             "Expected accepted draft tokens, mean over instances (95% bootstrap intervals in the JSON). "
             "LP (iid) bounds every verifier of K i.i.d. paths; RRS w/o repl. and GDS draw other drafts, "
             "bounded by their own LPs.", "",
             "| source | V | L | K | n | " + " | ".join(LABELS[c] for c in STUDY) + " | GBV < BV |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(STUDY) + 1)]
    for r in rows:
        lines.append(f"| {r['source']} | {r['vocab']} | {r['length']} | {r['drafts']} | {r['instances']} | "
                     + " | ".join(f"{r['value'][c]['mean']:.4f}" for c in STUDY)
                     + f" | {r['gbv_below_bv']['count']} |")
    lines += ["", "Gap to the bound of each verifier's own draft law (LP minus the verifier), mean:", "",
              "| source | V | L | K | " + " | ".join(LABELS[v] for v in VERIFIERS) + " | GDS - LP (iid) |",
              "|---|---:|---:|---:|" + "---:|" * (len(VERIFIERS) + 1)]
    for r in rows:
        lines.append(f"| {r['source']} | {r['vocab']} | {r['length']} | {r['drafts']} | "
                     + " | ".join(figure(r["gap"][v]["mean"]) for v in VERIFIERS)
                     + f" | {figure(r['over_iid_bound']['gds']['mean'], '+')} |")
    lines += ["", "Over every cell with K >= 2:", ""]
    for source, s in result["overall"].items():
        lines.append(f"- {source}: GBV below single-path BV on {s['gbv_below_bv']} of {s['instances']} "
                     f"instance-cells ({s['gbv_below_bv_share']:.0%}); GDS above the i.i.d. LP bound on "
                     f"{s['gds_over_lp']}, at its own bound on {s['gds_at_own_bound']}.")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """One panel per (source, V, L): each column's mean against K."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["source"], r["vocab"], r["length"]) for r in result["cells"]},
                    key=lambda key: (key[0] != "random", key[2], key[1]))
    cols = min(3, len(panels))
    grid_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(4.2 * cols, 3.2 * grid_rows), squeeze=False)
    for ax, (source, vocab, length) in zip(axes.flat, panels, strict=False):
        cells = [r for r in result["cells"]
                 if (r["source"], r["vocab"], r["length"]) == (source, vocab, length)]
        ks = [r["drafts"] for r in cells]
        for c in STUDY:
            bound = c.startswith("lp")
            ax.plot(ks, [r["value"][c]["mean"] for r in cells], "--" if bound else "-", color=COLORS[c],
                    marker="o", ms=3, lw=1.8 if bound else 1.0, label=LABELS[c])
        ax.set_title(f"{source}: V={vocab}, L={length}", fontsize=9)
        ax.set_xticks(ks)
        ax.set_xlabel("drafts K", fontsize=8)
        ax.set_ylabel("expected accepted tokens", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


@click.command("multidraft")
@click.option("--quick", is_flag=True, help="A small grid (seconds), saved as multidraft_quick.json.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for multidraft.json, .md and .png.")
@click.option("--workers", type=click.IntRange(1, 16),
              help="Processes evaluating the instances; 1: this process alone [default: 2, 1 with --quick].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(quick: bool, out: Path, workers: int | None, as_json: bool) -> None:
    """Multi-draft verifiers (RRS, SeqBV, GBV, GDS) against the LP bound by K, V and L, random and real."""
    workers = workers or (1 if quick else 2)  # spawning a worker costs seconds: not worth it for --quick
    grid, settings = (QUICK if quick else FULL), SETTINGS[quick]
    target, draft = load_model(TOY.target), load_model(TOY.draft_model)
    show = table(as_json)
    show(f"{'source':6} {'V':>2} {'L':>2} {'K':>2} " + " ".join(f"{c:>7}" for c in STUDY) + " GBV<BV")
    builds = {"random": [("random", seeded(index)) for index in range(settings["instances"])],
              "real": [(c.domain, partial(real_instance, c))
                       for c in contexts(target, draft, settings["domains"], settings["offsets"])]}
    cells = run_grid(grid, builds, workers, show)
    result = {"columns": list(STUDY), "bound_of": BOUND_OF, "cells": cells, "overall": overall(cells)}
    name = "multidraft_quick" if quick else "multidraft"
    config = {"quick": quick, "workers": workers,
              "grid": {s: [[v, l, list(ks)] for v, l, ks in g] for s, g in grid.items()},
              "random_instances": settings["instances"], "random_drafter": "indep",
              "real_domains": list(settings["domains"]), "real_offsets": list(settings["offsets"]),
              "context_tokens": CONTEXT_TOKENS, "target": str(TOY.target.name),
              "draft": str(TOY.draft_model.name),
              "replicates": REPLICATES}
    command_line = f"specblock benchmark multidraft{' --quick' if quick else ''}"
    saved = save_result(name, result, config, SEED, out)
    md, png = out / f"{name}.md", out / f"{name}.png"
    write_text(md, markdown(result, command_line))
    plot(result, png)
    finish(as_json, result, saved, md, png)


# --- its section of docs/results.md ----------------------------------------------------------------


def _multidraft_command(name: str, config: Record) -> str:
    return f"{benchmark('multidraft')}{' --quick' if config['quick'] else ''}"


def _multidraft_body(record: Record) -> Lines:
    result = record["results"]

    def mean(row: Record, column: str) -> str:
        return f"{row['value'][column]['mean']:.3f}"

    lines = ["Expected accepted draft tokens, mean over instances. LP: the bound for K i.i.d. paths, which "
             "token, BV, RRS, SeqBV and GBV draw; RRS without replacement and GDS (greedy draft) draw other "
             "drafts, so each is shown with the LP bound of its own draft law. GBV < BV: instances where GBV "
             "accepts less than single-path BV.", ""]
    rows = [[r["source"], r["vocab"], r["length"], r["drafts"], r["instances"], mean(r, "lp"),
             *(mean(r, c) for c in ("token", "block", "rrs", "seqbv", "gbv")),
             f"{mean(r, 'rrs_wor')} ({mean(r, 'lp_wor')})", f"{mean(r, 'gds')} ({mean(r, 'lp_gds')})",
             r["gbv_below_bv"]["count"]] for r in result["cells"]]
    lines += md_table(["source", "V", "L", "K", "n", "LP", "token", "BV", "RRS", "SeqBV", "GBV",
                    "RRS w/o repl. (its LP)", "GDS (its LP)", "GBV < BV"], rows)
    lines += ["", *(f"- {source}, K >= 2: GBV below BV on {s['gbv_below_bv']} of {s['instances']} "
                    f"instance-cells; GDS above the i.i.d. LP on {s['gds_over_lp']}, at its own bound on "
                    f"{s['gds_at_own_bound']}." for source, s in result["overall"].items())]
    return lines


RENDERERS: dict[str, Renderer] = {
    "multidraft": Renderer("Multi-draft verification against the LP bound", _multidraft_command,
                           _multidraft_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
