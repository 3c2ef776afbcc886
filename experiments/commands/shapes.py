"""`specblock shapes`: tune each drafter's shape on this machine (``experiments.shapes``).

Greedy tokens/s of every shape of ``experiments.shapes.GRIDS`` over vanilla, round-robin on the
calibration prompts; writes ``<out>/<tag>.json`` and ``.md``; ``--apply`` saves each drafter's fastest
shape as its folder's ``drafting.json``, which ``generate`` (and for the trained drafters ``bench`` and
``trace``) then use; the draft model's lies in ``<drafters-dir>/draft``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from core.errors import InputError
from core.names import registry, trained_drafters
from core.paths import MODELS, RESULTS
from experiments.cli import SEED

# the drafters with a deployable shape: the trained ones, then the others (the draft model)
TUNABLE = (*trained_drafters(),
           *(name for name, spec in registry.items() if spec.shape_options and not spec.trained))


@click.command("shapes")
@click.option("--drafters", default=",".join(TUNABLE), show_default=True,
              help="Comma-separated drafters to tune (trained ones and the draft model).")
@click.option("--domains", default="code,tests,prose,text", show_default=True, help="Prompt domains.")
@click.option("--prompts", "count", type=int, default=4, show_default=True,
              help="Calibration prompts per domain.")
@click.option("--rounds", type=int, default=2, show_default=True, help="Passes over the prompts.")
@click.option("--max-new-tokens", type=int, default=48, show_default=True)
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=MODELS / "target",
              show_default="data/models/target", help="Target folder.")
@click.option("--drafters-dir", type=click.Path(path_type=Path), default=MODELS, show_default="data/models",
              help="Folder holding <drafter>/ weights and the draft model's draft/.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch CPU threads.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS,
              show_default="benchmarks/results", help="Results folder.")
@click.option("--tag", default="shapes", show_default=True, help="Results file name.")
@click.option("--apply", is_flag=True, help="Save each drafter's fastest shape as its drafting.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(drafters: str, domains: str, count: int, rounds: int, max_new_tokens: int, model_dir: Path,
            drafters_dir: Path, threads: int, seed: int, out: Path, tag: str, apply: bool,
            as_json: bool) -> None:
    """Measure every shape of each drafter against vanilla; optionally deploy the fastest."""
    import torch  # torch and the engine: not for --help

    from experiments.shapes import label, run

    for flag, value in (("--prompts", count), ("--rounds", rounds), ("--max-new-tokens", max_new_tokens),
                        ("--threads", threads)):
        if value < 1:
            raise InputError(f"{flag} {value} is invalid: give 1 or more")
    names = [n.strip() for n in drafters.split(",") if n.strip()]
    doms = [d.strip() for d in domains.split(",") if d.strip()]
    if not names or not doms:
        raise InputError("--drafters and --domains need at least one name each: e.g. --drafters specblock")
    if not (model_dir / "config.json").is_file():
        raise InputError(f"--model {model_dir} is not a model folder (no config.json): pass the target's "
                         "folder")
    torch.set_num_threads(threads)
    result = run(model_dir, drafters_dir, names, doms, count, max_new_tokens, rounds, seed, out, tag, apply,
                 progress=not as_json)
    if as_json:
        click.echo(json.dumps(result))
        return
    for name, rows in result["drafters"].items():
        best = rows[0]
        click.echo(f"{name}: best {label(best['shape'])} at {best['speedup']:.2f}x vanilla "
                   f"(tau {best['tau']:.2f})" + (" -> drafting.json" if apply else ""))
    click.echo(f"results: {result['path']}")
