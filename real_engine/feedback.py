"""The verifier's free feedback on a live SpecBlock drafter, recorded per query and buffered for updates.

Verification tells, at every committed position, what the target predicted there. A
:class:`FeedbackDrafter` wraps the live drafter (same ``Drafter`` protocol and the same proposals, so
emitted tokens are unchanged) and keeps, per query, every committed token with the target's features
and top-k log-probabilities (the fields ``drafter_data`` stores for training), and the root position of
each iteration whose accepted length fell short of the drafted depth: a *rejected position*.

Each rejected position is one signal, routed to one buffer (SpecBlock appendix A.3 routes the
verifier's signals to a head or a full training buffer) by the rank of the target's next token in
the draft law the verifier cut short (the law of the slot that drafted past the last accepted token):

- **head**: ranked within the rank head's branching buckets (at most ``edges[-1]``, 10; rank 1 too,
  where the rank head gave up or the budget pruned the branch). The draft law holds the token:
  re-ranking it (the LM head) or branching wider (the rank head) fixes the miss, so the signal keeps
  that slot's last-layer state, the heads' input, as drafting computed it
  (``SpecBlockDrafter.proposal``: no forward) for a head update that runs no drafter body.
- **full**: ranked past them, or no slot drafted there (a block ended at that node): the drafter's
  states do not carry the continuation, so only a full update, from the iteration's root, can help.

:class:`FeedbackBuffer` holds one kind's signals (each with its query's rows) until an update
(``real_engine.adapt.update_drafter``) trains on them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from real_engine.drafters.specblock import Proposal, SpecBlock, SpecBlockDrafter
from real_engine.model import Output
from real_engine.tree import DraftTree
from real_engine.warp import Sampling


@dataclass(frozen=True)
class Feedback:
    """One served query as training data, in ``drafter_data``'s layout (row ``t`` follows token ``t``).

    The last token (the final root) has no target row yet: its row is zeros, which training never reads
    (it conditions no later row and predicts past the end). ``rejected`` holds every signal's root;
    ``full_roots`` and ``head_rows`` split them between the buffers (see the module doc).
    """

    domain: str
    tokens: torch.Tensor  # [T] long: every committed token
    features: torch.Tensor  # [T, 3 H_target] bfloat16: the target's low/mid/high features
    topk_logp: torch.Tensor  # [T, k] float32: the target's top-k log-probabilities
    topk_ids: torch.Tensor  # [T, k] long
    roots: tuple[int, ...]  # root position of every iteration the drafter heard the verdict of
    rejected: tuple[int, ...]  # those whose draft was cut short
    full_roots: tuple[int, ...]  # the rejected roots whose signal goes to the full buffer
    head_rows: tuple[int, ...]  # for the others: the row (position) of the last accepted token
    head_states: torch.Tensor  # [len(head_rows), H]: the state of the slot cut short after each

    def signals(self, kind: str) -> tuple[int, ...]:
        """The positions ``kind``'s buffer takes: head rows or full roots."""
        return self.head_rows if kind == "head" else self.full_roots


class FeedbackDrafter:
    """A SpecBlock drafter that records each query's feedback and takes new weights between queries.

    Proposals are the wrapped drafter's own. ``offer`` queues a network; the next ``begin`` makes it
    live (``syncs`` counts these swaps). ``take`` hands over the finished query's :class:`Feedback`.
    """

    reads_prompt_logits = True  # it records the target's law over the prompt too (``prompt_rows``)

    def __init__(self, inner: SpecBlockDrafter, top_k: int = 32) -> None:
        self.inner, self.top_k = inner, top_k
        self.syncs = 0
        self._lock = threading.Lock()
        self._pending: SpecBlock | None = None
        self._tree: DraftTree | None = None
        self._tokens: list[int] = []
        self._rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._roots: list[int] = []
        self._rejected: list[tuple[int, int, tuple[torch.Tensor, torch.Tensor] | None]] = []

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
        """Pass the verdict on; record the committed tokens, the target's rows and a rejection (its root,
        the row of its last accepted token and where the draft was cut short: :func:`cut_short`)."""
        tree = self._tree
        assert tree is not None, "accept before propose"
        drafted = int(tree.depths.max()) if tree.size > 1 else 0
        accepted = tree.tokens[list(path)].tolist()
        root = len(self._tokens) - 1
        self._roots.append(root)
        if len(path) < drafted:
            cut = cut_short(self.inner.proposal, accepted, int(token), self.inner.net)
            self._rejected.append((root, root + len(path), cut))
        self.inner.accept(path, token, target)
        self._tokens.extend(accepted)
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
        """The query just served as :class:`Feedback`, its signals routed (see the module doc; None before
        any query); recording restarts."""
        if not self._tokens:
            return None
        features, logp, ids = (torch.cat([r[i] for r in self._rows]) for i in range(3))
        pad = len(self._tokens) - features.shape[0]
        net = self.inner.net  # the network that drafted this query: new ones go live at ``begin``
        cuts = [cut for _, _, cut in self._rejected if cut is not None]
        near = iter(torch.stack([rank for _, rank in cuts]).le(net.config.edges[-1]).tolist() if cuts else [])
        full, rows, states = [], [], []
        for root, row, cut in self._rejected:
            if cut is not None and next(near):
                rows.append(row)
                states.append(cut[0])
            else:
                full.append(root)
        empty = torch.zeros(0, net.config.hidden_size, dtype=net.lm_head.weight.dtype)
        feedback = Feedback(
            domain, torch.tensor(self._tokens, dtype=torch.long),
            torch.cat((features, features.new_zeros(pad, features.shape[1]))),
            torch.cat((logp, logp.new_zeros(pad, logp.shape[1]))),
            torch.cat((ids, ids.new_zeros(pad, ids.shape[1]))).long(),
            tuple(self._roots), tuple(root for root, _, _ in self._rejected), tuple(full), tuple(rows),
            torch.stack(states).cpu() if states else empty)
        self._tokens, self._rows, self._roots, self._rejected = [], [], [], []
        return feedback


def cut_short(proposal: Proposal | None, accepted: Sequence[int], token: int, net: SpecBlock
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where the verifier cut ``proposal`` short: after its ``accepted`` tokens, the target's ``token``.

    Returns the last-layer state ([H], what the LM and rank heads read) of the slot whose law drafted
    past the last accepted token, and ``token``'s rank in that law (0-d: 1 is its argmax; past the
    drafting vocabulary when outside it); None when no slot drafted there (a block ended at that node).
    Reads what drafting kept: no forward, and no host sync on a GPU.
    """
    if proposal is None:
        return None
    tree, node = proposal.tree, 0
    for tok in accepted:  # the proposed tree renumbers the grown one's nodes: follow the tokens
        node = next(i for i, (parent, t) in enumerate(zip(tree.parents, tree.tokens, strict=True))
                    if parent == node and t == tok)
    slot = tree.expanded_by.get(node)
    if slot is None and node in tree.stopped:  # the rank head gave up there: the chain's next slot ran
        slot = proposal.block_slots.get(node, tree.origin[node] + 1)
    if slot is None:
        return None
    forward = 0  # the forward that ran the slot, and its row there
    while slot >= proposal.states[forward].shape[0]:
        slot -= proposal.states[forward].shape[0]
        forward += 1
    row = proposal.logps[forward][slot]
    if net.config.draft_vocab:
        hits = net.draft_ids == token
        score = torch.where(hits.any(), row[hits.int().argmax()], row.new_tensor(-torch.inf))
    else:
        score = row[token]
    return proposal.states[forward][slot].clone(), (row > score).sum() + 1


class FeedbackBuffer:
    """One kind's signals (``"head"`` or ``"full"``, see the module doc) of served queries, each with its
    query's rows; the oldest leave past ``capacity``."""

    def __init__(self, capacity: int, kind: str) -> None:
        self.capacity, self.kind = capacity, kind
        self.items: deque[tuple[Feedback, int]] = deque()

    def __len__(self) -> int:
        return len(self.items)

    @property
    def fill(self) -> float:
        """Buffered signals as a fraction of the capacity."""
        return min(len(self.items) / self.capacity, 1.0)

    def add(self, feedback: Feedback) -> None:
        """Buffer the signals of ``feedback`` routed to this kind (``Feedback.signals``)."""
        self.items.extend((feedback, position) for position in feedback.signals(self.kind))
        while len(self.items) > self.capacity:
            self.items.popleft()

    def drain(self) -> list[tuple[Feedback, list[int]]]:
        """Empty the buffer: its positions grouped by query, oldest query first."""
        groups: dict[int, tuple[Feedback, list[int]]] = {}
        for feedback, position in self.items:
            groups.setdefault(id(feedback), (feedback, []))[1].append(position)
        self.items.clear()
        return list(groups.values())
