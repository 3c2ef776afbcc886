"""The decode loop: prefill, vanilla decoding and speculative decoding (draft -> verify -> commit).

The target's cache holds every committed token but the last, the *root*. A speculative step asks the
drafter for a tree hanging from the root, runs the root and the tree through the target in one
forward (tree mask, depth positions), warps the logits into ``p``, verifies, keeps the root and the
accepted path in the cache and tells the drafter; the emitted token is the next root. Vanilla
decoding runs the root alone and samples from ``p``. Both stop at ``max_new_tokens`` or after EOS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from real_engine.drafters.base import Drafter, clock
from real_engine.drafters.draft_model import CHAIN_OPTIONS, DraftModelDrafter, load_vocab
from real_engine.drafters.ngram import NgramDrafter
from real_engine.drafters.trained import TRAINED, deployed_shape, load_trained
from real_engine.kv_cache import KVCache
from real_engine.model import Output, Transformer
from real_engine.tree import DraftTree
from real_engine.verify import VERIFIERS, TorchSampler, verify
from real_engine.warp import Sampling, warp

DRAFTERS = ("none", "ngram", "draft-model", "specblock", "eagle", "medusa")
GREEDY = Sampling()
MAX_TREE_NODES = 512  # scratch positions the target cache reserves for a draft tree


@dataclass(frozen=True)
class Stats:
    """Measurements of one ``generate`` call (seconds exclude the ``on_tokens`` callback)."""

    new_tokens: int
    iterations: int  # target forwards after prefill
    tau: float  # new tokens per target forward, bonus included (vanilla: 1.0)
    seconds: float
    tokens_per_second: float
    prefill_seconds: float  # target prefill and drafter start
    draft_seconds: float  # the drafter's propose and accept calls
    verify_seconds: float  # target tree forwards, warping, verification and cache compaction
    overhead_seconds: float  # wall time outside target and draft model forwards
    accepted: tuple[int, ...]  # draft tokens accepted at each iteration
    tree_sizes: tuple[int, ...]  # nodes (root included) the target ran at each iteration

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Iteration:
    """One speculative iteration, as ``generate``'s ``on_iteration`` callback sees it (for traces)."""

    tree: DraftTree  # the proposal the target verified
    path: tuple[int, ...]  # accepted node indices, root excluded
    token: int  # the emitted token after the path
    context_length: int  # tokens in the target's KV cache when the iteration started
    draft_seconds: float  # the drafter's propose and accept calls of this iteration
    verify_seconds: float  # the target's tree forward, warping, verification and cache compaction


@dataclass(frozen=True)
class Generation:
    """The new tokens of one call and its stats."""

    tokens: tuple[int, ...]
    stats: Stats


def prefill(model: Transformer, cache: KVCache, tokens: torch.Tensor) -> Output:
    """Run ``tokens`` ([T]) into ``cache`` and commit them; ``T = 0`` gives empty rows."""
    if tokens.numel() == 0:
        a, w = model.args, model.lm_head.weight
        return Output(w.new_zeros(1, 0, a.vocab_size), w.new_zeros(1, 0, 3 * a.hidden_size),
                      w.new_zeros(1, 0, a.hidden_size))
    out = model(tokens[None], cache=cache)
    cache.commit()
    return out


def make_drafter(name: str, target: Transformer, draft: Transformer | None = None, *,
                 folder: str | Path | None = None, depth: int | None = None, width: int | None = None,
                 budget: int | None = None, paths: int | None = None, max_ngram: int | None = None,
                 blocks: int | None = None, min_confidence: float | None = None, vocab: int | None = None,
                 staged: int | None = None, lookup: int | None = None, deployed: bool = True
                 ) -> Drafter | None:
    """The drafter called ``name`` (None for ``"none"``): the one way every command builds a drafter.

    ``ngram`` drafts ``depth`` (4) tokens with n-grams up to ``max_ngram`` (3). ``draft-model`` drafts
    with ``draft``: a top-k tree ``width`` wide of ``budget`` (16) nodes when ``width > 1``, ``paths``
    sampled paths when ``paths > 1``, otherwise a chain, all ``depth`` (4) deep, a chain stopping early
    where its law's top probability falls below ``min_confidence`` (0: never), drafting only the ``vocab``
    most frequent tokens of its folder's token order when given, a chain guessing ahead by n-gram lookup
    within ``staged`` forwards when given, a proposal by the lookup alone where the context's last
    ``lookup`` tokens occurred before (``DraftModelDrafter``); given the draft model's ``folder``,
    options left None take its deployed shape (``drafting.json``). ``specblock``,
    ``eagle`` and ``medusa`` load the weights in ``folder`` (default ``data/models/<name>``), keeping
    their deployed shape (``deployed=False``: their trained settings) where an option is None
    (``drafters.trained.load_trained``). Options a drafter does not use are ignored.
    """
    options = {"depth": depth, "width": width, "budget": budget, "paths": paths, "max_ngram": max_ngram,
               "blocks": blocks, "vocab": vocab, "staged": staged, "lookup": lookup}
    low = next((f"{k}={v}" for k, v in options.items() if v is not None and v < 1), None)
    if low is not None:
        raise InputError(f"drafter option {low} is below 1: give a positive value")
    if min_confidence is not None and not 0 <= min_confidence <= 1:
        raise InputError(f"minimum draft confidence {min_confidence}: give a probability in [0, 1]")
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter(depth or 4, max_ngram or 3)
    if name == "draft-model":
        if draft is None:
            raise InputError("the draft-model drafter needs a draft model: pass one (--draft-model DIR)")
        if draft.args.vocab_size != target.args.vocab_size:
            raise InputError(f"the draft model's vocabulary ({draft.args.vocab_size}) differs from the "
                             f"target's ({target.args.vocab_size}): use a draft model with the target's "
                             "tokenizer")
        if deployed and folder is not None and paths is None:
            saved = deployed_shape(name, folder)
            if (width or 1) > 1:  # a tree asked for: a deployed chain's options do not apply to it
                saved = {k: v for k, v in saved.items() if k not in CHAIN_OPTIONS}
            given = {"depth": depth, "width": width, "budget": budget, "min_confidence": min_confidence,
                     "vocab": vocab, "staged": staged, "lookup": lookup}
            depth, width, budget, min_confidence, vocab, staged, lookup = (
                saved.get(k) if v is None else v for k, v in given.items())
        width, paths = width or 1, paths or 1
        if width > 1 and paths > 1:
            raise InputError("choose a top-k tree (tree width > 1) or sampled paths (paths > 1), not both")
        shape = "paths" if paths > 1 else "tree" if width > 1 else "chain"
        if vocab is not None and folder is None:
            raise InputError("a reduced drafting vocabulary needs the draft model's folder (its token "
                             "order): pass the folder, or drop the vocab option")
        ids = None if vocab is None else load_vocab(folder, int(vocab))
        return DraftModelDrafter(draft, shape, depth or 4, width, budget or 16, paths, min_confidence or 0.0,
                                 ids, staged or 0, lookup or 0)
    if name in TRAINED:
        return load_trained(name, target, folder, depth=depth, width=width, budget=budget, blocks=blocks,
                            deployed=deployed)
    raise InputError(f"unknown drafter {name!r}: use one of {', '.join(DRAFTERS)}")


def _check(model: Transformer, prompt: torch.Tensor, drafter: Drafter | None, verifier: str,
           sampling: Sampling, max_new_tokens: int) -> None:
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise InputError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise InputError(f"max new tokens is {max_new_tokens}: give at least 1")
    if int(prompt.min()) < 0 or int(prompt.max()) >= model.args.vocab_size:
        raise InputError(f"prompt token ids must lie in [0, {model.args.vocab_size}): "
                         "use the model's tokenizer")
    need, limit = prompt.numel() + max_new_tokens, model.args.max_position_embeddings
    if need > limit:
        raise InputError(f"the prompt ({prompt.numel()} tokens) plus {max_new_tokens} new tokens exceeds the "
                         f"model's context of {limit}: shorten the prompt or lower max new tokens")
    if drafter is not None and verifier not in VERIFIERS:
        raise InputError(f"unknown verifier {verifier!r}: use one of {', '.join(VERIFIERS)}")
    if drafter is not None and verifier == "greedy" and not sampling.greedy:
        raise InputError("the greedy verifier is for temperature 0: use token, block, rrs, gbv or seqbv")


def _vanilla_step(model: Transformer, cache: KVCache, root: int, sampling: Sampling,
                  sampler: TorchSampler) -> tuple[Output, tuple[int, ...], int, float]:
    """Run the root alone and sample the next token: (output, empty path, token, forward seconds)."""
    device = cache.k.device
    start = clock(device)
    out = model(torch.tensor([[root]], device=device), cache=cache)
    cache.commit()
    forward = clock(device) - start
    logits = out.logits[0, -1]
    token = int(logits.argmax()) if sampling.greedy else sampler.categorical(warp(logits, sampling))
    return out, (), token, forward


def _speculative_step(model: Transformer, cache: KVCache, tree: DraftTree, verifier: str, sampling: Sampling,
                      sampler: TorchSampler) -> tuple[Output, tuple[int, ...], int, float]:
    """Run the root and the tree in one forward, verify, keep the accepted path in the cache."""
    if tree.size > MAX_TREE_NODES:
        raise InputError(f"a draft tree of {tree.size} nodes exceeds {MAX_TREE_NODES}: "
                         "lower the tree budget, width or depth")
    device = cache.k.device
    start = clock(device)
    chain = int(tree.depths[-1]) == tree.size - 1  # a chain's tree mask is the causal one the model builds
    out = model(tree.tokens.to(device)[None], tree.positions(cache.length).to(device), cache,
                None if chain else tree.mask().to(device))
    forward = clock(device) - start
    logits = out.logits[0]
    result = verify(verifier, tree, logits if verifier == "greedy" else warp(logits, sampling), sampler)
    cache.keep([0, *result.path])
    return out, result.path, result.token, forward


@torch.inference_mode()
def generate(model: Transformer, prompt: torch.Tensor | list[int], *, drafter: Drafter | None = None,
             verifier: str = "greedy", sampling: Sampling = GREEDY, max_new_tokens: int = 64,
             eos_id: int | None = None, seed: int = 0,
             on_tokens: Callable[[list[int]], None] | None = None,
             on_iteration: Callable[[Iteration], None] | None = None) -> Generation:
    """Generate up to ``max_new_tokens`` after ``prompt``: vanilla without a drafter, speculative with one.

    Stops after ``eos_id`` (which is emitted). ``on_tokens`` receives each step's new tokens (for
    streaming); ``on_iteration`` each speculative iteration (for traces). Neither's time is counted.
    Every random draw comes from one generator seeded with ``seed``.
    """
    device = model.lm_head.weight.device
    prompt = torch.as_tensor(prompt, dtype=torch.long).to(device)
    _check(model, prompt, drafter, verifier, sampling, max_new_tokens)
    generator = torch.Generator(device=device).manual_seed(seed)
    sampler = TorchSampler(generator)
    max_length = prompt.numel() + max_new_tokens
    cache = model.new_cache(max_length + (MAX_TREE_NODES if drafter is not None else 0))
    start = clock(device)
    target = prefill(model, cache, prompt[:-1])
    forward_seconds = clock(device) - start
    draft_model_start = drafter.model_seconds if drafter is not None else 0.0
    if drafter is not None:
        drafter.begin(prompt, target, sampling, generator, max_length)
    prefill_seconds = clock(device) - start
    root, emitted, accepted, sizes = int(prompt[-1]), [], [], []
    draft_seconds = verify_seconds = callback_seconds = 0.0
    while len(emitted) < max_new_tokens:
        remaining, context = max_new_tokens - len(emitted), cache.length
        t0 = clock(device)
        if drafter is None:
            t1 = t0
            out, path, token, forward = _vanilla_step(model, cache, root, sampling, sampler)
            new = [token]
            sizes.append(1)
        else:
            tree = drafter.propose(remaining - 1)
            t1 = clock(device)
            if tree.size == 1:  # nothing drafted (the last token, or a length policy chose 0): plain step
                out, path, token, forward = _vanilla_step(model, cache, root, sampling, sampler)
            else:
                out, path, token, forward = _speculative_step(model, cache, tree, verifier, sampling, sampler)
            drafted = tree.tokens.tolist()
            new = [*(drafted[i] for i in path), token]
            sizes.append(tree.size)
        t2 = clock(device)
        forward_seconds += forward
        verify_seconds += t2 - t1
        accepted.append(len(path))
        stop = eos_id is not None and eos_id in new
        if stop:
            new = new[:new.index(eos_id) + 1]
        new = new[:remaining]
        emitted.extend(new)
        stop = stop or len(emitted) >= max_new_tokens
        if drafter is not None and not stop:
            n = len(path) + 1  # the target's rows of the root and the accepted path: a prefix for a chain
            rows = slice(n) if tuple(path) == tuple(range(1, n)) else torch.tensor([0, *path], device=device)
            drafter.accept(path, token, Output(*(x[:, rows] for x in out)))
        t3 = clock(device)
        draft_seconds += (t1 - t0) + (t3 - t2)
        if on_iteration is not None and drafter is not None:
            on_iteration(Iteration(tree, path, token, context, (t1 - t0) + (t3 - t2), t2 - t1))
        if on_tokens is not None:
            on_tokens(new)
        if on_tokens is not None or on_iteration is not None:
            callback_seconds += clock(device) - t3
        if stop:
            break
        root = token
    seconds = clock(device) - start - callback_seconds
    if drafter is not None:
        forward_seconds += drafter.model_seconds - draft_model_start
    stats = Stats(
        new_tokens=len(emitted), iterations=len(accepted), tau=len(emitted) / len(accepted), seconds=seconds,
        tokens_per_second=len(emitted) / seconds, prefill_seconds=prefill_seconds,
        draft_seconds=draft_seconds, verify_seconds=verify_seconds,
        overhead_seconds=max(seconds - forward_seconds, 0.0), accepted=tuple(accepted),
        tree_sizes=tuple(sizes))
    return Generation(tuple(emitted), stats)
