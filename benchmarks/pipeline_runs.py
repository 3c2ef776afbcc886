"""The main job's fidelity, run after run: ``specblock pipeline`` (``--quick`` unless ``--full``) several
times in fresh processes, as ``make run`` runs it, and each run's fidelity error with its interval,
worst policy, rank agreement, and the adaptive policies against the best fixed length, side by side.
Saves ``benchmarks/results/<tag>.json`` (every run's summary, with provenance) and ``<tag>.md``.

    specblock benchmark pipeline_runs [--runs 3] [--full] [--model smollm2-135m] [--tag pipeline_quick]
                                      [--resume]

The runs live in ``runs/pipeline-series/<tag>/`` until the results are written: a series cut off (a full
run takes about an hour) continues with ``--resume``, which keeps the finished runs and resumes the
unfinished one with ``specblock pipeline --resume``.

A model other than the shipped toy family writes ``pipeline_quick_<model>`` (``pipeline_full_<model>``).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from benchmarks.output import finish
from core.errors import InputError
from core.files import MAX_RECORD_BYTES, read_json, write_json, write_text
from core.models import TOY, ModelSpec
from core.paths import PIPELINE_SERIES, RESULTS
from experiments.cli import OUT_FOLDER, model_arg, model_option, model_result
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag, interval, run_seconds, table


def run_once(out: Path, full: bool, model: str, resume: bool = False) -> dict[str, Any]:
    """One pipeline run of ``model`` (as ``--model`` takes it) in its own process, or the rest of the one
    in ``out`` when ``resume``; its ``--json`` summary."""
    command = [sys.executable, "-m", "experiments.cli", "pipeline", "--model", model, "--out", str(out),
               "--json", *([] if full else ["--quick"]), *(["--resume"] if resume else [])]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise click.ClickException(f"pipeline run failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout)


def series(work: Path, plan: dict[str, Any], resume: bool) -> None:
    """Make ``work`` the folder of a new series of ``plan`` (full or quick, model), or check that it
    holds one of ``plan`` to resume; InputError naming the fix otherwise."""
    plan_file = work / "plan.json"
    if not resume:
        if work.exists() and any(work.iterdir()):
            raise InputError(f"{work} holds a series that was cut off: pass --resume to continue it, or "
                             "remove the folder to start over")
        write_json(plan_file, plan)
        return
    if not plan_file.is_file():
        raise InputError(f"no series to resume in {work}: drop --resume to start one")
    found = read_json(plan_file, MAX_RECORD_BYTES, "pipeline series plan", f"remove {work} to start over")
    if found != plan:
        raise InputError(f"{work} holds a series of another plan ({found}): resume with the same --full "
                         "and --model, or remove the folder to start over")


def run_in_series(work: Path, i: int, full: bool, model: str) -> dict[str, Any]:
    """Run ``i`` of the series in ``work``: its summary when it finished earlier, else the run, resumed
    where it has a run record (``run.json``), started afresh where it has none (no step finished)."""
    done = work / f"run{i}.json"
    if done.is_file():
        return read_json(done, MAX_RECORD_BYTES, "pipeline run summary", f"remove {work} to start over")
    out = work / f"run{i}"
    resume = (out / "run.json").is_file()
    if out.exists() and not resume:
        shutil.rmtree(out)
    summary = run_once(out, full, model, resume)
    summary["resumed"] = resume
    write_json(done, summary)
    return summary


def row(summary: dict[str, Any]) -> dict[str, Any]:
    """One run's row of the side-by-side table: fidelity, worst policy, rank agreement, adaptive gain. A
    resumed run's seconds are its steps' (each timed in the process that ran it), not one process's."""
    policies = summary["policies"]
    worst = max(policies, key=lambda n: abs(policies[n]["error"]))
    resumed = bool(summary.get("resumed"))
    return {"fidelity_error": summary["fidelity_error"], "fidelity_error_ci": summary["fidelity_error_ci"],
            "worst_policy": worst, "worst_error": policies[worst]["error"],
            "replay_error": summary.get("replay_error"),
            "rank_agreement": summary["rank_agreement"], "against_best_fixed": summary["against_best_fixed"],
            "seconds": sum(summary["steps"].values()) if resumed else summary["seconds"],
            "resumed": resumed,
            "policies": {n: {k: p[k] for k in ("measured_tokens_per_second", "measured_ci",
                                              "predicted_tokens_per_second", "predicted_ci", "error")}
                         for n, p in policies.items()}}


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    """One line per run, then every policy's measured tokens/s with its interval in the last run."""
    lines = [f"# Pipeline fidelity, run after run (`{command}`)", "",
             "| run | fidelity error [95% CI] | worst policy | error on the held-out text | Kendall's tau "
             "| predicted best = measured best within interval | measured best among the simulator's ties "
             "| adaptive policies / best fixed [95% CI] | seconds |",
             "|---:|---|---|---:|---:|---|---|---|---:|"]
    for i, r in enumerate(rows, start=1):
        agreement, against = r["rank_agreement"], r["against_best_fixed"]
        ratios = "; ".join(f"{n} {v['ratio']:.3f} [{v['ratio_ci'][0]:.3f}, {v['ratio_ci'][1]:.3f}]"
                           for n, v in sorted(against.get("policies", {}).items()))
        lines.append(
            f"| {i} | {r['fidelity_error']:.1%} [{r['fidelity_error_ci'][0]:.1%}, "
            f"{r['fidelity_error_ci'][1]:.1%}] | {r['worst_policy']} {r['worst_error']:+.1%} "
            f"| {_replay(r)} | {agreement['kendall_tau']:.2f} "
            f"| {agreement['predicted_best']} / {agreement['measured_best']}: "
            f"{'yes' if agreement['predicted_best_within_interval'] else 'no'} "
            f"| {_tied(agreement)} "
            f"| vs {against.get('best_fixed', '-')}: {ratios} | {run_seconds(r)} |")
    lines += ["", f"Median of the runs' fidelity errors: "
              f"{statistics.median(r['fidelity_error'] for r in rows):.1%}.", "",
              "Last run, measured and predicted tokens/s (95% intervals):", "",
              "| policy | measured | predicted | error |", "|---|---|---|---:|"]
    for name, p in sorted(rows[-1]["policies"].items(), key=lambda kv: -kv[1]["measured_tokens_per_second"]):
        lines.append(f"| {name} | {p['measured_tokens_per_second']:.1f} [{p['measured_ci'][0]:.1f}, "
                     f"{p['measured_ci'][1]:.1f}] | {p['predicted_tokens_per_second']:.1f} "
                     f"[{p['predicted_ci'][0]:.1f}, {p['predicted_ci'][1]:.1f}] | {p['error']:+.1%} |")
    return "\n".join(lines) + "\n"


@click.command("pipeline_runs")
@click.option("--runs", type=int, default=3, show_default=True, help="Consecutive pipeline runs.")
@click.option("--full", is_flag=True, help="The full pipeline instead of --quick.")
@model_option("The model every run works on.")
@click.option("--tag", default=None,
              help="Results name [pipeline_quick or pipeline_full, with _<model> for a model other than the "
                   "toy family].")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for TAG.json and TAG.md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every run's figures.")
@click.option("--resume", is_flag=True,
              help="Continue the series cut off in runs/pipeline-series/TAG: keep its finished runs, resume "
                   "the unfinished one.")
def command(runs: int, full: bool, model: ModelSpec, tag: str | None, out: Path, as_json: bool,
            resume: bool) -> None:
    """The main job's fidelity, run after run: `specblock pipeline` several times in fresh processes."""
    if runs < 1:
        raise InputError(f"--runs {runs}: give 1 or more")
    model.require()  # a model not fetched yet fails here, not in the first run
    name = model_arg(model)
    tag = tag or model_result("pipeline_full" if full else "pipeline_quick", model.name)
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", tag):
        raise InputError(f"--tag {tag!r}: give a file name of letters, digits, '.', '_' and '-'")
    invocation = f"specblock pipeline{'' if full else ' --quick'}{flag('--model', name, TOY.name)}"
    work = PIPELINE_SERIES / tag
    series(work, {"full": full, "model": model.name}, resume)
    rows = []
    for i in range(runs):
        click.echo(f"run {i + 1}/{runs}: {invocation}", err=True)
        rows.append(row(run_in_series(work, i, full, name)))
        click.echo(f"  fidelity error {rows[-1]['fidelity_error']:.1%}", err=True)
    saved = save_result(tag, rows, {"command": invocation, "runs": runs, "model": model.name}, seed=0,
                        directory=out)
    table = write_text(out / f"{tag}.md", markdown(rows, invocation))
    if not as_json:
        click.echo(markdown(rows, invocation))
    shutil.rmtree(work)  # the series is in its results now
    finish(as_json, rows, saved, table)


# --- its section of docs/results.md ----------------------------------------------------------------


def _pipeline_command(name: str, config: Record) -> str:
    full = not config["command"].startswith("specblock pipeline --quick")
    model = config.get("model", TOY.name)
    default = model_result("pipeline_full" if full else "pipeline_quick", model)
    return (f"{benchmark('pipeline_runs')} --runs {config['runs']}{' --full' if full else ''}"
            f"{flag('--model', model, TOY.name)}{flag('--tag', name, default)}")


def _pipeline_body(record: Record) -> Lines:
    runs = record["results"]
    count = f"{len(runs)} {'run' if len(runs) == 1 else 'runs'}"
    lines = [f"{count} of `{record['config']['command']}` in a row. Fidelity error: the median over "
             "policies of |predicted / measured - 1| tokens/s; error on the held-out text: the same with the "
             "held-out prompts' own probed traces replayed instead of the calibration prompts' (the "
             "simulator's error on the text the engine decoded; runs before it was measured show -); "
             "Kendall's tau between the predicted and measured ranking of the policies.", ""]
    rows = []
    for i, run in enumerate(runs, 1):
        agree = run["rank_agreement"]
        rows.append([i, interval(run["fidelity_error"], run["fidelity_error_ci"], ".1%"),
                     f"{run['worst_policy']} {run['worst_error']:+.1%}", _replay(run),
                     f"{agree['kendall_tau']:.2f}",
                     f"{agree['predicted_best']} / {agree['measured_best']}",
                     "yes" if agree["predicted_best_within_interval"] else "no", _tied(agree),
                     run_seconds(run)])
    lines += table(["run", "fidelity error [95% CI]", "worst policy", "error on the held-out text",
                    "Kendall's tau", "predicted / measured best", "predicted best within interval",
                    "measured best among the simulator's ties", "seconds"], rows)
    policies = sorted({p for run in runs for p in run["against_best_fixed"]["policies"]})
    lines += ["", "Measured tokens/s of each adaptive policy over the run's best fixed length [95% CI]:", ""]
    header = ["policy", *(f"run {i} (vs {run['against_best_fixed']['best_fixed']})"
                          for i, run in enumerate(runs, 1))]
    rows = []
    for policy in policies:
        cells = [run["against_best_fixed"]["policies"].get(policy) for run in runs]
        rows.append([policy, *(interval(c["ratio"], c["ratio_ci"]) if c else "-" for c in cells)])
    rows.append(["vanilla (not drafting; no interval kept)", *(_vanilla_ratio(run) for run in runs)])
    return lines + table(header, rows)


def _replay(run: Record) -> str:
    """A run's median error with the held-out prompts' own traces; - for a run from before it was kept."""
    error = run.get("replay_error")
    return "-" if error is None else f"{error:.1%}"


def _tied(agreement: Record) -> str:
    """Whether the measured best is the predicted best or one of the policies the simulator could not tell
    from it, with those ties; - for a run from before ties were kept."""
    if "predicted_ties" not in agreement:
        return "-"
    ties = ", ".join(agreement["predicted_ties"]) or "none"
    return f"{'yes' if agreement['measured_best_tied'] else 'no'} (ties: {ties})"


def _vanilla_ratio(run: Record) -> str:
    """Vanilla's measured tokens/s over the run's best fixed length's: 1 where not drafting is that length
    (runs since it counts as length 0), above 1 where it beat every fixed policy of an older run."""
    policies, best = run["policies"], run["against_best_fixed"]["best_fixed"]
    if "vanilla" not in policies or best not in policies:
        return "-"
    speed = {name: policies[name]["measured_tokens_per_second"] for name in ("vanilla", best)}
    return f"{speed['vanilla'] / speed[best]:.3f}"


RENDERERS: dict[str, Renderer] = {
    "pipeline": Renderer("The main job's fidelity, run after run", _pipeline_command, _pipeline_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
