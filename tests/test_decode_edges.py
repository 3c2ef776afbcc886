"""The decode loop at its edges: make_drafter's options and what it needs, stats, the context and
tree bounds, and the overhead accounting."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from core.errors import InputError
from real_engine.decode import MAX_TREE_NODES, generate, make_drafter, prefill
from real_engine.model import Output, Transformer, load_model
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

OPTIONS = ("depth", "width", "budget", "paths", "max_ngram", "blocks", "vocab", "staged", "lookup")

@pytest.mark.parametrize("option", OPTIONS)
def test_a_drafter_option_below_one_is_refused_by_name(option: str, target: Transformer) -> None:
    with pytest.raises(InputError, match=f"^drafter option {option}=0 is below 1: give a positive value$"):
        make_drafter("ngram", target, **{option: 0})


def test_make_drafter_defaults_ranges_and_what_it_needs(target: Transformer, draft: Transformer,
                                                        other_vocab_dir: Path, tmp_path: Path) -> None:
    ngram = make_drafter("ngram", target)
    assert (ngram.depth, ngram.max_ngram) == (4, 3)
    ngram = make_drafter("ngram", target, depth=2, max_ngram=5)
    assert (ngram.depth, ngram.max_ngram) == (2, 5)
    assert make_drafter("draft-model", target, draft, min_confidence=1.0) is not None
    for bad in (-0.5, 1.5):
        with pytest.raises(InputError, match=rf"^min_confidence {bad} \(--min-confidence\): give a "
                                             r"probability in \[0, 1\]$"):
            make_drafter("draft-model", target, draft, min_confidence=bad)
    with pytest.raises(InputError, match=r"^the draft-model drafter needs a draft model: pass one "
                                         r"\(--draft-model DIR\)$"):
        make_drafter("draft-model", target)
    with pytest.raises(InputError, match=r"^the draft model's vocabulary \(\d+\) differs from the target's "
                                         r"\(96\): use a draft model with the target's tokenizer$"):
        make_drafter("draft-model", target, load_model(other_vocab_dir))
    (tmp_path / "drafting.json").write_text(json.dumps({"shape": {"depth": 6, "width": 1, "staged": 1,
                                                                  "lookup": 3}}))
    tree = make_drafter("draft-model", target, draft, folder=tmp_path, width=2)  # the deployed chain's
    assert (tree.shape, tree.width, tree.staged, tree.lookup) == ("tree", 2, 0, 0)  # options do not apply


def test_stats_to_dict_is_plain_json(target: Transformer) -> None:
    stats = generate(target, [1, 2, 3], drafter=make_drafter("ngram", target), max_new_tokens=5).stats
    plain = stats.to_dict()
    assert plain["accepted"] == list(stats.accepted) and plain["tree_sizes"] == list(stats.tree_sizes)
    assert plain["new_tokens"] == 5 and plain["tau"] == stats.tau
    assert json.loads(json.dumps(plain)) == plain


def test_a_one_token_prompt_prefills_nothing_and_decodes(target: Transformer) -> None:
    cache = target.new_cache(8)
    out = prefill(target, cache, torch.tensor([], dtype=torch.long))
    a = target.args
    shapes = [(1, 0, a.vocab_size), (1, 0, 3 * a.hidden_size), (1, 0, a.hidden_size)]
    assert [tuple(x.shape) for x in out] == shapes
    assert cache.length == 0
    vanilla = generate(target, [5], max_new_tokens=6).tokens
    assert generate(target, [5], drafter=make_drafter("ngram", target), max_new_tokens=6).tokens == vanilla


def test_the_prompt_and_new_tokens_may_fill_the_context_exactly(target: Transformer) -> None:
    limit = target.args.max_position_embeddings
    assert len(generate(target, [1] * (limit - 3), max_new_tokens=3).tokens) == 3
    with pytest.raises(InputError, match=f"exceeds the model's context of {limit}"):
        generate(target, [1] * (limit - 3), max_new_tokens=4)


class Flat:
    """Drafts ``width`` copies of one token under the root: a tree of ``width + 1`` nodes."""

    def __init__(self, width: int) -> None:
        self.width, self.model_seconds = width, 0.0

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Remember the root."""
        self.root = int(prompt[-1])

    def propose(self, max_depth: int) -> DraftTree:
        """The flat tree (the root alone when nothing may be drafted)."""
        width = self.width if max_depth else 0
        return DraftTree(torch.tensor([self.root, *[7] * width]), torch.tensor([-1, *[0] * width]))

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Follow the root."""
        self.root = token


def test_the_largest_tree_the_cache_holds_is_verified_and_a_larger_one_refused(target: Transformer) -> None:
    vanilla = generate(target, [1, 2, 3], max_new_tokens=3).tokens
    assert generate(target, [1, 2, 3], drafter=Flat(MAX_TREE_NODES - 1), max_new_tokens=3).tokens == vanilla
    with pytest.raises(InputError, match=f"^a draft tree of {MAX_TREE_NODES + 1} nodes exceeds "
                                         f"{MAX_TREE_NODES}: lower the tree budget, width or depth$"):
        generate(target, [1, 2, 3], drafter=Flat(MAX_TREE_NODES), max_new_tokens=3)


@pytest.mark.parametrize("name", ["none", "ngram"])
def test_overhead_is_what_the_forwards_leave_of_the_seconds(name: str, target: Transformer) -> None:
    stats = generate(target, [1, 2, 3, 1, 2, 3], drafter=make_drafter(name, target), max_new_tokens=6).stats
    assert 0 < stats.overhead_seconds < stats.seconds
