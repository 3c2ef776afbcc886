"""Several sequences' KV caches run as one packed sequence: the batched engine packs its requests' drafts
into one target forward, and a draft model's chains draft in lockstep the same way.

Attention is block-diagonal: a sequence's new tokens see its own cache and, among the new tokens, only
its own (by its mask), nothing of the others'.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from real_engine.kv_cache import KVCache
from real_engine.model import Output, Transformer


class RaggedCache:
    """Several requests' caches read and written as one packed sequence of ``counts`` new tokens each.

    ``Transformer.forward`` sees one cache: ``write`` splits the packed keys and values by request,
    stores each part in that request's cache and returns every request's keys (its prefix, then its new
    tokens) back to back, the layout ``mask`` gives attention. The copy costs one pass over every
    request's prefix per layer and iteration: negligible beside the forward at these contexts."""

    def __init__(self, caches: Sequence[KVCache], counts: Sequence[int]) -> None:
        self.caches, self.counts = list(caches), list(counts)
        self.length = sum(c.length for c in self.caches)  # keys before the packed new tokens, all requests

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store each request's part of ``k, v`` ([1, H, sum(counts), D]); all requests' keys and values."""
        parts = [c.write(layer, ki, vi) for c, ki, vi in
                 zip(self.caches, k.split(self.counts, 2), v.split(self.counts, 2), strict=True)]
        return torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 2)

    def mask(self, trees: Sequence[torch.Tensor]) -> torch.Tensor:
        """[sum(counts), length + sum(counts)] bool: each request's tokens attend to its own prefix and,
        among its new tokens, by its ``trees`` entry ([count, count])."""
        total = sum(self.counts)
        mask = torch.zeros(total, self.length + total, dtype=torch.bool, device=trees[0].device)
        row = col = 0
        for cache, count, tree in zip(self.caches, self.counts, trees, strict=True):
            mask[row:row + count, col:col + cache.length] = True
            mask[row:row + count, col + cache.length:col + cache.length + count] = tree
            row, col = row + count, col + cache.length + count
        return mask


def packed_forward(model: Transformer, caches: Sequence[KVCache], tokens: Sequence[torch.Tensor],
                   positions: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                   head: nn.Module | None = None) -> tuple[Output, list[int]]:
    """One forward of ``model`` over several sequences' new ``tokens`` (each at its ``positions``, attending
    among themselves by its ``masks`` entry and to its own cache, where they stay pending); the output's
    rows in sequence order and each sequence's count of them. ``head`` replaces the LM head (a drafter
    reads final hidden states)."""
    counts = [t.numel() for t in tokens]
    ragged = RaggedCache(caches, counts)
    return model(torch.cat(tokens)[None], torch.cat(positions), ragged, ragged.mask(masks), head), counts
