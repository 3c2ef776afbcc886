"""`specblock tune length|adaptation|serving`: tune the policies on the simulator with Ray Tune; export the
best.

The task is the role of the policies it tunes: ``length`` tunes speculation-length policies on SpecLength
queries, ``adaptation`` adaptation policies on AdaptStream streams with a domain shift, ``serving`` the
lengths of a batch's requests on SpecServe episodes (``adapt`` and ``serve`` still name the last two;
``experiments.tuning.tune`` describes the objective, the common random numbers and the out folder).
Local Ray on 2 CPUs by default; ``--address`` joins a running cluster (checked, and joined within 30 s,
before any work). ``--resume`` continues an interrupted study in the same ``--out`` from its trial
records; one process at a time may write a study folder.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.files import write_json
from core.names import ROLE_ALIASES, ROLES
from core.paths import TUNE_RUNS
from experiments.cli import OUT_FOLDER, SEED


def _table(task: str, report: dict[str, Any]) -> None:
    from rich.console import Console  # rich: not for --help
    from rich.table import Table

    rate = report["trials_per_minute"]
    table = Table(title=f"Tuned {task} policies: best configuration per kind (simulated)",
                  caption=f"{report['trials']} trials ({report['trials_run']} run now) in "
                          f"{report['tune_seconds']:.1f} s"
                          f"{'' if rate is None else f' ({rate:.1f} trials/min)'}; files in {report['out']}")
    for name in ("kind", "tokens/s", "params"):
        table.add_column(name, justify="right" if name == "tokens/s" else "left")
    for chosen in report["best_by_kind"].values():
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in chosen["params"].items())
        table.add_row(chosen["kind"], f"{chosen['tokens_per_second']:.2f}", params)
    Console().print(table)
    click.echo(f"best: {report['best']['kind']} -> {Path(report['out']) / 'best_policy.json'}")


def _range(value: str | None, flag: str) -> tuple[int, int] | None:
    """``LOW,HIGH`` as two integers (None when not given)."""
    if value is None:
        return None
    try:
        low, high = (int(v) for v in value.split(","))
    except ValueError:
        raise InputError(f"{flag} {value!r}: give LOW,HIGH, two whole numbers, e.g. 96,96") from None
    return low, high


@click.command("tune")
@click.argument("task", metavar="|".join(ROLES), type=click.Choice((*ROLES, *ROLE_ALIASES)))
@click.option("--samples", type=int, default=16, show_default=True,
              help="Configurations per policy kind (random: the defaults, then random draws; "
                   "grid: values per parameter); at most 4096.")
@click.option("--policy-kind", "kinds", multiple=True,
              help="Policy kind to tune (repeatable or comma-separated) [default: every kind of the "
                   "task's role that its class does not exclude from tuning; --json lists them].")
@click.option("--search", type=click.Choice(("random", "grid")), default="random", show_default=True,
              help="How configurations are drawn from each kind's parameter ranges.")
@click.option("--scheduler", type=click.Choice(("fifo", "asha")), default="fifo", show_default=True,
              help="asha stops poor trials after a chunk of queries.")
@click.option("--queries", type=int, default=None,
              help="length: queries per trial [256]; adaptation: queries per stream [2000]; serving: "
                   "requests per episode [64].")
@click.option("--chunks", type=int, default=None,
              help="length: batches the queries are served in [4]; adaptation: streams per trial [2]; "
                   "serving: episodes per trial [2]. One report per chunk.")
@click.option("--rate", type=float, default=None, help="serving: requests arriving per second [2].")
@click.option("--max-batch", type=int, default=None, help="serving: requests decoded together at most [8].")
@click.option("--prompt-tokens", default=None, help="serving: prompt lengths LOW,HIGH [128,1024].")
@click.option("--output-tokens", default=None, help="serving: output lengths LOW,HIGH [64,256].")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the simulated work (the same in every trial) and of the random search.")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path),
              help="Cost profile JSON [default: data/profiles/cpu_shipped.json, else the A100 paper "
                   "profile].")
@click.option("--traces", "traces_path", type=click.Path(path_type=Path),
              help="Acceptance traces (parquet) [default: data/traces/default.parquet, else the "
                   "parametric model].")
@click.option("--calibration", "calibration_path", type=click.Path(path_type=Path),
              help="Confidence calibration JSON (the pipeline's calibration.json) that the length and "
                   "serving policies reading confidences carry, in the trials and the exported files.")
@click.option("--calibrate", is_flag=True,
              help="Fit that calibration from --traces instead (isotonic, per position; written to "
                   "OUT/calibration.json).")
@click.option("--address", default=None,
              help="A running Ray cluster: host:port, ray://host:port, or auto (the one `ray start` "
                   "recorded) [default: a private local Ray].")
@click.option("--out", type=OUT_FOLDER, default=None,
              help="Study folder [default: runs/tune/TASK].")
@click.option("--resume", is_flag=True,
              help="Continue the study already in --out: run the trials it has no record of.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def command(task: str, samples: int, kinds: tuple[str, ...], search: str, scheduler: str, queries: int | None,
            chunks: int | None, rate: float | None, max_batch: int | None, prompt_tokens: str | None,
            output_tokens: str | None, seed: int,
            profile_path: Path | None, traces_path: Path | None, calibration_path: Path | None,
            calibrate: bool,
            address: str | None, out: Path | None, resume: bool, as_json: bool) -> None:
    """Tune speculation-length, adaptation or serving policies with Ray Tune; write the results and best
    policy."""
    from experiments.tuning.tune import (  # Ray: not for --help
        StudyError,
        check_kinds,
        make_setting,
        tune_policies,
    )
    from simulator.calibration import fit_calibration
    from simulator.spec_serve import ServeTraffic
    from simulator.traces import load_traces

    task = ROLE_ALIASES.get(task, task)
    given = {"rate": rate, "max_batch": max_batch, "prompt_tokens": _range(prompt_tokens, "--prompt-tokens"),
             "output_tokens": _range(output_tokens, "--output-tokens")}
    if task != "serving" and any(v is not None for v in given.values()):
        raise InputError("--rate, --max-batch, --prompt-tokens and --output-tokens shape the serving study's "
                         f"traffic: drop them for `specblock tune {task}`")
    serve = ServeTraffic(**{k: v for k, v in given.items() if v is not None})
    out = out or TUNE_RUNS / task
    if calibrate and (calibration_path is not None or traces_path is None or task == "adaptation"):
        raise InputError("--calibrate fits a length or serving study's calibration from --traces: give "
                         "--traces and no --calibration")
    setting = make_setting(task, profile_path, traces_path, queries, chunks, seed,
                           calibration=calibration_path, serve=serve)
    names = check_kinds(task, [k.strip() for group in kinds for k in group.split(",") if k.strip()])
    if calibrate:  # every input checked: the fitted map joins the study folder
        calibration = fit_calibration(load_traces(traces_path))
        calibration_path = write_json(out / "calibration.json", calibration.to_dict())
        setting = dataclasses.replace(setting, calibration=str(calibration_path.resolve()))
    try:
        result = tune_policies(setting, names, samples, out, search, scheduler, resume, address,
                               progress=lambda line: click.echo(line, err=True))
    except StudyError as err:
        raise click.ClickException(str(err)) from None
    report = {"kind": task, "policy_kinds": list(names), "samples": samples, "search": search,
              "scheduler": scheduler, "setting": setting.describe(), **result.summary()}
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        _table(task, report)
