"""The verifier registry (``core.verifiers``): a toy verifier registered with one ``register_verifier``
call is offered by `specblock generate` and `specblock trace`, decodes through ``generate``, is proven
lossless by the exact enumeration of ``real_engine.exact``, gets a column in the LP table, and is gone
once unregistered; malformed registrations are refused; the shipped specs load and keep the fit rules the
commands and the bench harness use."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from core import names, verifiers
from core.errors import InputError
from core.verifiers import VerifierSpec, register_verifier
from real_engine import exact, verify
from real_engine.decode import generate, make_drafter
from real_engine.model import Transformer
from real_engine.tree import DraftTree
from real_engine.warp import Sampling
from simulator.instances import random_instance

PROMPT = [5, 9, 2, 7, 7, 3]
TOL = 1e-12
SAMPLERS = ("draft-model",)  # the drafters sampling i.i.d. paths


def accept_nothing(tree: DraftTree, p: torch.Tensor, sampler: verify.Sampler) -> verify.Decision:
    """The toy verifier's law: accept no draft token and emit from the target's row at the root, which is
    lossless for any draft (and accepts nothing)."""
    return verify.Decision((), p[0], tree.size == 1)


@pytest.fixture
def reject() -> Iterator[VerifierSpec]:
    """The toy verifier, registered (one call) for one test."""
    spec = register_verifier("reject", f"{__name__}:accept_nothing", shapes=("chain",), lp_column="reject",
                             summary="accepts nothing (a toy)")
    yield spec
    verifiers.unregister_verifier(spec.name)


def test_a_registered_verifier_is_offered_and_decodes(reject: VerifierSpec, target: Transformer,
                                                      llama_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main
    from experiments.commands.generate import command as generate_command
    from experiments.commands.trace import command as trace_command

    for command in (generate_command, trace_command):
        choices = next(p for p in command.params if p.name == "verifier").type.choices
        assert choices == (*names.VERIFIERS, "reject")
    assert list(verify.VERIFIERS) == list(verify.LAWS) == [*names.VERIFIERS, "reject"]
    out = generate(target, PROMPT, drafter=make_drafter("ngram", target, depth=3), verifier="reject",
                   sampling=Sampling(1.0), max_new_tokens=12, seed=1)
    assert len(out.tokens) == 12 and out.stats.tau == 1.0  # every draft verified, none of it accepted
    assert max(out.stats.tree_sizes) > 1
    main(["generate", "--model", str(llama_dir), "--prompt", "the cat sat", "--max-new-tokens", "6",
          "--drafter", "ngram", "--verifier", "reject", "--temperature", "1", "--json"])
    run = json.loads(capsys.readouterr().out)
    assert run["verifier"] == "reject" and len(run["token_ids"]) == 6


@pytest.mark.parametrize("rule", ["iid", "topk"])
def test_a_registered_verifier_is_proven_lossless(reject: VerifierSpec, rule: str) -> None:
    for vocab, length, drafts in ((2, 2, 1), (3, 2, 2), (2, 3, 2)):
        inst = random_instance(vocab, length, np.random.default_rng([vocab, length, drafts]))
        assert exact.lossless_error("reject", inst, drafts, rule) <= TOL
        assert exact.expected_accepted("reject", inst, drafts, rule) == 0.0
    assert exact.lossless_error("block", inst, 1) <= TOL  # the same check passes a shipped verifier


def test_a_registered_verifier_has_an_lp_column(reject: VerifierSpec) -> None:
    from experiments.lp_table import columns, evaluate_verifiers

    assert columns()[-1] == "reject"
    row = evaluate_verifiers(random_instance(2, 2, np.random.default_rng(0)), 1, ("block", "reject"))
    assert row["reject"] == 0.0 < row["block"]


def test_an_unregistered_verifier_is_gone(reject: VerifierSpec) -> None:
    verifiers.unregister_verifier("reject")
    assert "reject" not in verify.VERIFIERS and "reject" not in verify.LAWS
    with pytest.raises(InputError, match=r"^unknown verifier 'reject': use one of greedy, token, block, rrs, "
                                         r"gbv, seqbv, gds$"):
        verifiers.verifier_spec("reject")


def test_malformed_registrations_are_refused(reject: VerifierSpec) -> None:
    law = f"{__name__}:accept_nothing"
    with pytest.raises(InputError, match="already registered"):
        register_verifier("reject", law)
    with pytest.raises(InputError, match=r"module\.path:function"):
        register_verifier("other", "accept_nothing")
    with pytest.raises(InputError, match="shape 'ring' is not one of chain, tree, paths"):
        register_verifier("other", law, shapes=("ring",))
    with pytest.raises(InputError, match="default for a tree it does not fit"):
        register_verifier("other", law, shapes=("chain",), default_for=("tree",))
    with pytest.raises(InputError, match="block is already the default"):
        register_verifier("other", law, shapes=("chain",), default_for=("chain",))
    with pytest.raises(InputError, match="LP column 'reject' is taken"):
        register_verifier("other", law, lp_column="reject")
    assert "other" not in verifiers.registry


@pytest.mark.parametrize("name", verifiers.verifier_names())
def test_the_shipped_specs_load(name: str) -> None:
    spec = verifiers.verifier_spec(name)
    assert set(spec.shapes) <= set(verifiers.DRAFT_SHAPES)
    assert verify.LAWS[name] is spec.load("law")
    assert callable(verify.VERIFIERS[name])


def test_the_fit_rules() -> None:
    assert {shape: verifiers.fits(shape) for shape in verifiers.DRAFT_SHAPES} == {
        "chain": ("token", "block", "rrs"), "tree": ("rrs",), "paths": ("rrs", "gbv", "seqbv")}
    assert [verifiers.default_verifier(t, s) for t in (0.0, 0.7) for s in verifiers.DRAFT_SHAPES] == [
        "greedy", "greedy", "greedy", "block", "rrs", "seqbv"]
    assert verifiers.sampling_verifiers() == ("token", "block", "rrs", "gbv", "seqbv")
    with pytest.raises(InputError, match="unknown draft shape 'ring'"):
        verifiers.fits("ring")
    ngram, model, eagle = (names.drafter_spec(n) for n in ("ngram", "draft-model", "eagle"))
    for verifier, drafter, width in (("gbv", model, 1), ("seqbv", ngram, None), ("token", model, 4),
                                     ("block", eagle, 1), ("rrs", eagle, None), ("gds", model, None)):
        verifiers.check_fit(verifier, drafter, width, SAMPLERS)
    refusals = ((("gbv", ngram, None), "i.i.d. sampled paths: use --drafter draft-model with"),
                (("seqbv", model, 4), "unmerged paths, not a top-k tree: .* or --verifier rrs$"),
                (("block", eagle, None), r"top-k tree: use --verifier rrs \(or greedy at temperature 0\), "
                                         "or --tree-width 1 .* for token, block$"),
                (("seqbv", eagle, 1), "the eagle drafter drafts a deterministic top-k tree"))
    for args, message in refusals:
        with pytest.raises(InputError, match=message):
            verifiers.check_fit(*args, SAMPLERS)
