"""`specblock shapes`: tune each drafter's shape on this machine (``experiments.specbench.shapes``).

Greedy tokens/s of every shape of each drafter's registered ``shapes``
(``experiments.specbench.shapes.shape_grids``) over vanilla, round-robin on the calibration prompts; writes
``<out>/<tag>.json`` and ``.md``; ``--apply`` saves each drafter's fastest shape as its folder's
``drafting.json``, which ``generate`` (and for the trained drafters ``bench`` and ``trace``) then use; the
draft model's lies in ``<drafters-dir>/draft``. Timed in a ``--dtype`` other than the model's own, they
are saved as ``drafting-<dtype>.json``, which runs in that dtype read before ``drafting.json``.
``--model`` chooses the model: its target, its drafters folder (default ``--drafters-dir``) and its
prompt sets.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from core.errors import InputError
from core.models import ModelSpec
from core.names import RUN_DTYPES, registry, trained_drafters
from core.paths import RESULTS
from experiments.cli import (
    OUT_FOLDER,
    SEED,
    model_arg,
    model_domains,
    model_option,
    model_prompts,
    model_result,
)

# the drafters with a deployable shape: the trained ones, then the others (the draft model)
TUNABLE = (*trained_drafters(),
           *(name for name, spec in registry.items() if spec.shape_options and not spec.trained))


@click.command("shapes")
@click.option("--drafters", default=",".join(TUNABLE), show_default=True,
              help="Comma-separated drafters to tune (trained ones and the draft model).")
@click.option("--domains", default=None, show_default="code,tests,prose,text where the model's prompt sets "
              "have them, else all of them", help="Prompt domains.")
@click.option("--prompts", "count", type=int, default=4, show_default=True,
              help="Calibration prompts per domain.")
@click.option("--rounds", type=int, default=2, show_default=True, help="Passes over the prompts.")
@click.option("--max-new-tokens", type=int, default=48, show_default=True)
@model_option()
@click.option("--drafters-dir", type=click.Path(path_type=Path), default=None, show_default="the model's own",
              help="Folder holding <drafter>/ weights and the draft model's draft/.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch CPU threads.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Results folder.")
@click.option("--tag", default=None, show_default="shapes for the toy family, shapes_<model> for another",
              help="Results file name.")
@click.option("--dtype", type=click.Choice(RUN_DTYPES), default=None, show_default="the model's own",
              help="The dtype the shapes are timed in (float32: any change to the greedy output is a bug "
                   "and stops the sweep; 16-bit: rounding may part greedy outputs at near-ties, and each "
                   "shape's share of identical outputs is reported).")
@click.option("--apply", is_flag=True, help="Save each drafter's fastest shape as its drafting.json (with a "
              "--dtype other than the model's own, as its drafting-<dtype>.json, which runs in it read).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(drafters: str, domains: str | None, count: int, rounds: int, max_new_tokens: int,
            model: ModelSpec, drafters_dir: Path | None, threads: int, seed: int, out: Path, tag: str | None,
            dtype: str | None, apply: bool, as_json: bool) -> None:
    """Measure every shape of each drafter against vanilla; optionally deploy the fastest."""
    import torch  # torch and the engine: not for --help

    from experiments.specbench.shapes import label, run
    from real_engine.drafters.trained import shape_name

    for flag, value in (("--prompts", count), ("--rounds", rounds), ("--max-new-tokens", max_new_tokens),
                        ("--threads", threads)):
        if value < 1:
            raise InputError(f"{flag} {value} is invalid: give 1 or more")
    names = [n.strip() for n in drafters.split(",") if n.strip()]
    doms = (list(model_domains(model)) if domains is None
            else [d.strip() for d in domains.split(",") if d.strip()])
    if not names or not doms:
        raise InputError("--drafters and --domains need at least one name each: e.g. --drafters specblock")
    model_dir = model.require().target
    own = dtype in (None, model.dtype)  # else the shapes are saved for runs in --dtype alone
    torch.set_num_threads(threads)
    result = run(model_dir, model.drafters if drafters_dir is None else drafters_dir, names, doms, count,
                 max_new_tokens, rounds, seed, out, tag or model_result("shapes", model.name), apply,
                 model_prompts(model, doms), model.name, progress=not as_json,
                 train_as=model_arg(model) if drafters_dir is None else None, dtype=dtype or model.dtype,
                 own_dtype=own)
    if as_json:
        click.echo(json.dumps(result))
        return
    saved = f" -> {shape_name(None if own else dtype)}" if apply else ""
    for name, rows in result["drafters"].items():
        best = rows[0]
        click.echo(f"{name}: best {label(best['shape'])} at {best['speedup']:.2f}x vanilla "
                   f"(tau {best['tau']:.2f}){saved}")
    click.echo(f"results: {result['path']}")
