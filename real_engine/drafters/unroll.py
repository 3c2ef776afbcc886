"""SpecBlock's training forward: the drafter run as inference runs it, on whole sequences at once.

Training (``training.specblock``), online adaptation (``adapt``) and the profiler's update timings run
:func:`unroll`: the prefix rows and block 1 at chosen start positions in one forward, then each later
block from a chosen slot of the previous one, under the same masks as drafting
(:class:`~real_engine.drafters.specblock.SpecBlockDrafter`), with keys grown by concatenation so that
autograd differentiates the whole unroll.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from real_engine.drafters.specblock import SpecBlock, causal_blocks


class GrowingCache:
    """Keys and values grown by concatenation: autograd-safe, for training's unrolled blocks."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v`` ([B, H, T, D]) to ``layer``'s; return all of them."""
        if layer in self.k:
            k, v = torch.cat((self.k[layer], k), dim=2), torch.cat((self.v[layer], v), dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v


class Unrolled(NamedTuple):
    """Training forward of M blocks at P start positions per sequence (see :func:`unroll`)."""

    logits: torch.Tensor  # [B, M, P, K, V] the block rows' token logits; block 1's slot 0: the prefix row
    positions: torch.Tensor  # [M, P, K] sequence position of each block row (it predicts position + 1)
    prefix: torch.Tensor  # [B, T, H] last-layer states of the prefix rows (row t: slot 0 of a block at t)
    states: torch.Tensor  # [B, M, P, K, H] last-layer states of the block rows (what ``logits`` read)


def unroll(net: SpecBlock, tokens: torch.Tensor, features: torch.Tensor, starts: torch.Tensor,
           start_slots: torch.Tensor) -> Unrolled:
    """Run the drafter as inference does, on a whole training sequence at once.

    ``tokens`` [B, T], ``features`` [B, T, 3 H_target] (the target's, row ``t`` after token ``t``);
    ``starts`` [P] the positions where block 1 starts; ``start_slots`` [M - 1, P]: block ``m + 1``
    starts at slot ``start_slots[m]`` of block ``m``, whose state conditions it, on the token that slot
    predicts (the sequence's). One forward for the prefix rows and block 1, one per later block;
    the LM head runs on block rows only (the rank head is left to the caller: training reads its own
    inputs, see ``training.specblock.rank_loss``).
    """
    b, t = tokens.shape
    k, p, m = net.config.block_size, starts.numel(), start_slots.shape[0] + 1
    dev = tokens.device
    arange_t, slots = torch.arange(t, device=dev), torch.arange(k, device=dev)
    cond = torch.cat((features.new_zeros(b, 1, features.shape[-1]), features[:, :-1]), dim=1)
    cond = net.condition(cond)  # [B, T, H]
    # Forward 1: T prefix rows, then slots 1..K-1 of block 1 at each start.
    extra = p * (k - 1)
    x = torch.cat((net.inputs(cond, tokens, torch.zeros_like(tokens)),
                   net.inputs(cond[:, starts].repeat_interleave(k - 1, 1),
                              tokens[:, starts].repeat_interleave(k - 1, 1),
                              slots[1:].repeat(p).expand(b, -1))),
                  dim=1)
    # Row index of block 1's slot j at start i: the prefix row for j = 0.
    rows = torch.cat((starts[:, None], t + torch.arange(extra, device=dev).view(p, k - 1)), dim=1)
    shift_from = torch.cat((arange_t, rows[:, :-1].reshape(-1)))
    positions = (starts[:, None] + slots).view(p, k)
    seen = arange_t[None] <= starts[:, None]  # [P, T] the prefix each start sees
    mask = torch.zeros(t + extra, t + extra, dtype=torch.bool, device=dev)
    mask[:t, :t] = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    mask[t:, :t] = seen.repeat_interleave(k - 1, 0)
    mask[t:, t:] = causal_blocks(p, k - 1, dev)
    cache = GrowingCache()
    first = net(x, shift_from, torch.cat((arange_t, positions[:, 1:].reshape(-1))), mask, cache)
    states, block_rows, all_positions = [first[:, rows]], [rows], [positions]
    path = torch.cat((seen, torch.zeros(p, extra, dtype=torch.bool, device=dev)), dim=1)  # [P, keys so far]
    total = t + extra
    for block in range(1, m):
        s = start_slots[block - 1]
        chosen = torch.arange(p, device=dev)
        # This block sees the previous one's slots 0..s on top of what that one saw.
        path[chosen[:, None], block_rows[-1]] |= slots[None] <= s[:, None]
        base = all_positions[-1][chosen, s] + 1  # [P] position of the start token
        tok = tokens[:, base.clamp(max=t - 1)]
        x = net.inputs(states[-1][:, chosen, s].repeat_interleave(k, 1), tok.repeat_interleave(k, 1),
                       slots.repeat(p).expand(b, -1))
        own = torch.arange(p * k, device=dev).view(p, k)
        shift_from = torch.cat((own[:, :1], own[:, :-1]), dim=1).reshape(-1)
        positions = base[:, None] + slots
        mask = torch.cat((path.repeat_interleave(k, 0), causal_blocks(p, k, dev)), dim=1)
        hidden = net(x, shift_from, positions.reshape(-1), mask, cache)
        states.append(hidden.view(b, p, k, -1))
        block_rows.append(total + own)
        all_positions.append(positions)
        path = torch.cat((path, torch.zeros(p, p * k, dtype=torch.bool, device=dev)), dim=1)
        total += p * k
    stacked = torch.stack(states, dim=1)
    return Unrolled(net.token_logits(stacked), torch.stack(all_positions), first[:, :t], stacked)
