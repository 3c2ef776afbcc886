"""Linear layers that run CPU inference on FBGEMM's packed half-precision weights.

On a CPU a decode step is a string of matrix-vector products, and torch's default kernel (MKL here)
is slow at the few rows a speculative verify runs: on the shipped target's LM head it takes 2 to 4
times a one-row product for 2 to 5 rows (``benchmarks/cpu_linear.py``). FBGEMM's fp16-weight kernel,
with weights packed once, takes 2.6 to 6 times less time there; it reads half the bytes (a whole
forward of the shipped target runs 1.5 to 2 times faster), and fp16 holds every bfloat16 weight at
or above 2^-14 exactly. So a ``Linear`` marked half (``use_half``: every model and drafter loaded
from a 16-bit checkpoint) computes in inference (no autograd, float32 input on a CPU with FBGEMM)
with its weights packed in fp16 and fp32 activations and accumulation; anywhere else, and always
while training, it is ``nn.Linear``. The packed copy follows the weight: an in-place update, a new
tensor or a move repacks it at the next call.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# torch marks the two FBGEMM entry points deprecated, but the quantized-op route to the same kernel
# costs about 40 us more per call, which is the whole gain on the layers' small matrices.
warnings.filterwarnings("ignore", message="fbgemm_.*is deprecated")

FBGEMM = (hasattr(torch, "fbgemm_pack_gemm_matrix_fp16")
          and "fbgemm" in torch.backends.quantized.supported_engines
          and torch.backends.cpu.get_cpu_capability() != "DEFAULT")


class _Pack:
    """The packed weight and the (storage, version) of the weight it was packed from; a copy starts empty."""

    __slots__ = ("key", "tensor")

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.tensor: torch.Tensor | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Pack:
        return _Pack()


class Linear(nn.Linear):
    """``nn.Linear`` with the same parameters and state dict, packed in fp16 for CPU inference once
    ``packs_half`` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.packs_half = False
        self._pack = _Pack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed(x)
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        y = torch.fbgemm_linear_fp16_weight_fp32_activation(rows, packed, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def _packed(self, x: torch.Tensor) -> torch.Tensor | None:
        w = self.weight
        if (not (self.packs_half and FBGEMM) or torch.is_grad_enabled() or x.device.type != "cpu"
                or x.dtype != torch.float32 or w.dtype != torch.float32 or x.numel() == 0):
            return None
        key = (w.data_ptr(), -1 if w.is_inference() else w._version)
        pack = self._pack
        if pack.key != key:
            pack.tensor, pack.key = torch.fbgemm_pack_gemm_matrix_fp16(w.detach()), key
        return pack.tensor


def use_half(module: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """Mark every ``Linear`` in ``module`` to infer on packed fp16 weights when its checkpoint ``state``
    stores them in 16 bits: fp16 then loses nothing that mattered (see the module docstring)."""
    if all(t.dtype in (torch.bfloat16, torch.float16) for t in state.values() if t.is_floating_point()):
        for m in module.modules():
            if isinstance(m, Linear):
                m.packs_half = True
    return module
