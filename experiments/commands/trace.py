"""`specblock trace`: record acceptance traces of the live engine on calibration prompts (parquet).

Decodes the first ``--prompts`` calibration prompts (the first half of each ``<domain>.jsonl`` of the
model's prompt sets; the toy family's are ``data/prompts``) of each domain with the chosen drafter and
writes one row per decoding iteration (``simulator.traces``; see ``real_engine.trace``). ``--probe``
writes one row per generated token instead: the drafter drafts at every position of the greedy text
and nothing is verified, the trace a simulated length policy walks as the engine would.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from core.errors import InputError
from core.models import ModelSpec
from core.names import RUN_DTYPES, drafter_names, drafter_spec
from core.verifiers import default_verifier, defaults_help, verifier_names
from experiments.cli import (
    SEED,
    LiveChoice,
    drafter_folder,
    model_arg,
    model_option,
    model_prompts,
    resolve_device,
)

UNTRAINED_SHAPE = {"depth": 8, "width": 1, "budget": 16}  # defaults of a drafter that is not trained


def _domains(text: str | None, model: ModelSpec) -> tuple[tuple[str, ...], Path]:
    """The domains ``--domains`` names (None: every domain of the model's prompt sets) and the folder of
    the prompt sets holding them (``model_prompts``)."""
    from real_engine.trace import prompt_domains  # torch, pandas: not for --help

    if text is None:
        folder = model_prompts(model)
        if not prompt_domains(folder):
            raise InputError(f"no <domain>.jsonl prompt sets in {folder}: give the model's prompt sets")
        return prompt_domains(folder), folder
    names = tuple(d.strip() for d in text.split(",") if d.strip())
    if not names:
        raise InputError(f"--domains {text!r} names no domain: give a comma-separated list such as "
                         f"{','.join(prompt_domains(model_prompts(model)))}")
    return names, model_prompts(model, names)


def _folder(path: Path, flag: str, train: str) -> Path:
    if not (path / "config.json").is_file():
        raise InputError(f"{flag} {path} is not a model folder (no config.json): train one with "
                         f"`specblock train {train}` or pass {flag} DIR")
    return path


@click.command("trace")
@click.option("--drafter", type=LiveChoice(drafter_names), default="draft-model", show_default=True,
              help="Drafter kind.")
@click.option("--domains", default=None, show_default="every domain of the model's prompt sets",
              help="Comma-separated prompt domains (<domain>.jsonl files of the model's prompt sets).")
@click.option("--prompts", type=int, default=8, show_default=True, help="Calibration prompts per domain.")
@click.option("--prompt-file", type=click.Path(path_type=Path), default=None,
              help="Trace your own prompts instead of the model's calibration sets: JSON lines of "
                   "{\"text\", \"domain\"?, \"chat\"?} or MT-bench questions (the first turn, through the "
                   "chat template; the category is the trace's domain); the first --prompts of each domain.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Parquet trace file to write.")
@model_option()
@click.option("--draft-model", "draft_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own", help="Draft model folder (for --drafter draft-model).")
@click.option("--drafter-model", "drafter_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own",
              help="A trained drafter's folder (for the trained drafters).")
@click.option("--draft-length", type=int, default=None,
              help="Draft depth per iteration [default: 8 for n-gram and the draft model; a trained "
                   "drafter's own].")
@click.option("--tree-width", type=int, default=None,
              help="Draft model: >1 drafts a top-k tree [default 1]; EAGLE: its top-k [default: as trained].")
@click.option("--tree-budget", type=int, default=None,
              help="Tree nodes kept [default: 16 for the draft model; a trained drafter's own].")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--verifier", type=LiveChoice(verifier_names), default=None,
              help=defaults_help(("chain", "tree")))
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy decoding.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Query i decodes with seed + i.")
@click.option("--probe", is_flag=True,
              help="Draft at every position of the greedy text, verifying nothing (one row per token): what "
                   "`specblock pipeline` records for its length policies. Temperature 0 only.")
@click.option("--device", default=None, help="torch device [default: cuda if available, else cpu].")
@click.option("--dtype", type=click.Choice(RUN_DTYPES), default=None, show_default="the model's own")
@click.option("--threads", type=int, default=None, help="torch intra-op threads [default: torch's].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (a summary) on stdout.")
def command(drafter: str, domains: str | None, prompts: int, prompt_file: Path | None, out: Path,
            model: ModelSpec,
            draft_dir: Path | None, drafter_dir: Path | None, draft_length: int | None,
            tree_width: int | None, tree_budget: int | None, max_new_tokens: int, verifier: str | None,
            temperature: float, seed: int, probe: bool, device: str | None, dtype: str | None,
            threads: int | None, as_json: bool) -> None:
    """Record one trace row per decoding iteration of the live engine."""
    spec = drafter_spec(drafter)
    given = {"depth": draft_length, "width": tree_width, "budget": tree_budget}
    if not spec.trained:  # a trained drafter keeps the settings it was trained with
        given = {k: UNTRAINED_SHAPE[k] if v is None and k in spec.options else v for k, v in given.items()}
    if prompt_file is not None and domains is not None:
        raise InputError("--prompt-file replaces the model's prompt sets: drop --domains")
    names, prompt_sets = ((), None) if prompt_file is not None else _domains(domains, model)
    if prompts < 1:
        raise InputError(f"--prompts {prompts} is too few: trace at least 1 prompt per domain")
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens} is too few: give at least 1")
    if threads is not None and threads < 1:
        raise InputError(f"--threads {threads} is invalid: give 1 or more")
    if probe and (temperature != 0.0 or verifier not in (None, "greedy")):
        raise InputError("--probe reads each draft's accepted path off the greedy text: drop --temperature "
                         "and --verifier, or drop --probe")
    model_dir = model.require().target
    dtype = dtype or model.dtype
    if drafter_dir is not None and not spec.trained:
        raise InputError(f"--drafter-model is a trained drafter's folder: drop it for --drafter {drafter}")
    folder = drafter_folder(model, drafter, drafter_dir) if spec.trained else None
    if spec.needs_draft_model:
        draft_dir = (drafter_folder(model, drafter) if draft_dir is None
                     else _folder(draft_dir, "--draft-model", f"draft-model --model {model_arg(model)}"))
    import torch  # torch and the engine: not for --help

    from real_engine.decode import make_drafter
    from real_engine.model import load_model
    from real_engine.prompts import load_prompt_file
    from real_engine.tokenizer import Tokenizer
    from real_engine.trace import load_prompts, record
    from real_engine.warp import Sampling
    from simulator.traces import save_traces

    if threads is not None:
        torch.set_num_threads(threads)
    sampling = Sampling(temperature)
    tree_drafter = (given["width"] or 1) > 1 or spec.trained  # a trained drafter: its top-k tree
    verifier = verifier or default_verifier(temperature, "tree" if tree_drafter else "chain")
    device = resolve_device(device)
    target = load_model(model_dir, dtype, device)
    tokenizer = Tokenizer.load(model_dir, target.args.vocab_size, target.args.eos_token_id)
    room = target.args.max_position_embeddings - max_new_tokens - (given["depth"] or 16) - 1
    if room < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's "
                         f"{target.args.max_position_embeddings} positions: lower it")
    if prompt_file is None:
        chosen = load_prompts(names, prompts, tokenizer.encode, max_tokens=room, folder=prompt_sets,
                              chat_encode=tokenizer.chat_encoder())
    else:
        chosen = [replace(p, tokens=p.tokens[-room:])
                  for p in load_prompt_file(prompt_file, prompts, tokenizer.encode, tokenizer.chat_encoder())]
    draft = load_model(draft_dir, dtype, device) if spec.needs_draft_model else None

    def new() -> object:
        return make_drafter(drafter, target, draft, folder=folder, **given)

    new()  # bad drafter settings fail here, before any decoding

    def progress(query: int, stats: object) -> None:
        click.echo(f"\r  traced {query + 1}/{len(chosen)} prompts", err=True, nl=False)

    recording = record(target, chosen, new, drafter, verifier=verifier, sampling=sampling,
                       max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, seed=seed, probe=probe,
                       progress=progress)
    click.echo("", err=True)
    save_traces(recording.traces, out)
    traces = recording.traces
    tokens = sum(s.new_tokens for s in recording.stats)
    seconds = sum(s.seconds - s.prefill_seconds for s in recording.stats)
    result = {"out": str(out), "drafter": drafter, "verifier": verifier, "temperature": temperature,
              "probe": probe, "domains": list(names), "queries": len(chosen), "iterations": len(traces),
              "tau": tokens / len(traces), "mean_accepted": float(traces["accepted"].mean()),
              "tokens_per_second": tokens / seconds}
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    rate = (f"{result['mean_accepted']:.2f} draft tokens accepted per position" if probe
            else f"tau {result['tau']:.2f}")
    click.echo(f"wrote {out}: {result['iterations']} iterations of {result['queries']} queries, "
               f"{rate}, decode {result['tokens_per_second']:.1f} tokens/s")
