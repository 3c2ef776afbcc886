"""`specblock results`: write docs/results.md from the results files, or check that it is up to date.

The page is generated (``experiments.results.doc``), never edited by hand: ``--check`` exits 1 when the
committed page differs from what the files give, which is how CI catches a hand edit or a results file
committed without its page.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from core.files import MAX_RECORD_BYTES, read_text, write_text
from core.paths import RESULTS
from experiments.results.doc import PAGE, render


@click.command("results")
@click.option("--results", "folder", type=click.Path(path_type=Path), default=RESULTS,
              show_default="benchmarks/results", help="Folder of results files (*.json).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=PAGE,
              show_default="docs/results.md", help="The page to write (or check).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if --out differs from what it would be.")
def command(folder: Path, out: Path, check: bool) -> None:
    """Generate the results page (docs/results.md) from benchmarks/results/*.json."""
    link_base = Path(os.path.relpath(folder.resolve(), out.resolve().parent)).as_posix()
    page = render(folder, link_base)
    if check:
        current = read_text(out, MAX_RECORD_BYTES, "results page", "regenerate it with `specblock results`") \
            if out.exists() else None
        if current != page:
            state = "does not exist" if current is None else "differs from what the results files give"
            raise click.ClickException(f"{out} {state}: run `specblock results` to regenerate it (never edit "
                                       "it by hand)")
        return
    from experiments.folders import check_writable  # it loads numpy: not for --help

    check_writable(out.parent, "--out's folder")
    write_text(out, page)
    click.echo(f"wrote {out}")
