"""The plan of a live adaptation stream (``experiments.adapt.live``): its size, where its domain mix
first shifts, the range of each query's length and how often the engine is re-timed; the paper's
2,000-query plan, the quick one (also the full pipeline's) and the smoke pipeline's.

The stream's phases (``experiments.adapt.live.phase_counts``): the first serves ``shift`` queries and the
later ones share the rest equally. Over the shipped family's four domains there are two (the mix shifts
once, after ``shift`` queries); over another model's domains (the real model's ``chat`` and ``code``) one
per domain in turn and then the first again (chat, then code, then chat: with the shift halfway, a half,
a quarter and a quarter of the stream)."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InputError
from experiments.cli import model_result


@dataclass(frozen=True)
class StreamPlan:
    """Stream size, the query where the mix first shifts, query lengths and simulator repetitions."""

    queries: int  # queries in the stream (over the shipped family's domains a multiple of 4: equal shares)
    shift: int  # queries served before the domain mix first changes (the first phase's length)
    min_new_tokens: int  # each query generates a length drawn from [min_new_tokens, max_new_tokens]
    max_new_tokens: int
    sim_seeds: int
    retime_repeats: int  # rounds of ``retime`` before and after each policy's stream (0: the profile)
    retime_every: int = 0  # one round of decoding re-timed between every this many queries (0: none)

    def __post_init__(self) -> None:
        if not 0 < self.shift < self.queries:
            raise InputError(f"StreamPlan: {self.queries} queries shifting after {self.shift}: give a shift "
                             "between 0 and the query count")
        if not 1 <= self.min_new_tokens <= self.max_new_tokens:
            raise InputError(f"StreamPlan: new tokens {self.min_new_tokens}..{self.max_new_tokens}: give "
                             "1 <= min_new_tokens <= max_new_tokens")


DEFAULT_PLAN = StreamPlan(queries=2000, shift=1000, min_new_tokens=48, max_new_tokens=64, sim_seeds=32,
                          retime_repeats=3, retime_every=100)
"""The paper's stream: 2,000 queries of 48 to 64 tokens, the mix shifting halfway."""
QUICK_PLAN = StreamPlan(queries=16, shift=8, min_new_tokens=48, max_new_tokens=64, sim_seeds=4,
                        retime_repeats=1, retime_every=8)
"""``specblock adapt-live --quick``: the same stream shape, 16 queries (within 5 minutes on 2 CPU cores)."""
QUICK_SIZES = (QUICK_PLAN.queries, 200)
"""Stream sizes ``--quick`` has written: this plan's and, in results files written before it fitted in
5 minutes, 200 queries."""
SMOKE_PLAN = StreamPlan(queries=8, shift=4, min_new_tokens=8, max_new_tokens=12, sim_seeds=2,
                        retime_repeats=0)
"""The smoke pipeline's adaptation step (``specblock pipeline --smoke``, the tests): over the shipped
family's domains two queries each, the shifted domains after the shift; no re-timing (the shipped
profile's samples)."""


def result_name(model: str, quick: bool, overlap: bool) -> str:
    """The results file a run writes when not given a name: ``adapt_live``, ``_quick`` with the quick
    plan, ``_overlap`` with updates trained beside decoding; a model other than the shipped family adds
    its name after ``adapt_live`` (``adapt_live_smollm2-135m_quick``), so its runs sit beside the toy's."""
    return f"{model_result('adapt_live', model)}{'_quick' if quick else ''}{'_overlap' if overlap else ''}"
