"""Medusa-style drafter: K residual heads on the target's last hidden state and a static top-k tree.

Head ``k`` (0-based) reads the target's final hidden state (``Output.hidden``) at the position that
predicts the root, applies a residual SiLU block ``h + silu(W_k h)`` and an LM head (its own,
initialized from the target's, or the target's shared one), and predicts the token ``k + 1`` places
after the root, i.e. the draft token at depth ``k + 1`` (Cai et al., arXiv 2401.10774). The heads do
not see the drafted tokens, so one forward of K small heads drafts the whole tree.

The tree is static: a node is a tuple of ranks ``(i_1, ..., i_d)`` meaning "head 1's ``i_1``-th
candidate, then head 2's ``i_2``-th ...". :func:`choose_tree` picks it from calibration accuracies
(``acc[k][i]``: how often the target's token at depth ``k + 1`` is head ``k``'s ``i``-th candidate),
maximizing the expected accepted length ``sum over nodes of prod acc[d][i_d]`` under a node budget;
as every extension multiplies by a factor <= 1, the best set is the budget's most likely nodes, found
best first with a heap (Medusa builds its trees greedily the same way). Candidates are deterministic
(child rule ``topk``); ``q`` holds the warped law of the head that drafted each node's children and
``confidence`` each node's probability under its head's law (the softmax at temperature 0, else ``q``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, atomic_write, read_json, write_json
from real_engine.drafters.base import clock
from real_engine.drafters.trained import train_hint, trained_shape
from real_engine.model import Output, Transformer
from real_engine.packed import Linear, run_dtype, use_half
from real_engine.tree import DraftTree
from real_engine.warp import Sampling, warp

Node = tuple[int, ...]


class MedusaNet(nn.Module):
    """``heads`` residual SiLU blocks, each with its own LM head unless ``own_heads`` is False."""

    def __init__(self, hidden_size: int, vocab_size: int, heads: int, own_heads: bool = True) -> None:
        super().__init__()
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.blocks = nn.ModuleList(Linear(hidden_size, hidden_size) for _ in range(heads))
        self.lm_heads = nn.ModuleList(Linear(hidden_size, vocab_size, bias=False) for _ in range(heads)) \
            if own_heads else None

    @property
    def heads(self) -> int:
        """Number of heads (the deepest draft depth)."""
        return len(self.blocks)

    def head(self, k: int, hidden: torch.Tensor, target_head: nn.Linear) -> torch.Tensor:
        """Logits ``[..., V]`` of head ``k`` (the draft token at depth ``k + 1``) from hidden states."""
        h = hidden + F.silu(self.blocks[k](hidden))
        return (self.lm_heads[k] if self.lm_heads is not None else target_head)(h)

    def forward(self, hidden: torch.Tensor, target_head: nn.Linear, heads: int | None = None) -> torch.Tensor:
        """Logits ``[..., K, V]`` of the first ``heads`` heads (default all) from final hidden states
        ``[..., H]`` (a shared head runs once over all K states: it is the costly, memory-bound part)."""
        k = self.heads if heads is None else heads
        if self.lm_heads is None:
            states = [hidden + F.silu(block(hidden)) for block in self.blocks[:k]]
            return target_head(torch.stack(states, dim=-2))
        return torch.stack([self.head(i, hidden, target_head) for i in range(k)], dim=-2)


def new_medusa(target: Transformer, heads: int = 4, own_heads: bool = True, seed: int = 0) -> MedusaNet:
    """Fresh heads for ``target``: zero residual blocks, LM heads copied from the target's, so each head
    starts as the target's next-token law."""
    weight = target.lm_head.weight
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = MedusaNet(target.args.hidden_size, target.args.vocab_size, heads, own_heads)
    for block in net.blocks:
        nn.init.zeros_(block.weight)
        nn.init.zeros_(block.bias)
    if net.lm_heads is not None:
        for head in net.lm_heads:
            head.weight.data.copy_(weight.detach())
    return net.to(device=weight.device, dtype=weight.dtype)


def choose_tree(accuracies: Sequence[Sequence[float]], budget: int) -> list[Node]:
    """The ``budget`` nodes of largest path probability ``prod_d acc[d][i_d]`` (ties: shorter, then
    lexicographically smaller; nodes of probability 0 are left out), sorted by depth then ranks: the
    tree of largest expected accepted length under the independence assumption."""
    acc = [list(map(float, row)) for row in accuracies]
    if not acc or any(not row for row in acc) or any(not 0 <= a <= 1 for row in acc for a in row):
        raise InputError("Medusa accuracies must be a non-empty [heads, ranks] table of values in [0, 1]: "
                         "calibrate the heads on held-out data")
    heap = [(-a, 1, (i,)) for i, a in enumerate(acc[0])]
    heapq.heapify(heap)
    chosen: list[Node] = []
    while heap and len(chosen) < budget:
        neg, _, node = heapq.heappop(heap)
        if neg == 0:  # nothing left that could ever be accepted
            break
        chosen.append(node)
        if len(node) < len(acc):
            for i, a in enumerate(acc[len(node)]):
                heapq.heappush(heap, (neg * a, len(node) + 1, (*node, i)))
    return sorted(chosen, key=lambda n: (len(n), n))


def expected_length(tree: Sequence[Node], accuracies: Sequence[Sequence[float]]) -> float:
    """Expected accepted draft tokens of a static tree: the sum of its nodes' path probabilities."""
    total = 0.0
    for node in tree:
        prob = 1.0
        for depth, rank in enumerate(node):
            prob *= accuracies[depth][rank]
        total += prob
    return total


def _check_tree(tree: Sequence[Node], heads: int) -> list[Node]:
    nodes = [tuple(int(i) for i in n) for n in tree]
    known = set(nodes)
    if any(not n or len(n) > heads or min(n) < 0 or (len(n) > 1 and n[:-1] not in known) for n in nodes):
        raise InputError(f"a Medusa tree must be non-empty rank tuples of length <= {heads} (the heads) "
                         "whose prefixes are in the tree too: choose it with choose_tree")
    return sorted(set(nodes), key=lambda n: (len(n), n))


def save_medusa(net: MedusaNet, tree: Sequence[Node], folder: str | Path,
                accuracies: Sequence[Sequence[float]] | None = None,
                dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``model.safetensors`` (in ``dtype``) and ``config.json`` (the heads' shape, the chosen tree
    and the calibration accuracies it came from) to ``folder``."""

    folder = Path(folder)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in net.state_dict().items()}
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    config = {"drafter": "medusa", "hidden_size": net.hidden_size, "vocab_size": net.vocab_size,
              "heads": net.heads, "own_heads": net.lm_heads is not None,
              "tree": [list(n) for n in _check_tree(tree, net.heads)],
              "accuracies": [list(map(float, row)) for row in accuracies] if accuracies is not None else None}
    write_json(folder / "config.json", config)
    return folder


def load_medusa(folder: str | Path, target: Transformer, budget: int | None = None
                ) -> tuple[MedusaNet, list[Node]]:
    """Load heads and tree saved by :func:`save_medusa` for ``target`` (on its device and dtype); with
    ``budget``, the tree of that many nodes chosen from the saved calibration accuracies instead."""
    folder = Path(folder)
    config = read_json(folder / "config.json", MAX_CONFIG_BYTES, "Medusa heads config",
                       "train heads with `specblock train medusa`")
    try:
        net = MedusaNet(config["hidden_size"], config["vocab_size"], config["heads"], config["own_heads"])
        tree = _check_tree([tuple(n) for n in config["tree"]], net.heads)
        accuracies = config["accuracies"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{folder} holds no valid Medusa config.json ({exc}): train one with "
                         "`specblock train medusa`") from exc
    if (net.hidden_size, net.vocab_size) != (target.args.hidden_size, target.args.vocab_size):
        raise InputError(f"the Medusa heads in {folder} were trained for hidden size {net.hidden_size} and "
                         f"vocabulary {net.vocab_size}, not this target's: train heads for this target")
    try:
        state = load_file(str(folder / "model.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise InputError(f"cannot read {folder}/model.safetensors ({exc}): re-save or retrain it") from exc
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"{folder}/model.safetensors does not match its config (missing {missing[:2]}, "
                         f"unexpected {unexpected[:2]}): retrain or re-save the heads")
    if budget is not None:
        if accuracies is None:
            raise InputError(f"{folder} stores no calibration accuracies to choose a tree of {budget} nodes "
                             "from: use its saved tree (no budget) or retrain the heads")
        tree = choose_tree(accuracies, budget)
    weight = target.lm_head.weight
    return use_half(net, state).to(device=weight.device, dtype=weight.dtype).eval(), tree


class MedusaDrafter:
    """Drafts the static tree ``tree`` with the heads of ``net`` on ``target``'s last hidden state."""

    def __init__(self, net: MedusaNet, target: Transformer, tree: Sequence[Node]) -> None:
        if (net.hidden_size, net.vocab_size) != (target.args.hidden_size, target.args.vocab_size):
            raise InputError("the Medusa heads' hidden size or vocabulary differs from the target's: "
                             "train heads for this target")
        self.net, self.target, self.tree = net, target, _check_tree(tree, net.heads)
        self.device = target.lm_head.weight.device
        self.model_seconds = 0.0
        self.hidden: torch.Tensor | None = None

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Keep the hidden state that predicts the root (none for a one-token prompt)."""
        if target.hidden.shape[-1] != self.net.hidden_size:
            raise InputError(f"the target's hidden size {target.hidden.shape[-1]} differs from the Medusa "
                             f"heads' {self.net.hidden_size}: use the heads' own target")
        self.sampling = sampling
        self.root = int(prompt[-1])
        self.hidden = target.hidden[0, -1] if target.hidden.shape[1] else None

    def propose(self, max_depth: int) -> DraftTree:
        """Run the heads once and lay the static tree (cut at ``max_depth``) over their top candidates."""
        vocab = self.net.vocab_size
        fits = [n for n in self.tree if len(n) <= max_depth and max(n) < vocab]
        if self.hidden is None or not fits:
            root = torch.tensor([self.root], device=self.device)
            q = torch.zeros(1, vocab, device=self.device)
            return DraftTree(root, torch.full_like(root, -1), q, "topk", torch.ones(1, device=self.device))
        start = clock(self.device)
        depth = max(len(n) for n in fits)
        logits = self.net(self.hidden, self.target.lm_head, depth)  # [depth, V]: only the heads the tree uses
        candidates = logits.topk(1 + max(max(n) for n in fits), dim=-1).indices.tolist()
        laws = warp(logits, self.sampling)
        self.model_seconds += clock(self.device) - start
        # Depth-first order, lower ranks first, so paths()[0] is the all-top-1 path.
        order = sorted(fits)
        index = {(): 0, **{n: i + 1 for i, n in enumerate(order)}}
        parents = [-1, *(index[n[:-1]] for n in order)]
        tokens = [self.root, *(candidates[len(n) - 1][n[-1]] for n in order)]
        has_children = {n[:-1] for n in order}
        zero = torch.zeros(vocab, device=self.device)
        q = [laws[len(n)] if n in has_children else zero for n in [(), *order]]
        token_ids = torch.tensor(tokens, device=self.device)
        heads = torch.tensor([len(n) - 1 for n in order], device=self.device)
        own = logits.float().softmax(-1) if self.sampling.greedy else laws
        confidence = torch.cat((torch.ones(1, device=self.device), own[heads, token_ids[1:]]))
        return DraftTree(token_ids, torch.tensor(parents, device=self.device), torch.stack(q), "topk",
                         confidence)

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Keep the hidden state of the last accepted position (it predicts the new root)."""
        self.hidden = target.hidden[0, -1]
        self.root = token


def medusa_drafter(folder: str | Path, target: Transformer, budget: int | None = None) -> MedusaDrafter:
    """The heads saved in ``folder`` with their saved tree (or one of ``budget`` nodes)."""
    net, tree = load_medusa(folder, target, budget)
    return MedusaDrafter(net, target, tree)


def build_medusa(target: Transformer, draft: Transformer | None, folder: str | Path | None, deployed: bool, *,
                 depth: int | None = None, budget: int | None = None) -> MedusaDrafter:
    """The ``medusa`` drafter (``make_drafter``) trained for ``target`` in ``folder`` (the model's own,
    ``ModelSpec.drafter_folder``): a static tree of ``budget`` nodes (re-chosen from the saved
    calibration accuracies) cut at ``depth``; options not given keep the deployed shape (``deployed``),
    else the saved tree."""
    folder, shape = trained_shape("medusa", folder, deployed, run_dtype(target), depth=depth, budget=budget)
    with train_hint("medusa"):
        net, tree = load_medusa(folder, target, shape.get("budget"))
        depth = shape.get("depth")
        return MedusaDrafter(net, target, [n for n in tree if depth is None or len(n) <= depth])
