"""The verification LP bound beside every verifier: one row per instance, in expected accepted draft tokens.

Used by ``specblock lp`` and by the pipeline's report (``experiments.pipeline_report``). The verifiers'
exact evaluation runs the torch verifiers (``real_engine.exact``), so this module sits in
``experiments``, above both the simulator's LP and the engine.
"""

from __future__ import annotations

from real_engine.exact import expected_accepted
from simulator.instances import ARInstance
from simulator.lp import expected_bv, expected_token, solve_lp

MULTI_DRAFT = ("rrs", "seqbv", "gbv")
"""The verifiers that use all K draft paths (token-level and block verification use the first)."""
COLUMNS = ("lp", "token", "bv", *MULTI_DRAFT)


def evaluate_verifiers(inst: ARInstance, drafts: int) -> dict[str, float]:
    """The LP bound and every verifier's exact expected accepted length on one instance, and the LP's
    solve ``seconds``; ``simulator.lp.LPSolveError`` when the LP is not solved."""
    bound = solve_lp(inst, drafts)
    row = {"lp": bound.value, "token": expected_token(inst), "bv": expected_bv(inst)}
    row.update({name: expected_accepted(name, inst, drafts=drafts) for name in MULTI_DRAFT})
    row["seconds"] = bound.seconds
    return row
