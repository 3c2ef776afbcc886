"""`specblock lp`: the verification LP bound against the exact expected accepted length of each verifier.

For each instance (random Dirichlet laws, or the same step laws at every position) it solves the LP
of ``simulator.lp`` for K i.i.d. draft paths and evaluates the verifiers exactly: token-level
and block verification on the first path (closed forms), RRS (on the paths' token trie), SeqBV and GBV
on all K paths (exact enumeration of the torch verifiers), and GDS on its own draft (the top K-1 tokens
and one sampled path: not i.i.d., so the LP does not bound it). Every figure is an expected number of
accepted draft tokens.
"""

from __future__ import annotations

import json
import sys

import click

from core.errors import InputError
from experiments.cli import SEED

MAX_ENUMERATED = 4096  # draft tuples V^(L*K) the exact evaluation walks through, one by one, per instance
DEFAULT_INSTANCES = 5
MAX_INSTANCES = 10_000  # instances are built up front: more would hold memory for hours of solving


def _parse_vector(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise InputError(f"could not read {flag} {text!r}: give comma-separated probabilities such as "
                         "0.3,0.7") from None


def _check_flags(vocab: int | None, length: int, drafts: int, count: int | None,
                 step: tuple[list[float], list[float]] | None) -> tuple[int, int]:
    """Refuse bad or oversized input before anything is built; return the vocabulary and instance count."""
    from simulator.instances import check_shape  # the simulator, cvxpy: not for --help
    from simulator.lp import check_drafts, check_size

    if step is not None:
        if vocab is not None and vocab != len(step[0]):
            raise InputError(f"--vocab {vocab} but --step-p has {len(step[0])} entries: make them agree")
        if count not in (None, 1):
            raise InputError("step instances are all the same: drop --instances or set it to 1")
        vocab, count = len(step[0]), 1
    elif vocab is None:
        raise InputError("missing --vocab: give the vocabulary size (or --step-p and --step-q)")
    count = DEFAULT_INSTANCES if count is None else count
    if count < 1:
        raise InputError(f"--instances {count} is too few: evaluate at least 1 instance")
    if count > MAX_INSTANCES:
        raise InputError(f"--instances {count} is too many: evaluate at most {MAX_INSTANCES:,} instances")
    check_shape(vocab, length)
    check_drafts(drafts)
    check_size(vocab, length, drafts)
    tuples = vocab ** (length * drafts)
    if tuples > MAX_ENUMERATED:
        raise InputError(f"exact evaluation of the verifiers would walk {tuples:,} draft tuples "
                         f"(limit {MAX_ENUMERATED:,}): reduce the vocabulary, the length or the drafts")
    return vocab, count


def _table(rows: list[dict[str, float]], vocab: int, length: int, drafts: int) -> None:
    from rich.console import Console  # rich, and torch for the LP table: not for --help
    from rich.table import Table

    from core.verifiers import registry
    from experiments.lp_table import columns

    shown = columns()
    labels = {spec.lp_column: spec.label for spec in registry.values()}
    table = Table(title=f"Expected accepted draft tokens, V={vocab} L={length} K={drafts}",
                  caption="token and BV verify the first path; RRS, SeqBV, GBV and the LP bound use all K "
                          "i.i.d. paths; GDS drafts its own K (top K-1 and one sampled), beyond this LP")
    for name in ("instance", *(labels.get(c, "LP") for c in shown), "LP seconds"):
        table.add_column(name, justify="right")
    for i, row in enumerate(rows):
        table.add_row(str(i), *(f"{row[c]:.4f}" for c in shown), f"{row['seconds']:.2f}")
    table.add_section()
    mean = {c: sum(r[c] for r in rows) / len(rows) for c in (*shown, "seconds")}
    table.add_row("mean", *(f"{mean[c]:.4f}" for c in shown), f"{mean['seconds']:.2f}")
    Console().print(table)


@click.command("lp")
@click.option("--vocab", type=int, help="Vocabulary size V (implied by --step-p when given).")
@click.option("--length", type=int, required=True, help="Draft length L.")
@click.option("--drafts", type=int, default=1, show_default=True, help="Number K of i.i.d. draft paths.")
@click.option("--instances", "count", type=int, help=f"Random instances [default: {DEFAULT_INSTANCES}].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random instances.")
@click.option("--step-p", help="Target distribution at every step, e.g. 0.3333,0.6667 (with --step-q).")
@click.option("--step-q", help="Draft distribution at every step (with --step-p).")
@click.option("--drafter", type=click.Choice(["indep", "mix"]), default="indep", show_default=True,
              help="Random drafter: independent Dirichlet(1), or 0.6 p + 0.4 Dirichlet(1).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def command(vocab: int | None, length: int, drafts: int, count: int | None, seed: int, step_p: str | None,
            step_q: str | None, drafter: str, as_json: bool) -> None:
    """Bound the expected accepted length of lossless verification by an LP; score each verifier."""
    import numpy as np  # numpy, rich, the simulator and torch: not for --help
    from rich.console import Console
    from rich.progress import track

    from experiments.lp_table import evaluate_verifiers
    from simulator.instances import random_instance, step_instance
    from simulator.lp import LPSolveError

    if (step_p is None) != (step_q is None):
        raise InputError("--step-p and --step-q go together: give both the target and the draft distribution")
    step = None if step_p is None else (_parse_vector(step_p, "--step-p"), _parse_vector(step_q, "--step-q"))
    vocab, count = _check_flags(vocab, length, drafts, count, step)
    if step is not None:
        instances = [step_instance(*step, length)]
    else:
        rng = np.random.default_rng(seed)
        instances = [random_instance(vocab, length, rng, drafter) for _ in range(count)]
    stderr = Console(stderr=True)
    try:
        rows = [evaluate_verifiers(inst, drafts)
                for inst in track(instances, description="instances", console=stderr,
                                  transient=True, disable=not stderr.is_terminal)]
    except LPSolveError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        report = {"vocab": vocab, "length": length, "drafts": drafts, "instances": rows}
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        _table(rows, vocab, length, drafts)
