"""`specblock responses`: the target's own answers to its training prompts (self-distillation data).

Decodes a model's training prompt rows (``<prompt sets>/training/<domain>.jsonl``, which `specblock models
fetch` extracts for the real model) with continuous batching, greedy or, for a seeded share, sampled at
temperature 1, into ``--out`` (``runs/responses-<model>`` by default) as
``real_engine.training.responses`` describes: ``responses.jsonl`` and ``state.json``, batch by batch, so
``--minutes`` can stop a long run and ``--resume`` continues it.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from core.errors import InputError
from core.models import ModelSpec
from core.paths import RUNS
from experiments.cli import OUT_FOLDER, SEED, model_option


@click.command("responses")
@model_option()
@click.option("--out", type=OUT_FOLDER, default=None, show_default="runs/responses-<model>",
              help="Folder for responses.jsonl and state.json.")
@click.option("--prompts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Training prompts per domain, in file order (0: all).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--sampled", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Share of the prompts answered by sampling at temperature 1 (seeded); the rest greedily.")
@click.option("--batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests decoding together.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop after the batch running when this many minutes have passed (then --resume).")
@click.option("--resume", is_flag=True, help="Continue the run in --out.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="CPU threads for torch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the run's state).")
def command(model: ModelSpec, out: Path | None, prompts: int, max_new_tokens: int, sampled: float, batch: int,
            seed: int, minutes: float | None, resume: bool, threads: int, as_json: bool) -> None:
    """Answer the model's training prompts with the model itself (its drafters' training data)."""
    from real_engine.prompts import TRAINING_FOLDER, encode_row, read_prompt_set  # the engine: not for --help

    folder = model.prompts / TRAINING_FOLDER
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        raise InputError(f"model {model.name!r} has no training prompts in {folder}: use a model with a "
                         "training split (`specblock models fetch smollm2-135m`)")
    rows = [row for path in files for row in read_prompt_set(path, path.stem)[:prompts or None]]
    import torch  # torch and the engine: not for --help

    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer
    from real_engine.training.responses import ResponsePlan, respond

    torch.set_num_threads(threads)
    target = load_model(model.require().target, getattr(torch, model.dtype))
    tokenizer = Tokenizer.load(model.target, target.args.vocab_size, target.args.eos_token_id)
    plan = ResponsePlan(max_new_tokens, sampled, batch, seed)
    state = respond(target, rows, lambda row: encode_row(row, tokenizer.encode, tokenizer.encode_chat),
                    out or RUNS / f"responses-{model.name}", plan, eos_id=tokenizer.eos_id, minutes=minutes,
                    resume=resume, log=lambda line: click.echo(line, err=True))
    summary = {k: v for k, v in state.items() if k != "prompts"} | {"prompts": len(state["prompts"])}
    click.echo(json.dumps(summary) if as_json else
               f"{summary['done']}/{summary['prompts']} prompts answered in {summary['seconds']:.0f} s")
