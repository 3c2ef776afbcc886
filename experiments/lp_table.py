"""The verification LP bound beside every verifier: one row per instance, in expected accepted draft tokens.

Used by ``specblock lp``, the multi-draft benchmark (``benchmarks/multidraft.py``) and the pipeline's report
(``experiments.pipeline.report``). The verifiers' exact evaluation runs the torch verifiers
(``real_engine.exact``), so this module sits in ``experiments``, above both the simulator's LP and the
engine.
"""

from __future__ import annotations

from collections.abc import Callable

from core.errors import InputError
from core.verifiers import registry
from real_engine.exact import draft_law, expected_accepted
from simulator.instances import ARInstance
from simulator.lp import DraftLaw, expected_block, expected_token, merged_law, solve_lp

BOUNDS = {"lp": "iid", "lp_wor": "without_replacement", "lp_gds": "greedy_draft"}
"""The LP bound of each draft law: K i.i.d. paths (``lp``, the bound of every verifier of i.i.d. paths),
RRS's drafts without replacement, and GDS's greedy draft; only ``lp`` bounds every column drafted i.i.d."""
CLOSED_FORMS: dict[str, Callable[[ARInstance], float]] = {"token": expected_token, "block": expected_block}
"""The columns of single-path verifiers with a closed form (``simulator.lp``): the same figure as their exact
enumeration, faster."""
EXTRA = {"rrs_wor": ("rrs", "without_replacement")}
"""Columns beyond one per verifier: a verifier and the child rule of its K paths (``real_engine.exact``)."""
STUDY = ("lp", "lp_wor", "lp_gds", "token", "block", "rrs", "rrs_wor", "seqbv", "gbv", "gds")
"""Every column, as the multi-draft study reports them."""


def schemes() -> dict[str, tuple[str, str]]:
    """Each verifier column: its verifier and the child rule of its K paths, one per registered verifier
    with an ``lp_column`` (``core.verifiers``; single-path verifiers verify the first path), then
    ``EXTRA``."""
    return {**{spec.lp_column: (name, spec.draws) for name, spec in registry.items() if spec.lp_column},
            **EXTRA}


def columns() -> tuple[str, ...]:
    """What ``specblock lp`` shows: the bound of K i.i.d. paths, then every registered verifier's column
    (gds draws its own drafts, the top K-1 tokens and one sampled path, which ``lp`` does not bound)."""
    return ("lp", *(spec.lp_column for spec in registry.values() if spec.lp_column))


def law_of(inst: ARInstance, drafts: int, child_rule: str) -> DraftLaw | None:
    """The law of ``drafts`` paths drafted under ``child_rule`` as the LP reads it (None: i.i.d., the
    LP's own default)."""
    if child_rule == "iid":
        return None
    drafted = draft_law(inst, drafts, child_rule)
    return merged_law(((prob, [inst.code(path) for path in paths]) for prob, paths in drafted), drafts)


def evaluate_verifiers(inst: ARInstance, drafts: int,
                       names: tuple[str, ...] | None = None) -> dict[str, float]:
    """The LP bounds and the verifiers' exact expected accepted lengths named by ``names`` (None:
    ``columns()``) on one instance, and the LPs' total solve ``seconds``; ``simulator.lp.LPSolveError``
    when an LP is not solved."""
    names = columns() if names is None else names
    scored = schemes()
    unknown = [c for c in names if c not in (*BOUNDS, *scored)]
    if unknown:
        raise InputError(f"unknown LP table column {unknown[0]!r}: use some of "
                         f"{', '.join((*BOUNDS, *scored))}")
    row, seconds = {}, 0.0
    for name in names:
        if name in BOUNDS:
            bound = solve_lp(inst, drafts, law=law_of(inst, drafts, BOUNDS[name]))
            row[name], seconds = bound.value, seconds + bound.seconds
        elif name in CLOSED_FORMS:
            row[name] = CLOSED_FORMS[name](inst)
        else:
            verifier, child_rule = scored[name]
            row[name] = expected_accepted(verifier, inst, drafts=drafts, child_rule=child_rule)
    row["seconds"] = seconds
    return row
