"""docs/results.md, generated from the results files: one section per family, never edited by hand.

Every file under benchmarks/results/ was written by ``experiments.provenance.save_result`` and records
its config, seed, package versions, machine and commit. A renderer per family (the registry
``renderers()``) names the command that writes the file and turns its key figures into a compact table;
a file no renderer reads gets a one-line entry, so a new results file never breaks the page. The page
leads with the real models: one part per model a file's config names (``config.model``), the models
other than the shipped toy family first, each opening with its headline against the targets
(``experiments.results.headline``) and its main job against its goals (``experiments.results.loop``),
then the toy family's part, which also holds the files of no model (the tests' reference). The output
depends on the files only (sorted, no clock), so ``specblock results --check`` can compare it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, read_json
from core.models import TOY, registry
from core.paths import REPO, repo_relative
from experiments.report_format import Lines, Record, Renderer, recorded
from experiments.results.headline import headline
from experiments.results.loop import loop_goals
from experiments.results.renderers import renderers

GENERATOR = "specblock results"
PAGE = REPO / "docs" / "results.md"  # the page this module writes


# --- the page ---------------------------------------------------------------------------------------


def family(name: str) -> str | None:
    """The registry key that reads results file ``name``: the name itself or its longest prefix before
    an underscore (``bench_shipped`` -> ``bench``); None when no renderer knows it."""
    matches = [key for key in renderers() if name == key or name.startswith(f"{key}_")]
    return max(matches, key=len) if matches else None


def model_of(record: Any) -> str:
    """The model a results file is about: its config's ``model``, else the toy family (files written
    before configs named their model, and benchmarks of no model)."""
    config = record.get("config") if isinstance(record, dict) else None
    model = config.get("model") if isinstance(config, dict) else None
    return model if isinstance(model, str) else TOY.name


def part_title(model: str) -> str:
    """The heading of a model's part of the page."""
    spec = registry.get(model)
    if model == TOY.name:
        return f"`{model}`: {spec.summary}, and the benchmarks of no model"
    return f"`{model}`: {spec.summary}" if spec is not None else f"`{model}`"


def generic(name: str, record: Any) -> str:
    """The one-line entry of a file no renderer reads: its name, command and commit."""
    record = record if isinstance(record, dict) else {}
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    command = config.get("command")
    commit = record.get("git_commit")
    return (f"- `{name}.json`: command {f'`{command}`' if isinstance(command, str) else 'not recorded'}, "
            f"commit {f'`{commit[:12]}`' if isinstance(commit, str) else 'not recorded'}")


def links(name: str, folder: Path, link_base: str) -> str:
    """Links to the detailed ``.md`` and ``.png`` written beside a results file, where they exist."""
    found = [f"[{name}{ext}]({link_base}/{name}{ext})" for ext in (".md", ".png")
             if (folder / f"{name}{ext}").is_file()]
    return f"Details: {', '.join(found)}." if found else ""


def section(name: str, record: Record, renderer: Renderer, folder: Path, link_base: str) -> Lines | None:
    """A file's subsection; None when the file is not laid out as its renderer reads it."""
    try:
        command, body = renderer.command(name, record["config"]), renderer.body(record)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):  # another layout than it reads
        return None
    head = [f"#### {name}", "", f"Command: `{command}`. Recorded: {recorded(record)}."]
    detail = links(name, folder, link_base)
    return [*head, *([detail] if detail else []), "", *body, ""]


def render(folder: Path, link_base: str) -> str:
    """The markdown of docs/results.md for the results files in ``folder``; links to the files beside
    them start with ``link_base`` (the folder as seen from the page)."""
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not paths:
        raise InputError(f"{folder}: no results files (*.json) there: give --results the folder the "
                         "benchmarks write, benchmarks/results")
    parts: dict[str, dict[str, Lines]] = {}
    files: dict[str, dict[str, Record]] = {}  # model -> results file name -> its record, for the headline
    others: Lines = []
    for path in paths:
        name = path.stem
        record = read_json(path, MAX_RECORD_BYTES, "results file", "regenerate it with the command that "
                           "writes it, or remove it")
        key = family(name)
        lines = None
        if isinstance(record, dict):
            files.setdefault(model_of(record), {})[name] = record
        if key is not None and isinstance(record, dict) and "results" in record:
            lines = section(name, record, renderers()[key], folder, link_base)
        if lines is None:
            others.append(generic(name, record))
        else:
            groups = parts.setdefault(model_of(record), {k: [] for k in renderers()})
            groups[key] += lines
    page = ["# Results", "",
            f"Generated by `{GENERATOR}` from the files in `{repo_relative(folder)}/`: do not edit this page "
            f"by hand. `{GENERATOR} --check` (run by `make test`) fails when it differs from what the files "
            "give. Each section names the command that wrote its file and the commit, date and machine the "
            "file records; the files hold every figure unrounded, with their config and seed.", ""]
    for model in sorted(parts, key=lambda m: (m == TOY.name, m)):  # the real models lead
        page += [f"## {part_title(model)}", ""]
        if model != TOY.name:
            page += headline(files[model].get(f"bench_{model}"), files[model].get("peers"))
            page += loop_goals(model, files[model])
        for key, lines in parts[model].items():
            if lines:
                page += [f"### {renderers()[key].title}", "", *lines]
    if others:
        page += ["## Other files", "", "Files no renderer in `experiments/results/doc.py` reads:", "",
                 *others, ""]
    return "\n".join(page).rstrip("\n") + "\n"
