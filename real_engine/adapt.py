"""Online adaptation of the SpecBlock drafter from the verifier's free feedback (SpecBlock appendix A.3).

Verification tells, at every committed position, what the target predicted there. A
:class:`FeedbackDrafter` wraps the live drafter (same ``Drafter`` protocol and the same proposals, so
emitted tokens are unchanged) and keeps, per query, every committed token with the target's features
and top-k log-probabilities (the fields ``drafter_data`` stores for training), and the root position of
each iteration whose accepted length fell short of the drafted depth: a *rejected position*.

An :class:`Adapter` runs the lifecycle an adaptation policy drives once per query:

- **Buffers** (:class:`FeedbackBuffer`): each rejected position, with its query's rows, enters a head
  buffer and a full buffer of fixed capacities (the oldest leave first); ``s_trig`` counts rejected
  positions buffered since the last training event.
- **Updates** (``apply(HEAD | FULL)``): a background thread copies the newest drafter network and runs
  a few AdamW steps of the SpecBlock objective (``train_specblock.specblock_loss`` on the buffered
  queries, from each one's first buffered rejection on; ``START_RULES``) plus ``kl_weight`` times
  KL(pre-update draft law || updated draft law) on the same block rows. ``head`` trains the LM head
  and the rank head only, ``full`` every parameter; a head update drains the head buffer, a full
  update both (as ``AdaptStream`` does). An adapting drafter drafts the whole vocabulary: a reduced
  one, fixed offline from the training corpus, lost most of what the updates learnt on a shifted
  stream (see ``Adapter``). On a GPU the thread's
  work runs on its own CUDA stream (``side_stream``), overlapping the target's verify forwards;
  ``drafters.base.clock`` waits only for the decode thread's stream, so decode timings exclude it.
- **Swap**: the trained copy is handed over under a lock and goes live at the next ``begin``, by
  replacing the drafter's network reference. A live network is never modified, so a query sees one set
  of weights from its first to its last draft, whatever the trainer is doing.
- **Revert**: after a swap, measurement windows of ``window`` queries open; when mean tau falls across
  ``revert_windows`` windows in a row (the first compared with the last good drafter's window) the last
  good drafter goes live again; a window that does not fall makes the live drafter the last good one.
  A policy with its own revert rule (the cost-aware bandit) calls ``revert``/``checkpoint`` instead.
- **Observation and outcome**: ``features`` builds the policy's observation with
  ``policies.features.adapt_features``; ``info`` holds ``policies.adaptation.ADAPT_INFO_KEYS``.

:class:`StreamServer` serves a stream's queries one call at a time under an adaptation policy
(greedy decoding); :func:`run_stream` runs one over a whole stream and returns one row per query.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from core.errors import InputError
from policies.adaptation import ACTIONS, ADAPT_INFO_KEYS, FULL, HEAD, SKIP
from policies.base import Policy
from policies.features import adapt_features
from real_engine.decode import Iteration, Stats, generate
from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter, unroll, with_draft_vocab
from real_engine.model import Output, Transformer
from real_engine.train_specblock import specblock_loss
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

CLOCKS = ("wall", "cpu")
START_RULES = ("rejected", "roots", "all")
"""Where an update's training blocks start in a buffered query, from its first buffered rejection on:
at the buffered rejected positions, at every iteration's root, or at every committed position. Started
only at rejections, the rank head sees almost nothing but misses and learns to give up (smaller trees)."""


@dataclass(frozen=True)
class AdaptConfig:
    """Buffer sizes, update settings, the revert rule and the observation's EWMA weights.

    ``clock`` ``"cpu"`` charges an update the trainer thread's CPU seconds instead of its wall seconds
    (for a shared CPU machine, with one torch thread; the caller then times queries on the same clock).
    """

    head_capacity: int = 64  # rejected positions the head buffer holds
    full_capacity: int = 256  # rejected positions the full buffer holds
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


@dataclass(frozen=True)
class Feedback:
    """One served query as training data, in ``drafter_data``'s layout (row ``t`` follows token ``t``).

    The last token (the final root) has no target row yet: its row is zeros, which training never reads
    (it conditions no later row and predicts past the end).
    """

    domain: str
    tokens: torch.Tensor  # [T] long: every committed token
    features: torch.Tensor  # [T, 3 H_target] bfloat16: the target's low/mid/high features
    topk_logp: torch.Tensor  # [T, k] float32: the target's top-k log-probabilities
    topk_ids: torch.Tensor  # [T, k] long
    roots: tuple[int, ...]  # root position of every iteration the drafter heard the verdict of
    rejected: tuple[int, ...]  # those whose draft was cut short


class FeedbackDrafter:
    """A SpecBlock drafter that records each query's feedback and takes new weights between queries.

    Proposals are the wrapped drafter's own. ``offer`` queues a network; the next ``begin`` makes it
    live (``syncs`` counts these swaps). ``take`` hands over the finished query's :class:`Feedback`.
    """

    def __init__(self, inner: SpecBlockDrafter, top_k: int = 32) -> None:
        self.inner, self.top_k = inner, top_k
        self.syncs = 0
        self._lock = threading.Lock()
        self._pending: SpecBlock | None = None
        self._tree: DraftTree | None = None
        self._tokens: list[int] = []
        self._rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._roots: list[int] = []
        self._rejected: list[int] = []

    @property
    def model_seconds(self) -> float:
        """The wrapped drafter's model time."""
        return self.inner.model_seconds

    @property
    def net(self) -> SpecBlock:
        """The live network."""
        return self.inner.net

    def newest(self) -> SpecBlock:
        """The network the next query will use: the queued one, else the live one."""
        with self._lock:
            return self._pending if self._pending is not None else self.inner.net

    def offer(self, net: SpecBlock) -> None:
        """Queue ``net`` to go live at the next ``begin`` (replacing anything queued before)."""
        with self._lock:
            self._pending = net

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Swap in a queued network, start recording, start the wrapped drafter."""
        with self._lock:
            if self._pending is not None:
                self.inner.net, self._pending = self._pending, None
                self.syncs += 1
        self._tokens, self._rows, self._roots, self._rejected = prompt.tolist(), [], [], []
        self._keep(target)
        self.inner.begin(prompt, target, sampling, generator, max_length)

    def propose(self, max_depth: int) -> DraftTree:
        """The wrapped drafter's tree (remembered, to read the accepted tokens)."""
        self._tree = self.inner.propose(max_depth)
        return self._tree

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Pass the verdict on; record the committed tokens, the target's rows and a rejection."""
        self.inner.accept(path, token, target)
        tree = self._tree
        assert tree is not None, "accept before propose"
        drafted = int(tree.depths.max()) if tree.size > 1 else 0
        self._roots.append(len(self._tokens) - 1)
        if len(path) < drafted:
            self._rejected.append(len(self._tokens) - 1)
        self._tokens.extend(tree.tokens[list(path)].tolist())
        self._tokens.append(int(token))
        self._keep(target)

    def _keep(self, target: Output) -> None:
        """Store the target's rows: features as bfloat16, the top-k of its log-probabilities."""
        if target.logits.shape[1] == 0:
            return
        k = min(self.top_k, target.logits.shape[-1])
        top = target.logits[0].float().log_softmax(-1).topk(k, dim=-1)
        self._rows.append((target.features[0].to("cpu", torch.bfloat16), top.values.cpu(), top.indices.cpu()))

    def take(self, domain: str) -> Feedback | None:
        """The query just served as :class:`Feedback` (None before any query); recording restarts."""
        if not self._tokens:
            return None
        features, logp, ids = (torch.cat([r[i] for r in self._rows]) for i in range(3))
        pad = len(self._tokens) - features.shape[0]
        feedback = Feedback(
            domain, torch.tensor(self._tokens, dtype=torch.long),
            torch.cat((features, features.new_zeros(pad, features.shape[1]))),
            torch.cat((logp, logp.new_zeros(pad, logp.shape[1]))),
            torch.cat((ids, ids.new_zeros(pad, ids.shape[1]))).long(),
            tuple(self._roots), tuple(self._rejected))
        self._tokens, self._rows, self._roots, self._rejected = [], [], [], []
        return feedback


class FeedbackBuffer:
    """Rejected positions of served queries (each with its query's rows), oldest out past ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[tuple[Feedback, int]] = deque()

    def __len__(self) -> int:
        return len(self.items)

    @property
    def fill(self) -> float:
        """Buffered positions as a fraction of the capacity."""
        return min(len(self.items) / self.capacity, 1.0)

    def add(self, feedback: Feedback) -> None:
        """Buffer every rejected position of ``feedback``."""
        self.items.extend((feedback, root) for root in feedback.rejected)
        while len(self.items) > self.capacity:
            self.items.popleft()

    def drain(self) -> list[tuple[Feedback, list[int]]]:
        """Empty the buffer: its positions grouped by query, oldest query first."""
        groups: dict[int, tuple[Feedback, list[int]]] = {}
        for feedback, root in self.items:
            groups.setdefault(id(feedback), (feedback, []))[1].append(root)
        self.items.clear()
        return list(groups.values())


@dataclass(frozen=True)
class UpdateReport:
    """What one update measured (losses are the SpecBlock objective, without the KL term)."""

    kind: str  # "head" or "full"
    positions: int  # rejected positions trained on
    shares: dict[str, float]  # their domain composition
    steps: int
    seconds: float  # wall seconds of the copy and the optimizer steps
    cpu_seconds: float  # the training thread's CPU seconds for the same
    loss_before: float
    loss_after: float
    kl_first: float  # KL(pre-update || trained) at the first step: 0, the copy equals its reference
    kl: float  # the same KL after the last step
    fill: float = math.nan  # the used buffer's fill when the update started (set by the Adapter)
    windows: int = 0  # query windows trained on (one per buffered query with a start left)
    starts: int = 0  # block starts over those windows
    rows: int = 0  # committed rows over those windows (context before each first rejection included)


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


def update_drafter(net: SpecBlock, data: Sequence[tuple[Feedback, Sequence[int]]], kind: str,
                   config: AdaptConfig, seed: int = 0) -> tuple[SpecBlock, UpdateReport]:
    """Train a copy of ``net`` on buffered feedback; ``net`` itself is only read (it is the KL reference).

    ``data`` pairs each query's :class:`Feedback` with its buffered rejected positions. ``kind``
    ``"head"`` trains the LM head and the rank head, ``"full"`` every parameter; AdamW with gradient
    clipping at 1, in ``net``'s dtype. Returns the trained copy (in eval mode) and what was measured.
    """
    if kind not in ("head", "full"):
        raise InputError(f"unknown update kind {kind!r}: use head or full")
    wall, cpu = time.perf_counter(), time.thread_time()
    new = copy.deepcopy(net, memo={id(net.embed): net.embed}).train()  # the target's embeddings stay shared
    heads = {*new.lm_head.parameters(), *new.rank_head.parameters()}
    trainable = [p for p in new.parameters() if kind == "full" or p in heads]
    for p in new.parameters():
        p.requires_grad_(kind == "full" or p in heads)
    device = net.lm_head.weight.device
    batches = _windows(data, config, net.config.block_size, torch.Generator().manual_seed(seed), device)
    with torch.no_grad():
        references = [unroll(net, b["tokens"], b["features"], s, m).blocks.logits for b, s, m in batches]
    steps = config.full_steps if kind == "full" else config.head_steps
    optimizer = torch.optim.AdamW(trainable, lr=config.full_lr if kind == "full" else config.head_lr,
                                  weight_decay=0.0)

    def objective(backward: bool) -> tuple[float, float]:
        loss_sum = kl_sum = 0.0
        for (batch, starts, slots), reference in zip(batches, references, strict=True):
            with _lm_head_outputs(new) as seen:
                loss, _ = specblock_loss(new, batch, starts, slots, config.rank_weight)
            kl = reference_kl(reference, seen[-1])
            if backward:
                ((loss + config.kl_weight * kl) / len(batches)).backward()
            loss_sum, kl_sum = loss_sum + float(loss.detach()), kl_sum + float(kl.detach())
        return loss_sum / max(len(batches), 1), kl_sum / max(len(batches), 1)

    loss_before = kl_first = math.nan
    for step in range(steps if batches else 0):
        optimizer.zero_grad(set_to_none=True)
        loss, kl = objective(backward=True)
        if step == 0:
            loss_before, kl_first = loss, kl
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
    seconds, cpu_seconds = time.perf_counter() - wall, time.thread_time() - cpu
    new.eval()
    with torch.no_grad():
        loss_after, kl = objective(backward=False) if batches else (math.nan, math.nan)
    positions = [feedback.domain for feedback, roots in data for _ in roots]
    shares = {d: positions.count(d) / len(positions) for d in sorted(set(positions))}
    return new, UpdateReport(kind, len(positions), shares, steps if batches else 0, seconds, cpu_seconds,
                             loss_before, loss_after, kl_first, kl, windows=len(batches),
                             starts=sum(int(s.numel()) for _, s, _ in batches),
                             rows=sum(int(b["tokens"].shape[1]) for b, _, _ in batches))


class Adapter:
    """Online adaptation of a live SpecBlock drafter, driven once per query (see the module doc).

    Decode with ``adapter.drafter``; after each query call ``end_query``. Before each query a policy
    reads ``features()`` and its action goes to ``apply``; ``info()`` describes the last query. The
    drafter's network drafts the whole vocabulary from then on (a reduced one is dropped, in place).
    """

    def __init__(self, drafter: SpecBlockDrafter, config: AdaptConfig = AdaptConfig(),
                 domains: Sequence[str] = ()) -> None:
        self.config, self.domains = config, tuple(domains)
        # Draft the whole vocabulary: on the shipped 208-query shifted stream, SpecBlock's 2,048-token
        # vocabulary kept the cost-aware bandit's late shifted tau at +0.01 over never (+0.06 when each
        # update added its windows' target tokens), the whole one at +0.22.
        with_draft_vocab(drafter.net, None)
        self.drafter = FeedbackDrafter(drafter, config.top_k)
        self.head, self.full = FeedbackBuffer(config.head_capacity), FeedbackBuffer(config.full_capacity)
        self.trigger = 0  # s_trig: rejected positions buffered since the last training event
        self.since = 0  # queries since the last training event
        self.queries = self.updates = self.reverts = 0
        self.recent = self.long = 0.0
        self.shares = np.zeros(len(self.domains))
        self.reports: list[UpdateReport] = []  # every finished update, in order
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._unreported: list[UpdateReport] = []
        self._epoch = 0  # bumped by revert: a result trained before it is dropped
        self._good = drafter.net  # the last good network (live networks are never modified)
        self._syncs_seen = 0
        self._window: list[float] = []
        self._good_tau = self._last_tau = math.nan
        self._drops = 0
        self._info = dict.fromkeys(ADAPT_INFO_KEYS, 0.0)

    def features(self, domain_shares: np.ndarray | None = None) -> np.ndarray:
        """The policy's observation (``adapt_features``); domain shares are tracked unless given."""
        with self._lock:
            shares = self.shares if domain_shares is None else domain_shares
            return adapt_features(self.head.fill, self.full.fill, float(self.trigger), self.recent,
                                  self.recent - self.long, self.since, shares)

    def info(self) -> dict[str, float]:
        """``ADAPT_INFO_KEYS`` of the last query served."""
        return dict(self._info)

    def apply(self, action: int) -> bool:
        """Start the update ``action`` asks for, in a background thread; False when nothing started
        (skip, an empty buffer, or an update still running)."""
        if action not in (SKIP, HEAD, FULL):
            raise InputError(f"unknown adaptation action {action!r}: use 0 (skip), 1 (head) or 2 (full)")
        if action == SKIP:
            return False
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            buffer = self.full if action == FULL else self.head
            if not len(buffer):
                return False
            fill, data = buffer.fill, buffer.drain()
            if action == FULL:
                self.head.drain()
            self.trigger = self.since = 0
            self.updates += 1
            args = (self.drafter.newest(), data, ACTIONS[action], fill, self._epoch,
                    self.config.seed * 1_000_003 + self.updates)
            self._thread = threading.Thread(target=self._train, args=args, name="adapt", daemon=True)
            self._thread.start()
        return True

    def _train(self, net: SpecBlock, data: list[tuple[Feedback, list[int]]], kind: str, fill: float,
               epoch: int, seed: int) -> None:
        try:
            with side_stream(net.lm_head.weight.device):
                new, report = update_drafter(net, data, kind, self.config, seed)
        except BaseException as exc:  # re-raised in the caller's thread by wait() / end_query()
            self._error = exc
            return
        report = replace(report, fill=fill)
        with self._lock:
            self.reports.append(report)
            self._unreported.append(report)
            if epoch == self._epoch and report.steps:
                self.drafter.offer(new)

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the drafter update failed") from error

    def wait(self) -> UpdateReport | None:
        """Block until a running update has finished; the last finished update's report."""
        thread = self._thread
        if thread is not None:
            thread.join()
        self._raise()
        return self.reports[-1] if self.reports else None

    def checkpoint(self) -> None:
        """Make the live drafter the last good one."""
        self._good = self.drafter.net

    def revert(self) -> None:
        """Put the last good drafter live again at the next query (a running update's result is dropped)."""
        with self._lock:
            self._epoch += 1
            self.reverts += 1
            self.drafter.offer(self._good)
            self._window, self._drops, self._last_tau = [], 0, math.nan

    def end_query(self, stats: Stats, domain: str, seconds: float | None = None) -> dict[str, float]:
        """Book the query just served with ``adapter.drafter``: buffer its feedback, update the observation's
        statistics and the revert rule; ``seconds`` overrides ``stats.seconds`` (another clock).
        Returns ``info()``."""
        self._raise()
        if self.domains and domain not in self.domains:
            raise InputError(f"unknown domain {domain!r}: the adapter tracks {', '.join(self.domains)}")
        feedback = self.drafter.take(domain)
        seconds = stats.seconds if seconds is None else seconds
        with self._lock:
            if feedback is not None:
                self.head.add(feedback)
                self.full.add(feedback)
                self.trigger += len(feedback.rejected)
            done, self._unreported = self._unreported, []
            first, a, tau = self.queries == 0, self.config, stats.tau
            self.recent = tau if first else (1 - a.recent_alpha) * self.recent + a.recent_alpha * tau
            self.long = tau if first else (1 - a.long_alpha) * self.long + a.long_alpha * tau
            if self.domains:
                onehot = np.eye(len(self.domains))[self.domains.index(domain)]
                self.shares = onehot if first else (1 - a.share_alpha) * self.shares + a.share_alpha * onehot
            self.queries += 1
            self.since += 1
        cost = sum(r.cpu_seconds if self.config.clock == "cpu" else r.seconds for r in done)
        self._info = {"tokens_per_second": stats.new_tokens / seconds, "tau": stats.tau,
                      "query_seconds": seconds, "update_seconds": cost}
        self._watch(stats.tau)
        return self.info()

    def _watch(self, tau: float) -> None:
        """The revert rule over measurement windows (see the module doc)."""
        if self.config.revert_windows == 0:
            return
        if self.drafter.syncs != self._syncs_seen:  # new weights went live: a fresh window opens
            self._syncs_seen, self._window = self.drafter.syncs, []
        self._window.append(tau)
        if len(self._window) < self.config.window:
            return
        mean, self._window = float(np.mean(self._window)), []
        if self.drafter.net is self._good:
            self._good_tau, self._drops = mean, 0
            return
        previous = self._good_tau if self._drops == 0 else self._last_tau
        self._last_tau = mean
        if math.isnan(previous) or mean >= previous:
            self.checkpoint()
            self._good_tau, self._drops = mean, 0
        else:
            self._drops += 1
            if self._drops >= self.config.revert_windows:
                self.revert()


class StreamServer:
    """Serves a stream's queries one call at a time (greedy) while ``policy`` adapts ``drafter``.

    Before each query the policy acts on ``Adapter.features()``; an update it starts trains in the
    background and, unless ``overlap``, is waited for before the query (its seconds are then the
    query's ``update_seconds``; with ``overlap`` it trains while later queries decode). With
    ``config.clock == "cpu"`` queries are timed in process CPU seconds. A policy with ``should_revert``
    (the cost-aware bandit) decides reverts and checkpoints; for the others the adapter's own rule
    does. ``on_iteration(query index, iteration)`` sees each speculative iteration. Servers keep no
    shared state, so several may take turns on one stream; note that another server's updates evict
    what decoding keeps cached (measured: about 9% slower queries on this CPU).
    """

    def __init__(self, target: Transformer, drafter: SpecBlockDrafter, domains: Sequence[str], policy: Policy,
                 *, config: AdaptConfig = AdaptConfig(), max_new_tokens: int = 48, overlap: bool = False,
                 eos_id: int | None = None, seed: int = 0,
                 on_iteration: Callable[[int, Iteration], None] | None = None) -> None:
        if config.clock == "cpu" and overlap:
            raise InputError("the cpu clock needs updates waited for (overlap=False): process CPU time "
                             "would count the trainer's work in the queries")
        self.target, self.policy, self.config = target, policy, config
        self.max_new_tokens, self.overlap, self.eos_id, self.seed = max_new_tokens, overlap, eos_id, seed
        self.own_rule = hasattr(policy, "should_revert")
        self.adapter = Adapter(drafter, replace(config, revert_windows=0) if self.own_rule else config,
                               sorted(set(domains)))
        self.on_iteration = on_iteration
        self._callback = 0.0  # CPU seconds of the current query's on_iteration calls (not its own)

    def serve(self, index: int, domain: str, prompt: Sequence[int]) -> dict[str, Any]:
        """Let the policy act, then serve query ``index``: its row (domain, action, update run before it
        with its report, tau, tokens/s, seconds, new tokens, revert and checkpoint flags)."""
        adapter, policy = self.adapter, self.policy
        obs = adapter.features()
        action = policy.act(obs)
        started = adapter.apply(action)
        report = adapter.wait() if started and not self.overlap else None
        reverts = adapter.reverts
        self._callback = 0.0
        hook = None if self.on_iteration is None else lambda iteration: self._timed(index, iteration)
        cpu = time.process_time()
        generation = generate(self.target, list(prompt), drafter=adapter.drafter,
                              max_new_tokens=self.max_new_tokens, eos_id=self.eos_id, seed=self.seed + index,
                              on_iteration=hook)
        seconds = time.process_time() - cpu - self._callback if self.config.clock == "cpu" else None
        info = adapter.end_query(generation.stats, domain, seconds)
        policy.observe(obs, action, -(info["query_seconds"] + info["update_seconds"]), info)
        if self.own_rule and policy.should_revert():  # type: ignore[attr-defined]
            adapter.revert()
            policy.acknowledge_revert()  # type: ignore[attr-defined]
        checkpoint = bool(getattr(policy, "checkpoint_good", False))
        if checkpoint:
            adapter.checkpoint()
        return {"query": index, "domain": domain, "action": ACTIONS[action],
                "update": None if report is None or not started else asdict(report),
                **info, "new_tokens": generation.stats.new_tokens, "iterations": generation.stats.iterations,
                "wall_seconds": generation.stats.seconds, "syncs": adapter.drafter.syncs,
                "reverted": adapter.reverts > reverts, "checkpoint": checkpoint,
                "head_fill": adapter.head.fill, "full_fill": adapter.full.fill, "trigger": adapter.trigger}

    def close(self) -> None:
        """Wait for an update still training (with ``overlap``)."""
        self.adapter.wait()

    def _timed(self, index: int, iteration: Iteration) -> None:
        began = time.process_time()
        self.on_iteration(index, iteration)  # type: ignore[misc]
        self._callback += time.process_time() - began


def run_stream(target: Transformer, drafter: SpecBlockDrafter, prompts: Sequence[tuple[str, Sequence[int]]],
               policy: Policy, *, config: AdaptConfig = AdaptConfig(), max_new_tokens: int = 48,
               overlap: bool = False, eos_id: int | None = None, seed: int = 0,
               on_iteration: Callable[[int, Iteration], None] | None = None,
               on_query: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Serve ``prompts`` ((domain, token ids), in order) with one ``StreamServer``: one row per query
    (``on_query`` sees each as it comes)."""
    server = StreamServer(target, drafter, [domain for domain, _ in prompts], policy, config=config,
                          max_new_tokens=max_new_tokens, overlap=overlap, eos_id=eos_id, seed=seed,
                          on_iteration=on_iteration)
    rows = []
    for index, (domain, prompt) in enumerate(prompts):
        rows.append(server.serve(index, domain, prompt))
        if on_query is not None:
            on_query(rows[-1])
    server.close()
    return rows
