"""An independent small causal LM as the drafter, with its own KV cache.

Three shapes of draft:

- ``chain``: ``depth`` tokens, each sampled from the warped draft law ``q`` (the argmax at
  temperature 0); child rule ``iid``. With ``min_confidence`` it drafts a further token only while the
  latest token's law puts at least that much on its most likely token (transformers' assisted
  generation stops its assistant alike, by ``assistant_confidence_threshold``): a short draft where the
  draft model is unsure, a long one through text it predicts well. The stop reads the draft's laws only
  (their largest probability, as a length policy's hook does), never the target's, so verification
  stays lossless (enumerated exactly in ``tests/test_speculate.py``).
  With ``staged`` (staged speculation, Spector and Re 2023) the draft model is itself sped up by n-gram
  lookup: each forward also runs the tokens that followed the latest occurrence of the context's last
  n-gram (``NgramIndex``), and where the drafted token equals such a guess the next law is that guess's
  row, with no forward of its own. The drafted tokens are drawn exactly as without guesses; the chain
  ends early once ``staged`` forwards ran and the drafted token leaves the guesses (``staged=1``: the
  draft model's chain as far as it agrees with the lookup, plus its own next token). A small draft
  model costs per call, not per token, here (a forward of a few tokens costs little more than one of
  one token: the draft model's tree series in ``data/profiles/cpu_shipped.json``), so a chain through
  text the context repeats costs one forward. The stop depends on the drafted prefix
  only, so verification stays lossless (enumerated exactly in ``tests/test_speculate.py``).
  With ``lookup`` a proposal is the lookup's chain alone, with no forward, wherever the context's last
  ``lookup`` tokens (or more) occurred before (SAM-Decoding's rule, Hu et al. 2024): where the context
  repeats the lookup is as good a guess and costs a fraction of a forward, and the draft model drafts
  where it does not. The choice reads the committed tokens only, and the lookup's chain is a top-k
  chain of point masses, as the n-gram drafter's, so verification stays lossless.
- ``tree``: a deterministic top-k tree (child rule ``topk``). Depth by depth the ``width`` best
  frontier nodes (by path probability) are expanded into their ``width`` most likely children, in
  one forward per depth; the ``budget`` best nodes form the tree, in depth-first order so that
  ``paths()[0]`` is the most likely path. At temperature 0 the ranking uses the unwarped softmax.
- ``paths``: ``paths`` independent chains of length ``depth`` sampled from ``q`` and left unmerged
  (``DraftTree.from_paths``), one batched forward per depth, for RRS, GBV and SeqBV.

With ``vocab`` (token ids, the most frequent first: ``vocab.load_vocab`` reads them from the draft model's
folder) every shape drafts only those tokens, as FR-Spec and EAGLE-3 cut a drafter's LM head: on this
CPU the head over the whole vocabulary is most of the draft model's arithmetic. The laws are zero
elsewhere, so every verifier stays lossless.

The cache holds the committed tokens it has run; a proposal first runs the *backlog* (committed
tokens not yet run) and the root, then writes each depth's forwarded nodes after them. The LM head,
most of a small draft model's arithmetic, runs only on rows a draft reads: never on the backlog's, and
on a staged chain's guesses only once the chain reaches them. ``accept``
keeps exactly the accepted nodes that were forwarded and puts the rest in the backlog, so the cache
always equals a fresh prefill of the committed sequence. The deepest drafted nodes are never run.
Every tree carries ``confidence``: each node's probability under its parent's law (the plain softmax
at temperature 0, the warped ``q`` otherwise).

Several chains of one draft model can draft in lockstep (``propose_together``, the batched engine's
way): a proposal is a coroutine (``_drafting``) that yields each forward it needs, and every round
packs the forwards the chains wait for into one (``real_engine.ragged``), so a batch of requests pays
about one forward per position instead of one per request and position.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from pathlib import Path

import torch
from torch import nn

from core.errors import InputError
from core.verifiers import DRAFT_SHAPES
from real_engine.drafters.base import clock
from real_engine.drafters.ngram import NgramIndex, lookup_chain
from real_engine.drafters.trained import deployed_shape
from real_engine.drafters.vocab import load_vocab
from real_engine.model import Output, Transformer
from real_engine.packed import Linear, cut_rows, run_dtype
from real_engine.ragged import packed_forward
from real_engine.tree import DraftTree, best_subtree, expand_topk
from real_engine.warp import Sampling, warp

CHAIN_OPTIONS = ("min_confidence", "staged", "lookup")  # options that only a chain takes
_NO_HEAD = nn.Identity()  # as the LM head of a forward: its "logits" are the final hidden states
Run = tuple[list[int], int]  # tokens for the draft model to forward, and how many leading rows nothing reads


class DraftModelDrafter:
    """Drafts with ``model`` (sharing the target's vocabulary) as a chain, a top-k tree or K paths."""

    def __init__(self, model: Transformer, shape: str = "chain", depth: int = 4, width: int = 4,
                 budget: int = 16, paths: int = 4, min_confidence: float = 0.0,
                 vocab: torch.Tensor | None = None, staged: int = 0, lookup: int = 0) -> None:
        if shape not in DRAFT_SHAPES:
            raise InputError(f"unknown draft shape {shape!r}: use one of {', '.join(DRAFT_SHAPES)}")
        if min(depth, width, budget, paths) < 1:
            raise InputError("draft depth, tree width, tree budget and path count must all be >= 1")
        if not 0.0 <= min_confidence <= 1.0:
            raise InputError(f"minimum draft confidence {min_confidence}: give a probability in [0, 1] "
                             "(0: never stop early)")
        self.model, self.shape = model, shape
        self.depth, self.width, self.budget, self.paths = depth, width, budget, paths
        if staged < 0 or (staged and shape != "chain"):
            raise InputError(f"staged={staged}: staged drafting takes a chain and a forward budget >= 1 "
                             "(0: one forward per token)")
        self.index = NgramIndex()  # the committed tokens, for a staged chain's guesses and lookup proposals
        if not 0 <= lookup <= self.index.max_ngram or (lookup and shape != "chain"):
            raise InputError(f"lookup={lookup}: lookup proposals take a chain and a match length of 1 to "
                             f"{self.index.max_ngram} tokens (0: never)")
        self.min_confidence, self.staged, self.lookup = min_confidence, staged, lookup
        v = model.args.vocab_size
        if vocab is not None and (vocab.ndim != 1 or vocab.numel() == 0 or int(vocab.min()) < 0
                                  or int(vocab.max()) >= v or vocab.unique().numel() != vocab.numel()):
            raise InputError(f"drafting vocabulary: give distinct token ids below {v}")
        self.vocab = None if vocab is None else vocab.to(model.lm_head.weight.device)
        self._head: Linear | None = None  # the LM head cut to ``vocab``, cut again at each ``begin``
        self.device = model.lm_head.weight.device
        self.model_seconds = 0.0
        # A chain's stopping rule (``real_engine.speculate``): called after each drafted token with the
        # largest probability of every position's law so far (never the sampled token's own, which would
        # bias the draft); False ends the chain there. ``min_confidence`` reads the same ones.
        self.keep_drafting: Callable[[list[float]], bool] | None = None
        # Per-proposal state: the committed length once the root has run, the cache slot (offset
        # after it) of each forwarded tree node, and the tree's tokens.
        self._base: int | None = None
        self._slots: dict[int, int] = {}
        self._tokens: list[int] = []

    @property
    def max_slots(self) -> int:
        """Most nodes a proposal writes into the cache after the root."""
        if self.shape == "chain":
            return self.depth - 1
        if self.shape == "paths":
            return self.paths * (self.depth - 1)
        return self.width * (self.depth - 1)

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Check the vocabulary and context, then prefill the draft cache with ``prompt[:-1]``."""
        vocab, own = target.logits.shape[-1], self.model.args.vocab_size
        if vocab != own:
            raise InputError(f"the draft model's vocabulary ({own}) differs from the target's ({vocab}): "
                             "use a draft model trained with the target's tokenizer")
        if max_length > self.model.args.max_position_embeddings:
            raise InputError(f"the draft model's context is {self.model.args.max_position_embeddings} "
                             f"positions but {max_length} are needed: shorten the prompt or max new tokens")
        self.sampling, self.generator = sampling, generator
        if self.vocab is not None:  # cut per query, so that it follows the model's current weights
            self._head = cut_rows(self.model.lm_head, self.vocab)
        self.cache = self.model.new_cache(max_length + self.max_slots + 1)
        self.backlog = prompt[:-1].tolist()
        self.root = int(prompt[-1])
        self._base = None
        if self.staged or self.lookup:
            self.index = NgramIndex()
            self.index.extend(prompt.tolist())

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``tokens`` ([T]) into the cache, commit them, return their final hidden states ([T, H])."""
        start = clock(self.device)
        hidden = self.model(tokens[None], positions, self.cache, mask, _NO_HEAD).hidden[0]
        self.cache.commit()
        self.model_seconds += clock(self.device) - start
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on ``hidden`` ([T, H] -> [T, V]; -inf outside the drafting vocabulary)."""
        start = clock(self.device)
        logits = (self.model.lm_head if self._head is None else self._head)(hidden)
        if self.vocab is not None:
            full = logits.new_full((logits.shape[0], self.model.args.vocab_size), float("-inf"))
            logits = full.index_copy_(1, self.vocab, logits)
        self.model_seconds += clock(self.device) - start
        return logits

    def _sample(self, q: torch.Tensor, n: int = 1) -> torch.Tensor:
        """``n`` i.i.d. draws from each row of ``q`` ([..., V] -> [..., n]); the argmax when greedy."""
        if self.sampling.greedy:
            return q.argmax(-1, keepdim=True).expand(*q.shape[:-1], n)
        return torch.multinomial(q, n, replacement=True, generator=self.generator)

    def propose(self, max_depth: int) -> DraftTree:
        """The lookup's chain where the context repeats (``lookup``); else run the backlog and the root,
        then draft a tree of the configured shape."""
        steps = self._drafting(max_depth)
        try:
            run, skip = next(steps)
            while True:
                hidden = self._forward(torch.tensor(run, device=self.device))
                run, skip = steps.send((self._logits(hidden[skip:skip + 1])[0], hidden[skip + 1:]))
        except StopIteration as stop:
            return stop.value

    def _drafting(self, max_depth: int) -> Generator[Run, tuple[torch.Tensor, torch.Tensor], DraftTree]:
        """``propose`` as a coroutine, so that several drafters' forwards can be packed into one: yields
        each run of tokens for the draft model to forward into the cache (and commit) with how many of its
        leading rows nothing reads; is sent the logits of the next row and the final hidden states of the
        rest; returns the tree."""
        depth = min(self.depth, max_depth)
        if depth < 1:
            self._base, self._tokens = None, [self.root]
            return DraftTree(torch.tensor([self.root], device=self.device),
                             torch.tensor([-1], device=self.device),
                             torch.zeros(1, self.model.args.vocab_size, device=self.device), "iid",
                             torch.ones(1, device=self.device))
        start, match = self.index.find() if self.staged or self.lookup else (0, 0)
        if self.lookup and match >= self.lookup:  # no forward: the backlog grows by this proposal
            self._base, self._tokens = None, [self.root, *self.index.tokens[start:start + depth]]
            return lookup_chain(self.root, self._tokens[1:], self.model.args.vocab_size, self.device)
        guesses = self.index.tokens[start:start + depth - 1] if self.staged else []
        logits, rows = yield [*self.backlog, self.root, *guesses], len(self.backlog)
        self.backlog, self._base, self._slots = [], self.cache.length - len(guesses), {}
        if self.shape == "chain":
            tree = yield from self._chain(logits, rows, depth, guesses)
        else:
            tree = (self._tree if self.shape == "tree" else self._paths)(logits, depth)
        self._tokens = tree.tokens.tolist()
        return tree

    def _confidence(self, logits: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Probability of ``tokens`` ([...]) under each row's law: the softmax when greedy, else ``q``."""
        law = logits.float().softmax(-1) if self.sampling.greedy else q
        return law[tokens] if law.dim() == 1 else law.gather(-1, tokens[:, None])[:, 0]

    def _chain(self, logits: torch.Tensor, rows: torch.Tensor, depth: int, guesses: list[int]
               ) -> Generator[Run, tuple[torch.Tensor, torch.Tensor], DraftTree]:
        """A chain from the root's ``logits``; ``rows`` are the final hidden states of ``guesses``, run after
        the root (staged drafting), through the LM head once the chain reaches the first. A coroutine as
        ``_drafting``: it yields each further forward."""
        chain, headed, forwards = _Chain(self, depth), False, 1
        while chain.draw(logits):
            d, token = len(chain.tokens), int(chain.tokens[-1])
            if guesses and guesses[0] == token:  # run already, as a guess: its row is the law
                self._slots[d] = d - 1
                if not headed:
                    rows, headed = self._logits(rows), True
                guesses, logits, rows = guesses[1:], rows[0], rows[1:]
                continue
            if self.staged and forwards == self.staged:
                break
            self._slots[d] = d - 1
            if self.staged:  # drop the guesses that were wrong, guess again after the drafted tokens
                self.cache.truncate(self._base + d - 1)
                guesses = self.index.lookup(depth - 1 - d, [int(t) for t in chain.tokens])
            logits, rows = yield [token, *guesses], 0
            headed, forwards = False, forwards + 1
        self.cache.truncate(self._base + len(self._slots))  # guesses beyond where the chain stopped
        return chain.tree()

    @property
    def batch_key(self) -> int | None:
        """Drafters of equal keys draft together (``propose_together``): chains of one draft model."""
        return id(self.model) if self.shape == "chain" else None

    @staticmethod
    def propose_together(drafters: Sequence[DraftModelDrafter], depths: Sequence[int]) -> list[DraftTree]:
        """Each drafter's ``propose(depth)``, their chains drafted in lockstep: each round packs the forward
        every chain waits for (its backlog and root first, then its latest token and any guesses) into one
        forward of the draft model (``ragged.packed_forward``) and one LM head call. Each chain draws and
        stops exactly as alone; only the arithmetic's order differs. The drafters share a ``batch_key``."""
        steps = [drafter._drafting(depth) for drafter, depth in zip(drafters, depths, strict=True)]
        trees: dict[int, DraftTree] = {}
        waiting: dict[int, Run] = {}

        def advance(i: int, sent: tuple[torch.Tensor, torch.Tensor] | None) -> None:
            try:
                waiting[i] = steps[i].send(sent)
            except StopIteration as stop:
                trees[i] = stop.value

        for i in range(len(drafters)):
            advance(i, None)
        while waiting:
            runs, waiting = waiting, {}
            group = [drafters[i] for i in runs]
            hidden = _lockstep(group, [run for run, _ in runs.values()])
            logits = _heads(group, torch.stack([h[skip] for h, (_, skip) in zip(hidden, runs.values(),
                                                                                strict=True)]))
            for i, h, row, (_, skip) in zip(runs, hidden, logits, runs.values(), strict=True):
                advance(i, (row, h[skip + 1:]))
        return [trees[i] for i in range(len(drafters))]

    def _paths(self, logits: torch.Tensor, depth: int) -> DraftTree:
        k = self.paths
        q_root = warp(logits, self.sampling)
        columns, qs = [self._sample(q_root, k)], []  # columns[d - 1]: the K tokens at depth d
        confidence = [self._confidence(logits, q_root, columns[0])]
        eye = torch.eye(k, dtype=torch.bool, device=self.device)
        for d in range(1, depth):
            mask = torch.cat((torch.ones(k, self._base, dtype=torch.bool, device=self.device),
                              eye.repeat(1, d)), dim=1)
            positions = torch.full((k,), self._base - 1 + d, device=self.device)
            logits = self._logits(self._forward(columns[-1], positions, mask))
            qs.append(warp(logits, self.sampling))
            columns.append(self._sample(qs[-1])[:, 0])
            confidence.append(self._confidence(logits, qs[-1], columns[-1]))
        qs.append(torch.zeros(k, q_root.shape[-1], device=self.device))
        # Node order of from_paths: root, then path 0's nodes by depth, then path 1's, ...
        q = torch.cat((q_root[None], torch.stack(qs, dim=1).reshape(k * depth, -1)))
        for path in range(k):
            for d in range(1, depth):
                self._slots[1 + path * depth + d - 1] = (d - 1) * k + path
        conf = torch.cat((torch.ones(1, device=self.device), torch.stack(confidence, dim=1).reshape(-1)))
        return DraftTree.from_paths(self.root, torch.stack(columns, dim=1).tolist(), q, "iid", conf)

    def _rank(self, logits: torch.Tensor) -> torch.Tensor:
        """The law that orders candidates: the warped ``q``, or the softmax at temperature 0."""
        return logits.float().softmax(-1) if self.sampling.greedy else warp(logits, self.sampling)

    def _tree(self, logits: torch.Tensor, depth: int) -> DraftTree:
        parents, tokens, scores = [-1], [self.root], [0.0]
        laws = {0: self._rank(logits)}  # node -> its law, for forwarded nodes
        ancestors: dict[int, list[int]] = {0: []}  # node -> cache slots of its forwarded ancestry
        frontier = [0]
        for d in range(1, depth + 1):
            rows = torch.stack([laws[n] for n in frontier])
            probs, ids = rows.topk(min(self.width, rows.shape[-1]), dim=-1)
            created = expand_topk(frontier, probs, ids, parents, tokens, scores)
            if d == depth or not created:
                break
            frontier = sorted(created, key=lambda n: -scores[n])[:self.width]
            start = self.cache.length
            mask = torch.zeros(len(frontier), start + len(frontier), dtype=torch.bool)
            mask[:, :self._base] = True
            for row, node in enumerate(frontier):
                ancestors[node] = [*ancestors[parents[node]], start - self._base + row]
                mask[row, [self._base + s for s in ancestors[node]]] = True
                self._slots[node] = start - self._base + row
            positions = torch.full((len(frontier),), self._base - 1 + d, device=self.device)
            run = torch.tensor([tokens[n] for n in frontier], device=self.device)
            logits = self._logits(self._forward(run, positions, mask.to(self.device)))
            for node, law in zip(frontier, logits, strict=True):
                laws[node] = self._rank(law)
        return self._select(parents, tokens, scores, laws)

    def _select(self, parents: list[int], tokens: list[int], scores: list[float],
                laws: dict[int, torch.Tensor]) -> DraftTree:
        """The ``budget`` most likely nodes (``tree.best_subtree``), with the forwarded ones' cache slots."""
        tree, index = best_subtree(parents, tokens, scores, laws, self.budget, self.device)
        self._slots = {index[n]: s for n, s in self._slots.items() if n in index}
        return tree

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Keep the accepted forwarded nodes in the cache; the rest join the backlog."""
        if self.staged or self.lookup:
            self.index.extend([*(self._tokens[n] for n in path), token])
        if self._base is None:
            self.backlog.append(self.root)
        else:
            slots = [self._slots[n] for n in path if n in self._slots]
            forwarded = self.cache.length - self._base
            self.cache.truncate(self._base)
            self.cache.pending = forwarded  # reopen the drafted region, then compact the kept nodes
            self.cache.keep(slots)
            path = path[len(slots):]
        self.backlog.extend(self._tokens[n] for n in path)
        self.root = token
        self._base = None


class _Chain:
    """One chain being drafted: each position's token, its confidence and its law, and when it stops."""

    def __init__(self, drafter: DraftModelDrafter, depth: int) -> None:
        self.drafter, self.depth = drafter, depth
        self.tokens: list[torch.Tensor] = []
        self.qs: list[torch.Tensor] = []  # each position's warped law (none at temperature 0)
        self.confidence = [torch.ones(1, device=drafter.device)]
        self.laws: list[float] = []  # each position's largest probability, which a stopping rule reads

    def draw(self, logits: torch.Tensor) -> bool:
        """Draft the next position from its law's ``logits``; whether the chain drafts one more after it."""
        drafter = self.drafter
        greedy = drafter.sampling.greedy
        if greedy:  # the confidence law is the softmax, its argmax the drafted token
            law = logits.float().softmax(-1)
            self.tokens.append(logits.argmax(-1))
        else:
            law = warp(logits, drafter.sampling)
            self.qs.append(law)
            self.tokens.append(drafter._sample(law)[0])
        self.confidence.append(law[self.tokens[-1]][None])
        if len(self.tokens) == self.depth:
            return False
        if drafter.min_confidence or drafter.keep_drafting is not None:
            self.laws.append(float(self.confidence[-1]) if greedy else float(law.max()))
            if self.laws[-1] < drafter.min_confidence:
                return False
            return drafter.keep_drafting is None or drafter.keep_drafting(self.laws)
        return True

    def tree(self) -> DraftTree:
        """The drafted chain, with ``q`` (point masses on the drafted tokens at temperature 0)."""
        drafter, drafted = self.drafter, torch.stack(self.tokens)
        if drafter.sampling.greedy:
            q = torch.zeros(len(self.tokens) + 1, drafter.model.args.vocab_size, device=drafter.device)
            q[torch.arange(len(self.tokens), device=drafter.device), drafted] = 1.0
        else:
            q = torch.stack([*self.qs, torch.zeros_like(self.qs[0])])
        return DraftTree.chain(drafter.root, drafted.cpu(), q, "iid", torch.cat(self.confidence))


def _lockstep(drafters: Sequence[DraftModelDrafter], runs: Sequence[list[int]]) -> list[torch.Tensor]:
    """Run each drafter's ``runs`` entry into its cache in one packed forward of their shared model and
    commit them; each run's final hidden states ([T, H]), its time shared among the drafters."""
    first = drafters[0]
    start = clock(first.device)
    tokens = [torch.tensor(run, device=first.device) for run in runs]
    positions = [torch.arange(d.cache.length, d.cache.length + len(run), device=first.device)
                 for d, run in zip(drafters, runs, strict=True)]
    masks = [torch.ones(len(run), len(run), dtype=torch.bool, device=first.device).tril() for run in runs]
    out, counts = packed_forward(first.model, [d.cache for d in drafters], tokens, positions, masks, _NO_HEAD)
    for drafter in drafters:
        drafter.cache.commit()
    share = (clock(first.device) - start) / len(drafters)
    for drafter in drafters:
        drafter.model_seconds += share
    return list(out.hidden[0].split(counts))


def _heads(drafters: Sequence[DraftModelDrafter], hidden: torch.Tensor) -> torch.Tensor:
    """Each drafter's LM head on its row of ``hidden`` ([B, H] -> [B, V]): one call when none cuts its
    vocabulary, else each its own."""
    if all(d.vocab is None for d in drafters):
        return drafters[0]._logits(hidden)
    return torch.cat([d._logits(row[None]) for d, row in zip(drafters, hidden, strict=True)])


def build_draft_model(target: Transformer, draft: Transformer | None, folder: str | Path | None,
                      deployed: bool, *, depth: int | None = None, width: int | None = None,
                      budget: int | None = None, paths: int | None = None,
                      min_confidence: float | None = None, vocab: int | None = None,
                      staged: int | None = None, lookup: int | None = None) -> DraftModelDrafter:
    """The ``draft-model`` drafter (``make_drafter``): drafts with ``draft`` a top-k tree ``width`` wide of
    ``budget`` (16) nodes when ``width > 1``, ``paths`` sampled paths when ``paths > 1``, otherwise a
    chain, all ``depth`` (4) deep, a chain stopping early where its law's top probability falls below
    ``min_confidence`` (0: never), drafting only the ``vocab`` most frequent tokens of its folder's token
    order when given, a chain guessing ahead by n-gram lookup within ``staged`` forwards when given, a
    proposal by the lookup alone where the context's last ``lookup`` tokens occurred before. Given the
    draft model's ``folder`` (and ``deployed``), options left None take its deployed shape."""
    if draft is None:
        raise InputError("the draft-model drafter needs a draft model: pass one (--draft-model DIR)")
    if draft.args.vocab_size != target.args.vocab_size:
        raise InputError(f"the draft model's vocabulary ({draft.args.vocab_size}) differs from the "
                         f"target's ({target.args.vocab_size}): use a draft model with the target's "
                         "tokenizer")
    if deployed and folder is not None and paths is None:
        saved = deployed_shape("draft-model", folder, run_dtype(target))
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
