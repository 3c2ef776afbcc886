"""`specblock study length|adaptation|serving`: one of the policy studies (``experiments.tuning.studies``).

Tunes the policies with Ray Tune on tuning seeds, evaluates every policy on held-out seeds with common
random numbers, and writes ``<out>/study_<name>.json``, ``.md`` and ``.png``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from core.names import ROLE_ALIASES
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER


@click.command("study")
@click.argument("name", metavar="STUDY")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for study_<STUDY>.json, .md and .png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results instead of the "
                                                      "tables.")
def command(name: str, out: Path, as_json: bool) -> None:
    """Run a policy study on local Ray: STUDY is length (speculation-length policies per cost profile,
    drafter and traffic), adaptation (adaptation policies on shifted streams) or serving (serving policies
    under load, across arrival rates); adapt and serve name them too."""
    from experiments.tuning.studies import run_study  # Ray and the simulator: not for --help

    name = ROLE_ALIASES.get(name, name)
    result = run_study(name, out)
    files = {suffix: str(out / f"study_{name}.{suffix}") for suffix in ("json", "md", "png")}
    if as_json:
        sys.stdout.write(json.dumps({"results": files["json"], "markdown": files["md"], "plot": files["png"],
                                     **result}) + "\n")
        return
    click.echo((out / f"study_{name}.md").read_text())
    click.echo(f"{result['seconds']:.0f} s; wrote {', '.join(files.values())}", err=True)
