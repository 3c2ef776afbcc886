"""One online update of the SpecBlock drafter from the verifier's free feedback (SpecBlock appendix A.3),
and the settings of online adaptation (``AdaptConfig``).

``update_drafter`` copies the newest drafter network and runs a few AdamW steps of the SpecBlock
objective plus ``kl_weight`` times KL(pre-update draft law || updated draft law) on the same rows:

- ``full`` trains every parameter on the full buffer's queries of ``real_engine.feedback``
  (``real_engine.training.specblock.specblock_loss``, blocks unrolled from each query's first buffered
  rejection on; ``START_RULES``).
- ``head`` trains the LM head and the rank head only, on the head buffer's stored states: the
  last-layer state of each slot the verifier cut short, as drafting computed it, against the target's
  law there (the draft KL and the rank loss of ``specblock_loss``, on rows whose context was the
  committed one). It runs no forward of the drafter's body, hence its cost: about a tenth of a full
  update's or less (``real_engine.update_profile.specblock_update_samples`` times both).

``real_engine.adapter.Adapter`` decides when updates run (in a background thread, on its own CUDA
stream on a GPU: ``side_stream``) and puts their result live.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.errors import InputError
from core.names import CLOCKS
from real_engine.drafters.specblock import SpecBlock
from real_engine.drafters.unroll import unroll
from real_engine.feedback import Feedback
from real_engine.training.specblock import draft_kl, rank_labels, specblock_loss

START_RULES = ("rejected", "roots", "all")
"""Where an update's training blocks start in a buffered query, from its first buffered rejection on:
at the buffered rejected positions, at every iteration's root, or at every committed position. Started
only at rejections, the rank head sees almost nothing but misses and learns to give up (smaller trees)."""


@dataclass(frozen=True)
class AdaptConfig:
    """Buffer sizes, update settings, the revert rule and the observation's EWMA weights.

    ``clock`` ``"cpu"`` or ``"thread"`` charges an update the trainer thread's CPU seconds instead of its
    wall seconds (for a shared CPU machine, with one torch thread; the caller then times queries on the
    process's or the decoding thread's CPU clock).
    ``trainer_core`` pins the training thread to one core (the CPU counterpart of the paper's second
    device; the decoding thread is pinned by its caller to the others: ``experiments.adapt.live``). With
    one torch thread each thread runs its own ops, so the two work side by side.
    """

    head_capacity: int = 64  # signals (rejected positions) the head buffer holds
    full_capacity: int = 256  # signals the full buffer holds
    head_steps: int = 4
    full_steps: int = 4
    head_lr: float = 5e-4
    full_lr: float = 5e-4
    kl_weight: float = 1.0
    rank_weight: float = 1.0
    blocks: int = 2  # blocks unrolled from each start in training
    context: int = 128  # committed tokens kept before a query's first buffered rejection
    starts: str = "all"  # where training blocks start: see START_RULES
    top_k: int = 32  # target log-probabilities kept per position
    window: int = 4  # queries per measurement window
    revert_windows: int = 3  # falling windows in a row that revert; 0: never revert on its own
    recent_alpha: float = 0.3
    long_alpha: float = 0.05
    share_alpha: float = 0.1
    clock: str = "wall"
    trainer_core: int | None = None  # the CPU core the training thread runs on (None: where the OS puts it)
    seed: int = 0

    def __post_init__(self) -> None:
        counts = ("head_capacity", "full_capacity", "head_steps", "full_steps", "blocks", "context", "top_k",
                  "window")
        if any(getattr(self, name) < 1 for name in counts) or self.revert_windows < 0:
            raise InputError(f"AdaptConfig: {', '.join(counts)} must be >= 1 and revert_windows >= 0")
        if not (self.head_lr > 0 and self.full_lr > 0 and self.kl_weight >= 0 and self.rank_weight >= 0):
            raise InputError("AdaptConfig: learning rates must be > 0, kl_weight and rank_weight >= 0")
        if not all(0 < a <= 1 for a in (self.recent_alpha, self.long_alpha, self.share_alpha)):
            raise InputError("AdaptConfig: EWMA weights must lie in (0, 1]")
        if self.starts not in START_RULES:
            raise InputError(f"AdaptConfig: unknown starts {self.starts!r}: use {', '.join(START_RULES)}")
        if self.clock not in CLOCKS:
            raise InputError(f"AdaptConfig: unknown clock {self.clock!r}: use one of {', '.join(CLOCKS)}")
        if self.trainer_core is not None and self.trainer_core not in usable_cores():
            raise InputError(f"AdaptConfig: trainer_core {self.trainer_core} is not one of this process's "
                             f"cores {sorted(usable_cores())}: pick one of them or None")


_CORES = frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ())
"""The cores this process could run on when it imported this module, before any thread was pinned (Linux
pins threads one at a time, and a pinned caller would see only its own cores)."""


def usable_cores() -> set[int]:
    """The CPU cores this process may run on (empty where the OS cannot pin threads)."""
    return set(_CORES)


@dataclass(frozen=True)
class UpdateReport:
    """What one update measured (losses are the SpecBlock objective, without the KL term)."""

    kind: str  # "head" or "full"
    positions: int  # signals (rejected positions) trained on
    shares: dict[str, float]  # their domain composition
    steps: int
    seconds: float  # wall seconds of the copy and the optimizer steps
    cpu_seconds: float  # the training thread's CPU seconds for the same
    loss_before: float
    loss_after: float
    kl_first: float  # KL(pre-update || trained) at the first step: 0, the copy equals its reference
    kl: float  # the same KL after the last step
    fill: float = math.nan  # the used buffer's fill when the update started (set by the Adapter)
    windows: int = 0  # query windows trained on (one per buffered query with a start left; head: queries)
    starts: int = 0  # block starts over those windows (head: none)
    rows: int = 0  # committed rows over those windows, context included (head: the stored states)


@contextmanager
def side_stream(device: torch.device) -> Iterator[None]:
    """On a GPU, run the enclosed work on its own CUDA stream, so that it overlaps the target's verify
    forwards on the decode thread's stream, and wait for it before leaving (a network is offered only
    once complete); elsewhere (the CPU's background thread) do nothing."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


def reference_kl(reference_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(reference || current) of the draft laws over all rows ([..., V] each)."""
    ref = reference_logits.float().log_softmax(-1)
    return (ref.exp() * (ref - logits.float().log_softmax(-1))).sum(-1).mean()


@contextmanager
def _lm_head_outputs(net: SpecBlock) -> Iterator[list[torch.Tensor]]:
    """Collect what ``net.lm_head`` returns while inside (``unroll`` calls it once, on every block row)."""
    seen: list[torch.Tensor] = []
    handle = net.lm_head.register_forward_hook(lambda _module, _inputs, out: seen.append(out))
    try:
        yield seen
    finally:
        handle.remove()


def _windows(data: Sequence[tuple[Feedback, Sequence[int]]], config: AdaptConfig, block_size: int,
             generator: torch.Generator, device: torch.device
             ) -> list[tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]:
    """One training window per query: its rows from ``context`` tokens before its first buffered
    rejection, the block starts (``config.starts``) and seeded start slots for the later blocks."""
    out = []
    for feedback, rejected in data:
        first = min(rejected)
        lo = max(0, first - config.context)
        length = feedback.tokens.numel() - lo
        chosen = {"rejected": rejected, "roots": [r for r in feedback.roots if r >= first],
                  "all": range(first, lo + length)}[config.starts]
        starts = sorted({r - lo for r in chosen if r - lo < length - 1})
        if not starts:
            continue
        batch = {"tokens": feedback.tokens[lo:], "features": feedback.features[lo:].float(),
                 "topk_logp": feedback.topk_logp[lo:], "topk_ids": feedback.topk_ids[lo:]}
        # clone(): rows recorded under inference mode become ordinary tensors autograd accepts
        batch = {name: value.clone()[None].to(device) for name, value in batch.items()}
        slots = torch.randint(0, block_size, (config.blocks - 1, len(starts)), generator=generator)
        out.append((batch, torch.tensor(starts, device=device), slots.to(device)))
    return out


Objective = Callable[[SpecBlock, bool], tuple[float, float]]
"""(network, backward) -> (loss without the KL term, KL), averaged over the update's rows; with
``backward`` it also accumulates the gradient of loss + ``kl_weight`` KL."""


def _full_objective(net: SpecBlock, data: Sequence[tuple[Feedback, Sequence[int]]], config: AdaptConfig,
                    seed: int) -> tuple[Objective, dict[str, int]]:
    """``specblock_loss`` on blocks unrolled from the buffered queries (``_windows``), and its sizes."""
    device = net.lm_head.weight.device
    batches = _windows(data, config, net.config.block_size, torch.Generator().manual_seed(seed), device)
    with torch.no_grad():
        references = [unroll(net, b["tokens"], b["features"], s, m).logits for b, s, m in batches]

    def objective(new: SpecBlock, backward: bool) -> tuple[float, float]:
        loss_sum = kl_sum = 0.0
        for (batch, starts, slots), reference in zip(batches, references, strict=True):
            with _lm_head_outputs(new) as seen:
                loss, _ = specblock_loss(new, batch, starts, slots, config.rank_weight)
            kl = reference_kl(reference, seen[-1])
            if backward:
                ((loss + config.kl_weight * kl) / len(batches)).backward()
            loss_sum, kl_sum = loss_sum + float(loss.detach()), kl_sum + float(kl.detach())
        return loss_sum / max(len(batches), 1), kl_sum / max(len(batches), 1)

    sizes = {"windows": len(batches), "starts": sum(int(s.numel()) for _, s, _ in batches),
             "rows": sum(int(b["tokens"].shape[1]) for b, _, _ in batches)}
    return objective, sizes


def _head_objective(net: SpecBlock, data: Sequence[tuple[Feedback, Sequence[int]]], config: AdaptConfig
                    ) -> tuple[Objective, dict[str, int]]:
    """The draft KL and the rank loss of ``specblock_loss`` on the stored states of the buffered head rows
    (no forward of the drafter's body), and its sizes."""
    device, dtype = net.lm_head.weight.device, net.lm_head.weight.dtype
    states, logp, ids = [], [], []
    for feedback, rows in data:
        index = {row: i for i, row in enumerate(feedback.head_rows)}
        states.append(feedback.head_states[[index[row] for row in rows]])
        logp.append(feedback.topk_logp[list(rows)])
        ids.append(feedback.topk_ids[list(rows)])
    if not states:
        return (lambda new, backward: (math.nan, math.nan)), {"windows": 0, "starts": 0, "rows": 0}
    # cat: states recorded under inference mode become an ordinary tensor autograd accepts
    hidden, logp_all, ids_all = (torch.cat(t).to(device) for t in (states, logp, ids))
    hidden = hidden.to(dtype)
    with torch.no_grad():
        reference = net.token_logits(hidden)

    def objective(new: SpecBlock, backward: bool) -> tuple[float, float]:
        logits, buckets = new.heads(hidden)
        labels = rank_labels(logits.detach(), ids_all[:, 0], new.config.edges)
        loss = draft_kl(logits, logp_all, ids_all).mean() + config.rank_weight * F.cross_entropy(
            buckets.float(), labels)
        kl = reference_kl(reference, logits)
        if backward:
            (loss + config.kl_weight * kl).backward()
        return float(loss.detach()), float(kl.detach())

    return objective, {"windows": len(states), "starts": 0, "rows": int(hidden.shape[0])}


def update_drafter(net: SpecBlock, data: Sequence[tuple[Feedback, Sequence[int]]], kind: str,
                   config: AdaptConfig, seed: int = 0) -> tuple[SpecBlock, UpdateReport]:
    """Train a copy of ``net`` on buffered feedback; ``net`` itself is only read (it is the KL reference).

    ``data`` pairs each query's :class:`Feedback` with its buffered signals (``FeedbackBuffer.drain``):
    rejected roots for ``"full"``, which trains every parameter, head rows for ``"head"``, which trains
    the LM head and the rank head on the states stored at those rows. Those are the states of the
    network that drafted the query: the pre-update body's, as the paper's cheap update uses them; since
    a head update leaves the body alone they equal ``net``'s own unless a full update or a revert went
    live since they were drafted. AdamW with gradient clipping at 1, in ``net``'s dtype. Returns the
    trained copy (in eval mode) and what was measured.
    """
    if kind not in ("head", "full"):
        raise InputError(f"unknown update kind {kind!r}: use head or full")
    wall, cpu = time.perf_counter(), time.thread_time()
    new = copy.deepcopy(net, memo={id(net.embed): net.embed}).train()  # the target's embeddings stay shared
    heads = {*new.lm_head.parameters(), *new.rank_head.parameters()}
    trainable = [p for p in new.parameters() if kind == "full" or p in heads]
    for p in new.parameters():
        p.requires_grad_(kind == "full" or p in heads)
    objective, sizes = (_full_objective(net, data, config, seed) if kind == "full"
                        else _head_objective(net, data, config))
    steps = (config.full_steps if kind == "full" else config.head_steps) if sizes["rows"] else 0
    optimizer = torch.optim.AdamW(trainable, lr=config.full_lr if kind == "full" else config.head_lr,
                                  weight_decay=0.0)
    loss_before = kl_first = math.nan
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss, kl = objective(new, True)
        if step == 0:
            loss_before, kl_first = loss, kl
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
    seconds, cpu_seconds = time.perf_counter() - wall, time.thread_time() - cpu
    new.eval()
    with torch.no_grad():
        loss_after, kl = objective(new, False) if steps else (math.nan, math.nan)
    positions = [feedback.domain for feedback, signals in data for _ in signals]
    shares = {d: positions.count(d) / len(positions) for d in sorted(set(positions))}
    return new, UpdateReport(kind, len(positions), shares, steps, seconds, cpu_seconds, loss_before,
                             loss_after, kl_first, kl, **sizes)
