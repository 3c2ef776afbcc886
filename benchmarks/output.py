"""How every benchmark prints: its table on stdout and ``wrote ...`` on stderr; under ``--json`` one JSON
object on stdout and the table on stderr, as progress."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def table(as_json: bool) -> Callable[[str], None]:
    """Print one line of the benchmark's table: on stdout, or on stderr under ``--json``."""
    return lambda line: click.echo(line, err=as_json)


def finish(as_json: bool, results: Any, *written: Path) -> None:
    """Report the files written (the results JSON first); under ``--json`` with ``results`` as one object."""
    if as_json:
        sys.stdout.write(json.dumps({"results": str(written[0]), "files": [str(p) for p in written],
                                     "rows": results}) + "\n")
    else:
        click.echo(f"wrote {', '.join(map(str, written))}", err=True)
