"""`specblock benchmark NAME`: one benchmark of ``benchmarks/`` (`specblock benchmark NAME --help` shows its
options); each writes its result JSON, with provenance, under ``--out`` (default ``benchmarks/results``)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import ClassVar

import click

from core.names import BENCHMARKS
from experiments.cli import LazyGroup

SHORT = 55  # characters of each benchmark's description in the listing


class BenchmarkGroup(LazyGroup):
    """The benchmarks, each imported only when it runs (or its help is shown)."""

    commands_by_name: ClassVar[dict[str, str]] = {name: name for name in BENCHMARKS}  # named as modules
    package = "benchmarks"

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List each benchmark with the start of its module's docstring, read without importing the
        module (the benchmarks import torch and the simulator at their top)."""
        rows = []
        for name in self.list_commands(ctx):
            origin = importlib.util.find_spec(self._module(name)).origin
            doc = ast.get_docstring(ast.parse(Path(str(origin)).read_text())) or ""
            first = " ".join(doc.split("\n\n")[0].split())
            rows.append((name, first if len(first) <= SHORT else first[:SHORT - 3].rsplit(" ", 1)[0] + "..."))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group("benchmark", cls=BenchmarkGroup)
def command() -> None:
    """Run one of the project's benchmarks (a module of benchmarks/: engine, kernels, LP, simulator,
    verifiers, checkouts, pipeline, mutation testing); `specblock bench` is the decoding benchmark."""
