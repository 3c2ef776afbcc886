"""Linear layers that run CPU inference on prepacked weights: FBGEMM's half precision for a float32
model, oneDNN's bfloat16 for a bfloat16 one.

On a CPU a decode step is a string of matrix-vector products, and torch's default kernel (MKL here) is
slow at the few rows a speculative verify runs: on the shipped target's LM head a product of 2 to 5 rows
takes several times a one-row product. FBGEMM's fp16-weight kernel, with weights packed once, takes
several times less time there and reads half the bytes (each kernel's times:
``benchmarks/results/cpu_linear.json``, docs/results.md, "Packed half-precision linears on CPU"), and
fp16 holds every bfloat16 weight at or above 2^-14 exactly. So a ``Linear`` marked half (``use_half``:
every model and drafter loaded from a 16-bit checkpoint) computes in inference (no autograd, float32
input on a CPU with FBGEMM) with its weights packed in fp16 and fp32 activations and accumulation;
anywhere else, and always while training, it is ``nn.Linear``. The packed copy follows the weight: an
in-place update, a new tensor or a move repacks it at the next call.

A bfloat16 model runs its linears on oneDNN with weights reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, the layout inductor's CPU freezing uses): torch's default
bfloat16 linear is several times slower at one to a few rows (``benchmarks/cpu_linear.py``), and the
reordered product computes the same numbers. It needs no mark: the weights are already bfloat16. A
float32 model whose checkpoint holds float32 weights (a GGUF's F32 tensors) runs the same way on its
float32 weights, reordered, not rounded: torch's default (MKL) float32 linear at one to a few rows is
likewise the slow one (``benchmarks/cpu_linear.py`` times both).

A small decode step costs more in calls than in arithmetic (each product and its checks cost a fixed
overhead per call), so ``Fused`` runs linears that share an input (query, key and value; gate and
up) as one packed product, and the repacking check reads the parameters directly.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# torch marks the two FBGEMM entry points deprecated, but the quantized-op route to the same kernel
# adds a per-call overhead as large as the whole gain on the layers' small matrices.
warnings.filterwarnings("ignore", message="fbgemm_.*is deprecated")

FBGEMM = (hasattr(torch, "fbgemm_pack_gemm_matrix_fp16")
          and "fbgemm" in torch.backends.quantized.supported_engines
          and torch.backends.cpu.get_cpu_capability() != "DEFAULT")
ONEDNN = torch.backends.mkldnn.is_available()
ONEDNN_BF16 = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
ONEDNN_ROWS = 1  # the row count oneDNN's reorder is told to expect (it serves every count)


def _kind(layer: Linear, x: torch.Tensor) -> str | None:
    """Which prepacked kernel serves ``layer`` on input ``x``: "fp16" (FBGEMM, a half-marked layer on
    float32), "fp32" (oneDNN, any other float32 layer), "bf16" (oneDNN, a bfloat16 layer) or None
    (torch's own linear: training, another device or dtype, an empty input)."""
    if torch.is_grad_enabled() or not x.is_cpu or x.numel() == 0:
        return None
    if x.dtype is torch.float32:
        return "fp16" if layer.packs_half else "fp32" if ONEDNN else None
    if x.dtype is torch.bfloat16 and ONEDNN_BF16:
        return "bf16"
    return None


def _run(kind: str, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The product of ``x`` and a pack of kind ``kind`` (see ``_kind``)."""
    if kind != "fp16":
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    y = torch.fbgemm_linear_fp16_weight_fp32_activation(x.reshape(-1, x.shape[-1]), packed, bias)
    return y.view(*x.shape[:-1], y.shape[-1])


class _Pack:
    """A pack of one or more layers' weights stacked (and their biases), of one kernel's kind, with the
    parameters (and their in-place versions) it was packed from; a copy starts empty."""

    __slots__ = ("bias", "kind", "sources", "tensor")

    def __init__(self) -> None:
        self.sources: list[tuple[dict[str, Any], str, torch.Tensor | None, int]] = []
        self.tensor: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.kind: str | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Pack:
        return _Pack()

    def get(self, layers: tuple[Linear, ...], x: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        """The kernel's kind and the pack of ``layers``' weights for input ``x``, repacked if a weight or
        bias was replaced or changed in place; None where the product runs unpacked (``_kind``). A decode
        step runs this check for every product, so it reads the parameter dicts directly."""
        kind = _kind(layers[0], x)
        if kind is None:
            return None
        if kind != self.kind:
            return self._repack(layers, kind)
        for params, name, tensor, version in self.sources:
            now = params[name]
            if now is not tensor or (version >= 0 and now._version != version):
                return self._repack(layers, kind)
        return (kind, self.tensor) if self.sources else self._repack(layers, kind)

    def _repack(self, layers: tuple[Linear, ...], kind: str) -> tuple[str, torch.Tensor] | None:
        weights = [m.weight for m in layers]
        self.sources, self.tensor, self.kind = [], None, None
        wanted = torch.bfloat16 if kind == "bf16" else torch.float32
        if not all(w.dtype is wanted and (kind != "fp16" or m.packs_half)
                   for m, w in zip(layers, weights, strict=True)):
            return None
        stacked = torch.cat([w.detach() for w in weights])
        self.tensor = (torch.fbgemm_pack_gemm_matrix_fp16(stacked) if kind == "fp16" else
                       torch.ops.mkldnn._reorder_linear_weight(stacked, ONEDNN_ROWS))
        self.kind = kind
        biases = [m.bias for m in layers]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else m.weight.new_zeros(m.out_features)
             for m, b in zip(layers, biases, strict=True)])
        self.sources = [(m._parameters, name, t, -1 if t is None or t.is_inference() else t._version)
                        for m in layers for name, t in (("weight", m.weight), ("bias", m.bias))]
        return kind, self.tensor


class Linear(nn.Linear):
    """``nn.Linear`` with the same parameters and state dict, packed for CPU inference: in fp16 once
    ``packs_half`` is set, else reordered in its own dtype (``_kind``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.packs_half = False
        self._pack = _Pack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed(x)
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        return _run(packed[0], x, packed[1], self.bias)

    def _packed(self, x: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        return self._pack.get((self,), x)


class Fused:
    """Linears that share their input, run as one product with their outputs concatenated: the query,
    key and value projections, or the gate and up projections. Packed, that is one fp16 product over
    their stacked weights (a decode step's small products cost mostly per call); otherwise one
    ``F.linear`` each. A plain attribute, not a module, so the state dict keeps the Hugging Face names
    of the layers it holds."""

    def __init__(self, *layers: Linear) -> None:
        self.layers = layers
        self._pack = _Pack()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._pack.get(self.layers, x)
        if packed is None:
            return torch.cat([F.linear(x, m.weight, m.bias) for m in self.layers], dim=-1)
        return _run(packed[0], x, packed[1], self._pack.bias)

    def __deepcopy__(self, memo: dict[int, Any]) -> Fused:
        return Fused(*(copy.deepcopy(m, memo) for m in self.layers))


def prepack(module: nn.Module) -> None:
    """Pack every half-marked linear of ``module`` now: a copy (a trained drafter) packs at its first
    inference call otherwise, so whoever prepares a network pays for it, not the first query it serves."""
    fused = [v for m in module.modules() for v in vars(m).values() if isinstance(v, Fused)]
    inside = {id(layer) for f in fused for layer in f.layers}  # run as their fused product, never alone
    with torch.no_grad():
        for f in fused:
            f(f.layers[0].weight.new_zeros(1, f.layers[0].in_features))
        for m in module.modules():
            if isinstance(m, Linear) and id(m) not in inside:
                m._packed(m.weight.new_zeros(1, m.in_features))


def cut_rows(layer: Linear, ids: torch.Tensor) -> Linear:
    """``layer`` cut to the output rows ``ids``: a frozen copy, packed for inference as ``layer`` is (an LM
    head over a drafter's reduced vocabulary)."""
    w = layer.weight
    cut = Linear(w.shape[1], ids.numel(), bias=False, device=w.device, dtype=w.dtype)
    cut.weight = nn.Parameter(w.detach()[ids.to(w.device)], requires_grad=False)
    cut.packs_half = layer.packs_half
    return cut


def use_half(module: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """Mark every ``Linear`` in ``module`` to infer on packed fp16 weights when its checkpoint ``state``
    stores them in 16 bits: fp16 then loses nothing that mattered (see the module docstring)."""
    if all(t.dtype in (torch.bfloat16, torch.float16) for t in state.values() if t.is_floating_point()):
        for m in module.modules():
            if isinstance(m, Linear):
                m.packs_half = FBGEMM
    return module
