"""The verifier's free feedback on a live SpecBlock drafter, recorded per query and buffered for updates.

Verification tells, at every committed position, what the target predicted there. A
:class:`FeedbackDrafter` wraps the live drafter (same ``Drafter`` protocol and the same proposals, so
emitted tokens are unchanged) and keeps, per query, every committed token with the target's features
and top-k log-probabilities (the fields ``drafter_data`` stores for training), and the root position of
each iteration whose accepted length fell short of the drafted depth: a *rejected position*.
:class:`FeedbackBuffer` holds rejected positions (each with its query's rows) until an update
(``real_engine.adapt.update_drafter``) trains on them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter
from real_engine.model import Output
from real_engine.tree import DraftTree
from real_engine.warp import Sampling


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
