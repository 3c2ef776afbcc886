"""`specblock train KIND`: build the corpus data, or train a model of the shipped family.

Kinds: ``tokenizer`` (corpus manifest, tokenizer and prompt sets under data/), ``target`` (the target
LM, shipped to data/models/target) and ``draft-model`` (a small model distilled from the target,
shipped to data/models/draft). Checkpoints live under runs/<kind>/ and ``--resume`` continues them.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from policies.errors import InputError

KINDS = ("tokenizer", "target", "draft-model")
DEFAULT_OUT = {"target": Path("data/models/target"), "draft-model": Path("data/models/draft")}


@click.command("train")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder for the trained model (default data/models/target or data/models/draft).")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder (default runs/<kind>).")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in the run folder.")
@click.option("--minutes", type=float, default=None, help="Wall-clock budget that the schedule spans.")
@click.option("--steps", type=int, default=None, help="A fixed number of steps instead of a time budget.")
@click.option("--target", "target_dir", type=click.Path(path_type=Path), default=Path("data/models/target"),
              help="The target to distil from (draft-model only).")
@click.option("--threads", type=int, default=2, help="CPU threads for torch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(kind: str, out: Path | None, run_dir: Path | None, resume: bool, minutes: float | None,
            steps: int | None, target_dir: Path, threads: int, as_json: bool) -> None:
    """Build the tokenizer data or train the target / draft model on the offline corpus."""
    if minutes is not None and minutes <= 0:
        raise InputError(f"--minutes must be positive, got {minutes}: give a budget such as 60")
    if steps is not None and steps <= 0:
        raise InputError(f"--steps must be positive, got {steps}: give a count such as 2000")
    if threads < 1:
        raise InputError(f"--threads must be at least 1, got {threads}: give 1 or 2")
    import dataclasses

    import torch

    from real_engine import train

    torch.set_num_threads(threads)
    if kind == "tokenizer":
        result = train.prepare_data()
    else:
        base = train.TARGET if kind == "target" else train.DRAFT_MODEL
        overrides = {k: v for k, v in (("minutes", minutes), ("steps", steps)) if v is not None}
        cfg = dataclasses.replace(base, **overrides)
        out = out or DEFAULT_OUT[kind]
        run_dir = run_dir or Path("runs") / kind
        if kind == "target":
            log = train.train_target(out, run_dir, cfg, resume=resume)
        else:
            if not (target_dir / "config.json").exists():
                raise InputError(f"no target model in {target_dir}: run `specblock train target` first")
            log = train.train_draft_model(out, run_dir, target_dir, cfg, resume=resume)
        result = {k: v for k, v in log.items() if k not in ("loss_curve", "eval_curve")}
        result["out"] = str(out)
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key}: {value}")
