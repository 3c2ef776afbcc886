"""`specblock adapt-live`: live online adaptation on a shifting stream, and the simulator's prediction of it.

The engine serves the stream (2,000 queries, 48 to 64 new tokens each; ``--quick``: 16) over the model's
prompt domains (the shipped family's four in equal shares, the mix shifting halfway; the real model's
chat, then code, then back to chat: a half, a quarter and a quarter) once per adaptation policy (never,
always with head updates, always with full updates, epsilon-greedy, the cost-aware bandit); the
simulator, fitted to those streams, predicts each (``experiments.adapt.live`` describes the experiment).
Writes ``<out>/<name>.json``, ``.md`` and ``.png``; ``--json`` prints one object: ``policies`` -> name ->
``tokens_per_second``, ``tokens_per_second_ci`` (95%), ``tau``, ``updates`` (by kind), ``update_seconds``,
``simulated_tokens_per_second``, ``simulated_error`` and more, and ``fidelity_error``. ``--overlap`` trains
updates beside decoding (the trainer thread on its own core) and times queries on the wall clock.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from core.models import ModelSpec
from core.paths import RESULTS
from experiments.adapt.plan import DEFAULT_PLAN, QUICK_PLAN, result_name
from experiments.cli import (
    OUT_FOLDER,
    SEED,
    drafter_folder,
    model_domains,
    model_option,
    model_profile,
    model_prompts,
)


@click.command("adapt-live")
@model_option()
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own", help="SpecBlock drafter folder (save_specblock).")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
              show_default="the model's own", help="CPU cost profile the simulator starts from.")
@click.option("--quick", is_flag=True,
              help="The 16-query stream (within 5 minutes on 2 CPU cores) instead of 2,000.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--overlap", is_flag=True,
              help="Train updates beside decoding, on this process's last core (wall clock, both cores "
                   "busy).")
@click.option("--name", default=None,
              help="Result file name [adapt_live; adapt_live_quick with --quick; _overlap added with "
                   "--overlap; another model's name after adapt_live].")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for <name>.json, <name>.md and <name>.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with each policy's figures.")
def command(model: ModelSpec, drafter_dir: Path | None, profile_path: Path | None, quick: bool,
            overlap: bool, seed: int, name: str | None, out: Path, as_json: bool) -> None:
    """Serve a domain-shifting stream live with each adaptation policy; compare with the simulator."""
    model_dir = model.require().target
    drafter_dir = drafter_folder(model, "specblock", drafter_dir)
    profile_path = model_profile(model, profile_path)
    from experiments.adapt.live import run  # torch, the simulator: not for --help

    name = name or result_name(model.name, quick, overlap)
    domains = model_domains(model)
    result = run(model_dir, drafter_dir, profile_path, QUICK_PLAN if quick else DEFAULT_PLAN, seed, name,
                 results=out, overlap=overlap, prompts=model_prompts(model, domains), model=model.name,
                 domains=domains, dtype=model.dtype)
    figures = result["figures"]
    files = {suffix: str(out / f"{name}.{suffix}") for suffix in ("json", "md", "png")}
    if as_json:
        sys.stdout.write(json.dumps({"results": files["json"], "markdown": files["md"], "plot": files["png"],
                                     **figures, "fit": result["fit"]}) + "\n")
        return
    for kind, f in figures["policies"].items():
        low, high = f["tokens_per_second_ci"]
        click.echo(f"{kind}: {f['tokens_per_second']:.1f} tok/s [{low:.1f}, {high:.1f}] (sim "
                   f"{f['simulated_tokens_per_second']:.1f}, {f['simulated_error']:+.1%}), "
                   f"tau {f['tau']:.3f}, "
                   f"updates {f['updates']['head']} head / {f['updates']['full']} full "
                   f"({f['update_seconds']:.1f} s), shifted tau {f['shifted_tau_early']:.3f} -> "
                   f"{f['shifted_tau_late']:.3f}")
    click.echo(f"fidelity error {figures['fidelity_error']:.1%}; wrote {', '.join(files.values())}", err=True)
