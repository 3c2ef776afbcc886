"""The token windows training reads: each corpus domain's split as a packed token stream (cached per
tokenizer), cut into seeded training windows, consecutive held-out windows or drawn drafter windows, and
the target's own continuations of their first tokens (on-policy data)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from core.errors import InputError
from core.files import atomic_write
from core.names import DOMAINS
from core.paths import TOKEN_CACHE, TOKENIZER
from real_engine.model import Transformer
from real_engine.training import corpus


def token_stream(domain: str, split: str, tokenizer_path: Path = TOKENIZER) -> np.ndarray:
    """One domain's split as a token stream (``corpus.encode_documents``), cached under ``runs/tokens`` by
    tokenizer hash."""
    tok_hash = hashlib.sha256(Path(tokenizer_path).read_bytes()).hexdigest()[:12]
    path = TOKEN_CACHE / f"{domain}-{split}-{tok_hash}-py{sys.version_info[0]}{sys.version_info[1]}.npy"
    if path.exists():
        return np.load(path, allow_pickle=False)
    tok = corpus.load_tokenizer(tokenizer_path)
    ids = corpus.encode_documents(tok, corpus.documents((domain,), split))
    atomic_write(path, lambda tmp: np.save(open(tmp, "wb"), ids, allow_pickle=False))  # noqa: SIM115
    return ids


def training_stream() -> np.ndarray:
    """The training splits of every corpus domain, one packed stream (the models' training text)."""
    return np.concatenate([token_stream(d, "train") for d in DOMAINS])


class TokenWindows:
    """Non-overlapping ``seq_len + 1`` windows of a packed token stream, in a seeded order per epoch."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.count = (len(tokens) - 1) // seq_len
        if self.count < 1:
            raise InputError(f"the corpus has fewer than {seq_len + 1} tokens: use a shorter seq_len")
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def batch(self, position: int, size: int) -> torch.Tensor:
        """Windows ``position .. position + size`` of the endless seeded sequence, as [size, seq_len + 1]."""
        rows = []
        for p in range(position, position + size):
            epoch, index = divmod(p, self.count)
            if epoch != self._epoch:
                self._epoch = epoch
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.count)
            start = int(self._order[index]) * self.seq_len
            rows.append(self.tokens[start:start + self.seq_len + 1])
        return torch.from_numpy(np.stack(rows).astype(np.int64))


def heldout_windows(seq_len: int, max_windows: int | None, domains: Sequence[str] = DOMAINS,
                    tokenizer_path: Path = TOKENIZER) -> dict[str, torch.Tensor]:
    """Per domain, the held-out stream (tokenized with ``tokenizer_path``) cut into consecutive
    ``seq_len + 1`` windows (capped)."""
    out = {}
    for domain in domains:
        ids = token_stream(domain, "heldout", tokenizer_path)
        n = (len(ids) - 1) // seq_len
        if max_windows is not None:
            n = min(n, max_windows)
        out[domain] = torch.from_numpy(
            np.stack([ids[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int64))
    return out


def corpus_windows(domains: Sequence[str], seq_len: int, count: int, seed: int = 0,
                   tokenizer_path: Path = TOKENIZER) -> torch.Tensor:
    """``count`` token windows ([count, seq_len] long) of the training split of ``domains``.

    Each domain's packed token stream (:func:`token_stream`: with the shipped tokenizer, the one the toy
    target was trained on; with a real model's ``tokenizer_path``, the same text re-tokenized) is cut into
    non-overlapping windows; ``count`` of them are drawn, seeded, from the pool.
    """
    if seq_len < 2 or count < 1:
        raise InputError(f"need seq_len >= 2 and count >= 1, got {seq_len} and {count}")
    pool = []
    for domain in domains:
        ids = token_stream(domain, "train", tokenizer_path)
        usable = len(ids) // seq_len * seq_len
        pool.append(torch.from_numpy(ids[:usable].astype("int64")).view(-1, seq_len))
    windows = torch.cat(pool)
    if len(windows) < count:
        raise InputError(f"the corpus gives {len(windows)} windows of {seq_len} tokens, not {count}: "
                         "ask for fewer")
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed))[:count]
    return windows[order.sort().values]


def check_on_policy(share: float, prefix: int, seq_len: int) -> None:
    """Refuse an on-policy share outside [0, 1] or a rollout prompt that leaves no token to generate."""
    if not 0.0 <= share <= 1.0:
        raise InputError(f"an on-policy share of {share}: give a fraction in [0, 1]")
    if not 1 <= prefix < seq_len:
        raise InputError(f"a rollout prompt of {prefix} tokens: give 1 to {seq_len - 1}")


class Rollouts:
    """Corpus windows of which the first ``share`` of each batch is continued by ``target`` itself after a
    ``prefix``-token corpus prompt: half of those rows greedily, half sampled at temperature 1.

    On-policy distillation data (DistillSpec, Zhou et al. 2024): speculative decoding verifies drafts
    against the target's own continuations, whose statistics (repeats included) corpus text lacks. A
    batch depends only on its position and the seed, so a resumed run draws the same rows.
    """

    def __init__(self, windows: TokenWindows, target: Transformer, share: float, prefix: int = 64) -> None:
        check_on_policy(share, prefix, windows.seq_len)
        self.windows, self.target, self.share, self.prefix = windows, target, share, prefix
        self.seq_len = windows.seq_len

    def batch(self, position: int, size: int) -> torch.Tensor:
        """``TokenWindows.batch`` with its first ``round(share * size)`` rows replaced by rollouts."""
        x = self.windows.batch(position, size)
        n = round(self.share * size)
        if n:
            gen = torch.Generator().manual_seed(self.windows.seed * 1_000_003 + position)
            sampled = torch.arange(n) >= (n + 1) // 2
            x[:n] = rollout(self.target, x[:n, :self.prefix], self.seq_len + 1, sampled, gen)
        return x


@torch.inference_mode()
def rollout(target: Transformer, prompts: torch.Tensor, total: int, sampled: torch.Tensor,
            gen: torch.Generator) -> torch.Tensor:
    """Continue ``prompts`` ([B, P]) to ``total`` tokens with ``target`` and a batched KV cache: rows where
    ``sampled`` ([B] bool) is True draw from its softmax, the others take its argmax."""
    b, start = prompts.shape
    cache = target.new_cache(total, batch=b)
    out = torch.empty(b, total, dtype=torch.long)
    out[:, :start] = prompts
    logits = target(prompts, cache=cache).logits[:, -1].float()
    cache.commit()
    for i in range(start, total):
        draw = torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
        out[:, i] = torch.where(sampled, draw, logits.argmax(-1))
        if i + 1 < total:
            logits = target(out[:, i:i + 1], cache=cache).logits[:, -1].float()
            cache.commit()
    return out
