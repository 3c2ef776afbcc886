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
from core.names import VANILLA, draft_options, drafter_spec
from core.verifiers import sampling_verifiers, verifier_spec
from real_engine.drafters.base import Drafter, clock, prompt_rows
from real_engine.kv_cache import KVCache
from real_engine.model import Output, Transformer
from real_engine.tree import DraftTree
from real_engine.verify import TorchSampler, verify
from real_engine.warp import Sampling, warp

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


def prefill(model: Transformer, cache: KVCache, tokens: torch.Tensor, last: int | None = 1) -> Output:
    """Run ``tokens`` ([T]) into ``cache`` and commit them; ``T = 0`` gives empty rows. The logits are the
    ``last`` positions' only (None: all): the decode loop runs the prompt's last token (the root) in its
    first step, and a drafter reads the prompt's logits only where ``prompt_rows`` says so."""
    if tokens.numel() == 0:
        a, w = model.args, model.lm_head.weight
        return Output(w.new_zeros(1, 0, a.vocab_size), w.new_zeros(1, 0, 3 * a.hidden_size),
                      w.new_zeros(1, 0, a.hidden_size))
    out = model(tokens[None], cache=cache, last=last)
    cache.commit()
    return out


def make_drafter(name: str, target: Transformer, draft: Transformer | None = None, *,
                 folder: str | Path | None = None, deployed: bool = True, **options: float | None
                 ) -> Drafter | None:
    """The drafter called ``name`` (None for ``"none"``, vanilla decoding): the one way every command
    builds a drafter.

    Looks ``name`` up in the registry (``core.names``), checks the options (each a count >= 1, or a
    probability for a probability option such as ``min_confidence``; one the drafter does not take is
    refused, one left None is dropped) and calls the builder its spec names with ``draft`` (the draft
    model), ``folder`` (where its weights or deployed shape lie) and ``deployed`` (False: ignore the
    deployed shape, ``drafting.json``, and keep the trained settings).
    """
    for option, value in options.items():
        known = draft_options.get(option)
        if value is not None and known is not None and known.probability and not 0 <= value <= 1:
            raise InputError(f"{option} {value} ({known.flag}): give a probability in [0, 1]")
        if value is not None and not (known is not None and known.probability) and value < 1:
            raise InputError(f"drafter option {option}={value} is below 1: give a positive value")
    if name == VANILLA:
        return None
    spec = drafter_spec(name)
    stray = next((k for k, v in options.items() if v is not None and k not in spec.options), None)
    if stray is not None:
        raise InputError(f"the {name} drafter takes no option {stray}: drop it (it takes "
                         f"{', '.join(spec.options) or 'no options'})")
    given = {k: v for k, v in options.items() if v is not None}
    return spec.load()(target, draft, folder, deployed, **given)


def check_request(model: Transformer, prompt: torch.Tensor, drafter: Drafter | None, verifier: str,
           sampling: Sampling, max_new_tokens: int) -> None:
    """InputError naming what makes a request unservable: an empty or out-of-vocabulary prompt, too many
    tokens for the context, an unknown verifier, or the greedy verifier with sampling."""
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
    if drafter is not None and verifier_spec(verifier).greedy and not sampling.greedy:
        *others, last = sampling_verifiers()
        raise InputError(f"the {verifier} verifier is for temperature 0: use {', '.join(others)} or {last}")


def settle(cache: KVCache, logits: torch.Tensor, tree: DraftTree | None, verifier: str, sampling: Sampling,
           sampler: TorchSampler) -> tuple[tuple[int, ...], int]:
    """The accepted path and the emitted token from the target's ``logits`` ([T, V]) over the root alone
    (``tree`` None: sampled from ``p``) or the root and ``tree`` (verified); the cache, whose pending
    region holds those T tokens, keeps the root and the path."""
    if tree is None:
        cache.commit()
        row = logits[-1]
        return (), int(row.argmax()) if sampling.greedy else sampler.categorical(warp(row, sampling))
    greedy = verifier_spec(verifier).greedy  # argmax matching reads the raw logits
    result = verify(verifier, tree, logits if greedy else warp(logits, sampling), sampler)
    cache.keep([0, *result.path])
    return result.path, result.token


def cut_at_eos(new: list[int], eos_id: int | None, remaining: int) -> tuple[list[int], bool]:
    """An iteration's ``new`` tokens cut after ``eos_id`` and to ``remaining``; whether EOS came."""
    stop = eos_id is not None and eos_id in new
    if stop:
        new = new[:new.index(eos_id) + 1]
    return new[:remaining], stop


def vanilla_step(model: Transformer, cache: KVCache, root: int, sampling: Sampling,
                  sampler: TorchSampler) -> tuple[Output, tuple[int, ...], int, float]:
    """Run the root alone and sample the next token: (output, empty path, token, forward seconds)."""
    device = cache.k.device
    start = clock(device)
    out = model(torch.tensor([[root]], device=device), cache=cache)
    forward = clock(device) - start
    path, token = settle(cache, out.logits[0], None, "greedy", sampling, sampler)
    return out, path, token, forward


def speculative_step(model: Transformer, cache: KVCache, tree: DraftTree, verifier: str, sampling: Sampling,
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
    path, token = settle(cache, out.logits[0], tree, verifier, sampling, sampler)
    return out, path, token, forward


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
    check_request(model, prompt, drafter, verifier, sampling, max_new_tokens)
    generator = torch.Generator(device=device).manual_seed(seed)
    sampler = TorchSampler(generator)
    max_length = prompt.numel() + max_new_tokens
    cache = model.new_cache(max_length + (MAX_TREE_NODES if drafter is not None else 0))
    start = clock(device)
    target = prefill(model, cache, prompt[:-1], prompt_rows(drafter))
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
            out, path, token, forward = vanilla_step(model, cache, root, sampling, sampler)
            new = [token]
            sizes.append(1)
        else:
            tree = drafter.propose(remaining - 1)
            t1 = clock(device)
            if tree.size == 1:  # nothing drafted (the last token, or a length policy chose 0): plain step
                out, path, token, forward = vanilla_step(model, cache, root, sampling, sampler)
            else:
                out, path, token, forward = speculative_step(model, cache, tree, verifier, sampling, sampler)
            drafted = tree.tokens.tolist()
            new = [*(drafted[i] for i in path), token]
            sizes.append(tree.size)
        t2 = clock(device)
        forward_seconds += forward
        verify_seconds += t2 - t1
        accepted.append(len(path))
        new, stop = cut_at_eos(new, eos_id, remaining)
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
