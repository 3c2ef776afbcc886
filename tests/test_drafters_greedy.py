"""Every drafter as `make_drafter` builds it: greedy output equals vanilla on the shipped models, and the
draft trees carry the drafter's confidences (SpecBlock's rank buckets too)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from core.errors import InputError
from core.names import trained_drafters
from core.paths import MODELS, PROMPTS
from experiments.cli import main
from real_engine.decode import Iteration, generate, make_drafter
from real_engine.drafters.draft_model import DraftModelDrafter
from real_engine.model import ModelArgs, Transformer, load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import node_columns
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

TEXTS = ("def fib(n):\n", 'import os\n\n\ndef read_config(path):\n    """Return the config."""\n')
NEW_TOKENS = 24
CONFIGS = [("ngram", {}), ("draft-model", {}), ("draft-model", {"width": 3, "budget": 12}),
           ("specblock", {}), ("specblock", {"width": 1, "budget": 4}),
           ("specblock", {"blocks": 2, "width": 1}), ("eagle", {}), ("medusa", {})]


@pytest.fixture(scope="module")
def shipped() -> tuple[Transformer, Transformer, list[list[int]], list[tuple[int, ...]]]:
    """The shipped target and draft model, the prompts' tokens and vanilla's greedy continuations."""
    for name in ("target", "draft", "specblock", "eagle", "medusa"):  # shipped, so never skipped
        assert (MODELS / name / "config.json").is_file(), f"no shipped {name} in {MODELS}"
    target, draft = load_model(MODELS / "target"), load_model(MODELS / "draft")
    tokenizer = Tokenizer.load(MODELS / "target", target.args.vocab_size, target.args.eos_token_id)
    prompts = [tokenizer.encode(text) for text in TEXTS]
    return target, draft, prompts, [generate(target, p, max_new_tokens=NEW_TOKENS).tokens for p in prompts]


@pytest.mark.parametrize(("name", "options"), CONFIGS)
def test_greedy_output_equals_vanilla_and_trees_carry_confidences(name: str, options: dict, shipped) -> None:
    target, draft, prompts, vanilla = shipped
    accepted = 0
    for prompt, expected in zip(prompts, vanilla, strict=True):
        iterations: list[Iteration] = []
        folder = MODELS / name if name in trained_drafters() else None  # the shipped family's own
        out = generate(target, prompt, drafter=make_drafter(name, target, draft, folder=folder, **options),
                       max_new_tokens=NEW_TOKENS, on_iteration=iterations.append)
        assert out.tokens == expected
        accepted += sum(out.stats.accepted)
        trees = [it.tree for it in iterations]
        for tree in trees:
            if name == "ngram":  # deterministic lookups: no probabilities
                assert tree.confidence is None
                continue
            conf = tree.confidence
            assert conf.shape == (tree.size,) and float(conf[0]) == 1.0
            assert bool(((conf >= 0) & (conf <= 1)).all())
            if options.get("width") == 1:  # a chain: no node has two children
                parents = tree.parents.tolist()[1:]
                assert len(set(parents)) == len(parents)
                assert tree.size - 1 <= options.get("budget", tree.size)
            if name == "specblock":
                assert tree.rank_buckets.tolist()[0] == -1
                assert set(tree.rank_buckets.tolist()[1:]) <= {0, 1, 2, 3}
            else:
                assert tree.rank_buckets is None
        drafted = torch.cat([t.confidence[1:] for t in trees]) if name != "ngram" else None
        assert drafted is None or bool((drafted < 1).any())  # real probabilities, not point masses
    assert accepted > 0


def tiny(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelArgs(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16)).eval()


def first_tree(model: Transformer, prompt: list[int], drafter: DraftModelDrafter,
               sampling: Sampling | None = None) -> DraftTree:
    sampling = sampling or Sampling()
    trees: list[Iteration] = []
    generate(model, prompt, drafter=drafter, verifier="greedy" if sampling.greedy else "rrs",
             sampling=sampling, max_new_tokens=8, on_iteration=trees.append)
    return trees[0].tree


def test_greedy_chain_confidence_is_the_draft_softmax_of_each_token() -> None:
    model, prompt = tiny(), [3, 7, 1, 4]
    tree = first_tree(model, prompt, DraftModelDrafter(model, "chain", depth=3))
    drafted = tree.tokens[1:].tolist()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + drafted[:-1]])).logits[0, len(prompt) - 1:]
    expected = logits.softmax(-1)[torch.arange(3), torch.tensor(drafted)]
    assert drafted == logits.argmax(-1).tolist()  # greedy draft: q is a point mass on these
    torch.testing.assert_close(tree.confidence[1:], expected)
    assert bool((tree.confidence[1:] < 1).all()) and float(tree.confidence[0]) == 1.0


@pytest.mark.parametrize("shape", ["chain", "paths", "tree"])
def test_sampled_confidence_is_the_warped_law_of_the_parent(shape: str) -> None:
    model = tiny(1)
    sampling = Sampling(1.0, top_k=8)
    tree = first_tree(model, [5, 2, 9], DraftModelDrafter(model, shape, depth=3, width=2, budget=5, paths=2),
                      sampling)
    rows = tree.q[tree.parents[1:], tree.tokens[1:]]
    torch.testing.assert_close(tree.confidence[1:], rows)
    assert bool((rows > 0).all())


def test_trace_columns_use_the_tree_annotations() -> None:
    q = torch.zeros(3, 8)
    q[0, 4], q[1, 5] = 1.0, 1.0  # greedy point masses: the columns must not read them
    tree = DraftTree(torch.tensor([1, 4, 5]), torch.tensor([-1, 0, 1]), q, "topk",
                     torch.tensor([1.0, 0.4, 0.7]), torch.tensor([-1, 1, 0]))
    cols = node_columns(Iteration(tree, (1,), 6, 10, 0.0, 0.0))
    np.testing.assert_allclose(cols["confidences"], [0.4, 0.7])
    assert cols["rank_buckets"].tolist() == [1, 0]
    with pytest.raises(InputError, match="confidence"):
        DraftTree(torch.tensor([1, 4]), torch.tensor([-1, 0]), confidence=torch.ones(3))
    with pytest.raises(InputError, match="rank_buckets"):
        DraftTree(torch.tensor([1, 4]), torch.tensor([-1, 0]), rank_buckets=torch.zeros(2, 1))


def test_generate_cli_with_the_shipped_specblock(shipped, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = []
    for drafter in ("none", "specblock"):
        main(["generate", "--drafter", drafter, "--prompt", "def fib(n):", "--max-new-tokens", "16",
              "--json"])
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[1]["token_ids"] == outputs[0]["token_ids"] and len(outputs[1]["token_ids"]) == 16
    assert (outputs[1]["drafter"], outputs[1]["verifier"]) == ("specblock", "greedy")


def test_shipped_specblock_reaches_tau_two_on_held_out_code(shipped) -> None:
    """The quick quality check of the shipped SpecBlock drafter: greedy, default tree, 48 tokens after the
    last 192 tokens of four held-out code prompts (measured 2.23 with the 16M family; 1.55 before SpecBlock
    normalized its inputs, 2.04 for the 5M family's drafter)."""
    target, _, _, _ = shipped
    tokenizer = Tokenizer.load(MODELS / "target", target.args.vocab_size, target.args.eos_token_id)
    lines = (PROMPTS / "code.jsonl").read_text().splitlines()
    new = iterations = 0
    for line in lines[:4]:
        prompt = tokenizer.encode(json.loads(line)["text"])[-192:]
        drafter = make_drafter("specblock", target, folder=MODELS / "specblock")
        stats = generate(target, prompt, drafter=drafter, max_new_tokens=48).stats
        new, iterations = new + stats.new_tokens, iterations + stats.iterations
    assert new / iterations >= 2.0


@pytest.mark.parametrize("name", ["draft-model", "specblock", "eagle", "medusa"])
def test_deployed_shapes_decode_greedily_as_vanilla(name: str, shipped) -> None:
    """Each shipped drafter in its deployed shape (``drafting.json``, as commands load it) is lossless."""
    target, draft, prompts, vanilla = shipped
    folder = MODELS / ("draft" if name == "draft-model" else name)
    accepted = 0
    for prompt, expected in zip(prompts, vanilla, strict=True):
        out = generate(target, prompt, drafter=make_drafter(name, target, draft, folder=folder),
                       max_new_tokens=NEW_TOKENS)
        assert out.tokens == expected
        accepted += sum(out.stats.accepted)
    assert accepted > 0
