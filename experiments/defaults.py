"""What a simulation uses when not told: the cost profile, the traces that go with it, and the drafter.

One home for the defaults that ``specblock simulate`` and the tuning studies (``experiments.tuning.tune``)
resolve alike. Light on purpose (no numpy or pandas at import): the ``simulate`` command imports it
before it parses its options.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import InputError
from core.models import TOY, ModelSpec
from core.paths import PAPER_PROFILE
from experiments.cli import model_profile

TUNE_SEED, HELD_OUT_SEED = 0, 100
"""The policy studies' seeds: tuning work, and the held-out work every policy is compared on."""

if TYPE_CHECKING:
    import pandas as pd

    from core.cost_profile import CostProfile


def default_profile(model: ModelSpec = TOY) -> Path:
    """The profile used when none is given: ``model``'s own (measured here); for the shipped toy family
    the paper's when it has none; for another model InputError naming `specblock profile --model`."""
    if model == TOY:
        return TOY.profile if TOY.profile is not None and TOY.profile.exists() else PAPER_PROFILE
    return model_profile(model)


def shipped_traces(profile: Path, measured_here: bool = False, model: ModelSpec = TOY) -> Path | None:
    """``model``'s traces when they go with ``profile``, else None.

    They were recorded with the model: they go with its own profile and with a profile measured on this
    machine (``measured_here``: it times that model), never with one the user picked.
    """
    traces = model.traces
    mine = measured_here or (model.profile is not None and profile == model.profile)
    return traces if mine and traces is not None and traces.exists() else None


def default_drafter(profile: CostProfile, traces: pd.DataFrame | None) -> str:
    """The drafter the traces were recorded with, else ``specblock`` when profiled, else the first profiled
    drafter by name; InputError when the traces hold several drafters or one the profile does not time."""
    kinds = sorted(profile.drafters)
    if traces is not None:
        used = sorted(set(traces["drafter"]))
        if len(used) != 1 or used[0] not in kinds:
            raise InputError(f"the traces were recorded with drafter(s) {', '.join(used)} and the profile "
                             f"times {', '.join(kinds)}: pass traces of one profiled drafter")
        return used[0]
    return "specblock" if "specblock" in kinds else kinds[0]
