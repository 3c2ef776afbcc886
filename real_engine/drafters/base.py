"""The one protocol every drafter implements, so the decode loop drives them all alike.

The decode loop keeps the target's KV cache holding every committed token but the last, the
*root*; each target forward runs the root together with a draft tree hanging from it. A drafter
follows the same sequence through three calls:

- ``begin(prompt, target, sampling, generator, max_length)`` starts a sequence. ``prompt[-1]`` is
  the root; ``target`` is the target's output over ``prompt[:-1]`` (row ``i`` is position ``i``,
  which predicts ``prompt[i + 1]``), so feature drafters (SpecBlock, EAGLE, Medusa) get the
  low/mid/high features (``Output.features``) and the final hidden (``Output.hidden``) of every
  committed position. ``sampling`` is the target's warping, which the drafter applies to its own
  law; every random draw uses ``generator``; ``max_length`` bounds the sequence (for cache sizing).
- ``propose(max_depth)`` returns a :class:`DraftTree` rooted at the root, at most ``max_depth``
  deep, with ``q`` (row ``i``: the law node ``i``'s children were drafted from; zero where nothing
  was drafted) and the ``child_rule`` they obey.
- ``accept(path, token, target)``: the verifier accepted the nodes ``path`` of the last proposal
  and emitted ``token``, the next root. ``target`` holds the target's rows at the root and at those
  nodes; row ``i`` predicts ``[*accepted tokens, token][i]``, the pairing ``begin`` uses.

A drafter with its own model keeps its own cache exact through these calls (n-gram needs only the
tokens) and adds the time its model forwards take to ``model_seconds``, so the loop can tell model
time from overhead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch

from real_engine.model import Output
from real_engine.tree import DraftTree
from real_engine.warp import Sampling


class Drafter(Protocol):
    """Proposes a draft tree each step and follows the committed sequence (see the module doc)."""

    model_seconds: float

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Start a sequence whose last prompt token is the root."""
        ...

    def propose(self, max_depth: int) -> DraftTree:
        """A draft tree from the current root, no deeper than ``max_depth``."""
        ...

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Commit the accepted nodes of the last proposal and the emitted ``token`` (the new root)."""
        ...


def prompt_rows(drafter: object | None) -> int | None:
    """How many of the prompt's last positions the prefill before ``drafter.begin`` must give logits for:
    every one (None) for a drafter that reads them (one whose class sets ``reads_prompt_logits``: the
    adaptation's feedback recorder keeps the target's law at every committed position), else the last
    one (the LM head over a long prompt costs more than the rest of its forward)."""
    return None if getattr(drafter, "reads_prompt_logits", False) else 1


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the calling thread's CUDA stream has finished its queued work (so GPU
    time lands where it was spent, while an update on a side stream runs on; a no-op wait on CPU)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return time.perf_counter()
