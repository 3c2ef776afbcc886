"""The verification LP bound beside every verifier: one row per instance, in expected accepted draft tokens.

Used by ``specblock lp``, the multi-draft benchmark (``benchmarks/multidraft.py``) and the pipeline's report
(``experiments.pipeline_report``). The verifiers' exact evaluation runs the torch verifiers
(``real_engine.exact``), so this module sits in ``experiments``, above both the simulator's LP and the
engine.
"""

from __future__ import annotations

from core.errors import InputError
from real_engine.exact import draft_law, expected_accepted
from simulator.instances import ARInstance
from simulator.lp import DraftLaw, expected_bv, expected_token, merged_law, solve_lp

SCHEMES: dict[str, tuple[str, str]] = {
    "rrs": ("rrs", "iid"), "rrs_wor": ("rrs", "without_replacement"), "seqbv": ("seqbv", "iid"),
    "gbv": ("gbv", "iid"), "gds": ("gds", "greedy_draft"),
}
"""Each multi-draft column: its verifier, and the child rule of its K paths (``real_engine.exact``)."""
BOUNDS = {"lp": "iid", "lp_wor": "without_replacement", "lp_gds": "greedy_draft"}
"""The LP bound of each draft law: K i.i.d. paths (``lp``, the bound of rrs, seqbv and gbv), RRS's drafts
without replacement, and GDS's greedy draft; only ``lp`` bounds every column drafted i.i.d."""
MULTI_DRAFT = ("rrs", "seqbv", "gbv", "gds")
"""The verifiers ``specblock lp`` scores on all K draft paths (token-level and block verification use the
first); gds draws its own drafts (the top K-1 tokens and one sampled path), which ``lp`` does not bound."""
COLUMNS = ("lp", "token", "bv", *MULTI_DRAFT)
STUDY = ("lp", "lp_wor", "lp_gds", "token", "bv", "rrs", "rrs_wor", "seqbv", "gbv", "gds")
"""Every column, as the multi-draft study reports them."""


def law_of(inst: ARInstance, drafts: int, child_rule: str) -> DraftLaw | None:
    """The law of ``drafts`` paths drafted under ``child_rule`` as the LP reads it (None: i.i.d., the
    LP's own default)."""
    if child_rule == "iid":
        return None
    drafted = draft_law(inst, drafts, child_rule)
    return merged_law(((prob, [inst.code(path) for path in paths]) for prob, paths in drafted), drafts)


def evaluate_verifiers(inst: ARInstance, drafts: int, columns: tuple[str, ...] = COLUMNS) -> dict[str, float]:
    """The LP bounds and the verifiers' exact expected accepted lengths named by ``columns`` on one instance,
    and the LPs' total solve ``seconds``; ``simulator.lp.LPSolveError`` when an LP is not solved."""
    unknown = [c for c in columns if c not in (*BOUNDS, "token", "bv", *SCHEMES)]
    if unknown:
        raise InputError(f"unknown LP table column {unknown[0]!r}: use some of {', '.join(STUDY)}")
    row, seconds = {}, 0.0
    for name in columns:
        if name in BOUNDS:
            bound = solve_lp(inst, drafts, law=law_of(inst, drafts, BOUNDS[name]))
            row[name], seconds = bound.value, seconds + bound.seconds
        elif name in SCHEMES:
            verifier, child_rule = SCHEMES[name]
            row[name] = expected_accepted(verifier, inst, drafts=drafts, child_rule=child_rule)
        else:
            row[name] = expected_token(inst) if name == "token" else expected_bv(inst)
    row["seconds"] = seconds
    return row
