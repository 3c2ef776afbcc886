"""Draft-model chains drafted in lockstep (``DraftModelDrafter.propose_together``) are each drafter's own
proposal: the same tokens, confidences and laws, the same cache after ``accept``, whatever stops each chain;
the batched engine drafts that way and stays lossless."""

from __future__ import annotations

import pytest
import torch

from real_engine.batch import BatchEngine, Request
from real_engine.decode import GREEDY, generate, make_drafter
from real_engine.drafters.draft_model import DraftModelDrafter
from real_engine.model import Output, Transformer
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

TOLERANCE = 1e-5  # packed arithmetic differs from a lone forward's in the last bits only


def started(target: Transformer, draft: Transformer, prompts: list[list[int]], sampling: Sampling,
            **options: float) -> tuple[list[DraftModelDrafter], Output]:
    """A chain drafter per prompt, begun on it (the target's rows are a stand-in: chains never read them)."""
    drafters = []
    with torch.inference_mode():
        rows = target(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]))
        for seed, prompt in enumerate(prompts):
            drafter = DraftModelDrafter(draft, "chain", **options)
            drafter.begin(torch.tensor(prompt), rows, sampling, torch.Generator().manual_seed(seed), 96)
            drafters.append(drafter)
    return drafters, rows


def same_tree(a: DraftTree, b: DraftTree) -> None:
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    torch.testing.assert_close(a.confidence, b.confidence, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(a.q, b.q, atol=TOLERANCE, rtol=0)


def same_cache(a: DraftModelDrafter, b: DraftModelDrafter) -> None:
    assert (a.cache.length, a.backlog, a.root) == (b.cache.length, b.backlog, b.root)
    n = a.cache.length
    torch.testing.assert_close(a.cache.k[..., :n, :], b.cache.k[..., :n, :], atol=TOLERANCE, rtol=0)


CHAINS = {"plain": {"depth": 5, "min_confidence": 0.05}, "deployed": {"depth": 8, "staged": 1, "lookup": 3},
          "staged": {"depth": 6, "staged": 2}}


@pytest.mark.parametrize("options", list(CHAINS.values()), ids=list(CHAINS))
@pytest.mark.parametrize("sampling", [GREEDY, Sampling(temperature=1.0)], ids=["greedy", "sampled"])
def test_lockstep_chains_equal_each_drafters_own(target: Transformer, draft: Transformer,
                                                 sampling: Sampling, options: dict) -> None:
    """Four requests of different prompts (repeating ones, for staged guesses and lookup proposals),
    depths (0 included) and stopping rules, over eight iterations with varied accepted paths: every tree
    and cache as each drafter alone makes it."""
    prompts = [[3, 4, 5, 3, 4, 5, 3], [8, 9], [10, 11, 12, 10, 11], [13, 14, 15, 16, 17, 18, 19]]
    alone, rows = started(target, draft, prompts, sampling, **options)
    together, _ = started(target, draft, prompts, sampling, **options)
    for pair in (alone, together):  # a serving policy's hook: request i stops after 1 + i positions
        for i, drafter in enumerate(pair):
            drafter.keep_drafting = lambda laws, i=i: len(laws) < 1 + i
    gen = torch.Generator().manual_seed(3)
    stopped = 0
    for step in range(8):
        depths = [0] * 4 if step == 4 else [8, 0 if step % 3 == 0 else 4, 3, 8]
        with torch.inference_mode():
            solo = [d.propose(depth) for d, depth in zip(alone, depths, strict=True)]
            batched = DraftModelDrafter.propose_together(together, depths)
        for a, b in zip(solo, batched, strict=True):
            same_tree(a, b)
            stopped += 1 < a.size < 4
        for a, b, tree in zip(alone, together, solo, strict=True):
            kept = int(torch.randint(0, tree.size, (1,), generator=gen))
            token = int(torch.randint(1, 96, (1,), generator=gen))
            with torch.inference_mode():
                a.accept(list(range(1, kept + 1)), token, rows)
                b.accept(list(range(1, kept + 1)), token, rows)
            same_cache(a, b)
    assert stopped > 0  # the stopping rules did cut chains short


def test_batch_key_admits_chains_of_one_model(draft: Transformer, target: Transformer) -> None:
    chain = DraftModelDrafter(draft, "chain")
    assert chain.batch_key == DraftModelDrafter(draft, "chain", staged=1, lookup=2).batch_key is not None
    assert chain.batch_key != DraftModelDrafter(target, "chain").batch_key
    assert DraftModelDrafter(draft, "tree", width=2).batch_key is None
    assert DraftModelDrafter(draft, "paths", paths=2).batch_key is None


def test_engine_drafting_together_emits_what_drafting_alone_does(target: Transformer,
                                                                 draft: Transformer) -> None:
    """Greedy: the batched engine's tokens, acceptance and tree sizes are the same with lockstep drafting
    as with every drafter proposing alone, and each request's tokens are its solo vanilla ones."""
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
    runs = []
    for together in (True, False):
        engine = BatchEngine(target, max_batch=4, batch_drafting=together)
        for prompt in prompts:
            engine.submit(Request(prompt, 10, make_drafter("draft-model", target, draft, depth=4)))
        runs.append(engine.run())
    for rid, prompt in enumerate(prompts):
        a, b = runs[0][rid], runs[1][rid]
        assert (a.tokens, a.accepted, a.tree_sizes) == (b.tokens, b.accepted, b.tree_sizes)
        assert tuple(a.tokens) == generate(target, prompt, max_new_tokens=10).tokens
    assert sum(sum(r.accepted) for r in runs[0].values()) > 0
