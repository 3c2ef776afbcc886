"""Drafter training's numeric precision: ``"32"`` (float32 throughout) or ``"bf16-mixed"`` (the names
Lightning gives them).

Mixed precision keeps the weights, the optimizer state and the losses in float32 and runs the matrix
products in bfloat16 with float32 accumulation (``torch.autocast``), as EAGLE's and Medusa's trainers do
on GPUs; on a CPU with bfloat16 dot products a step takes less than half the time. The frozen LM head a
drafter scores every row through (EAGLE-style's and Medusa-style's are the target's; SpecBlock's rows
outside its drafting vocabulary stay the target's) is ``FrozenHead``: a bfloat16 copy under mixed
precision, so that its product (over SmolLM2's 49,152 rows, most of a step in float32) never runs in
float32, and float32 logits out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import InputError

PRECISION = "bf16-mixed"
"""The recipes' precision (``BaselineConfig.precision``, ``SpecBlockTrainConfig.precision``)."""
PRECISIONS = ("32", "bf16-mixed")


def check_precision(name: str) -> None:
    """InputError unless ``name`` is a training precision."""
    if name not in PRECISIONS:
        raise InputError(f"precision {name!r}: use one of {', '.join(PRECISIONS)}")


def head_dtype(precision: str) -> torch.dtype:
    """The dtype a frozen head runs in under ``precision``."""
    return torch.bfloat16 if precision == "bf16-mixed" else torch.float32


@contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """The forward of a training step under ``precision``."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        yield


class FrozenHead(nn.Module):
    """``x @ weight.T`` with ``weight`` frozen, in ``head_dtype(precision)`` (a copy outside the state
    dict); float32 logits."""

    def __init__(self, weight: torch.Tensor, precision: str = PRECISION) -> None:
        super().__init__()
        check_precision(precision)
        self.register_buffer("weight", weight.detach().to(head_dtype(precision)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x`` ([..., H] -> [..., V])."""
        return F.linear(x.to(self.weight.dtype), self.weight).float()
