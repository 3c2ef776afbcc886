"""`specblock bench`: measure drafters and verifiers against vanilla decoding, Spec-Bench style."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.models import ModelSpec
from core.names import RUN_DTYPES, drafter_choices, registry, trained_drafters
from core.paths import RESULTS, repo_relative
from core.verifiers import DRAFT_SHAPES, verifier_names
from experiments.cli import (
    OUT_FOLDER,
    SEED,
    csv_names,
    model_arg,
    model_option,
    model_profile,
    model_prompts,
    model_result,
    resolve_device,
)
from experiments.provenance import save_result
from experiments.specbench.report import markdown, write_report
from real_engine.drafters.trained import deployed_shape, trained_available


def _temperatures(value: str) -> tuple[float, ...]:
    try:
        temps = tuple(dict.fromkeys(float(v) for v in value.split(",") if v.strip()))
    except ValueError as exc:
        raise InputError(f"--temperatures {value!r} is not a list of numbers: give e.g. 0,1") from exc
    if not temps:
        raise InputError(f"--temperatures {value!r}: give one or more temperatures >= 0, e.g. 0,1")
    from real_engine.warp import Sampling  # torch: not for --help

    for temp in temps:
        try:
            Sampling(temp)
        except InputError as exc:
            raise InputError(f"--temperatures: {exc}") from None
    return temps


def _policies(paths: tuple[Path, ...]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(name, content) of each length policy file; InputError for a bad file or another role's policy."""
    from policies import check_role, load_policy, policy_to_dict  # numpy, torch: not for --help

    out = {}
    for path in paths:
        out[path.stem] = policy_to_dict(check_role(load_policy(path), "length", f"--policy {path}"))
    return tuple(out.items())


def _model(path: Path, flag: str, train: str) -> Path:
    if not (path / "config.json").is_file():
        raise InputError(f"{flag} {path} is not a model folder (no config.json): train one with "
                         f"`specblock train {train}` or pass {flag} DIR")
    return path


@click.command()
@click.option("--drafters", default=",".join(drafter_choices()), show_default=True,
              help=f"Drafters to measure (vanilla always runs); {', '.join(trained_drafters())} need their "
                   "trained weights under --drafters-dir (the model's own) and are skipped with a note "
                   "otherwise.")
@click.option("--verifiers", default="greedy,block,rrs", show_default=True,
              help="Verifiers: T=0 uses greedy; T>0 each listed sampling verifier that fits a draft shape.")
@click.option("--temperatures", default="0,1", show_default=True, help="Sampling temperatures.")
@click.option("--categories", default=None,
              help="Prompt categories: the prompt sets <category>.jsonl in --prompts-dir to decode (default: "
                   "all of them); a --prompt-file brings its own.")
@click.option("--prompts", "count", type=int, default=8, show_default=True, help="Prompts per category.")
@click.option("--shapes", default="chain,tree", show_default=True,
              help="Draft-model shapes: chain, tree (top-k), paths (K sampled paths).")
@click.option("--trained-shapes", is_flag=True,
              help=f"Also run the trained drafters ({', '.join(trained_drafters())}) at the shape they were "
                   "trained with (SpecBlock's 2 blocks, EAGLE's saved tree, Medusa's static tree: the "
                   "papers' deep trees), beside the deployed one.")
@click.option("--every-verifier", is_flag=True,
              help="At T=0 run every --verifiers entry that fits a shape, not only greedy: each must "
                   "reproduce vanilla's output (greedy_identical), the losslessness check.")
@click.option("--hf/--no-hf", default=True, show_default=True,
              help="Also measure transformers' assisted generation (skipped with a note if unavailable).")
@model_option()
@click.option("--draft-model", "draft_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own", help="Draft model folder (draft-model and --hf).")
@click.option("--drafters-dir", type=click.Path(path_type=Path), default=None, show_default="the model's own",
              help=f"Folder holding the trained drafters ({', '.join(f'{n}/' for n in trained_drafters())}).")
@click.option("--prompts-dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own",
              help="Folder of <category>.jsonl prompt sets (a \"text\" per line).")
@click.option("--prompt-file", type=click.Path(path_type=Path), default=None,
              help="Prompts of your own instead of the model's sets: JSON lines of {\"text\", \"domain\"?, "
                   "\"chat\"?} or MT-bench questions ({\"question_id\", \"category\", \"turns\"}: the first "
                   "turn through the chat template); rows are reported per category: a row's \"domain\" "
                   "or a question's category.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Prompt j decodes with seed + j.")
@click.option("--draft-length", type=int, default=None,
              help="Draft depth of n-gram and of the draft model's chain and tree [default: 4, and for the "
                   "draft model's chain the depth and early stop that `specblock shapes --apply` deployed, "
                   "if a chain].")
@click.option("--tree-width", type=int, default=4, show_default=True,
              help="Draft-model tree width (and path count for the paths shape).")
@click.option("--tree-budget", type=int, default=16, show_default=True, help="Draft-model tree: nodes kept.")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
@click.option("--device", default=None, help="torch device (default: cuda if available, else cpu).")
@click.option("--dtype", type=click.Choice(RUN_DTYPES), default=None, show_default="the model's own")
@click.option("--tag", default=None, help="Name the results bench_<tag> (default: bench for the toy family, "
              "bench_<model> for another model).")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for <name>.json, <name>.md and <name>.png.")
@click.option("--policy", "policy_files", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              multiple=True, help="A length policy file (repeatable): each chain/tree configuration runs "
                                  "once "
                                  "more with the policy choosing how much of each draft to verify.")
@click.option("--profile", "profile_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, show_default="the model's own",
              help="The cost profile the policies see (the one they were tuned on).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows and file paths.")
def command(drafters: str, verifiers: str, temperatures: str, categories: str | None, count: int, shapes: str,
            trained_shapes: bool, every_verifier: bool, hf: bool, model: ModelSpec, draft_dir: Path | None,
            drafters_dir: Path | None, prompts_dir: Path | None, prompt_file: Path | None,
            max_new_tokens: int, seed: int,
            draft_length: int, tree_width: int, tree_budget: int, threads: int | None, device: str | None,
            dtype: str | None, tag: str | None, out: Path, policy_files: tuple[Path, ...],
            profile_path: Path | None,
            as_json: bool) -> None:
    """Decode the prompt sets with vanilla and each drafter and verifier (Spec-Bench style, per category and
    temperature; not `specblock benchmark NAME`, which runs one of the project's benchmarks).

    Writes benchmarks/results/bench[_TAG].json (bench_<model>.json for a model other than the toy family)
    plus a markdown table and a PNG plot; progress on stderr.
    """
    from experiments.specbench.run import Settings, load_prompts  # torch and the engine: not for --help
    from real_engine.prompts import read_prompt_file

    names = csv_names(drafters, "--drafters", drafter_choices(), "; the transformers peer is --hf")
    for flag, value in (("--max-new-tokens", max_new_tokens), ("--draft-length", draft_length),
                        ("--tree-width", tree_width), ("--tree-budget", tree_budget), ("--threads", threads)):
        if value is not None and value < 1:
            raise InputError(f"{flag} is {value}: give at least 1")
    if tag is not None and (not tag or not tag.replace("-", "").replace("_", "").isalnum()):
        raise InputError(f"--tag {tag!r}: use letters, digits, - and _ only")
    device = resolve_device(device)
    model_dir = model.require().target
    draft_dir = model.draft_model if draft_dir is None else draft_dir
    drafters_dir = model.drafters if drafters_dir is None else drafters_dir
    chosen = None if categories is None else csv_names(categories, "--categories")
    if prompt_file is not None and (categories is not None or prompts_dir is not None):
        raise InputError("--prompt-file replaces the model's prompt sets: drop --categories and "
                         "--prompts-dir")
    prompts_dir = model_prompts(model, chosen) if prompts_dir is None else prompts_dir
    policies = _policies(policy_files)
    if policies:
        profile_path = model_profile(model, profile_path)
    elif profile_path is None:
        profile_path = model.profile  # recorded with the results (only policies read it)
    chain = None
    if draft_length is None and (draft_dir / "config.json").is_file():
        from real_engine.drafters.draft_model import CHAIN_OPTIONS

        deployed = deployed_shape("draft-model", draft_dir, dtype or model.dtype)
        if deployed.get("width", 1) == 1 and "depth" in deployed:  # a deployed chain
            chain = {k: v for k, v in deployed.items() if k in ("depth", "vocab", *CHAIN_OPTIONS)}
    settings = Settings(
        categories=(load_prompts(prompts_dir, chosen, count) if prompt_file is None
                    else read_prompt_file(prompt_file, count)),
        drafters=names, verifiers=csv_names(verifiers, "--verifiers", verifier_names()),
        temperatures=_temperatures(temperatures), shapes=csv_names(shapes, "--shapes", DRAFT_SHAPES),
        max_new_tokens=max_new_tokens, seed=seed, depth=draft_length or 4, width=tree_width,
        budget=tree_budget, chain=chain, policies=policies,
        profile=None if profile_path is None else str(profile_path), trained_shapes=trained_shapes,
        every_verifier=every_verifier)
    notes: list[str] = []
    has_draft = (draft_dir / "config.json").is_file()
    if any(registry[n].needs_draft_model for n in names if n in registry):
        _model(draft_dir, "--draft-model", f"draft-model --model {model_arg(model)}")
    if hf and not has_draft:
        notes.append(f"hf-assisted: no draft model in {draft_dir}, skipped")
    name = f"bench_{tag}" if tag else model_result("bench", model.name)
    results, config = _run(settings, model_dir, draft_dir if has_draft else None, drafters_dir,
                           hf and has_draft, threads, device, notes, model_arg(model), dtype or model.dtype)
    config.update(model=model.name, model_dir=repo_relative(model_dir),
                  draft_model=repo_relative(draft_dir) if has_draft else None,
                  drafters_dir=repo_relative(drafters_dir), prompts_dir=repo_relative(prompts_dir),
                  prompt_file=None if prompt_file is None else repo_relative(prompt_file),
                  profile=None if profile_path is None else repo_relative(profile_path), name=name)
    saved = save_result(name, results, config, seed, directory=out)
    md, png = write_report(results, out, name)
    if as_json:
        shown = {k: v for k, v in results.items() if k != "per_prompt"}
        click.echo(json.dumps({"results": str(saved), "markdown": str(md), "plot": str(png), **shown}))
        return
    click.echo(markdown(results, f"specblock bench ({name})"))
    click.echo(f"wrote {saved}, {md} and {png}", err=True)


def _run(settings: Any, model_dir: Path, draft_dir: Path | None, drafters_dir: Path, hf: bool,
         threads: int | None, device: str, notes: list[str], model: str = "", dtype: str = "float32"
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the models, plan and measure; return (results, config for provenance); ``model`` is how
    ``--model`` names the model, for the notes on drafters not trained for it."""
    import torch  # torch, rich and the engine: not for --help
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from experiments.specbench.hf_peer import HFPeer, transformers_available
    from experiments.specbench.run import (
        Engine,
        agreement,
        plan,
        rank_confusion,
        run_bench,
        text_acceptance,
    )
    from real_engine.model import load_model
    from real_engine.prompts import encode_row
    from real_engine.tokenizer import Tokenizer

    if threads is not None:
        torch.set_num_threads(threads)
    target = load_model(model_dir, dtype, device)
    draft = load_model(draft_dir, dtype, device) if draft_dir is not None else None
    tokenizer = Tokenizer.load(model_dir, target.args.vocab_size, target.args.eos_token_id)
    context = min(m.args.max_position_embeddings for m in (target, draft) if m is not None)
    deepest = max(settings.depth, int((settings.chain or {}).get("depth", 0)))
    limit = context - settings.max_new_tokens - deepest - 1
    if limit < 1:
        raise InputError(f"--max-new-tokens {settings.max_new_tokens} leaves no room for a prompt in the "
                         f"models' context of {context}: lower it")
    chat = tokenizer.chat_encoder()
    prompts = {c: [ids[-limit:] for ids in (encode_row(row, tokenizer.encode, chat) for row in rows) if ids]
               for c, rows in settings.categories.items()}
    empty = [c for c, p in prompts.items() if not p]
    if empty:
        raise InputError(f"the {empty[0]} prompts encode to no tokens: give prompts with text")
    available = [n for n, spec in registry.items()  # what each needs: trained weights, the draft model
                 if (not spec.trained or trained_available(drafters_dir / n))
                 and (not spec.needs_draft_model or draft is not None)]
    if hf and not transformers_available():
        notes.append("hf-assisted: transformers is not installed, skipped")
        hf = False
    chains = [n for n in trained_drafters() if n in available  # a deployed chain samples at T > 0
              and deployed_shape(n, drafters_dir / n, dtype).get("width") == 1]
    configs, plan_notes = plan(settings, available, hf, chains, model or None)
    notes.extend(plan_notes)
    peer = HFPeer(model_dir, draft_dir, device) if hf else None
    engine = Engine(target, draft, drafters_dir, settings, tokenizer.eos_id, draft_dir)
    agree = {c: agreement(target, draft, p) for c, p in prompts.items()} if draft is not None else {}
    confusion = {}
    if "specblock" in available and "specblock" in settings.drafters:  # its rank head's confusion
        from real_engine.drafters.specblock import load_specblock

        net = load_specblock(drafters_dir / "specblock", target)
        confusion = {c: rank_confusion(target, net, p, settings.seed) for c, p in prompts.items()}
    total = len(configs) * (1 + sum(map(len, prompts.values())))
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench", total=total)
        measured = run_bench(settings, engine, prompts, configs, peer,
                             lambda text: progress.update(task, advance=1, description=text))
        progress.update(task, description="acceptance on real text")
        on_text = text_acceptance(engine, configs, prompts, settings.seed)
    results = {"rows": measured["rows"], "agreement": agree, "text_acceptance": on_text,
               "rank_confusion": confusion, "notes": notes, "per_prompt": measured["per_prompt"]}
    config = {k: v for k, v in dataclasses.asdict(settings).items() if k != "categories"}
    config.update(deployed_shapes={n: deployed_shape(n, drafters_dir / n, dtype) for n in trained_drafters()
                                   if n in available and n in settings.drafters})
    config.update(categories={c: len(p) for c, p in prompts.items()}, prompt_token_limit=limit, device=device,
                  dtype=dtype,
                  threads=torch.get_num_threads(),
                  configs=[f"{c.label} T={c.temperature:g}" for c in configs],
                  hf_assisted=peer.config() if peer else None)
    return results, config
