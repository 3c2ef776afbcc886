"""What a simulation uses when not told: the cost profile, the traces that go with it, and the drafter.

One home for the defaults that ``specblock simulate`` and the tuning studies (``experiments.tune``)
resolve alike. Light on purpose (no numpy or pandas at import): the ``simulate`` command imports it
before it parses its options.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import InputError
from core.paths import CPU_PROFILE, PAPER_PROFILE, TRACES

TUNE_SEED, HELD_OUT_SEED = 0, 100
"""The policy studies' seeds: tuning work, and the held-out work every policy is compared on."""

if TYPE_CHECKING:
    import pandas as pd

    from core.cost_profile import CostProfile


def default_profile() -> Path:
    """The profile used when none is given: the shipped one (measured here), else the paper's."""
    return CPU_PROFILE if CPU_PROFILE.exists() else PAPER_PROFILE


def shipped_traces(profile: Path, measured_here: bool = False) -> Path | None:
    """The shipped traces when they go with ``profile``, else None.

    They were recorded with the shipped models: they go with the shipped profile and with a profile
    measured on this machine (``measured_here``: it times those models), never with one the user picked.
    """
    return TRACES if (measured_here or profile == CPU_PROFILE) and TRACES.exists() else None


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
