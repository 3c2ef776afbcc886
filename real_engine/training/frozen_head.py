"""A frozen LM head in drafter training, its product taken in a lower precision.

The feature drafters score every row against the whole vocabulary through an LM head they do not train
(EAGLE-style's and Medusa-style's are the target's; SpecBlock's rows outside its drafting vocabulary stay
the target's). Over a real vocabulary that product is most of a step: SmolLM2's head is 49,152 x 576.
``FrozenHead`` takes it in ``HEAD_DTYPE`` with float32 accumulation, as mixed-precision training does, and
returns float32 logits; on a CPU with bfloat16 dot products that is several times faster than float32,
and the gradient flows to the head's input only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import InputError

HEAD_DTYPE = "bfloat16"
"""The frozen head's dtype in training: ``BaselineConfig.head_dtype`` and ``SpecBlockTrainConfig``'s."""
HEAD_DTYPES = ("float32", "bfloat16")


def check_head_dtype(name: str) -> None:
    """InputError unless ``name`` is a dtype a frozen head can run in."""
    if name not in HEAD_DTYPES:
        raise InputError(f"head_dtype {name!r}: use one of {', '.join(HEAD_DTYPES)}")


class FrozenHead(nn.Module):
    """``x @ weight.T`` in ``dtype`` (a copy of ``weight``, outside the state dict), returned in ``x``'s
    dtype."""

    def __init__(self, weight: torch.Tensor, dtype: str = HEAD_DTYPE) -> None:
        super().__init__()
        check_head_dtype(dtype)
        self.register_buffer("weight", weight.detach().to(getattr(torch, dtype)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x`` ([..., H] -> [..., V])."""
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
