"""`specblock serve-bench`: serving policies live in the batched engine under Poisson arrivals, beside the
serving simulator's prediction of the same requests (``experiments.serving.bench``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.files import write_text
from core.models import TOY, ModelSpec
from core.paths import RESULTS, SERVE_BENCH_RUNS, SERVE_POLICIES, repo_relative
from experiments.cli import (
    OUT_FOLDER,
    SEED,
    drafter_folder,
    model_arg,
    model_option,
    model_prompts,
    model_result,
)
from experiments.serving.lengths import CONTEXT_TOKENS, LENGTHS, MIN_OUTPUT, default_lengths, servable

QUICK = {"rates": "8", "requests": 12, "tokens": 32, "rounds": 3, "prompts": 4}


def _rates(value: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        rates = ()
    if not rates or min(rates) <= 0 or len(set(rates)) != len(rates):
        raise InputError(f"--rates {value!r}: give distinct positive arrival rates (requests per second) "
                         "separated by commas, e.g. 2,8")
    return rates


def _policies(paths: tuple[Path, ...]) -> list[tuple[str, dict[str, Any]]]:
    """(name, content) of each serving policy file, named by its stem; InputError for a bad one."""
    from policies import check_role, load_policy, policy_to_dict  # numpy: not for --help

    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        if path.stem in out or path.stem == "none":
            raise InputError(f"--policy {path}: another setting is already called {path.stem!r}: rename the "
                             "file")
        out[path.stem] = policy_to_dict(check_role(load_policy(path), "serving", f"--policy {path}"))
    return list(out.items())


def _steering(model: ModelSpec, given: Path | None) -> Path:
    """``given``, else ``model``'s serving profile; InputError naming how to measure one otherwise."""
    if given is not None:
        return given
    if model.serve_profile is None or not model.serve_profile.is_file():
        arg = model_arg(model)
        raise InputError(f"model {model.name!r} has no serving profile: measure a cost profile with "
                         f"`specblock profile --model {arg} --out FILE` and pass --steering-profile FILE "
                         "(--profile-out then keeps the serving costs measured beside)")
    return model.serve_profile


@click.command("serve-bench")
@model_option()
@click.option("--policy", "policy_paths", multiple=True, type=click.Path(path_type=Path),
              help="A serving policy file (repeatable) [default: for toy-16m the tuned files in "
                   "data/policies/serving, else each serving kind's defaults]. Vanilla decoding always runs "
                   "beside them.")
@click.option("--rates", default="2,8,32", show_default=True, help="Arrival rates (requests per second).")
@click.option("--requests", type=int, default=16, show_default=True, help="Requests per round and rate.")
@click.option("--tokens", type=int, default=32, show_default=True,
              help="The output cap: new tokens per request at most (every request's under --lengths fixed).")
@click.option("--lengths", type=click.Choice(LENGTHS), default=None,
              show_default="dataset where the held-out prompts carry reference answers, as the real "
                           "prompt sets do; else fixed",
              help="Each request's new tokens: fixed, --tokens; dataset, the length in tokens of the "
                   "dataset's answer to its prompt (ShareGPT's reply, HumanEval's canonical solution), "
                   f"capped at --tokens, prompts without an answer of {MIN_OUTPUT} tokens or more left out, "
                   "as vLLM's serving benchmark replays ShareGPT. Prompts are cut to their last "
                   f"{CONTEXT_TOKENS} tokens either way.")
@click.option("--rounds", type=int, default=4, show_default=True,
              help="Arrival draws per rate (the intervals are over them).")
@click.option("--max-batch", type=int, default=4, show_default=True,
              help="Requests decoded together at most.")
@click.option("--prompts", type=int, default=8, show_default=True,
              help="Held-out prompts per domain to draw from.")
@click.option("--calibration-prompts", "calibration_count", type=int, default=24, show_default=True,
              help="Calibration prompts per domain whose acceptance the simulator replays (fewer let a few "
                   "easy prompts set it).")
@click.option("--steering-profile", "steering_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              show_default="the model's serving profile (toy-16m: data/profiles/cpu_serve.json)",
              help="The costs the policies see (the profile they were tuned on), live and simulated alike.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The costs the simulator charges [default: measured in this process, its rounds "
                   "interleaved with the live rounds; the results file keeps it].")
@click.option("--profile-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the profile measured alongside here (e.g. data/profiles/cpu_serve.json).")
@click.option("--profile-repeats", type=int, default=2, show_default=True,
              help="Measuring rounds of the profile per live round.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch intra-op threads.")
@click.option("--quick", is_flag=True,
              help="One rate (8/s), 12 requests of at most 32 new tokens, 3 rounds, 4 prompts per domain, "
                   "written to runs/serve-bench unless --out is given: about a minute.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--name", default=None,
              show_default="serve_bench, with _<model> for a model other than the toy family",
              help="Result file name.")
@click.option("--out", type=OUT_FOLDER, default=None,
              help="Folder for <name>.json and <name>.md [default: benchmarks/results; with --quick, "
                   "runs/serve-bench].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
def command(model: ModelSpec, policy_paths: tuple[Path, ...], rates: str, requests: int, tokens: int,
            lengths: str | None, rounds: int, max_batch: int, prompts: int, calibration_count: int,
            steering_path: Path | None, profile_path: Path | None, profile_out: Path | None,
            profile_repeats: int, threads: int, quick: bool, seed: int, name: str | None, out: Path | None,
            as_json: bool) -> None:
    """Serve Poisson arrivals with each serving policy in the batched engine; compare with the simulator."""
    name = name or model_result("serve_bench", model.name)
    if quick:
        rates, requests, tokens, rounds, prompts = (
            QUICK[k] for k in ("rates", "requests", "tokens", "rounds", "prompts"))
    scratch = quick and out is None  # a smoke run: kept apart from the committed results
    out = SERVE_BENCH_RUNS if scratch else RESULTS if out is None else out
    rate_list = _rates(rates)
    for flag, value, low in (("--requests", requests, 1), ("--tokens", tokens, 2), ("--rounds", rounds, 2),
                             ("--max-batch", max_batch, 1), ("--prompts", prompts, 1),
                             ("--calibration-prompts", calibration_count, 1),
                             ("--profile-repeats", profile_repeats, 1), ("--threads", threads, 1)):
        if value < low:
            raise InputError(f"{flag} {value} is too small: give {low} or more")
    if profile_out is not None and (profile_path is not None or not profile_out.parent.is_dir()):
        raise InputError(f"--profile-out {profile_out}: give an existing folder, and no --profile (it "
                         "writes the profile measured first)")
    tuned = tuple(sorted(SERVE_POLICIES.glob("*.json"))) if model == TOY else ()  # tuned on its costs
    files = _policies(policy_paths or tuned)
    model_dir = model.require().target
    draft_dir = drafter_folder(model, "draft-model")
    steering_path = _steering(model, steering_path)
    import torch  # torch, the engine and the simulator load here, not for --help

    from core.cost_profile import load_profile, profile_from_json
    from experiments.provenance import save_result
    from experiments.serving.bench import (
        ServeBench,
        ServedDraft,
        default_settings,
        measure_profile,
        record_acceptance,
    )
    from experiments.serving.report import bench_body
    from real_engine import profile as prof
    from real_engine.model import load_model
    from real_engine.timing import frozen_heap
    from real_engine.tokenizer import Tokenizer
    from real_engine.trace import load_prompts, prompt_domains

    steering = load_profile(steering_path)  # bad files fail first
    profile = None if profile_path is None else load_profile(profile_path)
    torch.set_num_threads(threads)
    dtype = getattr(torch, model.dtype)
    target = load_model(model_dir, dtype)
    draft = ServedDraft(load_model(draft_dir, dtype), draft_dir)
    tokenizer = Tokenizer.load(model_dir, target.args.vocab_size, target.args.eos_token_id)
    prompt_sets = model_prompts(model)
    domains = prompt_domains(prompt_sets)
    held_out = load_prompts(domains, prompts, tokenizer.encode, "evaluation", CONTEXT_TOKENS,
                            folder=prompt_sets, chat_encode=tokenizer.chat_encoder())
    calibration = load_prompts(domains, calibration_count, tokenizer.encode, "calibration", CONTEXT_TOKENS,
                               folder=prompt_sets, chat_encode=tokenizer.chat_encoder())
    lengths = lengths or default_lengths(held_out)
    held_out = servable(held_out, lengths)  # refused here, before the long part, when none is
    out.mkdir(parents=True, exist_ok=True)  # every input checked: --out is created as in every command
    start = time.perf_counter()

    def log(line: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.0f} s] {line}", err=True)

    log(f"recording acceptance on {len(calibration)} calibration prompts")
    bench = ServeBench(target, draft, steering, record_acceptance(target, draft, calibration, tokens, seed),
                       default_settings(files), held_out, rate_list, requests, tokens, max_batch, seed,
                       lengths, log)
    bench.warm_up()
    measured = None
    with frozen_heap():  # measuring and serving alike, as a server after start-up
        if profile is None:
            log(f"live rounds, each after {profile_repeats} rounds of measuring the serving costs")

            def between(k: int) -> None:
                if k % profile_repeats == profile_repeats - 1:
                    bench.live_round(k // profile_repeats)

            measured = measure_profile(target, draft, max_batch, tokens, rounds * profile_repeats, seed,
                                       between)
            profile = profile_from_json(measured)
        else:
            for k in range(rounds):
                bench.live_round(k)
    result = bench.report(profile)
    if profile_out is not None:
        prof.save(measured, profile_out)
    config = {"model": model.name, "model_dir": repo_relative(model_dir),
              "draft_model": repo_relative(draft_dir), "draft_vocab": draft.vocab,
              "prompts_dir": repo_relative(prompt_sets),
              "rates": list(rate_list), "requests": requests, "tokens": tokens, "lengths": lengths,
              "drawn_lengths": bench.drawn_lengths(), "rounds": rounds,
              "max_batch": max_batch, "prompts": prompts, "context_tokens": CONTEXT_TOKENS,
              "threads": threads, "quick": quick,
              "traces": f"recorded: draft-model chains on {len(calibration)} calibration prompts",
              "steering_profile": repo_relative(steering_path), "profile_repeats": profile_repeats,
              "profile": repo_relative(profile_path) if profile_path is not None else measured,
              "policy_files": [repo_relative(p) for p in policy_paths]}
    saved = save_result(name, result, config, seed, directory=out)
    table = write_text(out / f"{name}.md", "\n".join([f"# {name}", "", *bench_body(
        {"results": result, "config": config})]) + "\n")
    if as_json:
        sys.stdout.write(json.dumps({"results": str(saved), "markdown": str(table), **result}) + "\n")
        return
    click.echo(table.read_text())
    click.echo(f"wrote {saved} and {table}", err=True)
