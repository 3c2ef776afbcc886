"""EAGLE-style drafter: one decoder layer over the target's fused features, with an EAGLE-2 dynamic tree.

The drafter reads pairs ``(conditioning vector, next token)``. For a committed position ``i`` the
vector is ``fc`` of the target's low/mid/high features at ``i`` (EAGLE-3's multi-layer fusion) and the
token is ``x[i + 1]``; the layer's output at the pair predicts ``x[i + 2]``. Deeper in a draft the
vector is the drafter's own output at the parent node (it runs autoregressively on its own hidden
states), and the pair sits at position ``i + d``. Each pair's input is one linear fusion of the
normed token embedding and the normed vector. The token embedding is the target's (frozen, shared);
the LM head is the target's or, with ``own_head``, the drafter's own (initialized from the target's).

Inference keeps the drafter's own single-layer KV cache over the committed pairs. ``accept`` drops
the draft's scratch entries and queues the accepted positions with the target's true features; the
next ``propose`` runs that queue (ending at the root's pair, whose output is the root's law), then
grows the EAGLE-2 dynamic tree (Li et al., arXiv 2406.16858): at each depth the ``top_k`` most
likely frontier nodes by cumulative draft probability each get their ``top_k`` most likely children,
all frontier nodes in one forward under a tree mask over the drafter's cache; finally the
``total_tokens`` most likely nodes are kept (an ancestor-closed set: a child's cumulative probability
never exceeds its parent's). With ``vocab`` (token ids, the most frequent first: the
folder's ``draft_vocab.json``, ``vocab.load_vocab``) the head runs on those rows only and every other
token gets zero probability, as EAGLE-3 drafts; by default it drafts the net's ``draft_ids`` (saved with
its weights; ``config.json``'s ``draft_vocab`` counts them, 0: all tokens). Candidates are deterministic
(child rule ``topk``); ``q`` holds the
warped draft law at each node whose children were kept (zero elsewhere) and ``confidence`` each
node's probability under its parent's ranking law (the softmax at temperature 0, else ``q``). One
drafter forward per depth: the queue with the root's pair, then one per expanded frontier. A chain
(``top_k`` 1) at temperature > 0 samples each token from ``q`` instead (child rule ``iid``), so that
token-level and block verification apply (their acceptance, ``1 - TV(p, q)`` per position, beats a
deterministic candidate's ``p(x)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, atomic_write, read_json, write_json
from real_engine.drafters.base import clock
from real_engine.drafters.trained import train_hint, trained_shape
from real_engine.drafters.vocab import drafting_vocab
from real_engine.kv_cache import KVCache
from real_engine.model import DecoderLayer, ModelArgs, Output, RMSNorm, Transformer, rope, rope_frequencies
from real_engine.packed import Linear, cut_rows, run_dtype, use_half
from real_engine.tree import DraftTree, best_subtree, expand_topk
from real_engine.warp import Sampling, warp


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """EAGLE-2 dynamic-tree settings: ``depth`` levels, ``top_k`` children and frontier width, and
    ``total_tokens`` drafted nodes kept (the root excluded)."""

    depth: int = 5
    top_k: int = 4
    total_tokens: int = 24

    def __post_init__(self) -> None:
        if min(self.depth, self.top_k, self.total_tokens) < 1:
            raise InputError(f"EAGLE tree needs depth, top-k and total tokens >= 1, got {self}")


def drafter_args(target: ModelArgs) -> ModelArgs:
    """The drafter layer's shape: one decoder layer of the target's width."""
    return dataclasses.replace(target, num_hidden_layers=1, feature_layers=(0, 0, 0))


class EagleNet(nn.Module):
    """The drafter's own weights: feature map ``fc`` (3H -> H), input fusion (2H -> H), one decoder
    layer, the final norm and, optionally, its own LM head."""

    def __init__(self, args: ModelArgs, own_head: bool = False, draft_vocab: int = 0) -> None:
        super().__init__()
        h = args.hidden_size
        self.args = args
        self.fc = Linear(3 * h, h, bias=False)
        self.cond_norm = RMSNorm(h, args.rms_norm_eps)
        self.embed_norm = RMSNorm(h, args.rms_norm_eps)
        self.fuse = Linear(2 * h, h, bias=False)
        self.layer = DecoderLayer(args, 0)
        self.norm = RMSNorm(h, args.rms_norm_eps)
        self.lm_head = Linear(h, args.vocab_size, bias=False) if own_head else None
        self.register_buffer("inv_freq", rope_frequencies(args), persistent=False)
        if draft_vocab:  # the tokens drafted by default (``with_draft_ids`` sets them)
            self.register_buffer("draft_ids", torch.arange(draft_vocab))

    @property
    def draft_vocab(self) -> int:
        """How many tokens the net drafts by default (0: all)."""
        ids = getattr(self, "draft_ids", None)
        return 0 if ids is None else ids.numel()

    def with_draft_ids(self, ids: torch.Tensor | None) -> EagleNet:
        """This net drafting only ``ids`` by default (distinct token ids, the most frequent first; None:
        every token)."""
        v = self.args.vocab_size
        if ids is None:
            self._buffers.pop("draft_ids", None)
            return self
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.ndim != 1 or ids.unique().numel() != ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= v:
            raise InputError(f"drafting vocabulary: give distinct token ids below {v}")
        self._buffers.pop("draft_ids", None)
        self.register_buffer("draft_ids", ids.to(self.fuse.weight.device))
        return self

    def forward(self, cond: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                cache: Any, mask: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` of pairs (``cond`` [B, T, H], ``embeds`` [B, T, H]) at 1-D
        ``positions``; ``cache`` is a ``KVCache`` (or any object with its ``write``) and ``mask`` the
        boolean attention mask over the cached keys."""
        x = self.fuse(torch.cat((self.embed_norm(embeds), self.cond_norm(cond)), dim=-1))
        cos, sin = rope(self.inv_freq, positions, x.dtype)
        return self.layer(x, cos, sin, mask, cache)

    def logits(self, hidden: torch.Tensor, target_head: nn.Linear) -> torch.Tensor:
        """Next-token logits of drafter hidden states (own head, else the target's)."""
        head = self.lm_head if self.lm_head is not None else target_head
        return head(self.norm(hidden))


def new_eagle(target: Transformer, own_head: bool = False, seed: int = 0) -> EagleNet:
    """A freshly initialized drafter for ``target`` (own head copied from the target's), on its device."""
    weight = target.lm_head.weight
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = EagleNet(drafter_args(target.args), own_head)
    if own_head:
        net.lm_head.weight.data.copy_(weight.detach())
    return net.to(device=weight.device, dtype=weight.dtype)


def save_eagle(net: EagleNet, folder: str | Path, shape: TreeShape = TreeShape(),
               dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``model.safetensors`` (the drafter's own weights in ``dtype``, its default drafting tokens)
    and ``config.json`` (with the tree shape and how many tokens it drafts by default, 0: all)."""

    folder = Path(folder)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in net.state_dict().items()}
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    config = {"drafter": "eagle", "own_head": net.lm_head is not None, "tree": dataclasses.asdict(shape),
              "draft_vocab": net.draft_vocab, "layer": net.args.to_hf()}
    write_json(folder / "config.json", config)
    return folder


def load_eagle(folder: str | Path, target: Transformer) -> tuple[EagleNet, TreeShape]:
    """Load a drafter saved by :func:`save_eagle` for ``target`` (on its device and dtype)."""
    folder = Path(folder)
    config = read_json(folder / "config.json", MAX_CONFIG_BYTES, "EAGLE drafter config",
                       "train one with `specblock train eagle`")
    try:
        args = ModelArgs.from_hf(config["layer"])
        shape = TreeShape(**config["tree"])
        own_head = bool(config["own_head"])
        draft_vocab = int(config.get("draft_vocab", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{folder} holds no valid EAGLE config.json ({exc}): train one with "
                         "`specblock train eagle`") from exc
    if (args.hidden_size, args.vocab_size) != (target.args.hidden_size, target.args.vocab_size):
        raise InputError(f"the EAGLE drafter in {folder} was trained for hidden size {args.hidden_size} and "
                         f"vocabulary {args.vocab_size}, not this target's: train one for this target")
    try:
        state = load_file(str(folder / "model.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise InputError(f"cannot read {folder}/model.safetensors ({exc}): re-save or retrain it") from exc
    net = EagleNet(args, own_head, draft_vocab)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"{folder}/model.safetensors does not match its config (missing {missing[:2]}, "
                         f"unexpected {unexpected[:2]}): retrain or re-save the drafter")
    weight = target.lm_head.weight
    return use_half(net, state).to(device=weight.device, dtype=weight.dtype).eval(), shape


class EagleDrafter:
    """Drafts an EAGLE-2 dynamic tree with an :class:`EagleNet` over ``target``'s features, from the
    tokens ``vocab`` only when given."""

    def __init__(self, net: EagleNet, target: Transformer, shape: TreeShape = TreeShape(),
                 vocab: torch.Tensor | None = None) -> None:
        v = net.args.vocab_size
        if net.args.hidden_size != target.args.hidden_size or v != target.args.vocab_size:
            raise InputError("the EAGLE drafter's hidden size or vocabulary differs from the target's: "
                             "train a drafter for this target")
        if vocab is not None and (vocab.ndim != 1 or vocab.numel() == 0 or int(vocab.min()) < 0
                                  or int(vocab.max()) >= v or vocab.unique().numel() != vocab.numel()):
            raise InputError(f"drafting vocabulary: give distinct token ids below {v}")
        self.net, self.target, self.shape = net, target, shape
        vocab = getattr(net, "draft_ids", None) if vocab is None else vocab
        self.vocab = None if vocab is None or vocab.numel() == v else vocab.to(target.lm_head.weight.device)
        self._head: nn.Module = target.lm_head  # cut to ``vocab`` at each ``begin`` (follows the weights)
        self.device = target.lm_head.weight.device
        self.model_seconds = 0.0
        self._queue_cond = torch.zeros(0, 3 * net.args.hidden_size, device=self.device)
        self._queue_tokens: list[int] = []
        self._base = 0
        self._proposed: list[int] = []

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Size the cache and queue the prompt's pairs (features at ``i``, token ``i + 1``)."""
        a = self.net.args
        if target.features.shape[-1] != 3 * a.hidden_size:
            raise InputError(f"the target's features have width {target.features.shape[-1]}, the EAGLE "
                             f"drafter expects {3 * a.hidden_size}: use the drafter's own target")
        w = self.target.lm_head.weight
        slots = self.shape.top_k * (self.shape.depth - 1)
        self.cache = KVCache(1, 1, a.num_key_value_heads, a.head_dim, max_length + slots + 1, w.dtype,
                             w.device)
        self.sampling, self.generator = sampling, generator
        head = self.net.lm_head if self.net.lm_head is not None else self.target.lm_head
        self._head = head if self.vocab is None else cut_rows(head, self.vocab)
        self._queue_cond = target.features[0]
        self._queue_tokens = prompt[1:].tolist()
        self.root = int(prompt[-1])
        self._base = 0

    def _run(self, cond: torch.Tensor, tokens: list[int], positions: torch.Tensor, mask: torch.Tensor,
             features: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward pairs into the cache (committed); their hidden states [T, H] and logits [T, V].
        ``cond`` is target features ([T, 3H], mapped by ``fc``) when ``features``, else drafter states."""
        start = clock(self.device)
        if features:
            cond = self.net.fc(cond)
        embeds = self.target.model.embed_tokens(torch.tensor(tokens, device=self.device))
        hidden = self.net(cond[None], embeds[None], positions, self.cache, mask)[0]
        logits = self._head(self.net.norm(hidden))
        if self.vocab is not None:  # -inf outside the drafting vocabulary: zero probability there
            full = logits.new_full((logits.shape[0], self.net.args.vocab_size), float("-inf"))
            logits = full.index_copy_(1, self.vocab, logits)
        self.cache.commit()
        self.model_seconds += clock(self.device) - start
        return hidden, logits

    def _rank(self, logits: torch.Tensor) -> torch.Tensor:
        """The law that orders candidates: the warped ``q``, or the softmax at temperature 0."""
        return logits.float().softmax(-1) if self.sampling.greedy else warp(logits, self.sampling)

    def propose(self, max_depth: int) -> DraftTree:
        """Run the queued pairs, then grow and prune the dynamic tree (at most ``max_depth`` deep)."""
        depth = min(self.shape.depth, max_depth)
        vocab = self.net.args.vocab_size
        if depth < 1 or not self._queue_tokens:
            self._base, self._proposed = self.cache.length, [self.root]
            root = torch.tensor([self.root], device=self.device)
            q = torch.zeros(1, vocab, device=self.device)
            return DraftTree(root, torch.full_like(root, -1), q, "topk", torch.ones(1, device=self.device))
        n, start = len(self._queue_tokens), self.cache.length
        mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(start)
        positions = torch.arange(start, start + n, device=self.device)
        hidden, logits = self._run(self._queue_cond, self._queue_tokens, positions, mask, features=True)
        self._queue_cond, self._queue_tokens = self._queue_cond[:0], []
        self._base = self.cache.length
        tree = self._grow(hidden[-1], logits[-1], depth)
        self._proposed = tree.tokens.tolist()
        return tree

    def _grow(self, root_hidden: torch.Tensor, root_logits: torch.Tensor, depth: int) -> DraftTree:
        k, base = self.shape.top_k, self._base
        sampled = k == 1 and not self.sampling.greedy  # a sampled chain (module doc)
        parents, tokens, scores = [-1], [self.root], [0.0]
        hiddens = {0: root_hidden}
        laws, ranks = {0: warp(root_logits, self.sampling)}, {0: self._rank(root_logits)}
        slots: dict[int, list[int]] = {0: []}  # node -> cache indices of its forwarded ancestry
        frontier = [0]
        for d in range(1, depth + 1):
            if sampled:
                ids = torch.multinomial(laws[frontier[0]], 1, generator=self.generator)[None]
                probs = laws[frontier[0]][ids]
            else:
                probs, ids = torch.stack([ranks[n] for n in frontier]).topk(min(k, ranks[0].numel()), dim=-1)
            created = expand_topk(frontier, probs, ids, parents, tokens, scores)
            if d == depth or not created:
                break
            frontier = sorted(created, key=lambda n: (-scores[n], n))[:k]
            start = self.cache.length
            mask = torch.zeros(len(frontier), start + len(frontier), dtype=torch.bool)
            mask[:, :base] = True
            for row, node in enumerate(frontier):
                slots[node] = [*slots[parents[node]], start + row]
                mask[row, slots[node]] = True
            cond = torch.stack([hiddens[parents[n]] for n in frontier])
            positions = torch.full((len(frontier),), base - 1 + d, device=self.device)
            hidden, logits = self._run(cond, [tokens[n] for n in frontier], positions, mask.to(self.device))
            for node, h, row in zip(frontier, hidden, logits, strict=True):
                hiddens[node], laws[node], ranks[node] = h, warp(row, self.sampling), self._rank(row)
        return best_subtree(parents, tokens, scores, laws, self.shape.total_tokens, self.device,
                            "iid" if sampled else "topk")[0]

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Drop the draft's cache entries; queue the accepted positions with the target's features."""
        self.cache.truncate(self._base)
        self._queue_cond = torch.cat((self._queue_cond, target.features[0]))
        self._queue_tokens.extend([*(self._proposed[n] for n in path), token])
        self.root = token


def eagle_drafter(folder: str | Path, target: Transformer, depth: int | None = None, top_k: int | None = None,
                  total_tokens: int | None = None, vocab: int | None = None) -> EagleDrafter:
    """The drafter saved in ``folder``, with its saved tree shape and drafting vocabulary unless
    overridden (``vocab``: draft the folder's ``vocab`` most frequent tokens; the vocabulary's size: all)."""
    net, shape = load_eagle(folder, target)
    overrides = {"depth": depth, "top_k": top_k, "total_tokens": total_tokens}
    shape = dataclasses.replace(shape, **{k: v for k, v in overrides.items() if v is not None})
    return EagleDrafter(net, target, shape, drafting_vocab(folder, "eagle", net.args.vocab_size, vocab))


def build_eagle(target: Transformer, draft: Transformer | None, folder: str | Path | None, deployed: bool, *,
                depth: int | None = None, width: int | None = None, budget: int | None = None,
                vocab: int | None = None) -> EagleDrafter:
    """The ``eagle`` drafter (``make_drafter``) trained for ``target`` in ``folder`` (the model's own,
    ``ModelSpec.drafter_folder``): a dynamic tree ``depth`` deep, ``width`` the top-k (children per node
    and frontier width), ``budget`` tokens in all, drafting the ``vocab`` most frequent tokens; options not
    given keep the deployed shape (``deployed``), else the saved tree shape and vocabulary."""
    folder, shape = trained_shape("eagle", folder, deployed, run_dtype(target), depth=depth, width=width,
                                  budget=budget, vocab=vocab)
    with train_hint("eagle"):
        return eagle_drafter(folder, target, shape.get("depth"), shape.get("width"), shape.get("budget"),
                             shape.get("vocab"))
