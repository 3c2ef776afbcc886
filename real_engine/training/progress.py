"""The progress bar every training run shows on stderr."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def progress_bar(enabled: bool) -> Progress:
    """A rich progress bar on stderr (a no-op when not ``enabled``)."""
    columns = TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
    return Progress(*columns, console=Console(stderr=True), disable=not enabled)
