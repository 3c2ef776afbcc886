"""Logit warping: temperature, top-k and top-p turn logits into the law that is sampled and verified.

The target's warped law is the distribution a lossless verifier reproduces; a drafter warps its own
logits with the same settings to get its draft law ``q``. Temperature 0 means greedy decoding: the
law is a point mass on the argmax (ties to the lowest token id, as ``torch.argmax``).

A sampling temperature is finite and at least ``MIN_TEMPERATURE``, else InputError: dividing by a
smaller one overflows float32 for logits above 3.4e38 x temperature (NaN probabilities, and draws
outside the vocabulary), and one below float32's smallest number rounds to 0. From ``MIN_TEMPERATURE``
up, every logit below 3.4e34 in magnitude (any model's) divides to a finite number, so the law is a
proper distribution and every draw a token id; a huge temperature gives the uniform law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.errors import InputError

MIN_TEMPERATURE = 1e-4  # the smallest sampling temperature; below it use 0 (greedy), which it approaches


@dataclass(frozen=True)
class Sampling:
    """Decoding settings: ``temperature`` (0 = greedy), ``top_k`` (0 = off), ``top_p`` (1 = off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature):
            raise InputError(f"temperature {self.temperature} is not a finite number: give 0 (greedy) or a "
                             "positive temperature such as 1")
        if self.temperature < 0:
            raise InputError(f"temperature {self.temperature} is negative: give 0 (greedy) or more")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise InputError(f"temperature {self.temperature:g} is below {MIN_TEMPERATURE:g}, where logits / "
                             f"temperature overflow: use 0 (greedy) or {MIN_TEMPERATURE:g} or more")
        if self.top_k < 0:
            raise InputError(f"top-k {self.top_k} is negative: give 0 (off) or a positive count")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top-p {self.top_p} is outside (0, 1]: give 1 (off) or a fraction")

    @property
    def greedy(self) -> bool:
        """True at temperature 0."""
        return self.temperature == 0


def warp(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Probabilities (float32, ``[..., V]``) from ``logits`` under ``sampling``.

    Top-k keeps the ``k`` largest logits (ties at the k-th included); top-p then keeps the smallest
    set of most likely tokens whose mass reaches ``p`` (the most likely token always stays).
    """
    vocab = logits.shape[-1]
    if sampling.greedy:  # a point mass (scatter: one_hot checks its input, which costs more here)
        point = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return point.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    x = logits.float() / sampling.temperature
    if 0 < sampling.top_k < vocab:
        kth = x.topk(sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sampling.top_p < 1:
        ordered, order = x.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        ordered = ordered.masked_fill(before >= sampling.top_p, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, ordered)
    return x.softmax(-1)
