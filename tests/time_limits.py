"""Time limits that scale with the machine, for subprocess and wait timeouts in the tests.

A limit is written as the seconds it allows on the reference machine (this project's CI kind: 2 vCPUs,
one of them busy with another job); ``limit(seconds)`` scales it by ``slowness()``, how much slower this
machine runs the speed workload when the test run starts (``tests/conftest.py`` measures it at
collection and scales the pytest-timeout backstop by it too). Machines of one kind differ 2-4x and drift
15-30% within a run, so each limit is still several times what its test takes on the reference machine.
"""

from __future__ import annotations

import functools
import statistics
import time

SPEED_SECONDS = 0.1
"""The speed workload's median wall seconds on the reference machine: a vanilla greedy decode of 48
tokens after a 64-token prompt by the shipped toy target on one torch thread."""


@functools.cache
def slowness() -> float:
    """How many times slower than the reference machine this one runs now (at least 1): the median wall
    time of five runs of the speed workload (after one warm-up) over ``SPEED_SECONDS``. Wall time, so a
    machine shared with other jobs counts as slower. Measured once per test run."""
    import torch

    from core.models import TOY
    from real_engine.decode import generate
    from real_engine.model import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_model(TOY.target)
        prompt = list(range(1, 65))
        seconds = []
        for run in range(6):
            start = time.perf_counter()
            generate(model, prompt, max_new_tokens=48)
            if run:
                seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return max(1.0, statistics.median(seconds) / SPEED_SECONDS)


def limit(seconds: float) -> float:
    """A time limit of ``seconds`` on the reference machine, for this machine as it runs now."""
    return seconds * slowness()
