"""The plan of a live adaptation stream (``experiments.adapt_live``): its size, query length and how often
the engine is re-timed; the default plan and the quick one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamPlan:
    """Stream size, query length and simulator repetitions."""

    first: int  # queries of the first domain only
    mixed: int  # queries of the mixed phase (domains in turn)
    max_new_tokens: int
    sim_seeds: int
    retime_repeats: int  # rounds of ``retime`` before and after each policy's stream (0: the profile)
    retime_every: int = 0  # one round of decoding re-timed between every this many queries (0: none)


DEFAULT_PLAN = StreamPlan(first=16, mixed=192, max_new_tokens=48, sim_seeds=32, retime_repeats=3,
                          retime_every=16)
QUICK_PLAN = StreamPlan(first=4, mixed=8, max_new_tokens=24, sim_seeds=4, retime_repeats=1)
