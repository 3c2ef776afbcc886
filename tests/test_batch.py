"""Continuous batching: batched greedy decoding equals each request decoded alone, requests join and
leave between iterations, and a request the engine cannot serve never disturbs the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.errors import InputError
from core.names import DOMAINS
from core.paths import MODELS
from experiments.cli import main
from real_engine.batch import BatchEngine, Request
from real_engine.decode import generate, make_drafter
from real_engine.model import Transformer, load_model
from real_engine.ragged import RaggedCache
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts
from real_engine.warp import Sampling

MARGIN = 1e-5  # a batched forward may flip a near-tie of the solo one, and only such a tie


def lengths(count: int) -> list[int]:
    """Varied new-token counts, so that requests leave at different iterations."""
    return [6 + (5 * i) % 9 for i in range(count)]


def near_tie(target: Transformer, prompt: list[int], solo: tuple[int, ...], batched: list[int]) -> float:
    """The solo forward's top-two logit margin where the batched output first departs from it."""
    i = next(i for i, (a, b) in enumerate(zip(solo, batched, strict=False)) if a != b)
    with torch.inference_mode():
        logits = target(torch.tensor([[*prompt, *solo[:i]]])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def check_equal_to_solo(target: Transformer, prompts: list[list[int]], results: dict, new: list[int]) -> None:
    """Every request's tokens are its solo vanilla tokens, but past a near-tie."""
    for rid, (prompt, n) in enumerate(zip(prompts, new, strict=True)):
        solo = generate(target, prompt, max_new_tokens=n).tokens
        got = results[rid].tokens
        assert results[rid].error is None and len(got) == n
        if list(solo) != got:
            assert near_tie(target, prompt, solo, got) < MARGIN, rid


@pytest.mark.parametrize("drafter", ["none", "ngram", "draft-model"])
def test_batched_greedy_equals_solo_vanilla(target: Transformer, draft: Transformer, drafter: str) -> None:
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 96, (int(torch.randint(2, 14, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(7)]
    new = lengths(len(prompts))
    engine = BatchEngine(target, max_batch=3)
    for prompt, n in zip(prompts, new, strict=True):
        engine.submit(Request(prompt, n, make_drafter(drafter, target, draft, depth=3)
                              if drafter == "draft-model" else make_drafter(drafter, target)))
    batches = []
    while engine.busy:
        engine.step()
        batches.append(len(engine.running))
    assert max(batches) == 3 and batches[-1] == 0  # full batches, then requests leave as they finish
    check_equal_to_solo(target, prompts, engine.results, new)
    if drafter == "draft-model":  # a perturbed copy of the target: it drafts what the target accepts
        assert sum(sum(r.accepted) for r in engine.results.values()) > 0


def test_sampled_requests_draw_as_each_would_alone(target: Transformer, draft: Transformer) -> None:
    """At temperature 1 each request's seeded draws are its own: batched, a request emits what
    ``generate`` emits alone with the same seed (token-level and block verification), EOS included."""
    sampling = Sampling(temperature=1.0)
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    settings = [(verifier, seed) for verifier in ("token", "block") for seed in (0, 1)]
    engine = BatchEngine(target, max_batch=3)
    solo = []
    for (verifier, seed), prompt in zip(settings, prompts, strict=True):
        engine.submit(Request(prompt, 9, make_drafter("draft-model", target, draft, depth=3), verifier,
                              sampling, seed=seed))
        solo.append(generate(target, prompt, drafter=make_drafter("draft-model", target, draft, depth=3),
                             verifier=verifier, sampling=sampling, max_new_tokens=9, seed=seed).tokens)
    results = engine.run()
    assert [tuple(results[i].tokens) for i in range(len(prompts))] == solo
    eos = solo[0][2]  # a token the first request emits third: it ends there, EOS emitted
    engine = BatchEngine(target)
    rid = engine.submit(Request(prompts[0], 9, make_drafter("draft-model", target, draft, depth=3), "token",
                                sampling, eos_id=eos, seed=0))
    assert engine.run()[rid].tokens == list(solo[0][:solo[0].index(eos) + 1])


def test_shipped_drafters_batched_equal_solo_vanilla_on_held_out_prompts() -> None:
    """The shipped target with SpecBlock, EAGLE-style and n-gram requests mixed in one batch, on 12 held-out
    prompts (the last 96 tokens of three per domain)."""
    target = load_model(MODELS / "target")
    tokenizer = Tokenizer.load(MODELS / "target", target.args.vocab_size, target.args.eos_token_id)
    prompts = [p.tokens for p in load_prompts(DOMAINS, 3, tokenizer.encode, "evaluation", 96)]
    names = ("specblock", "eagle", "ngram", "none")
    new = lengths(len(prompts))
    engine = BatchEngine(target, max_batch=5)
    for i, (prompt, n) in enumerate(zip(prompts, new, strict=True)):
        name = names[i % len(names)]
        folder = None if name in ("ngram", "none") else MODELS / name
        engine.submit(Request(prompt, n, make_drafter(name, target, folder=folder)))
    results = engine.run()
    check_equal_to_solo(target, prompts, results, new)
    assert all(r.tau > 1 for i, r in results.items() if names[i % len(names)] == "specblock")


def test_requests_join_between_iterations_and_leave_when_done(target: Transformer) -> None:
    engine = BatchEngine(target, max_batch=2)
    ids = [engine.submit(Request([3, 4, 5], n)) for n in (2, 6, 3)]
    assert engine.step() == [] and sorted(engine.running) == ids[:2] and len(engine.waiting) == 1
    assert engine.step() == [ids[0]]  # done after its second token
    engine.step()
    assert sorted(engine.running) == ids[1:]  # the third joined at the next iteration's start
    results = engine.run()
    assert [len(results[i].tokens) for i in ids] == [2, 6, 3]
    assert results[ids[2]].first_token > results[ids[0]].finished
    assert all(r.submitted <= r.first_token <= r.finished for r in results.values())


def test_a_request_it_cannot_serve_fails_alone(target: Transformer, draft: Transformer) -> None:
    engine = BatchEngine(target, max_batch=4)
    shared = make_drafter("draft-model", target, draft, depth=3)
    limit = target.args.max_position_embeddings
    good = [engine.submit(Request([5, 6, 7], 5, shared)), engine.submit(Request([8, 9], 4))]
    bad = {
        engine.submit(Request([], 4)): "the prompt is empty",
        engine.submit(Request([1, 2], limit)): "exceeds the model's context",
        engine.submit(Request([1, 2], 4, shared, verifier="nope")): "unknown verifier",
        engine.submit(Request([1, 2], 4, shared)): "drafter is serving another running request",
        engine.submit(Request([1, target.args.vocab_size], 4)): "prompt token ids must lie in",
    }
    results = engine.run()
    for rid, message in bad.items():
        assert message in results[rid].error and results[rid].tokens == []
    check_equal_to_solo(target, [[5, 6, 7], [8, 9]], {i: results[rid] for i, rid in enumerate(good)}, [5, 4])
    with pytest.raises(InputError, match="max_batch"):
        BatchEngine(target, max_batch=0)


def test_ragged_mask_is_block_diagonal(target: Transformer) -> None:
    caches = [target.new_cache(16) for _ in range(2)]
    caches[0].length, caches[1].length = 3, 1
    tree = torch.tensor([[True, False], [True, True]])
    mask = RaggedCache(caches, [2, 1]).mask([tree, torch.ones(1, 1, dtype=torch.bool)])
    expected = torch.zeros(3, 7, dtype=torch.bool)
    expected[0:2, 0:3] = True  # request 0 sees its 3-token prefix
    expected[0:2, 3:5] = tree  # and its own tree
    expected[2, 5:7] = True  # request 1: its prefix and its root, nothing of request 0's
    assert torch.equal(mask, expected)


def test_throughput_benchmark_reports_every_setting(tmp_path: Path, capsys) -> None:
    argv = ["benchmark", "batch_throughput", "--batches", "1,3", "--drafters", "none,ngram,draft-model",
            "--alone", "--prompts", "1", "--tokens", "4", "--rounds", "2", "--out", str(tmp_path), "--json"]
    try:
        main(argv)
    except SystemExit as exc:  # click exits only on an error here
        assert not exc.code
    data = json.loads(capsys.readouterr().out)
    assert [Path(f).name for f in data["files"]] == ["batch_throughput.json", "batch_throughput.md"]
    rows = data["rows"]
    names = ["none", "ngram", "draft-model", "draft-model alone"]  # n-gram lookup has no forward to share
    assert [(r["batch"], r["drafter"]) for r in rows] == [(b, name) for b in (1, 3) for name in names]
    for row in rows:
        low, high = row["tokens_per_second_ci"]
        assert low <= row["tokens_per_second"] <= high and len(row["rounds"]) == 2
        assert all(r["tokens"] == 4 * 4 for r in row["rounds"])  # four prompts, four tokens each
        assert ("speedup" in row) == (row["drafter"] != "none")
    saved = json.loads(Path(data["results"]).read_text())
    assert saved["config"]["batches"] == [1, 3] and "git_commit" in saved
