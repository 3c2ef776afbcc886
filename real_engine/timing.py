"""Timing the engine: a clock that waits for the device (or counts this process's CPU seconds), and
``Bench``, which runs timed jobs round-robin so drift on a shared machine touches every job alike.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from core.errors import InputError
from core.names import CLOCKS
from real_engine.drafters.base import clock

Timer = Callable[[], float]


CPU_CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "thread": time.thread_time}
"""The CPU clocks of ``core.names.CLOCKS``: this process's CPU seconds, the calling thread's."""


def make_timer(device: torch.device, kind: str = "wall") -> Timer:
    """Seconds now: ``wall`` time once the device is idle, ``cpu`` seconds of this process, or ``thread``
    CPU seconds of the calling thread.

    The CPU clock counts the work the process did, not the time other jobs held the cores, so it
    measures a CPU engine reproducibly on a shared machine; with one torch thread it equals wall time
    on an idle machine.
    """
    if kind not in CLOCKS:
        raise InputError(f"unknown clock {kind!r}: use one of {', '.join(CLOCKS)}")
    if kind in ("cpu", "thread"):
        if device.type != "cpu":
            raise InputError(f"the {kind} clock cannot time a {device.type} device: use the wall clock")
        return CPU_CLOCKS[kind]
    return lambda: clock(device)


class Bench:
    """Timed jobs, run round-robin: every round calls each job once, so each configuration's repeats
    spread over the whole measurement (a burst of load on a shared machine touches every grid point
    alike), and each call finds the caches as the other jobs left them, as in the decode loop."""

    def __init__(self, timer: Timer, repeats: int, warmup: int) -> None:
        self.timer, self.repeats, self.warmup = timer, repeats, warmup
        self.jobs: list[tuple[Callable[[], Any], bool, int, list[float], Callable[[], Any] | None]] = []

    def add(self, fn: Callable[[], Any], inference: bool = True, per: int = 1,
            before: Callable[[], Any] | None = None) -> list[float]:
        """Register ``fn`` (run under ``torch.inference_mode(inference)``, right after ``before``, which is
        not timed); its seconds, divided by ``per`` (the steps one call runs), fill the list returned here
        when ``run`` is called."""
        seconds: list[float] = []
        self.jobs.append((fn, inference, per, seconds, before))
        return seconds

    def run(self, between: Callable[[int], Any] | None = None) -> None:
        """``warmup`` untimed rounds, then ``repeats`` timed ones, each timed round ``k`` followed by
        ``between(k)`` (other work measured alongside, so that drift touches both alike)."""
        for round_ in range(self.warmup + self.repeats):
            for fn, inference, per, seconds, before in self.jobs:
                with torch.inference_mode(inference):
                    if before is not None:
                        before()
                    start = self.timer()
                    fn()
                    if round_ >= self.warmup:
                        seconds.append((self.timer() - start) / per)
            if between is not None and round_ >= self.warmup:
                between(round_ - self.warmup)


def random_tokens(n: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` random token ids in [1, vocab): the synthetic inputs timed samples run on."""
    return torch.randint(1, vocab, (n,), generator=generator)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then keep every object alive out of the garbage collector's scans while inside, as servers
    do after start-up (vLLM among them): a collection then costs what the work inside allocated, not the
    whole heap, which would tax allocation-heavy speculative iterations more than plain ones. Nested,
    only the outermost unfreezes."""
    outermost = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if outermost:
            gc.unfreeze()
