"""`specblock profile`: measure this device's decoding costs and write a cost profile (JSON).

Times the target's verify step over tree sizes and contexts, its vanilla step, every available
drafter's drafting per iteration (the draft model over its deployed drafting vocabulary, n-gram, and
SpecBlock/EAGLE/Medusa with the weights trained for ``--model`` or random weights of the shipped shape)
and a head-only and a full drafter update; see
``real_engine.profile``. The profile is written to the model's own (``--out`` for a model without one).
``--quick`` measures a small grid with few repeats (seconds, not minutes); ``--only-updates`` re-times
the SpecBlock updates of an existing profile and keeps the rest.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from core.errors import InputError
from core.files import MAX_PROFILE_BYTES, read_json
from core.models import ModelSpec
from core.names import RUN_DTYPES, trained_drafters
from experiments.cli import SEED, model_arg, model_option, resolve_device


def _model_folder(path: Path, flag: str, train: str) -> Path:
    if not (path / "config.json").is_file():
        raise InputError(f"{flag} {path} is not a model folder (no config.json): train one with "
                         f"`specblock train {train}` or pass {flag} DIR")
    return path


@click.command("profile")
@model_option()
@click.option("--draft-model", "draft_dir", type=click.Path(path_type=Path), default=None,
              help="Draft model folder [default: the model's own when it exists; 'none' skips it].")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              show_default="the model's profile (toy-16m: data/profiles/cpu_shipped.json)",
              help="Profile JSON to write (required for a model without a profile of its own).")
@click.option("--quick", is_flag=True, help="Small grid and few repeats (well under a minute).")
@click.option("--no-feature-drafters", is_flag=True,
              help=f"Skip the trained feature drafters ({', '.join(trained_drafters())}; those trained for "
                   "the model, else random weights of the shipped shape).")
@click.option("--repeats", type=int, default=None, help="Timed repeats per configuration (median kept).")
@click.option("--device", default=None, help="torch device [default: cuda if available, else cpu].")
@click.option("--dtype", type=click.Choice(RUN_DTYPES), default=None, show_default="the model's own")
@click.option("--threads", type=int, default=None, help="torch intra-op threads [default: torch's].")
@click.option("--clock", "clock_kind", type=click.Choice(("wall", "cpu")), default="wall", show_default=True,
              help="wall: elapsed time; cpu: CPU seconds of this process (reproducible on a shared CPU "
                   "machine; use with --threads 1).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds the random tokens and weights.")
@click.option("--only-updates", is_flag=True,
              help="Re-time only the SpecBlock updates of the profile at --out (on its clock), keeping the "
                   "rest.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the summary) on stdout.")
def command(model: ModelSpec, draft_dir: Path | None, out: Path | None, quick: bool,
            no_feature_drafters: bool, repeats: int | None, device: str | None, dtype: str | None,
            threads: int | None, clock_kind: str, seed: int, only_updates: bool, as_json: bool) -> None:
    """Measure verify, vanilla, drafting and update costs on this device; write a cost profile."""
    model_dir = model.require().target
    if out is None:
        if model.profile is None:
            raise InputError(f"model {model.name!r} has no profile of its own to write: give --out FILE (and "
                             "pass it as --profile FILE to the commands that read it)")
        out = model.profile
    dtype = dtype or model.dtype
    if draft_dir is None:
        own = model.draft_model
        draft_dir = own if (own / "config.json").is_file() else None
    elif str(draft_dir) == "none":
        draft_dir = None
    else:
        _model_folder(draft_dir, "--draft-model", f"draft-model --model {model_arg(model)}")
    if repeats is not None and repeats < 1:
        raise InputError(f"--repeats {repeats} is too few: time each configuration at least once")
    if threads is not None and threads < 1:
        raise InputError(f"--threads {threads} is invalid: give 1 or more")
    import torch  # torch and the engine: not for --help

    from real_engine import profile as prof
    from real_engine.drafters.vocab import deployed_vocab
    from real_engine.model import load_model

    if only_updates:
        measured = read_json(out, MAX_PROFILE_BYTES, "cost profile",
                             "give --out a profile specblock profile wrote, or run it without --only-updates")
        prof.check_remeasurable(measured)
    if threads is not None:
        torch.set_num_threads(threads)
    device = resolve_device(device)
    target = load_model(model_dir, dtype, device)
    draft = None if draft_dir is None else load_model(draft_dir, dtype, device)
    vocab = None if draft_dir is None else deployed_vocab(draft_dir, dtype=dtype)  # drafting as deployed
    grid = prof.QUICK if quick else prof.FULL
    if repeats is not None:
        grid = dataclasses.replace(grid, repeats=repeats)
    click.echo(f"profiling {model_dir} on {device} ({'quick' if quick else 'full'} grid"
               f"{', updates only' if only_updates else ''})...", err=True)
    if only_updates:
        data = prof.remeasure_updates(measured, target, grid=grid, seed=seed, models_dir=model.drafters)
    else:
        data = prof.measure(target, target_name=prof.model_name(target, model_dir), draft=draft,
                            draft_name=None if draft is None else prof.model_name(draft, draft_dir),
                            grid=grid, feature=not no_feature_drafters, dtype=dtype, threads=threads,
                            clock_kind=clock_kind, seed=seed, models_dir=model.drafters, draft_vocab=vocab)
    data["measurement"] = {**data["measurement"], "model": model.name}  # which --model it times
    prof.save(data, out)
    result = {"out": str(out), "model": model.name, **prof.summary(data), "clock": clock_kind,
              "drafters": data["models"]["drafters"], "verify_rows": len(data["samples"]["verify"]),
              "draft_vocab": data["measurement"].get("draft_vocab"),
              "quick": quick}
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    click.echo(f"wrote {out} ({result['device']})")
    for name, value in result["milliseconds"].items():
        click.echo(f"  {name:>24}: {value:8.3f} ms (context {result['context']:.0f})")
