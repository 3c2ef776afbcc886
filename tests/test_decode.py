"""The decode loop and the first drafters: greedy equality, exact drafter state, losslessness, stopping."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from core.errors import InputError
from real_engine.decode import generate, make_drafter
from real_engine.drafters.draft_model import DraftModelDrafter
from real_engine.drafters.ngram import NgramIndex
from real_engine.model import ModelArgs, Output, Transformer, load_model
from real_engine.tree import DraftTree
from real_engine.warp import Sampling, warp

ALL = ("greedy", "token", "block", "rrs", "gbv", "seqbv")
SINGLE = ("greedy", "token", "block", "rrs")
# (drafter, draft shape, verifiers): gbv needs i.i.d. paths, gbv and seqbv equal-length unmerged paths.
CONFIGS = [("ngram", {}, (*SINGLE, "seqbv")), ("draft-model", {"depth": 3}, ALL),
           ("draft-model", {"width": 3, "budget": 8, "depth": 3}, SINGLE),
           ("draft-model", {"paths": 2, "depth": 3}, ALL),
           ("draft-model", {"depth": 5, "min_confidence": 0.3}, SINGLE),
           ("draft-model", {"depth": 5, "staged": 1}, SINGLE),
           ("draft-model", {"depth": 4, "staged": 4}, SINGLE),
           ("draft-model", {"depth": 5, "staged": 1, "lookup": 2}, SINGLE),
           ("draft-model", {"depth": 3, "lookup": 1}, SINGLE)]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(1, 96, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(20)]


@pytest.fixture(scope="module")
def vanilla(target: Transformer, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    return [generate(target, prompt, max_new_tokens=NEW_TOKENS).tokens for prompt in prompts]


@pytest.mark.parametrize(("name", "shape", "verifier"),
                         [(name, shape, v) for name, shape, vs in CONFIGS for v in vs])
def test_greedy_speculative_equals_vanilla(name: str, shape: dict, verifier: str, target: Transformer,
                                           draft: Transformer, prompts: list[list[int]],
                                           vanilla: list[tuple[int, ...]]) -> None:
    accepted = 0
    for prompt, expected in zip(prompts, vanilla, strict=True):
        drafter = make_drafter(name, target, draft, **shape)
        out = generate(target, prompt, drafter=drafter, verifier=verifier, max_new_tokens=NEW_TOKENS)
        assert out.tokens == expected
        assert out.stats.new_tokens == NEW_TOKENS
        assert out.stats.tau == pytest.approx(NEW_TOKENS / out.stats.iterations)
        accepted += sum(out.stats.accepted)
    assert accepted > 0


def test_vanilla_stats() -> None:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8)).eval()
    stats = generate(model, [1, 2, 3], max_new_tokens=5).stats
    assert (stats.new_tokens, stats.iterations, stats.tau, stats.accepted) == (5, 5, 1.0, (0,) * 5)
    assert 0 <= stats.overhead_seconds <= stats.seconds


class Recorder:
    """Wraps a drafter and records each proposal with the committed context it was drafted from."""

    def __init__(self, inner: DraftModelDrafter) -> None:
        self.inner, self.proposals, self.max_depths = inner, [], []

    @property
    def model_seconds(self) -> float:
        return self.inner.model_seconds

    def begin(self, prompt: torch.Tensor, target: Output, *args: object) -> None:
        self.context = prompt.tolist()
        self.inner.begin(prompt, target, *args)

    def propose(self, max_depth: int) -> DraftTree:
        self.tree = self.inner.propose(max_depth)
        self.proposals.append((list(self.context), self.tree))
        self.max_depths.append(max_depth)
        return self.tree

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        self.context += [int(self.tree.tokens[n]) for n in path] + [token]
        self.inner.accept(path, token, target)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chain_stops_where_its_law_falls_below_min_confidence(temperature: float, target: Transformer,
                                                               draft: Transformer) -> None:
    """Each proposal drafts past position d only when position d's law (the softmax at T = 0, the warped
    q otherwise) puts at least ``min_confidence`` on its top token; 0 never stops early, 1 always does."""
    sampling = Sampling(temperature)
    verifier = "greedy" if sampling.greedy else "block"

    def run(m: float) -> tuple[list[int], list[float]]:
        recorder = Recorder(make_drafter("draft-model", target, draft, depth=4, min_confidence=m))
        generate(target, [5, 6, 7], drafter=recorder, verifier=verifier, sampling=sampling, max_new_tokens=24,
                 seed=1)
        drafted, seen = [], []
        for (_, tree), cap in zip(recorder.proposals, recorder.max_depths, strict=True):
            # position d's law is q's row d - 1; greedy q is one-hot, so there the softmax of the drafted
            # argmax, the node's confidence
            tops = (tree.confidence[1:] if sampling.greedy else tree.q[:-1].max(-1).values).tolist()
            n = tree.size - 1  # the last proposals are also cut by the tokens left (cap)
            assert all(top >= m for top in tops[:n - 1])  # no stop before the last token
            assert n == min(4, cap) or tops[n - 1] < m  # the stop, or the full depth
            drafted.append(n)
            seen += tops
        return drafted, seen

    never, tops = run(0.0)
    assert set(never[:4]) == {4}
    assert set(run(1.0)[0]) == {1}
    assert len(set(run(float(torch.tensor(tops).median()))[0])) > 1


def ancestry(tree: DraftTree, node: int) -> list[int]:
    parents, path = tree.parents.tolist(), []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("shape", [{}, {"width": 3, "budget": 12}, {"paths": 3}, {"staged": 1},
                                   {"staged": 3}, {"staged": 1, "lookup": 2}, {"lookup": 1}])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@torch.inference_mode()
def test_draft_model_laws_equal_a_fresh_forward(shape: dict, temperature: float, target: Transformer,
                                                draft: Transformer) -> None:
    """Every drafted-from law equals the draft model run afresh on the committed context plus the node's
    path: the draft cache stays exact across keep, backlog and tree masks, step after step (lookup
    proposals, which run no forward, leave a backlog; they are checked in their own test)."""
    sampling = Sampling(temperature)
    recorder = Recorder(make_drafter("draft-model", target, draft, depth=3, **shape))
    verifier = "greedy" if sampling.greedy else "rrs"
    prompt = [5, 6, 7, 5, 6] if "lookup" in shape else [5, 6, 7]  # a repeat: one lookup proposal at least
    generate(target, prompt, drafter=recorder, verifier=verifier, sampling=sampling, max_new_tokens=16)
    topk_ranking = "width" in shape and sampling.greedy
    checked = 0
    lookup = shape.get("lookup", 4)  # a match length no context reaches: no lookup proposal
    proposals = [(c, t) for c, t in recorder.proposals if _index(c).find()[1] < lookup]
    if "lookup" in shape:
        assert 0 < len(proposals) < len(recorder.proposals)
    for context, tree in proposals:
        assert tree.tokens[0] == context[-1]
        with_children = set(tree.parents.tolist()[1:])
        for node in range(tree.size):
            if node not in with_children:
                continue
            sequence = torch.tensor(context + tree.tokens[ancestry(tree, node)].tolist())
            logits = draft(sequence[None]).logits[0, -1]
            law = logits.softmax(-1) if topk_ranking else warp(logits, sampling)
            torch.testing.assert_close(tree.q[node], law, atol=1e-5, rtol=0)
            checked += 1
    if "staged" in shape or "lookup" in shape:  # staged chains end where the guesses fail: at the root
        assert checked >= sum(tree.size > 1 for _, tree in proposals)
    else:
        assert checked > 2 * len(proposals)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_staged_chain_is_the_plain_chain_in_fewer_forwards(temperature: float, target: Transformer,
                                                             draft: Transformer) -> None:
    """Guessing ahead within as many forwards as the depth changes no draft and no output, only the
    number of draft-model forwards; with one forward the chain follows the n-gram guesses and ends at the
    draft model's first token off them."""
    sampling = Sampling(temperature)
    verifier = "greedy" if sampling.greedy else "block"
    runs = {}
    calls = [0]
    hook = draft.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        for staged in (0, 4, 1):
            recorder = Recorder(make_drafter("draft-model", target, draft, depth=4, staged=staged or None))
            calls[0] = 0
            out = generate(target, [5, 6, 7, 8] * 3, drafter=recorder, verifier=verifier, sampling=sampling,
                           max_new_tokens=40, seed=1)
            runs[staged] = (recorder.proposals, calls[0], out.tokens)
    finally:
        hook.remove()
    (plain, plain_calls, tokens), (same, same_calls, same_tokens) = runs[0], runs[4]
    assert same_tokens == tokens and len(same) == len(plain)
    for (_, a), (_, b) in zip(plain, same, strict=True):
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.q, b.q, atol=1e-5, rtol=0)
    # fewer forwards where a guess held (at T = 1 the guesses fail more)
    assert same_calls < plain_calls if sampling.greedy else same_calls <= plain_calls
    capped, capped_calls, _ = runs[1]
    assert capped_calls == sum(tree.size > 1 for _, tree in capped)  # one forward per proposal
    lengths = set()
    for context, tree in capped:
        index = _index(context)
        guesses, drafted = index.lookup(3), tree.tokens[1:].tolist()
        n = len(drafted)
        if n == 0:  # the last step: no token left to draft
            continue
        assert drafted[:n - 1] == guesses[:n - 1]
        assert n == 4 or n - 1 == len(guesses) or drafted[n - 1] != guesses[n - 1]
        lengths.add(n)
    assert 1 in lengths and max(lengths) > 1  # guesses failed at the root in some chains, held in others


def test_staged_drafting_takes_a_chain_and_a_deployed_one_keeps_to_chains(target: Transformer,
                                                                         draft: Transformer,
                                                                         tmp_path: Path) -> None:
    with pytest.raises(InputError, match="takes a chain"):
        make_drafter("draft-model", target, draft, width=2, staged=1)
    for bad in ({"paths": 2, "lookup": 1}, {"lookup": 4}):
        with pytest.raises(InputError, match="lookup proposals take a chain and a match length of 1 to 3"):
            make_drafter("draft-model", target, draft, **bad)
    (tmp_path / "drafting.json").write_text(json.dumps({"shape": {"depth": 6, "width": 1, "staged": 1,
                                                                  "lookup": 3}}))
    chain = make_drafter("draft-model", target, draft, folder=tmp_path)
    assert (chain.shape, chain.depth, chain.staged, chain.lookup) == ("chain", 6, 1, 3)
    tree = make_drafter("draft-model", target, draft, folder=tmp_path, width=3)  # the user's tree, unstaged
    assert (tree.shape, tree.staged, tree.lookup) == ("tree", 0, 0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lookup_proposals_are_the_ngram_chain_without_a_forward(temperature: float, target: Transformer,
                                                                 draft: Transformer) -> None:
    """Where the context's last ``lookup`` tokens occurred before, a proposal is the n-gram drafter's
    chain (point masses, top-k rule) and runs no draft-model forward; elsewhere the draft model drafts,
    once per proposal with ``staged=1``. The LM head never runs on the backlog's rows."""
    sampling = Sampling(temperature)
    verifier = "greedy" if sampling.greedy else "block"
    calls, head_rows = [0], []
    hooks = [draft.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)),
             draft.lm_head.register_forward_hook(lambda _m, args, _o: head_rows.append(args[0].shape[0]))]
    prompt = [5, 6, 7, 8, 9, 10, 11] * 2 + [40, 41, 5, 6]
    try:
        recorder = Recorder(make_drafter("draft-model", target, draft, depth=4, staged=1, lookup=2))
        generate(target, prompt, drafter=recorder, verifier=verifier, sampling=sampling, max_new_tokens=40,
                 seed=1)
    finally:
        for hook in hooks:
            hook.remove()
    kinds = []
    for context, tree in recorder.proposals:
        index = _index(context)
        start, match = index.find()
        kinds.append(match >= 2)
        if match >= 2:
            assert tree.child_rule == "topk"
            assert tree.tokens[1:].tolist() == index.tokens[start:start + 4][:tree.size - 1]
            torch.testing.assert_close(tree.q[:-1], F.one_hot(tree.tokens[1:], tree.q.shape[1]).float())
        else:
            assert tree.child_rule == "iid"
    assert any(kinds) and not all(kinds)
    model = sum(not k and tree.size > 1 for k, (_, tree) in zip(kinds, recorder.proposals, strict=True))
    assert calls[0] == model  # one forward per model proposal (the last drafts nothing), none per lookup
    assert head_rows[0] < len(prompt) - 1  # the first forward runs the whole prompt as backlog


@pytest.fixture(scope="module")
def tiny(build: Callable[..., Path],
         tmp_path_factory: pytest.TempPathFactory) -> tuple[Transformer, Transformer]:
    """A 4-token target and a perturbed copy as its draft model (total variation ~0.2 on two tokens)."""
    kw = {"vocab": 4, "hidden": 16, "layers": 1, "init": 0.2, "seed": 10}
    return (load_model(build(tmp_path_factory.mktemp("tiny_target"), **kw)),
            load_model(build(tmp_path_factory.mktemp("tiny_draft"), noise=0.05, **kw)))


@torch.inference_mode()
def pair_law(model: Transformer, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """Exact law [V, V] of the first two sampled tokens after ``prompt``."""
    vocab = model.args.vocab_size
    sequences = torch.tensor([[*prompt, a] for a in range(vocab)])
    logits = model(sequences).logits
    first = warp(logits[0, -2], sampling)
    return first[:, None] * warp(logits[:, -1], sampling)


def pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square p-value of ``counts`` under ``law`` (0 if a zero-probability outcome occurred)."""
    if counts[law == 0].sum() > 0:
        return 0.0
    counts, law = counts[law > 0].double(), law[law > 0].double()
    return float(chisquare(counts.numpy(), (law / law.sum() * counts.sum()).numpy()).pvalue)


STATISTICAL = [("none", {}, "token", 1.0), ("draft-model", {}, "token", 1.0),
               ("draft-model", {}, "block", 0.9), ("draft-model", {}, "rrs", 1.0),
               ("draft-model", {"width": 2, "budget": 4}, "rrs", 1.0),
               ("draft-model", {"staged": 1}, "block", 0.9),
               ("draft-model", {"staged": 1, "lookup": 1}, "block", 0.9),
               ("draft-model", {"lookup": 2}, "token", 1.0),
               ("draft-model", {"paths": 3}, "gbv", 1.0), ("draft-model", {"paths": 3}, "seqbv", 0.9)]


@pytest.mark.parametrize(("name", "shape", "verifier", "top_p"), STATISTICAL)
def test_sampled_continuations_follow_the_target(name: str, shape: dict, verifier: str, top_p: float,
                                                 tiny: tuple[Transformer, Transformer]) -> None:
    """Through the real loop at temperature 1: the first two tokens' frequencies match the target's
    exact law, and with this many runs they would reject the draft model's law (the test has power)."""
    target, draft = tiny
    prompt, runs, sampling = [1, 3, 0], 300, Sampling(1.0, top_p=top_p)
    counts = torch.zeros(4, 4)
    accepted = 0
    for seed in range(runs):
        drafter = make_drafter(name, target, draft, depth=2, **shape)
        out = generate(target, prompt, drafter=drafter, verifier=verifier, sampling=sampling,
                       max_new_tokens=3, seed=seed)
        counts[out.tokens[0], out.tokens[1]] += 1
        accepted += sum(out.stats.accepted)
    assert pvalue(counts, pair_law(target, prompt, sampling)) > 1e-4
    assert pvalue(counts, pair_law(draft, prompt, sampling)) < 1e-4
    assert name == "none" or accepted > 0


@pytest.fixture(scope="module")
def small(build: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Transformer:
    """A 12-token target: the smallest vocabulary SpecBlock's rank summary takes."""
    folder = build(tmp_path_factory.mktemp("small"), vocab=12, hidden=32, layers=1, init=0.3, seed=11)
    return load_model(folder)


def sampled_chain(kind: str, target: Transformer) -> object:
    """A random trained drafter for ``target`` drafting a chain: SpecBlock with every bucket's children
    capped at 1 (its rank head biased to continue), or EAGLE-style with top-k 1."""
    from real_engine.drafters.eagle import EagleDrafter, TreeShape, new_eagle
    from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter

    if kind == "eagle":
        shape = TreeShape(depth=3, top_k=1, total_tokens=3)
        return EagleDrafter(new_eagle(target, seed=3).eval(), target, shape)
    net = SpecBlock.for_target(target, seed=3).eval()
    with torch.no_grad():
        net.rank_head.down.bias.copy_(torch.tensor([20.0, 0.0, 0.0, -20.0]))
    return SpecBlockDrafter(net, blocks=2, budget=6, children=(1, 1, 1, 0))


@pytest.mark.parametrize("kind", ["specblock", "eagle"])
@torch.inference_mode()
def test_a_trained_drafters_chain_is_sampled_from_its_law_at_temperature_one(kind: str, small: Transformer
                                                                              ) -> None:
    """A chain of a trained drafter at T > 0 draws its tokens from ``q`` (child rule iid): the first
    drafted token's frequencies match ``q``'s row at the root; at T = 0 it is the top-1 chain."""
    prompt = torch.tensor([1, 3, 0])
    counts, law = torch.zeros(12), None
    for seed in range(400):
        drafter = sampled_chain(kind, small)
        generator = torch.Generator().manual_seed(seed)
        drafter.begin(prompt, small(prompt[None, :-1]), Sampling(1.0), generator, 16)
        tree = drafter.propose(3)
        assert tree.child_rule == "iid" and tree.parents.tolist() == list(range(-1, tree.size - 1))
        assert tree.size == 4
        law = tree.q[0] if law is None else law
        torch.testing.assert_close(tree.q[0], law)  # the same law every time, only the draw changes
        counts[tree.tokens[1]] += 1
    assert pvalue(counts, law) > 1e-4 and int((counts > 0).sum()) > 2
    drafter = sampled_chain(kind, small)
    drafter.begin(prompt, small(prompt[None, :-1]), Sampling(), torch.Generator(), 16)
    tree = drafter.propose(3)
    assert tree.child_rule == "topk" and int(tree.tokens[1]) == int(law.argmax())


@pytest.mark.parametrize(("kind", "verifier"), [("specblock", "block"), ("specblock", "token"),
                                                ("eagle", "block"), ("eagle", "rrs")])
def test_trained_drafters_sampled_chains_follow_the_target(kind: str, verifier: str,
                                                            small: Transformer) -> None:
    """Through the real loop at temperature 1, the first and the second token's frequencies match the
    target's exact marginal laws."""
    prompt, sampling = [1, 3, 0], Sampling(1.0)
    counts, accepted = torch.zeros(12, 12), 0
    for seed in range(600):
        out = generate(small, prompt, drafter=sampled_chain(kind, small), verifier=verifier,
                       sampling=sampling, max_new_tokens=3, seed=seed)
        counts[out.tokens[0], out.tokens[1]] += 1
        accepted += sum(out.stats.accepted)
    law = pair_law(small, prompt, sampling)
    assert pvalue(counts.sum(1), law.sum(1)) > 1e-4 and pvalue(counts.sum(0), law.sum(0)) > 1e-4
    assert accepted > 0


@pytest.mark.parametrize("name", ["none", "ngram", "draft-model"])
def test_stops_at_eos_and_max_new_tokens(name: str, target: Transformer, draft: Transformer,
                                         prompts: list[list[int]], vanilla: list[tuple[int, ...]]) -> None:
    prompt, expected = prompts[0], vanilla[0]
    stop = next(i for i in range(2, NEW_TOKENS) if expected[i] not in expected[:i])
    out = generate(target, prompt, drafter=make_drafter(name, target, draft), max_new_tokens=NEW_TOKENS,
                   eos_id=expected[stop])
    assert out.tokens == expected[:stop + 1]
    for limit in range(1, 8):
        streamed: list[int] = []
        out = generate(target, prompt, drafter=make_drafter(name, target, draft, depth=4),
                       max_new_tokens=limit, on_tokens=streamed.extend)
        assert out.tokens == expected[:limit] == tuple(streamed)


def _index(tokens: list[int], max_ngram: int = 3, min_ngram: int = 1) -> NgramIndex:
    index = NgramIndex(max_ngram, min_ngram)
    index.extend(tokens)
    return index


def test_ngram_lookup_takes_the_latest_longest_match() -> None:
    assert _index([1, 2, 3, 4, 1, 2, 5, 6, 9, 1, 2]).lookup(3) == [5, 6, 9]  # [1, 2] last at 4; no [9, 1, 2]
    # the trigram [1, 2, 8] at 4 beats the later bigram [2, 8] at 9
    assert _index([5, 2, 8, 6, 1, 2, 8, 4, 3, 2, 8, 9, 1, 2, 8]).lookup(2) == [4, 3]
    assert _index([1, 2, 3]).lookup(3) == []
    assert _index([1, 2, 3, 1, 2]).lookup(3, tail=[3]) == [1, 2]  # a draft's tokens extend the n-gram


@pytest.mark.parametrize("seed", range(4))
def test_ngram_index_matches_a_scan_of_the_whole_context(seed: int) -> None:
    """The incremental index answers as a scan for the latest earlier occurrence does, as it grows."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4, 120).tolist()
    max_ngram, min_ngram = 3, 1 + seed % 2
    index = NgramIndex(max_ngram, min_ngram)
    for i, token in enumerate(tokens):
        index.extend([token])
        tail = tokens[i + 1:i + 1 + seed]  # tokens beyond the index, as a draft's
        context = tokens[:i + 1] + tail
        expected: list[int] = []
        match = 0
        for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
            hits = [s for s in range(i + 1 - n) if context[s:s + n] == context[-n:]]
            if hits:
                expected, match = tokens[:i + 1][hits[-1] + n:hits[-1] + n + 3], n
                break
        assert index.lookup(3, tail) == expected
        assert index.find(tail)[1] == match


def test_warp() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert warp(logits, Sampling()).tolist() == [1.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(warp(logits, Sampling(2.0)), (logits / 2).softmax(-1))
    assert (warp(logits, Sampling(1.0, top_k=2)) > 0).tolist() == [True, True, False, False]
    probs = logits.softmax(-1)  # 0.64, 0.24, 0.09, 0.03
    assert (warp(logits, Sampling(1.0, top_p=0.64)) > 0).tolist() == [True, False, False, False]
    assert (warp(logits, Sampling(1.0, top_p=0.65)) > 0).tolist() == [True, True, False, False]
    torch.testing.assert_close(warp(logits, Sampling(1.0, top_p=0.9)), torch.cat((probs[:3] / probs[:3].sum(),
                                                                                   torch.zeros(1))))
    for bad in ({"temperature": -1.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(InputError):
            Sampling(**bad)


def test_bad_input_raises_input_error(target: Transformer, draft: Transformer, other_vocab_dir: Path) -> None:
    with pytest.raises(InputError, match="empty"):
        generate(target, [])
    with pytest.raises(InputError, match="context"):
        generate(target, [1] * 250, max_new_tokens=10)
    with pytest.raises(InputError, match="vocabulary"):
        make_drafter("draft-model", target, load_model(other_vocab_dir))
    with pytest.raises(InputError, match="vocabulary"):
        generate(target, [1, 2], drafter=DraftModelDrafter(load_model(other_vocab_dir)))
    with pytest.raises(InputError, match="unknown verifier"):
        generate(target, [1, 2], drafter=make_drafter("ngram", target), verifier="nope")
    with pytest.raises(InputError, match="temperature 0"):
        generate(target, [1, 2], drafter=make_drafter("ngram", target), sampling=Sampling(1.0))
    with pytest.raises(InputError, match="unknown drafter"):
        make_drafter("nope", target)
    with pytest.raises(InputError, match="specblock train eagle"):
        make_drafter("eagle", target, folder=other_vocab_dir)  # a model folder, not an EAGLE drafter's
    with pytest.raises(InputError, match="token ids"):
        generate(target, [1, 96])


@pytest.mark.parametrize("shape", [{}, {"width": 3, "budget": 8}, {"paths": 2}])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@torch.inference_mode()
def test_a_reduced_vocabulary_drafts_only_its_tokens(shape: dict, temperature: float, target: Transformer,
                                                     draft: Transformer, tmp_path: Path) -> None:
    """With ``vocab`` every shape drafts from laws that are the draft model's, renormalised over the
    ``vocab`` first tokens of its folder's order and zero elsewhere; greedy output stays vanilla's."""
    order = torch.randperm(96, generator=torch.Generator().manual_seed(0)).tolist()
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"ids": order}))
    allowed = torch.zeros(96, dtype=torch.bool)
    allowed[order[:24]] = True
    sampling = Sampling(temperature)
    drafter = make_drafter("draft-model", target, draft, folder=tmp_path, depth=3, vocab=24, **shape)
    recorder = Recorder(drafter)
    verifier = "greedy" if sampling.greedy else "rrs" if "width" in shape else "token"
    out = generate(target, [5, 6, 7], drafter=recorder, verifier=verifier, sampling=sampling,
                   max_new_tokens=16)
    if sampling.greedy:
        assert out.tokens == generate(target, [5, 6, 7], max_new_tokens=16).tokens
    for context, tree in recorder.proposals:
        assert bool(allowed[tree.tokens[1:]].all())
        with_children = set(tree.parents.tolist()[1:])
        for node in with_children:
            sequence = torch.tensor(context + tree.tokens[ancestry(tree, node)].tolist())
            logits = draft(sequence[None]).logits[0, -1].masked_fill(~allowed, float("-inf"))
            law = logits.softmax(-1) if "width" in shape and sampling.greedy else warp(logits, sampling)
            torch.testing.assert_close(tree.q[node], law, atol=1e-5, rtol=0)
            assert float(tree.q[node][~allowed].abs().sum()) == 0.0


def test_a_reduced_vocabulary_needs_a_valid_token_order(target: Transformer, draft: Transformer,
                                                        tmp_path: Path) -> None:
    with pytest.raises(InputError, match="draft model's folder"):
        make_drafter("draft-model", target, draft, vocab=8)
    with pytest.raises(InputError, match=r"no draft_vocab\.json"):
        make_drafter("draft-model", target, draft, folder=tmp_path, vocab=8)
    for bad in ('{"ids": [1, 1, 2]}', '{"ids": "abc"}', "[", '{"order": [1]}'):
        (tmp_path / "draft_vocab.json").write_text(bad)
        with pytest.raises(InputError, match="token order"):
            make_drafter("draft-model", target, draft, folder=tmp_path, vocab=1)
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"ids": [3, 200, 5]}))
    with pytest.raises(InputError, match="1 to 3"):
        make_drafter("draft-model", target, draft, folder=tmp_path, vocab=4)
    with pytest.raises(InputError, match="below 96"):
        make_drafter("draft-model", target, draft, folder=tmp_path, vocab=2)


