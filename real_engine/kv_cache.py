"""A preallocated key/value cache with a scratch region for a draft tree.

The committed prefix occupies positions ``[0, length)``. A forward over ``T`` new tokens writes them
at ``[length, length + T)`` (the pending, or scratch, region) and attends over ``[0, length + T)``.
Afterwards the caller either commits them all (prefill, vanilla decoding) or keeps only the accepted
tree path with ``keep(indices)``, which compacts it in place.
"""

from __future__ import annotations

import torch

from core.errors import InputError


class KVCache:
    """Keys and values of every layer, preallocated for ``max_length`` positions (batch first)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, max_length: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (layers, batch, kv_heads, max_length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_length = max_length
        self.length = 0
        self.pending = 0
        self._layers = list(zip(self.k.unbind(0), self.v.unbind(0), strict=True))  # views, for `write`

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ([B, H, T, D]) after the committed prefix; return keys/values up to them."""
        t = k.shape[2]
        end = self.length + t
        if end > self.max_length:
            raise InputError(f"the KV cache holds {self.max_length} positions but {end} are needed: "
                             "raise max_length or shorten the prompt or the number of new tokens")
        keys, values = self._layers[layer]
        keys.narrow(2, self.length, t).copy_(k)
        values.narrow(2, self.length, t).copy_(v)
        self.pending = t
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)

    def commit(self, n: int | None = None) -> None:
        """Keep the first ``n`` pending positions (all of them by default)."""
        n = self.pending if n is None else n
        if not 0 <= n <= self.pending:
            raise ValueError(f"cannot commit {n} of {self.pending} pending positions")
        self.length += n
        self.pending = 0

    def keep(self, indices: list[int] | torch.Tensor) -> None:
        """Commit the pending positions at ``indices`` (in order), compacting them in place."""
        if not isinstance(indices, torch.Tensor) and list(indices) == list(range(len(indices))):
            self.commit(len(indices))  # a prefix (a chain's accepted tokens) is already in place
            return
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.k.device)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.pending):
            raise ValueError(f"keep indices must lie in [0, {self.pending})")
        src = idx + self.length
        n = idx.numel()
        # index_select copies first, so overlapping source and destination are safe.
        self.k[:, :, :, self.length:self.length + n] = self.k.index_select(3, src)
        self.v[:, :, :, self.length:self.length + n] = self.v.index_select(3, src)
        self.length += n
        self.pending = 0

    def truncate(self, length: int) -> None:
        """Forget everything after ``length`` committed positions (e.g. to reuse a prefix)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length
        self.pending = 0
