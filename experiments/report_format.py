"""The pieces every results renderer writes with: the ``Renderer`` record, markdown tables, figures with
their intervals, command-line lists and flags, and where a results file was recorded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Record = dict[str, Any]
Lines = list[str]


@dataclass(frozen=True)
class Renderer:
    """How one family of results files reads: its section title, the command that writes a file of it
    (from the file's name and config) and the markdown lines of its key figures."""

    title: str
    command: Callable[[str, Record], str]
    body: Callable[[Record], Lines]


# --- formatting -------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Lines:
    """A markdown table; cells are written with ``str``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def interval(value: float, ci: Sequence[float], fmt: str = ".3f") -> str:
    """``value [low, high]``: a figure with its 95% interval."""
    return f"{value:{fmt}} [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


def pairs(mapping: dict[str, Any]) -> str:
    """``key=value`` pairs, as shapes and settings are written on the command line's reports."""
    return " ".join(f"{key}={value}" for key, value in mapping.items())


def listed(values: Sequence[Any]) -> str:
    """A comma-separated command-line list (``0.0`` written ``0``)."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def flag(name: str, value: Any, default: Any = None) -> str:
    """`` --name value``, or nothing where the value is the option's default."""
    return "" if value == default else f" {name} {value}"


def recorded(record: Record) -> str:
    """Commit, date and machine a results file records."""
    commit = record.get("git_commit")
    created = str(record.get("created") or "")[:10]
    machine = record.get("machine") or {}
    where = machine.get("gpu") or machine.get("cpu")
    if machine.get("cpu_count"):
        where = f"{where}, {machine['cpu_count']} CPUs"
    torch = (record.get("versions") or {}).get("torch")
    parts = [f"commit `{commit[:12]}`" if commit else "commit not recorded",
             created or "date not recorded", where or "machine not recorded"]
    return ", ".join(parts + ([f"torch {torch}"] if torch else []))


def benchmark(module: str) -> str:
    """``specblock benchmark NAME`` for the script ``benchmarks/<module>.py``."""
    return f"specblock benchmark {module}"


def run_seconds(run: Record) -> str:
    """A pipeline run's wall time in seconds, marked where the run was resumed (then its steps' sum, each
    step timed in the process that ran it)."""
    return f"{run['seconds']:.0f}" + (" (resumed)" if run.get("resumed") else "")
