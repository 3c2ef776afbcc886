"""Probed traces and the simulator's walk: at temperature 0 a length policy's simulation on a probed trace
takes the engine's own iterations, so its tau is the engine's, policy by policy and prompt by prompt."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_fidelity import flat_profile

from core.errors import InputError
from core.paths import MODELS
from policies.base import make_policy
from real_engine.decode import generate, make_drafter
from real_engine.model import Transformer, load_model
from real_engine.prompts import Prompt
from real_engine.speculate import LengthControlled
from real_engine.tokenizer import Tokenizer
from real_engine.trace import greedy_path, load_prompts, record
from real_engine.tree import DraftTree
from real_engine.warp import Sampling
from simulator.parametric import default_acceptance, synthetic_traces
from simulator.positions import advances, positions
from simulator.replay import TraceReplay
from simulator.rollout import run_length
from simulator.spec_length import SpecLengthVectorEnv

DEPTH, TOKENS = 4, 24


@pytest.fixture(scope="module")
def shipped() -> tuple[Transformer, Transformer]:
    """The shipped toy target and draft model: trained, so their confidences spread over (0, 1)."""
    return load_model(MODELS / "target"), load_model(MODELS / "draft")


@pytest.fixture(scope="module")
def prompts(shipped: tuple[Transformer, Transformer]) -> list[Prompt]:
    target = shipped[0]
    tokenizer = Tokenizer.load(MODELS / "target", target.args.vocab_size, target.args.eos_token_id)
    return load_prompts(("code", "prose"), 2, tokenizer.encode, "evaluation", max_tokens=48)


@pytest.fixture(scope="module")
def probed(shipped: tuple[Transformer, Transformer], prompts: list[Prompt]) -> pd.DataFrame:
    target, draft = shipped
    return record(target, prompts, lambda: make_drafter("draft-model", target, draft, depth=DEPTH),
                  "draft-model", max_new_tokens=TOKENS + DEPTH, probe=True).traces


def test_greedy_path_follows_the_text_down_the_tree() -> None:
    tree = DraftTree(torch.tensor([0, 5, 6, 7, 8]), torch.tensor([-1, 0, 0, 2, 3]))
    assert greedy_path(tree, [6, 7, 8, 9]) == (2, 3, 4)
    assert greedy_path(tree, [5, 7]) == (1,)
    assert greedy_path(tree, [9]) == ()


def test_a_probe_row_is_the_iteration_a_decode_starting_there_records(
        shipped: tuple[Transformer, Transformer], prompts: list[Prompt], probed: pd.DataFrame) -> None:
    """Every position has a row (one token a step), and where a verifying decode started an iteration, the
    probe drafted the same chain and the greedy text accepts as much of it as the verifier did."""
    target, draft = shipped
    decoded = record(target, prompts, lambda: make_drafter("draft-model", target, draft, depth=DEPTH),
                     "draft-model", max_new_tokens=TOKENS + DEPTH).traces
    for query, rows in probed.groupby("query_id"):
        assert np.diff(rows["context_length"]).tolist() == [1] * (TOKENS + DEPTH - 1)
        assert (advances(probed)[rows.index] == 1).all()
        at = rows.set_index("context_length")
        for _, it in decoded[decoded["query_id"] == query].iterrows():
            row = at.loc[it["context_length"]]
            assert row["accepted"] == it["accepted"]
            np.testing.assert_allclose(row["confidences"], it["confidences"], atol=1e-5)
    assert probed["accepted"].sum() > 0


def test_probing_needs_greedy_decoding(shipped: tuple[Transformer, Transformer],
                                       prompts: list[Prompt]) -> None:
    target, draft = shipped
    with pytest.raises(InputError, match="greedy"):
        record(target, prompts[:1], lambda: make_drafter("draft-model", target, draft, depth=DEPTH),
               "draft-model", sampling=Sampling(1.0), verifier="token", max_new_tokens=4, probe=True)


@pytest.mark.parametrize("spec", [{"kind": "fixed", "params": {"length": 3}},
                                  {"kind": "threshold", "params": {"threshold": 0.5}},
                                  {"kind": "libraspec", "params": {}},
                                  {"kind": "heuristic", "params": {}}])
def test_the_walk_takes_the_engines_iterations(spec: dict, shipped: tuple[Transformer, Transformer],
                                               prompts: list[Prompt], probed: pd.DataFrame) -> None:
    """Each prompt alone: the simulated query starts where the prompt ends and walks its probed text, so it
    emits the same tokens in the same number of iterations as the engine under the same policy."""
    target, draft = shipped
    profile = flat_profile()
    iterations, sizes = [], set()
    for query, prompt in enumerate(prompts):
        live = generate(target, list(prompt.tokens), max_new_tokens=TOKENS,
                        drafter=LengthControlled(make_drafter("draft-model", target, draft, depth=DEPTH),
                                                 make_policy(spec["kind"], spec["params"]), profile,
                                                 "draft-model"))
        replay = TraceReplay.from_traces(probed[probed["query_id"] == query])
        context = len(prompt.tokens) - 1
        env = SpecLengthVectorEnv(1, profile, replay, "draft-model", TOKENS, (context, context))
        simulated = run_length(make_policy(spec["kind"], spec["params"]), env, seed=query)
        assert simulated.tokens == live.stats.new_tokens == TOKENS
        assert simulated.iterations == live.stats.iterations
        iterations.append(live.stats.iterations)
        sizes |= set(live.stats.tree_sizes)
    assert min(iterations) < TOKENS  # some drafts were accepted
    assert spec["kind"] == "fixed" or len(sizes) > 1  # the policy chose several lengths


def test_a_walk_steps_through_a_probed_query_and_draws_elsewhere() -> None:
    """On a probed query the walk starts at its first row and moves to the row of the text position it
    reached, or to a uniformly random row of the query past its end; a decode's trace is started and
    walked by uniform draws within each query."""
    decoded = synthetic_traces(default_acceptance(), queries=1, iterations=12, seed=0)
    assert decoded["accepted"].max() > 0
    probe = TraceReplay.from_traces(decoded.assign(context_length=100 + decoded["iteration"]))
    plain = TraceReplay.from_traces(decoded)
    assert probe.query_probed.tolist() == [True] and plain.query_probed.tolist() == [False]
    assert positions(decoded).context.tolist() == decoded["context_length"].tolist()
    rng, start = np.random.default_rng(0), np.zeros(400, dtype=np.int64)
    assert (probe.first_rows(rng, start) == 0).all()
    assert set(plain.first_rows(rng, start).tolist()) == set(range(12))
    assert probe.walk(rng, np.array([0, 3]), np.array([2, 5])).tolist() == [2, 8]
    assert set(probe.walk(rng, np.full(400, 10), np.full(400, 4)).tolist()) == set(range(12))
    assert set(plain.walk(rng, np.zeros(400, dtype=np.int64), np.full(400, 1)).tolist()) == set(range(12))
