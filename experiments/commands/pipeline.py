"""`specblock pipeline`: the main job, from measuring the engine to a simulated-versus-measured report.

One process at a time may write a run folder (``experiments.folders``). ``--resume`` reuses the cost
profile of the run when it is at most ``PROFILE_MAX_AGE_HOURS`` (6 h) old, else measures it again with
every step that reads it; the log and the ``--json`` summary (``profile_age_hours``, ``profile_reused``)
say how old the profile behind the results is.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from core.errors import InputError
from core.models import ModelSpec
from core.paths import PIPELINE_RUNS
from experiments.cli import OUT_FOLDER, model_option


def _latest() -> Path:
    found = PIPELINE_RUNS.glob("*") if PIPELINE_RUNS.is_dir() else ()
    runs = sorted(p for p in found if (p / "run.json").is_file())
    if not runs:
        raise InputError(f"no pipeline run under {PIPELINE_RUNS} to resume: give --out DIR or drop --resume")
    return runs[-1]


@click.command("pipeline")
@click.option(
    "--out",
    type=OUT_FOLDER,
    default=None,
    help="Run folder [default: runs/pipeline/<date-time>; with --resume, the latest one].",
)
@click.option("--quick", is_flag=True,
              help="Small sizes: the whole loop within 10 minutes on 2 CPU cores on the real model "
              "(`make run`), 5 on the toy family.")
@click.option("--smoke", is_flag=True,
              help="The fewest prompts and queries that still run every step (under a minute; the tests): "
              "a check that it works, not a measurement.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --out, skipping its finished steps (a cost profile over 6 h old is "
    "measured again, with the steps that read it).",
)
@click.option(
    "--address",
    default=None,
    help="A running Ray cluster for the tuning step: host:port, ray://host:port or auto, checked before "
    "any step [default: a private local Ray].",
)
@model_option("The model every step works on: its target, draft model, drafters, prompt sets and profile.")
@click.option(
    "--draft-model",
    "draft_dir",
    type=click.Path(path_type=Path),
    default=None,
    show_default="the model's own",
    help="Draft model folder.",
)
@click.option(
    "--prompt-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Your own prompts instead of the model's sets: JSON lines of {\"text\", \"domain\"?, \"chat\"?, "
    "\"split\"?} or MT-bench questions; each category is traced on one half (its calibration split) and "
    "deployed on the other.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (run_dir, seconds, policies, fidelity_error, ...) on stdout.",
)
def command(
    out: Path | None,
    quick: bool,
    smoke: bool,
    resume: bool,
    address: str | None,
    model: ModelSpec,
    draft_dir: Path | None,
    prompt_file: Path | None,
    as_json: bool,
) -> None:
    """Profile, trace, simulate, tune, deploy and report, into one run folder."""
    if quick and smoke:
        raise InputError("--quick and --smoke are two plans: give one of them")
    from rich.console import Console  # rich, torch and Ray: not for --help
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from experiments.pipeline.run import FULL, QUICK, SMOKE, STEPS, run_pipeline

    if out is None:
        out = _latest() if resume else PIPELINE_RUNS / time.strftime("%Y%m%d-%H%M%S")
    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]pipeline[/]"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("steps", total=len(STEPS))
        result = run_pipeline(
            out,
            SMOKE if smoke else QUICK if quick else FULL,
            resume=resume,
            model=model,
            draft_dir=draft_dir,
            address=address,
            log=lambda line: console.log(line),
            advance=lambda _: progress.advance(task),
            prompt_file=prompt_file,
        )
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    click.echo(f"run folder: {result['run_dir']} ({result['seconds']:.0f} s)")
    if result["profile_age_hours"] is not None:
        how = "reused" if result["profile_reused"] else "measured in this run"
        click.echo(f"cost profile: {how}, {result['profile_age_hours']:.1f} h old")
    click.echo(f"{'policy':>22} {'measured':>10} {'simulated':>10} {'error':>8}")
    for name, row in sorted(result["policies"].items(), key=lambda kv: -kv[1]["measured_tokens_per_second"]):
        click.echo(
            f"{name:>22} {row['measured_tokens_per_second']:10.1f} "
            f"{row['predicted_tokens_per_second']:10.1f} "
            f"{row['error']:+8.1%}"
        )
    click.echo(f"fidelity error (median |simulated/measured - 1|): {result['fidelity_error']:.1%}")
    click.echo(f"report: {result['report']}")
