"""Prompt-lookup (n-gram) drafting: continue the context the way it continued before.

For ``n`` from ``max_ngram`` down to ``min_ngram``, find the latest earlier occurrence of the
context's last ``n`` tokens and propose the tokens that followed it (as ``transformers``'
``prompt_lookup_num_tokens`` and vLLM's n-gram proposer do). The draft is deterministic, so ``q``
is a point mass on each drafted token and the child rule is ``topk``; there is no model to run.
``NgramIndex`` keeps, per n-gram, where it last continued, so a lookup costs the same at any context
length; the draft model reads its staged chains' guesses and its lookup proposals from it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from core.errors import InputError
from real_engine.drafters.trained import deployed_shape
from real_engine.model import Output, Transformer
from real_engine.packed import run_dtype
from real_engine.tree import DraftTree
from real_engine.warp import Sampling


class NgramIndex:
    """A growing token sequence with, for each n-gram of 1 to ``max_ngram`` tokens, the position after its
    latest occurrence that some token followed."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self._after: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens``; each one becomes the continuation of the n-grams that end just before it."""
        for token in tokens:
            i = len(self.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, i) + 1):
                self._after[n][tuple(self.tokens[i - n:i])] = i
            self.tokens.append(int(token))

    def find(self, tail: Sequence[int] = ()) -> tuple[int, int]:
        """Where the continuation starts after the latest earlier occurrence of the longest n-gram that
        ends the sequence extended by ``tail`` (tokens not yet in it, such as a draft's), and that
        n-gram's length; ``(len(tokens), 0)`` when none occurred."""
        context = [*self.tokens[-self.max_ngram:], *tail]
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            start = self._after[n].get(tuple(context[-n:]))
            if start is not None:
                return start, n
        return len(self.tokens), 0

    def lookup(self, k: int, tail: Sequence[int] = ()) -> list[int]:
        """Up to ``k`` tokens that followed the match ``find`` gives."""
        start, _ = self.find(tail)
        return self.tokens[start:start + k]


def lookup_chain(root: int, draft: Sequence[int], vocab: int, device: torch.device) -> DraftTree:
    """The chain ``root -> draft`` of looked-up tokens: deterministic candidates (child rule ``topk``)
    with point-mass ``q``, so every verifier stays lossless."""
    q = F.one_hot(torch.tensor(draft, dtype=torch.long), vocab).float()
    q = torch.cat((q, q.new_zeros(1, vocab))).to(device)
    tokens = torch.tensor([root, *draft], device=device)
    parents = torch.arange(-1, len(draft), device=device)
    return DraftTree(tokens, parents, q, "topk")


class NgramDrafter:
    """Drafts a chain of up to ``depth`` tokens by n-gram lookup in the committed context."""

    def __init__(self, depth: int = 4, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if depth < 1 or not 1 <= min_ngram <= max_ngram:
            raise InputError(f"n-gram drafter needs depth >= 1 and 1 <= min_ngram <= max_ngram, got "
                             f"depth={depth}, min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.depth, self.max_ngram, self.min_ngram = depth, max_ngram, min_ngram
        self.model_seconds = 0.0
        self.index = NgramIndex(max_ngram, min_ngram)
        self.vocab = 0
        self.device = torch.device("cpu")
        self._last: list[int] = []

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Start from the prompt (only its tokens are used)."""
        self.index = NgramIndex(self.max_ngram, self.min_ngram)
        self.index.extend(prompt.tolist())
        self.vocab, self.device = target.logits.shape[-1], prompt.device

    def propose(self, max_depth: int) -> DraftTree:
        """A chain of looked-up tokens (possibly empty) with point-mass ``q``."""
        draft = self.index.lookup(min(self.depth, max_depth)) if max_depth > 0 else []
        self._last = draft
        return lookup_chain(self.index.tokens[-1], draft, self.vocab, self.device)

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Append the accepted tokens (node ``i`` of the chain is draft token ``i - 1``) and ``token``."""
        self.index.extend([*(self._last[node - 1] for node in path), token])


def build_ngram(target: Transformer, draft: Transformer | None, folder: str | Path | None, deployed: bool, *,
                depth: int | None = None, max_ngram: int | None = None) -> NgramDrafter:
    """The ``ngram`` drafter (``make_drafter``): chains of ``depth`` (4) tokens looked up with n-grams of up
    to ``max_ngram`` (3) tokens; it runs no model. Given a model's ``folder`` (and ``deployed``), options
    left None take the shape `specblock shapes --apply` saved there for that model."""
    saved = deployed_shape("ngram", folder, run_dtype(target)) if deployed and folder is not None else {}
    return NgramDrafter(depth or int(saved.get("depth", 4)), max_ngram or int(saved.get("max_ngram", 3)))
