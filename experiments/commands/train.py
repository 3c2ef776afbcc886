"""`specblock train KIND`: build the corpus data, or train a model of the shipped family, or a drafter
for any model.

Kinds: ``tokenizer`` (corpus manifest, tokenizer and prompt sets under data/) and ``target`` (the target
LM, shipped to data/models/target), both the shipped toy family's only; then every registered drafter
with a training recipe (``DrafterSpec.recipe``, run by ``real_engine.training.recipes.train_drafter``):
the draft model (distilled from the target) and the feature drafters (trained on the target's rows,
cached under runs/drafter-data), each for the model ``--model`` names and written to that model's
drafters folder (``ModelSpec.drafter_folder``: the toy family's are data/models/draft and
data/models/<kind>, a checkpoint folder's DIR/drafters/<kind>). Checkpoints live under runs/<kind>/
(another model's under runs/<kind>-<model>/) and ``--resume`` continues them. The default paths
(data/..., runs/...) lie in the repository wherever the command runs; a path given on the command line
is relative to the working directory.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from core.errors import InputError
from core.models import TOY, ModelSpec
from core.names import trainable_drafters, trained_drafters
from core.paths import RUNS
from experiments.cli import OUT_FOLDER, LiveChoice, model_option

TOY_ONLY = ("tokenizer", "target")  # they build the shipped toy family itself
CURVES = ("losses", "accuracies", "loss_curve", "eval_curve")  # a training record's curves: not printed


def kinds() -> tuple[str, ...]:
    """What `specblock train` builds: the toy family's tokenizer and target, every drafter with a recipe."""
    return (*TOY_ONLY, *trainable_drafters())


def default_out(kind: str, model: ModelSpec) -> Path:
    """Where ``kind`` trained for ``model`` goes: the toy family's target for ``target``, else the model's
    own folder of the drafter (``ModelSpec.drafter_folder``; the draft model's for ``draft-model``)."""
    return TOY.target if kind == "target" else model.drafter_folder(kind)


def default_run_dir(kind: str, model: ModelSpec) -> Path:
    """The checkpoint folder of ``kind`` trained for ``model``: runs/<kind> for the toy family, else
    runs/<kind>-<model name>, so one model's checkpoints never resume another's."""
    return RUNS / kind if model == TOY else RUNS / f"{kind}-{model.name}"


def _responses(kind: str, model: ModelSpec, given: Path | None, on_policy: float | None) -> Path | None:
    """The responses a drafter trains on: ``given``, else the model's own where they exist (the shipped
    ones, ``ModelSpec.responses``, then a `specblock responses` run's, ``runs/responses-<model>``), else
    None: the toy family's corpus, whose ids only the toy family's tokenizer reads (a real model's drafters
    need its responses). InputError for responses given to the toy family's own builds or beside
    --on-policy."""
    if given is not None and kind not in trainable_drafters():
        raise InputError(f"--responses feeds the drafters ({', '.join(trainable_drafters())}): drop it "
                         f"for {kind}")
    if given is not None and on_policy is not None:
        raise InputError("--on-policy mixes the target's continuations into the corpus windows: drop it "
                         "with --responses, whose answers are all the target's own")
    if given is None and kind in trainable_drafters() and model != TOY:
        return next((own for own in (model.responses, RUNS / f"responses-{model.name}")
                     if (own / "state.json").is_file()), None)
    return given


@click.command("train")
@click.argument("kind", type=LiveChoice(kinds))
@click.option("--out", type=OUT_FOLDER, default=None,
              help="Folder for the trained model [default: the model's own drafter folder (toy-16m: "
                   "data/models/<kind>, data/models/draft for draft-model; a folder DIR: "
                   "DIR/drafters/<kind>); target: data/models/target].")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder [default: runs/<kind>; another model's runs/<kind>-<model>].")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in the run folder.")
@click.option("--minutes", type=float, default=None,
              help="Wall-clock budget: the schedule spans it (target, draft-model), or the run stops there, "
                   "checkpointed for --resume (specblock, eagle, medusa).")
@click.option("--steps", type=int, default=None, help="A fixed number of steps instead of a time budget.")
@model_option("The model to distil a draft model from, or to train a drafter for (tokenizer and target "
              "build the toy family: toy-16m only).")
@click.option("--sequences", type=int, default=None,
              help="Windows of the target's rows to train on (drafters; default: the recipe's, "
                   "real_engine/training/recipes.py).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=RUNS / "drafter-data",
              show_default="runs/drafter-data", help="Cache of the target's rows (drafters).")
@click.option("--init", "init_dir", type=click.Path(path_type=Path), default=None,
              help="Start from this model's weights, with a fresh optimiser and schedule: continue a target "
                   "or draft model of the recipe's shape, or warm-start a drafter of the kind (e.g. the one "
                   "trained for an earlier version of the target).")
@click.option("--responses", "responses_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              show_default="the model's shipped responses, else runs/responses-<model>, where they exist, "
                           "for a model other than the toy family",
              help="A drafter's data: the target's own answers (`specblock responses`) instead of the toy "
                   "family's corpus.")
@click.option("--lr", type=float, default=None, help="Peak learning rate (default: the recipe's).")
@click.option("--batch-size", type=int, default=None, help="Windows per step (default: the recipe's).")
@click.option("--on-policy", type=float, default=None,
              help="On-policy data: the share of the training windows that the target continues itself after "
                   "their first 64 tokens, half greedily, half sampled (draft model: default 0, corpus text "
                   "only; feature drafters: default 0.5, their recipe's).")
@click.option("--size", type=click.Choice(("16m", "5m")), default=None,
              help="The target's shape (target): 16m, the shipped one (384 x 8 layers, the default), or "
                   "5m (256 x 4 layers).")
@click.option("--threads", type=int, default=2, help="CPU threads for torch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(kind: str, out: Path | None, run_dir: Path | None, resume: bool, minutes: float | None,
            steps: int | None, model: ModelSpec, sequences: int | None, data_dir: Path, init_dir: Path | None,
            responses_dir: Path | None, lr: float | None, batch_size: int | None, on_policy: float | None,
            size: str | None, threads: int, as_json: bool) -> None:
    """Build the tokenizer data, or train the target, the draft model or a feature drafter."""
    if minutes is not None and minutes <= 0:
        raise InputError(f"--minutes must be positive, got {minutes}: give a budget such as 60")
    if steps is not None and steps <= 0:
        raise InputError(f"--steps must be positive, got {steps}: give a count such as 2000")
    if lr is not None and not 0 < lr < 1:
        raise InputError(f"--lr must be in (0, 1), got {lr}: give a rate such as 1e-3")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}: give a size such as 8")
    if on_policy is not None and (kind in ("tokenizer", "target") or not 0 <= on_policy <= 1):
        raise InputError(f"--on-policy {on_policy}: give a share in [0, 1], for the draft model or a drafter")
    if size is not None and kind != "target":
        raise InputError("--size chooses the target's shape: drop it for the other kinds")
    if init_dir is not None and kind == "tokenizer":
        raise InputError("--init starts a model from trained weights: drop it for the tokenizer")
    if init_dir is not None and not (init_dir / "config.json").exists():
        raise InputError(f"no model in {init_dir}: give a folder with config.json and safetensors weights")
    if threads < 1:
        raise InputError(f"--threads must be at least 1, got {threads}: give 1 or 2")
    responses_dir = _responses(kind, model, responses_dir, on_policy)
    corpus_only = kind not in trained_drafters() and responses_dir is None  # the toy draft model's data
    if sequences is not None and (sequences < 1 or corpus_only):
        raise InputError(f"--sequences {sequences}: give a positive count, for "
                         f"{', '.join(trained_drafters())} or a drafter trained on --responses")
    if kind in TOY_ONLY and model != TOY:
        raise InputError(f"`specblock train {kind}` builds the shipped toy family ({TOY.name}), not a target "
                         f"for model {model.name!r}: drop --model, or train a drafter "
                         f"({', '.join(trainable_drafters())}) for it")
    target_dir = model.target
    if kind not in TOY_ONLY and not (target_dir / "config.json").exists():
        if model != TOY:
            model.require()
        raise InputError(f"no target model in {target_dir}: run `specblock train target` or give --model")
    out = out or default_out(kind, model)
    run_dir = run_dir or default_run_dir(kind, model)
    import torch  # torch and the training code: not for --help

    from real_engine.training import corpus, recipes, target

    torch.set_num_threads(threads)
    if kind == "tokenizer":
        result = corpus.prepare_data()
    elif kind == "target":
        overrides = {k: v for k, v in (("minutes", minutes), ("steps", steps), ("lr", lr),
                                       ("batch_size", batch_size)) if v is not None}
        cfg = dataclasses.replace(target.TARGETS[size or "16m"], **overrides)
        log = target.train_target(out, run_dir, cfg, resume=resume, init=init_dir)
        result = {**{k: v for k, v in log.items() if k not in CURVES}, "out": str(out)}
    else:
        request = recipes.TrainRequest(steps=steps, lr=lr, batch_size=batch_size, sequences=sequences,
                                       on_policy=on_policy, minutes=minutes, data_dir=data_dir, resume=resume,
                                       init=init_dir, responses=responses_dir)
        log = recipes.train_drafter(kind, target_dir, out, run_dir, request)
        result = {**{k: v for k, v in log.items() if k not in CURVES}, "out": str(out)}
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key}: {value}")
