"""`specblock gpu-check`: the prepared check of a GPU machine (``experiments.gpu_check.check``).

Decodes with the shipped drafters (their tokens must equal vanilla decoding's), profiles a
Llama-3.1-8B-shape target and its drafters, and overlaps a drafter update with verification on CUDA
streams. A machine with only torch, numpy and safetensors runs the same check as
``python -m experiments.gpu_check``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.models import SMOLLM2
from core.paths import MODELS
from experiments.cli import OUT_FOLDER, SEED, resolve_device
from experiments.gpu_real import split_file


@click.command("gpu-check")
@click.option("--device", default=None, help="torch device [default: cuda if available, else cpu].")
@click.option("--tiny", is_flag=True, help="Tiny shapes (seconds, for tests on a CPU); needs --out.")
@click.option("--out", type=OUT_FOLDER, default=None,
              help="Folder for the profile and gpu_check.json [default: $OUT when set, else data/profiles "
                   "and benchmarks/results].")
@click.option("--models", type=click.Path(file_okay=False, path_type=Path), default=MODELS,
              show_default="data/models", help="Shipped models folder.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--real-model", type=click.Path(path_type=Path), default=None,
              help="Also check SmolLM2: its checkpoint folder, GGUF or .parts.json manifest (--pack).")
@click.option("--pack", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Instead of checking: cut SmolLM2's GGUF into parts a device run can carry, with their "
                   "manifest, into this folder (`specblock models fetch smollm2-135m` first).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every section's results.")
def command(device: str | None, tiny: bool, out: Path | None, models: Path, seed: int,
            real_model: Path | None, pack: Path | None, as_json: bool) -> None:
    """Check decoding, profile an 8B-shape target and overlap an update with verification on this GPU."""
    if pack is not None:
        _pack(pack)
        return
    from experiments.gpu_check import check  # torch: not for --help

    results = check(resolve_device(device), tiny, out, models, seed, real_model)
    if as_json:
        sys.stdout.write(json.dumps(results) + "\n")
    else:
        _table(results)
    if results["errors"]:
        failed = "; ".join(f"{section}: {error}" for section, error in results["errors"].items())
        raise click.ClickException(f"{len(results['errors'])} section(s) failed ({failed})")


def _pack(folder: Path) -> None:
    """SmolLM2's GGUF, from its installed wheel, in parts under ``folder``."""
    gguf = SMOLLM2.wheel.installed_file() if SMOLLM2.wheel else None
    if gguf is None:
        raise InputError("SmolLM2's GGUF is not installed: run `specblock models fetch smollm2-135m` first")
    manifest = split_file(gguf, folder)
    parts = sorted(p.name for p in folder.glob(f"{gguf.name}.part[0-9]*"))
    click.echo(f"{manifest}: {len(parts)} parts; carry one part a call (the machine keeps them while warm), "
               f"then run `python -m experiments.gpu_check --real-model {manifest}`")


def _table(results: dict[str, Any]) -> None:
    """Each section's figures, readable."""
    env = results.get("environment")
    if env:
        click.echo(f"device {env['device']}: torch {env['torch']}, CUDA {env['cuda']}")
    shipped = results.get("shipped", {})
    if isinstance(shipped.get("skipped"), str):  # no shipped target
        click.echo(f"shipped drafters: skipped ({shipped['skipped']})")
    else:
        for row in shipped.get("configs", []):
            click.echo(f"  {row['name']:28s} {row['tokens_per_second']:8.1f} tok/s  {row['speedup']:5.2f}x  "
                       f"tau {row['tau']:.2f}  {'equal to' if row['equal'] else 'DIFFERS from'} vanilla")
        for name, reason in shipped.get("skipped", {}).items():
            click.echo(f"  {name}: skipped ({reason})")
    if "profile" in results:
        click.echo(f"profile: {results['profile']['path']} ({results['profile']['dtype']})")
    real = results.get("real_model")
    if real:
        for row in real["decoding"]["configs"]:
            same = "equal to" if row["equal"] else "differs from"
            click.echo(f"  SmolLM2 {row['name']:20s} {row['tokens_per_second']:8.1f} tok/s  "
                       f"{row['speedup']:5.2f}x  tau {row['tau']:.2f}  {same} vanilla")
        click.echo(f"SmolLM2 profile: {real['profile']}")
    overlap = results.get("overlap", {})
    if "skipped" in overlap:
        click.echo(f"overlap: skipped ({overlap['skipped']})")
    elif overlap:
        click.echo(f"overlap: {overlap['overlap']:.0%} of the shorter side hidden "
                   f"({overlap['sequential_seconds']:.3f} s in turn, {overlap['concurrent_seconds']:.3f} s "
                   f"together); verify results {'unchanged' if overlap['verify_unchanged'] else 'CHANGED'}")
