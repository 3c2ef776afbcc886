"""What an online update of a drafter costs: the profile's ``update`` samples (``real_engine.profile``
times them apart from decoding, whose caches a training step would evict)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from core.errors import InputError
from real_engine.drafters.unroll import unroll
from real_engine.feedback import Feedback, FeedbackBuffer
from real_engine.model import Transformer
from real_engine.timing import Bench, random_tokens


def update_samples(model: Transformer, update_batch: tuple[int, int], bench: Bench, seed: int = 0
                   ) -> dict[str, list[float]]:
    """Seconds of one next-token-loss backward plus AdamW step, LM head only vs all parameters (on a
    copy), timed when ``bench`` runs: the update cost of a plain LM drafter (no SpecBlock profiled)."""
    device = model.lm_head.weight.device
    sequences, length = update_batch
    length = min(length, model.args.max_position_embeddings)
    batch = random_tokens(sequences * length, model.args.vocab_size,
                          torch.Generator().manual_seed(seed)).view(sequences, length).to(device)
    out: dict[str, list[float]] = {}
    for kind in ("head", "full"):
        net = copy.deepcopy(model).train()
        net.requires_grad_(kind == "full")
        net.lm_head.weight.requires_grad_(True)
        optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-5)

        def step(net: Transformer = net, optimizer: torch.optim.Optimizer = optimizer) -> None:
            logits = net(batch).logits[:, :-1].float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        out[kind] = bench.add(step, inference=False)
    return out


NEW_TOKENS = 48  # generated tokens of a synthetic feedback query (as adapt_live's); the rest is prompt
REJECTED_EVERY = 3  # a cut-short draft every third generated position (about what the engine buffers)


def specblock_update_samples(target: Transformer, net: Any, update_batch: tuple[int, int], bench: Bench,
                             seed: int = 0, feedback: Sequence[Any] | None = None
                             ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    """Seconds of one online update of the SpecBlock drafter as the engine runs it
    (``real_engine.adapt.update_drafter``, ``AdaptConfig`` defaults), head and full, each on a buffer
    filled to its capacity, then on a buffer of its newest query alone; and the query windows each full
    buffer held (the update trains one per query). The feedback is ``feedback`` (served queries'
    ``real_engine.feedback.Feedback``, oldest first: the buffers take the newest, as the engine's do) or
    else synthetic: queries of ``update_batch[1]`` random tokens whose last ``NEW_TOKENS`` are
    roots, every ``REJECTED_EVERY``-th rejected, with the target's own features and top-k
    log-probabilities; each rejection is a signal of both kinds (so that both buffers fill), its head
    state the drafter's own at the root (block 1's slot 0). Timed when ``bench`` runs."""
    from real_engine.adapt import AdaptConfig, update_drafter  # needs rich, absent on gpu_check's machine

    config, device = AdaptConfig(seed=seed), target.lm_head.weight.device
    if feedback is None:
        length = min(update_batch[1], target.args.max_position_embeddings)
        roots = tuple(range(max(length - NEW_TOKENS, 0), length - 1))
        rejected = roots[::REJECTED_EVERY]
        gen = torch.Generator().manual_seed(seed)

        def query() -> Feedback:
            tokens = random_tokens(length, target.args.vocab_size, gen).to(device)
            with torch.inference_mode():
                out = target(tokens[None])
                top = out.logits[0].float().log_softmax(-1).topk(min(config.top_k, out.logits.shape[-1]), -1)
                features = out.features[0].to(torch.bfloat16)
                one = torch.tensor(rejected[:1], device=device)  # prefix rows are all that is read
                prefix = unroll(net, tokens[None], features[None].float(), one, one.new_zeros(0, 1)).prefix
            return Feedback("synthetic", tokens.cpu(), features.cpu(), top.values.cpu(), top.indices.cpu(),
                            roots, rejected, rejected, rejected, prefix[0, list(rejected)].cpu())

        count = -(-config.full_capacity // max(len(rejected), 1))
        feedback = [query() for _ in range(count)]
    for kind in ("head", "full"):
        if not any(f.signals(kind) for f in feedback):
            raise InputError(f"the feedback has no rejected position for a {kind} update to train on: serve "
                             "more queries")
    out: dict[str, list[float]] = {}
    single: dict[str, list[float]] = {}
    windows: dict[str, int] = {}
    for kind, capacity in (("head", config.head_capacity), ("full", config.full_capacity)):
        buffer = FeedbackBuffer(capacity, kind)
        for f in feedback:
            buffer.add(f)
        data = buffer.drain()
        out[kind] = bench.add(lambda data=data, kind=kind: update_drafter(net, data, kind, config, seed),
                              inference=False)
        single[kind] = bench.add(
            lambda one=data[-1:], kind=kind: update_drafter(net, one, kind, config, seed), inference=False)
        windows[kind] = len(data)
    return out, single, windows
