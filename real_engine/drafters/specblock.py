"""SpecBlock (arXiv 2605.07243): a block-iterative drafter that emits K dependent positions per forward.

**Inputs.** Every drafter row at position ``t`` is one linear fusion of three vectors: a conditioning
vector, the embedding of the token at ``t`` (the target's embeddings, frozen and shared) and a learned
query for the row's slot ``k``. The conditioning and the embedding are RMS-normalized first, as EAGLE-3
fuses its inputs: a target's residual features are hundreds of times longer than its token embeddings,
and fused raw they drowned the token and the queries. Committed positions are *prefix rows*: slot 0
conditioned on ``W_cond`` of the target's low/mid/high features at ``t - 1`` (zero at ``t = 0``), run
causally; the drafter's KV cache holds them. Block 1 is the root's prefix row (slot 0) plus slots
``1..K-1``, all with the root's token and conditioning. A later block started at a drafted node ``u``
bypasses ``W_cond``: its conditioning is the drafter's own last-layer state (before the final norm) at
the slot that drafted ``u``, its token is ``u``'s.

**Layers.** The decoder layers are the target's (``real_engine.model.DecoderLayer``). Before each
layer ``l > 0``, row ``k`` of a block becomes ``S_l([h_k, h_{k-1}])`` with a per-transition linear map
``S_l`` (2H -> H, initialized to the identity on ``h_k``); slot 0 and prefix rows pair with
themselves. Slot ``k`` predicts the token at ``t + k + 1`` through the norm and an own LM head, and
the rank head (``rank.py``) predicts its bucket.

**Attention.** Prefix rows attend causally. A block's slot ``k`` attends to the committed prefix, to
the slots on its own branch in earlier blocks (the slots that drafted its start node's ancestors)
and to its own slots ``0..k``; never to another branch.

**Drafting** (:class:`SpecBlockDrafter`): block 1, then ``blocks - 1`` rounds in which every chosen
start node (see :class:`~real_engine.drafters.rank.BucketTree`) gets a block, all in ONE forward;
the tree keeps the ``budget`` most likely nodes, child rule ``topk``, and carries each node's confidence
and predicted rank bucket (``BucketTree.build``). A chain (every bucket's children capped at 1) at
temperature > 0 samples each slot's token from its warped law instead (child rule ``iid``), so that
token-level and block verification apply: their acceptance, ``1 - TV(p, q)`` per position, beats a
deterministic candidate's ``p(x)``. Whether a slot is drafted reads only the drafter's own states (the
rank head's give-up bucket), never the token it would sample, so the draft stays a draw from ``q``.
After verification the accepted tokens become prefix rows of the next block-1 forward, conditioned on
the target's features, which the verifier's forward has just produced. What a proposal ran stays in
:attr:`SpecBlockDrafter.proposal` until the next (online adaptation reads it, with no forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, atomic_write, read_json, write_json
from real_engine.drafters.base import clock
from real_engine.drafters.rank import CHILDREN, EDGES, BucketTree, RankHead
from real_engine.drafters.trained import train_hint, trained_shape
from real_engine.drafters.vocab import drafting_vocab
from real_engine.kv_cache import KVCache
from real_engine.model import DecoderLayer, ModelArgs, Output, RMSNorm, Transformer, rope, rope_frequencies
from real_engine.packed import Linear, cut_rows, run_dtype, use_half
from real_engine.tree import DraftTree
from real_engine.warp import Sampling, warp

FORMAT = "specblock-v2"  # v2: RMS-normalized conditioning and embedding before the fusion
HEAD_ROWS = "lm_head_rows"  # a saved LM head cut to its ``draft_ids`` rows (``save_specblock``)


@dataclass(frozen=True)
class SpecBlockConfig:
    """The drafter's shape; ``target_hidden`` and ``vocab_size`` must match the target's."""

    vocab_size: int
    target_hidden: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int = 2
    block_size: int = 4
    model_type: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    rank_width: int = 128
    edges: tuple[int, ...] = field(default=EDGES)
    draft_vocab: int = 0  # tokens drafting may propose (``SpecBlock.draft_ids``); 0: the whole vocabulary
    bucket_bias: tuple[float, ...] = ()  # added to the rank head's scores in drafting (calibrated); (): none

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "bucket_bias", tuple(float(b) for b in self.bucket_bias))
        if self.bucket_bias and len(self.bucket_bias) != len(self.edges) + 1:
            raise InputError(f"bucket bias {self.bucket_bias}: give one offset per rank bucket "
                             f"({len(self.edges) + 1}) or none")
        if self.num_layers < 1 or self.block_size < 1:
            raise InputError("a SpecBlock drafter needs at least 1 layer and a block size of at least 1")
        if self.vocab_size < 10:
            raise InputError(f"vocabulary of {self.vocab_size} tokens: the rank summary needs at least 10")
        if list(self.edges) != sorted(set(self.edges)) or self.edges[0] < 1:
            raise InputError(f"rank bucket edges {self.edges} must be increasing positive ranks")
        if self.draft_vocab and not 10 <= self.draft_vocab <= self.vocab_size:
            raise InputError(f"a drafting vocabulary of {self.draft_vocab} tokens: give 0 (all) or 10 to "
                             f"{self.vocab_size}")
        self.layer_args()  # validates the attention shape

    @classmethod
    def for_target(cls, args: ModelArgs, hidden_size: int | None = None, num_layers: int = 2,
                   block_size: int = 4) -> SpecBlockConfig:
        """The paper's setup: the target's decoder design at its hidden size (or a smaller one, same
        head size, proportional MLP)."""
        hidden = hidden_size or args.hidden_size
        if hidden == args.hidden_size:
            heads, kv, inter = args.num_attention_heads, args.num_key_value_heads, args.intermediate_size
        else:
            if hidden % args.head_dim:
                raise InputError(f"drafter hidden size {hidden} must be a multiple of the head size "
                                 f"{args.head_dim}: pick another size")
            heads = kv = hidden // args.head_dim
            inter = hidden * args.intermediate_size // args.hidden_size
        return cls(vocab_size=args.vocab_size, target_hidden=args.hidden_size, hidden_size=hidden,
                   intermediate_size=inter, num_heads=heads, num_kv_heads=kv, head_dim=args.head_dim,
                   num_layers=num_layers, block_size=block_size, model_type=args.model_type,
                   rms_norm_eps=args.rms_norm_eps, rope_theta=args.rope_theta, rope_scaling=args.rope_scaling,
                   max_position_embeddings=args.max_position_embeddings)

    def layer_args(self) -> ModelArgs:
        """The ``ModelArgs`` of the drafter's decoder layers."""
        return ModelArgs(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                         intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                         num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                         head_dim=self.head_dim, model_type=self.model_type, rms_norm_eps=self.rms_norm_eps,
                         rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
                         max_position_embeddings=self.max_position_embeddings)


class Heads(NamedTuple):
    """What the heads make of a row's last-layer state."""

    logits: torch.Tensor  # [..., V]
    buckets: torch.Tensor  # [..., buckets] rank-head logits


class SpecBlock(nn.Module):
    """The SpecBlock network (see the module doc); ``embed`` is the target's embedding matrix."""

    def __init__(self, config: SpecBlockConfig, embed: torch.Tensor) -> None:
        super().__init__()
        c = self.config = config
        if tuple(embed.shape) != (c.vocab_size, c.target_hidden):
            raise InputError(f"target embeddings of shape {tuple(embed.shape)} do not fit a drafter for "
                             f"vocabulary {c.vocab_size} and hidden size {c.target_hidden}: use its target")
        h = c.hidden_size
        # Frozen and shared with the target: a buffer that follows .to() but stays out of the state dict.
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.cond = Linear(3 * c.target_hidden, h, bias=False)
        self.fuse = Linear(2 * h + c.target_hidden, h, bias=False)
        self.cond_norm = RMSNorm(h, c.rms_norm_eps)
        self.embed_norm = RMSNorm(c.target_hidden, c.rms_norm_eps)
        self.queries = nn.Parameter(torch.randn(c.block_size, h))  # on the normalized inputs' scale
        args = c.layer_args()
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(c.num_layers))
        self.shifts = nn.ModuleList(Linear(2 * h, h, bias=False) for _ in range(c.num_layers - 1))
        with torch.no_grad():
            for shift in self.shifts:
                shift.weight.zero_()
                shift.weight[:, :h].copy_(torch.eye(h))
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.lm_head = Linear(h, c.vocab_size, bias=False)
        self.rank_head = RankHead(h, c.rank_width, len(c.edges) + 1)
        self.register_buffer("inv_freq", rope_frequencies(args), persistent=False)
        if c.draft_vocab:
            self.register_buffer("draft_ids", torch.arange(c.draft_vocab))
        self._cut: tuple[tuple[int, int], Linear] | None = None  # the LM head's draft_ids rows, and its key

    @classmethod
    def for_target(cls, target: Transformer, config: SpecBlockConfig | None = None,
                   seed: int = 0) -> SpecBlock:
        """A fresh drafter for ``target`` (seeded), its LM head and final norm started from the
        target's when the hidden sizes agree (they stay the drafter's own, and trainable)."""
        config = config or SpecBlockConfig.for_target(target.args)
        weight = target.lm_head.weight
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = cls(config, target.model.embed_tokens.weight).to(device=weight.device, dtype=weight.dtype)
        if config.hidden_size == target.args.hidden_size:
            with torch.no_grad():
                net.lm_head.weight.copy_(weight)
                net.norm.weight.copy_(target.model.norm.weight)
        return net

    def inputs(self, cond: torch.Tensor, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Row inputs ``fuse([norm(cond), norm(embed(token)), query[slot]])`` ([..., H] from [..., H], [...],
        [...])."""
        emb = self.embed_norm(F.embedding(tokens, self.embed).to(cond.dtype))
        return self.fuse(torch.cat((self.cond_norm(cond), emb, self.queries[slots].to(cond.dtype)), dim=-1))

    def condition(self, features: torch.Tensor) -> torch.Tensor:
        """``W_cond`` of the target's concatenated low/mid/high features ([..., 3 H_target])."""
        return self.cond(features.to(self.cond.weight.dtype))

    def forward(self, x: torch.Tensor, shift_from: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: Any = None) -> torch.Tensor:
        """Last-layer states (before the final norm) of rows ``x`` ([B, R, H]).

        ``shift_from[i]`` is the row whose previous-layer state row ``i`` fuses at each layer
        transition (``i`` itself for slot 0 and prefix rows); ``positions`` ([R]) are RoPE positions;
        ``mask`` ([R, keys] bool) says which cached keys, then which of these rows, a row attends to;
        ``cache`` is a ``KVCache`` or anything with its ``write`` (training's ``unroll.GrowingCache``).
        """
        cos, sin = rope(self.inv_freq, positions, x.dtype)
        for i, layer in enumerate(self.layers):
            if i:
                x = self.shifts[i - 1](torch.cat((x, x[:, shift_from]), dim=-1))
            x = layer(x, cos, sin, mask, cache)
        return x

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Token logits over the whole vocabulary of last-layer states."""
        return self.lm_head(self.norm(hidden))

    def heads(self, hidden: torch.Tensor) -> Heads:
        """Token logits and rank-bucket logits of last-layer states."""
        normed = self.norm(hidden)
        logits = self.lm_head(normed)
        return Heads(logits, self.rank_head(normed, logits))

    def draft_heads(self, hidden: torch.Tensor) -> Heads:
        """``heads`` over the drafting vocabulary: logits [..., draft_vocab] of the tokens ``draft_ids``
        (all tokens when ``config.draft_vocab`` is 0); the rank head sees the law over them, and its
        scores get the calibrated ``config.bucket_bias``."""
        normed = self.norm(hidden)
        logits = self._draft_head()(normed) if self.config.draft_vocab else self.lm_head(normed)
        scores = self.rank_head(normed, logits)
        if self.config.bucket_bias:
            scores = scores + torch.tensor(self.config.bucket_bias, dtype=scores.dtype, device=scores.device)
        return Heads(logits, scores)

    def _draft_head(self) -> Linear:
        """The LM head cut to the ``draft_ids`` rows, cut again whenever the head's weight changes."""
        w = self.lm_head.weight
        key = (w.data_ptr(), -1 if w.is_inference() else w._version)
        if self._cut is None or self._cut[0] != key:
            self._cut = (key, cut_rows(self.lm_head, self.draft_ids))
        return self._cut[1]


def with_draft_vocab(net: SpecBlock, ids: torch.Tensor | None) -> SpecBlock:
    """``net`` drafting only the tokens ``ids`` (the most frequent first, by convention): the paper's
    reduced drafter vocabulary; None: the whole vocabulary again. Training still scores the whole
    vocabulary; drafting cuts the LM head, the rank summary and the laws to ``ids`` (zero probability
    elsewhere, so verification stays lossless)."""
    net._cut = None
    if ids is None:
        net.config = replace(net.config, draft_vocab=0)
        net._buffers.pop("draft_ids", None)
        return net
    ids = torch.as_tensor(ids, dtype=torch.long, device=net.lm_head.weight.device)
    v = net.config.vocab_size
    if ids.ndim != 1 or ids.unique().numel() != ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= v:
        raise InputError(f"drafting vocabulary: give distinct token ids below {v}")
    net.config = replace(net.config, draft_vocab=ids.numel())  # validates the count
    net.register_buffer("draft_ids", ids.clone())
    return net


def causal_blocks(groups: int, size: int, device: torch.device) -> torch.Tensor:
    """[groups * size, groups * size] bool: causal inside each group of rows, nothing across."""
    tril = torch.ones(size, size, dtype=torch.bool, device=device).tril()
    return torch.block_diag(*[tril] * groups) if groups else tril[:0, :0]


Laws = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # a forward's slots: q, confidence law, log-law


class Proposal(NamedTuple):
    """What one ``propose`` ran: slots by global id (the row of their concatenated states)."""

    tree: BucketTree  # the tree as grown (``build`` renumbers its nodes for the proposed one)
    states: list[torch.Tensor]  # each forward's slot states, last layer: what the LM and rank heads read
    logps: list[torch.Tensor]  # their log-laws over the drafting vocabulary
    block_slots: dict[int, int]  # the start node of each block -> its first slot


class SpecBlockDrafter:
    """Drafts a tree with ``blocks`` block forwards: block 1 at the root, then one batched forward
    for the ``starts`` best start nodes of each block; ``children`` per predicted bucket; at most
    ``budget`` drafted nodes (the most likely by path probability)."""

    def __init__(self, net: SpecBlock, blocks: int = 2, starts: int = 4, budget: int = 32,
                 children: tuple[int, ...] = CHILDREN) -> None:
        if min(blocks, starts, budget) < 1:
            raise InputError("SpecBlock needs blocks, starts and budget of at least 1")
        if len(children) != len(net.config.edges) + 1 or min(children) < 0:
            raise InputError(f"children {children}: give one non-negative count per rank bucket "
                             f"({len(net.config.edges) + 1})")
        self.net, self.blocks, self.starts, self.budget = net, blocks, starts, budget
        self.children = tuple(children)
        self.k = net.config.block_size
        self.device = net.lm_head.weight.device
        self.model_seconds = 0.0
        # What each proposal ran, as the cost profile keys SpecBlock's drafting (``core.cost_profile``):
        # block forwards and the mean start nodes of the later ones (the rank head decides both),
        # appended here only once a caller attaches a list (a serving drafter keeps nothing).
        self.shapes: list[dict[str, float]] | None = None
        self._base: int | None = None  # committed drafter length once the root's prefix row has run
        self._tokens: list[int] = []
        self.proposal: Proposal | None = None  # what the last proposal ran

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Check the target matches, size the cache, queue the prompt as prefix rows."""
        c = self.net.config
        if target.logits.shape[-1] != c.vocab_size or target.features.shape[-1] != 3 * c.target_hidden:
            raise InputError("this SpecBlock drafter was built for another target (vocabulary or hidden size "
                             "differ): load the drafter trained for this target")
        if max_length > c.max_position_embeddings:
            raise InputError(f"the drafter's context is {c.max_position_embeddings} positions but "
                             f"{max_length} are needed: shorten the prompt or max new tokens")
        self.sampling, self.generator = sampling, generator
        self.sampled = not sampling.greedy and max(self.children) == 1  # a sampled chain (module doc)
        extra = self.k + (self.blocks - 1) * self.starts * self.k
        self.cache = KVCache(c.num_layers, 1, c.num_kv_heads, c.head_dim, max_length + extra,
                             self.net.lm_head.weight.dtype, self.device)
        features = target.features[0].to(self.device)
        self.backlog = prompt.tolist()  # tokens not yet run as prefix rows; the last is the root
        self.conds = torch.cat((features.new_zeros(1, features.shape[-1]), features))  # one per backlog token
        self._base = None

    def _forward(self, x: torch.Tensor, shift_from: torch.Tensor, positions: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
        """Run rows ``x`` ([R, H]) into the cache and commit them; their last-layer states."""
        start = clock(self.device)
        hidden = self.net(x[None], shift_from, positions, mask, self.cache)[0]
        self.cache.commit()
        self.model_seconds += clock(self.device) - start
        return hidden

    def _heads(self, hidden: torch.Tensor) -> tuple[Laws, list[int], list[list[float]], list[list[float]],
                                                    list[list[int]]]:
        """Laws over the drafting vocabulary (the warped ``q``, the confidence law: the plain softmax at
        temperature 0, else ``q``, and the log-law), buckets and their probabilities, and the candidate
        tokens of slot rows with their log-probabilities: the best ones, or one draw from ``q`` for a
        sampled chain (one host sync)."""
        start = clock(self.device)
        logits, buckets = self.net.draft_heads(hidden)
        logp = logits.float().log_softmax(-1)
        laws = warp(logits, self.sampling)
        if self.sampled:
            picked = torch.multinomial(laws, 1, generator=self.generator)
            top = logp.gather(-1, picked), picked
        else:
            top = logp.topk(min(max(self.children), logits.shape[-1]), dim=-1)
        own = logp.exp() if self.sampling.greedy else laws
        ids = top[1] if not self.net.config.draft_vocab else self.net.draft_ids[top[1]]
        probs = buckets.float().softmax(-1)
        out = (laws, own, logp), probs.argmax(-1).tolist(), probs.tolist(), top[0].tolist(), ids.tolist()
        self.model_seconds += clock(self.device) - start
        return out

    def _full(self, laws: torch.Tensor) -> torch.Tensor:
        """Laws over the drafting vocabulary as laws over the target's (zero outside ``draft_ids``)."""
        if not self.net.config.draft_vocab:
            return laws
        full = laws.new_zeros(laws.shape[0], self.net.config.vocab_size)
        return full.index_copy_(1, self.net.draft_ids, laws)

    @torch.inference_mode()
    def propose(self, max_depth: int) -> DraftTree:
        """Block 1 from the root, then ``blocks - 1`` batched rounds from the best start nodes."""
        root, self.proposal = self.backlog[-1], None
        if max_depth < 1:
            self._base, self._tokens = None, [root]
            return DraftTree(torch.tensor([root], device=self.device), torch.tensor([-1], device=self.device),
                             torch.zeros(1, self.net.config.vocab_size, device=self.device), "topk",
                             torch.ones(1, device=self.device), torch.full((1,), -1, device=self.device))
        net, k, dev = self.net, self.k, self.device
        n, length = len(self.backlog), self.cache.length
        width = min(k, max_depth)  # block 1 drafts depths 1..width
        cond = net.condition(self.conds)
        tokens = torch.tensor(self.backlog, device=dev)
        slot_ids = torch.arange(k, device=dev)
        # The prefix rows (slot 0 each, the root's last), then slots 1.. of the root's block: one fusion.
        x = net.inputs(torch.cat((cond, cond[-1:].expand(width - 1, -1))),
                       torch.cat((tokens, tokens[-1:].expand(width - 1))),
                       torch.cat((torch.zeros_like(tokens), slot_ids[1:width])))
        rows = n + width - 1
        mask = torch.ones(rows, length + rows, dtype=torch.bool, device=dev)
        mask[:, length:] = torch.ones(rows, rows, dtype=torch.bool, device=dev).tril()
        shift_from = torch.cat((torch.arange(n, device=dev), n - 1 + torch.arange(width - 1, device=dev)))
        positions = length + torch.arange(rows, device=dev)
        hidden = self._forward(x, shift_from, positions, mask)[n - 1:]
        root_position = length + n - 1  # also the root's cache row
        self._base = root_position + 1
        # Every slot run in this proposal, by global slot id: its cache row and last-layer state.
        cache_rows = [root_position, *range(self._base, self._base + width - 1)]
        states = [hidden]
        laws, buckets, probs, logps, ids = self._heads(hidden)
        all_laws = [laws]
        tree = BucketTree(root, max_depth, self.children, net.config.edges)
        block_slots = {0: 0}
        created = tree.extend(0, list(range(width)), buckets, logps, ids, probs)
        counts = []  # start nodes of each later block that ran
        for _ in range(1, self.blocks):
            starts = tree.starts(created, self.starts)
            if not starts:
                break
            counts.append(len(starts))
            block_slots.update((u, len(cache_rows) + i * k) for i, u in enumerate(starts))
            created = self._block(tree, starts, cache_rows, states, all_laws, root_position)
        mean_starts = sum(counts) / len(counts) if counts else 1.0
        if self.shapes is not None:
            self.shapes.append({"starts": mean_starts, "blocks": 1 + len(counts)})
        self.proposal = Proposal(tree, states, [logp for *_, logp in all_laws], block_slots)
        laws = self._full(torch.cat([q for q, *_ in all_laws]))
        own = self._full(torch.cat([c for _, c, _ in all_laws])) if self.sampling.greedy else None
        draft = tree.build(self.budget, laws, "iid" if self.sampled else "topk", confidence_laws=own)
        self._tokens = draft.tokens.tolist()
        self.backlog, self.conds = [], self.conds[:0]
        return draft

    def _block(self, tree: BucketTree, starts: list[int], cache_rows: list[int], states: list[torch.Tensor],
               all_laws: list[Laws], root_position: int) -> list[int]:
        """One batched forward: a block of K slots at each start node; extends ``tree``."""
        net, k, dev = self.net, self.k, self.device
        s, length = len(starts), self.cache.length
        hidden_all = torch.cat(states)
        origin = torch.tensor([tree.origin[u] for u in starts], device=dev)
        tokens = torch.tensor([tree.tokens[u] for u in starts], device=dev)
        slots = torch.arange(k, device=dev)
        x = net.inputs(hidden_all[origin].repeat_interleave(k, 0), tokens.repeat_interleave(k),
                       slots.repeat(s))
        mask = torch.zeros(s * k, length + s * k, dtype=torch.bool, device=dev)
        mask[:, :self._base] = True
        for i, u in enumerate(starts):
            seen = [cache_rows[tree.origin[a]] for a in tree.path(u)]
            mask[i * k:(i + 1) * k, seen] = True
        mask[:, length:] = causal_blocks(s, k, dev)
        own = torch.arange(s * k, device=dev).view(s, k)
        shift_from = torch.cat((own[:, :1], own[:, :-1]), dim=1).reshape(-1)
        depth = torch.tensor([tree.depths[u] for u in starts], device=dev)
        positions = (root_position + depth[:, None] + slots).reshape(-1)
        hidden = self._forward(x, shift_from, positions, mask)
        first = len(cache_rows)
        cache_rows.extend(range(length, length + s * k))
        states.append(hidden)
        laws, buckets, probs, logps, ids = self._heads(hidden)
        all_laws.append(laws)
        created = []
        for i, u in enumerate(starts):
            part = slice(i * k, (i + 1) * k)
            created += tree.extend(u, list(range(first + i * k, first + (i + 1) * k)), buckets[part],
                                   logps[part], ids[part], probs[part])
        return created

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Keep the root's prefix row, drop the drafted rows, queue the accepted tokens and ``token``
        as prefix rows conditioned on the target's features at the positions before them."""
        if self._base is not None:
            self.cache.truncate(self._base)
        self.backlog.extend(self._tokens[n] for n in path)
        self.backlog.append(token)
        self.conds = torch.cat((self.conds, target.features[0].to(self.device)))
        self._base = None


def save_specblock(net: SpecBlock, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (the target's embeddings are not included).

    A drafter of the target's width with a drafting vocabulary keeps only its LM head's ``draft_ids`` rows
    (``HEAD_ROWS``), the ones it drafts with: loading takes the others from the target's head, where
    training started them. For a real model's vocabulary the whole head would be most of the file (SmolLM2:
    49,152 rows, several times the rest of the drafter)."""

    folder = Path(folder)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in net.state_dict().items()}
    if net.config.draft_vocab and net.config.hidden_size == net.config.target_hidden:
        state[HEAD_ROWS] = state.pop("lm_head.weight")[state["draft_ids"]].contiguous()
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": FORMAT}))
    write_json(folder / "config.json", {"format": FORMAT, **asdict(net.config)})
    return folder


def load_specblock(folder: str | Path, target: Transformer) -> SpecBlock:
    """Load a drafter saved by :func:`save_specblock` for ``target`` (on its device and dtype)."""
    folder = Path(folder)
    config_path, weights = folder / "config.json", folder / "model.safetensors"
    for path in (config_path, weights):
        if not path.exists():
            raise InputError(f"missing {path}: give a folder written by save_specblock "
                             "(specblock train specblock)")
    raw = read_json(config_path, MAX_CONFIG_BYTES, "drafter config", "re-save the drafter")
    if isinstance(raw, dict) and raw.get("format") == "specblock-v1":
        raise InputError(f"{folder} holds a specblock-v1 drafter, trained before its inputs were normalized: "
                         "retrain it for this version (specblock train specblock)")
    if not isinstance(raw, dict) or raw.pop("format", None) != FORMAT:
        raise InputError(f"{config_path} is not a {FORMAT} drafter config: re-save the drafter")
    try:
        config = SpecBlockConfig(**raw)
    except TypeError as exc:
        raise InputError(f"{config_path} has unexpected or missing fields ({exc}): re-save the drafter"
                         ) from exc
    a = target.args
    if config.vocab_size != a.vocab_size or config.target_hidden != a.hidden_size:
        raise InputError(f"{folder} was trained for a target with vocabulary {config.vocab_size} and hidden "
                         f"size {config.target_hidden}, not {a.vocab_size} and {a.hidden_size}: "
                         "train a drafter for this target")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise InputError(f"cannot read {weights} ({exc}): the file is corrupt; re-save or re-copy it"
                         ) from exc
    weight = target.lm_head.weight
    rows = state.pop(HEAD_ROWS, None)
    if rows is not None:  # the head's drafted rows: the others are the target's
        ids = state.get("draft_ids")
        if ids is None or config.hidden_size != a.hidden_size or rows.shape[0] != len(ids):
            raise InputError(f"{weights} holds LM head rows that do not fit its drafting vocabulary: re-save "
                             "the drafter")
        state["lm_head.weight"] = weight.detach().to("cpu", rows.dtype).index_copy(0, ids.long(), rows)
    with torch.random.fork_rng(devices=[]):  # the initial values are overwritten: leave the global RNG alone
        net = SpecBlock(config, target.model.embed_tokens.weight).to(device=weight.device, dtype=weight.dtype)
    expected = set(net.state_dict())
    if expected != state.keys():
        missing, unknown = sorted(expected - state.keys()), sorted(state.keys() - expected)
        raise InputError(f"{weights} does not match its config (missing {missing[:2]}, unexpected "
                         f"{unknown[:2]}): re-save the drafter")
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise InputError(f"{weights} has tensors of the wrong shape for its config: re-save the drafter"
                         ) from exc
    return use_half(net, state).eval()


def build_specblock(target: Transformer, draft: Transformer | None, folder: str | Path | None, deployed: bool,
                    *, blocks: int | None = None, budget: int | None = None, width: int | None = None,
                    vocab: int | None = None) -> SpecBlockDrafter:
    """The ``specblock`` drafter (``make_drafter``) trained for ``target`` in ``folder`` (the model's own,
    ``ModelSpec.drafter_folder``): ``blocks`` block forwards (M), ``budget`` drafted nodes, ``width``
    children per node at most (1 drafts a chain that still stops where the rank head gives up), drafting
    the folder's ``vocab`` most frequent tokens (the vocabulary's size: all); options not given keep
    the deployed shape (``deployed``), else the trained settings."""
    folder, shape = trained_shape("specblock", folder, deployed, run_dtype(target), blocks=blocks,
                                  budget=budget, width=width, vocab=vocab)
    options: dict[str, Any] = {k: shape[k] for k in ("blocks", "budget") if k in shape}
    if "width" in shape:
        options["children"] = tuple(min(c, shape["width"]) for c in CHILDREN)
    with train_hint("specblock"):
        net = load_specblock(folder, target)
        ids = drafting_vocab(folder, "specblock", net.config.vocab_size, shape.get("vocab"))
        if ids is not None:
            net = with_draft_vocab(net, None if ids.numel() == net.config.vocab_size else ids)
        return SpecBlockDrafter(net, **options)
