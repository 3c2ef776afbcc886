"""How each family of results files reads on docs/results.md: every family's ``Renderer``, collected.

Each module that writes a family of results files exports its renderers as ``RENDERERS`` (family name ->
``experiments.report_format.Renderer``: the command that writes a file of it, from the file's name and
config, and its key figures as a compact markdown table), next to the code that writes them: every
benchmark module (``core.names.BENCHMARKS``) and each job's report. ``renderers()`` here keys them by the
file name or its prefix before an underscore, in the order the page shows them;
``experiments.results.doc`` lays the page out.
"""

from __future__ import annotations

import functools
import importlib

from core.names import BENCHMARKS
from experiments.report_format import Renderer

FIRST = ("benchmarks.model_speed", "benchmarks.peers", "benchmarks.gguf_parity", "benchmarks.pipeline_runs",
         "experiments.pipeline.report", "experiments.specbench.report", "experiments.adapt.report",
         "experiments.tuning.studies", "benchmarks.adapt_breakeven")
"""The modules whose sections open the page: the real model, then the main job and its studies."""
LAST = ("experiments.serving.report",)


def providers() -> tuple[str, ...]:
    """Every module exporting renderers, in page order: ``FIRST``, every other benchmark, ``LAST``."""
    rest = tuple(f"benchmarks.{name}" for name in BENCHMARKS if f"benchmarks.{name}" not in FIRST)
    return (*FIRST, *rest, *LAST)


@functools.cache
def renderers() -> dict[str, Renderer]:
    """Family name -> its renderer, from every provider, once (importing them: torch with the benchmarks,
    so only when a page is rendered, never for --help)."""
    out: dict[str, Renderer] = {}
    for module in providers():
        out.update(importlib.import_module(module).RENDERERS)
    return out
