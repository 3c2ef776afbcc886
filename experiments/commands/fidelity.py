"""`specblock fidelity`: the simulator's predicted tokens/s against the live engine's, per configuration.

Records calibration traces, runs every configuration of ``experiments.pipeline.fidelity.configs()`` in the
engine on the evaluation prompts and in the simulator from its trace, and writes ``<out>/<name>.json`` (with
provenance) and ``<name>.md`` (``experiments.pipeline.fidelity`` describes the method).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import click

from core.errors import InputError
from core.files import write_text
from core.models import ModelSpec
from core.paths import RESULTS, repo_relative
from experiments.cli import OUT_FOLDER, SEED, model_option, model_profile, model_prompts
from experiments.provenance import save_result


@click.command("fidelity")
@model_option()
@click.option("--draft-model", "draft_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own", help="Draft model folder (skipped when it holds none).")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
              show_default="the model's own", help="Cost profile the simulator runs on.")
@click.option("--calibration", type=int, default=8, show_default=True, help="Calibration prompts per domain.")
@click.option("--evaluation", type=int, default=8, show_default=True, help="Evaluation prompts per domain.")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--queries", type=int, default=512, show_default=True, help="Simulated queries per config.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch intra-op threads.")
@click.option("--only", default=None, help="Comma-separated configuration names to run (default: all).")
@click.option("--name", default="fidelity", show_default=True, help="Result file name.")
@click.option("--traces", "trace_files", multiple=True,
              help="KEY=FILE: reuse a calibration trace instead of recording it (KEY: a trace name such as "
                   "chain-4 or specblock-2; a wrong one is refused with the list).")
@click.option("--measure-profile", "fresh_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Measure a cost profile (CPU clock, --threads) after the calibration traces, right before "
                   "the engine runs, write it here and use it instead of --profile: a shared machine's speed "
                   "drifts by several percent within an hour.")
@click.option("--profile-repeats", type=int, default=15, show_default=True,
              help="Timed repeats per configuration of --measure-profile.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for <name>.json and <name>.md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results instead of the "
                                                      "table.")
def command(model: ModelSpec, draft_dir: Path | None, profile_path: Path | None, calibration: int,
            evaluation: int,
            max_new_tokens: int, queries: int, threads: int, only: str | None, name: str,
            trace_files: tuple[str, ...], fresh_path: Path | None, profile_repeats: int, seed: int, out: Path,
            as_json: bool) -> None:
    """Compare the simulator's predicted tokens/s with the engine's measured tokens/s."""
    import torch  # torch, the engine and the simulator load here, not for --help

    from core.cost_profile import load_profile, profile_measurement
    from experiments.pipeline.fidelity import Engine, calibrate, configs, given_traces, markdown, run_fidelity
    from real_engine import profile as prof
    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer
    from real_engine.trace import load_prompts, prompt_domains

    if profile_repeats < 1:
        raise InputError(f"--profile-repeats {profile_repeats} is too few: give 1 or more")
    if fresh_path is not None and not fresh_path.parent.is_dir():  # fail now, not after the traces
        raise InputError(f"--measure-profile {fresh_path}: folder {fresh_path.parent} does not exist; "
                         "create it or write the profile elsewhere")
    model_dir = model.require().target
    draft_dir = model.draft_model if draft_dir is None else draft_dir
    if fresh_path is None:
        profile_path = model_profile(model, profile_path)
    torch.set_num_threads(threads)
    profile = None if fresh_path is not None else load_profile(profile_path)  # a bad file fails first
    dtype = getattr(torch, model.dtype)
    target = load_model(model_dir, dtype)
    draft = load_model(draft_dir, dtype) if (draft_dir / "config.json").is_file() else None
    tokenizer = Tokenizer.load(model_dir, target.args.vocab_size, target.args.eos_token_id)
    engine = Engine(target, draft, tokenizer.eos_id, max_new_tokens, seed, model)
    prompt_sets = model_prompts(model)
    domains = prompt_domains(prompt_sets)
    room = target.args.max_position_embeddings - max_new_tokens - 17
    cal = load_prompts(domains, calibration, tokenizer.encode, "calibration", room, folder=prompt_sets,
                       chat_encode=tokenizer.chat_encoder())
    ev = load_prompts(domains, evaluation, tokenizer.encode, "evaluation", room, folder=prompt_sets,
                      chat_encode=tokenizer.chat_encoder())
    chosen = configs() if only is None else tuple(c for c in configs() if c.name in only.split(","))
    start = time.perf_counter()

    def log(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.0f} s] {message}", err=True)

    traces = calibrate(engine, cal, chosen, given_traces(trace_files), log)
    if fresh_path is not None:
        log(f"measuring a cost profile ({profile_repeats} repeats) into {fresh_path}")
        grid = dataclasses.replace(prof.FULL, repeats=profile_repeats)
        prof.save(prof.measure(target, target_name=prof.model_name(target, model_dir), draft=draft,
                               draft_name=None if draft is None else prof.model_name(draft, draft_dir),
                               grid=grid, threads=threads, clock_kind="cpu", seed=seed,
                               models_dir=model.drafters), fresh_path)
        profile_path = fresh_path
        profile = load_profile(profile_path)
    clock = profile_measurement(profile_path).get("clock", "wall")
    result = run_fidelity(engine, profile, clock, traces, ev, chosen, queries, log)
    meta = {"profile": repo_relative(profile_path), "model": model.name,
            "model_dir": repo_relative(model_dir),
            "draft_model": repo_relative(draft_dir) if draft is not None else None,
            "prompts_dir": repo_relative(prompt_sets),
            "calibration": len(cal), "evaluation": len(ev), "max_new_tokens": max_new_tokens,
            "queries": queries, "threads": threads, "given_traces": list(trace_files)}
    saved = save_result(name, result, meta, seed, directory=out)
    table = write_text(out / f"{name}.md", markdown(result, meta))
    if as_json:
        sys.stdout.write(json.dumps({"results": str(saved), "markdown": str(table), **result}) + "\n")
        return
    click.echo(markdown(result, meta))
    click.echo(f"wrote {saved} and {table}", err=True)
