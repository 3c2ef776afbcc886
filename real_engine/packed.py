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

A model run in ``int4`` (``quantize``) reads 4-bit weights: its decoder layers' linears run on torch's
int4 kernel (``_weight_int4pack_mm_for_cpu``: groups of ``GROUP`` weights along the input, each with a
bfloat16 scale and zero, w = (q - 8) * scale + zero) and its LM head on the int8 one
(``_weight_int8pack_mm``: a bfloat16 scale per row), with bfloat16 activations, as llama.cpp runs a Q4_1
file (its layers Q4_1, its output Q8_0). The codes are found from the weights, a group's minimum and
maximum mapping to 0 and 15, then the scale and zero refitted to them: weights dequantized from a Q4_1
block (d * q + m, its minimum and maximum coded 0 and 15) give back the block's own codes, with d and m
rounded to bfloat16. The int4 and int8 kernels' cost grows with the rows faster than oneDNN's: past
``INT4_MOST_ROWS`` rows (a prefill, a large tree's verify) a quantized layer runs on oneDNN over the same
weights dequantized once to bfloat16 ((q - 8) * scale + zero, rounded), a second copy of the layer.
Each kernel computes a row the same whatever rows run with it, so below
that a verify's rows take the one-token steps' path (attention still parts them: docs/design.md).

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

from core.errors import InputError

# torch marks the two FBGEMM entry points deprecated, but the quantized-op route to the same kernel
# adds a per-call overhead as large as the whole gain on the layers' small matrices.
warnings.filterwarnings("ignore", message="fbgemm_.*is deprecated")

FBGEMM = (hasattr(torch, "fbgemm_pack_gemm_matrix_fp16")
          and "fbgemm" in torch.backends.quantized.supported_engines
          and torch.backends.cpu.get_cpu_capability() != "DEFAULT")
ONEDNN = torch.backends.mkldnn.is_available()
ONEDNN_BF16 = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
ONEDNN_ROWS = 1  # the row count oneDNN's reorder is told to expect (it serves every count)
INT4 = all(hasattr(torch.ops.aten, op) for op in ("_weight_int4pack_mm_for_cpu", "_weight_int8pack_mm"))
GROUP = 32  # weights per 4-bit group along a row, each with its scale and zero (a Q4_1 block)
INT4_TILES = 2  # the inner k tiles of the int4 packing (torch's CPU kernel)
INT4_ROWS = 16  # the int4 packing takes whole multiples of this many output rows
INT4_MOST_ROWS = 8  # more input rows than this run on the dequantized weights (the module docstring)


def _kind(layer: Linear, x: torch.Tensor) -> str | None:
    """Which prepacked kernel serves ``layer`` on input ``x``: "fp16" (FBGEMM, a half-marked layer on
    float32), "fp32" (oneDNN, any other float32 layer), "int4" or "int8" (torch's, a layer ``quantize``
    marked, on bfloat16), "bf16" (oneDNN, a bfloat16 layer) or None (torch's own linear: training,
    another device or dtype, an empty input)."""
    if torch.is_grad_enabled() or not x.is_cpu or x.numel() == 0:
        return None
    if x.dtype is torch.float32:
        return "fp16" if layer.packs_half else "fp32" if ONEDNN else None
    if x.dtype is torch.bfloat16 and layer.bits:
        return f"int{layer.bits}"
    if x.dtype is torch.bfloat16 and ONEDNN_BF16:
        return "bf16"
    return None


def _quantize(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] packed for the ``bits``-bit kernel, then the weights the pack gives, in
    bfloat16 reordered for oneDNN (for many rows): 4, each group's codes (its minimum to maximum in 16
    steps) packed and the scales and zeros that fit them best ([in / GROUP, out, 2], bfloat16); 8, its
    int8 rows and each row's scale (bfloat16, the row's largest magnitude over 127)."""
    w = weight.detach().float()
    if bits == 8:
        scale = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
        codes = (w / scale.float()[:, None]).round().clamp(-127, 127)
        weights = (codes * scale.float()[:, None]).to(torch.bfloat16)
        return (codes.to(torch.int8), scale, torch.ops.mkldnn._reorder_linear_weight(weights, ONEDNN_ROWS))
    groups = w.view(w.shape[0], -1, GROUP)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15).clamp_min(torch.finfo(torch.bfloat16).tiny)
    codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
    # then the scale and zero that fit the group best given its codes (least squares): from a 16-bit
    # model's weights, rounded from the file's, this recovers the block's d and m better than its ends
    u = codes.float() - 8  # w = (q - 8) s + z
    du, dw = u - u.mean(dim=2, keepdim=True), groups - groups.mean(dim=2, keepdim=True)
    spread = (du * du).sum(dim=2)
    scale = torch.where(spread > 0, (du * dw).sum(dim=2) / spread.clamp_min(1e-30), scale)
    zero = (groups - u * scale[..., None]).mean(dim=2)
    scale, zero = scale.to(torch.bfloat16), zero.to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.view_as(w), INT4_TILES)
    weights = (u * scale.float()[..., None] + zero.float()[..., None]).view_as(w).to(torch.bfloat16)
    return (packed, torch.stack((scale, zero), dim=2).transpose(0, 1).contiguous(),
            torch.ops.mkldnn._reorder_linear_weight(weights, ONEDNN_ROWS))


def _run(kind: str, x: torch.Tensor, packed: Any, bias: torch.Tensor | None) -> torch.Tensor:
    """The product of ``x`` and a pack of kind ``kind`` (see ``_kind``); a quantized layer's many rows run
    on its dequantized weights."""
    if kind in ("int4", "int8") and x.numel() > INT4_MOST_ROWS * x.shape[-1]:
        kind, packed = "bf16", packed[-1]
    if kind in ("bf16", "fp32"):
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    rows = x.reshape(-1, x.shape[-1])
    if kind == "fp16":
        y = torch.fbgemm_linear_fp16_weight_fp32_activation(rows, packed, bias)
    else:
        y = (torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed[0], GROUP, packed[1]) if kind == "int4"
             else torch.ops.aten._weight_int8pack_mm(rows, packed[0], packed[1]))
        y = y if bias is None else y + bias
    return y.view(*x.shape[:-1], y.shape[-1])


class _Pack:
    """A pack of one or more layers' weights stacked (and their biases), of one kernel's kind, with the
    parameters (and their in-place versions) it was packed from; a copy starts empty."""

    __slots__ = ("bias", "kind", "sources", "tensor")

    def __init__(self) -> None:
        self.sources: list[tuple[dict[str, Any], str, torch.Tensor | None, int]] = []
        self.tensor: Any = None  # a packed tensor, or a quantized kind's (codes, scales)
        self.bias: torch.Tensor | None = None
        self.kind: str | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Pack:
        return _Pack()

    def get(self, layers: tuple[Linear, ...], x: torch.Tensor) -> tuple[str, Any] | None:
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

    def _repack(self, layers: tuple[Linear, ...], kind: str) -> tuple[str, Any] | None:
        weights = [m.weight for m in layers]
        self.sources, self.tensor, self.kind = [], None, None
        wanted = torch.float32 if kind in ("fp16", "fp32") else torch.bfloat16
        if not all(w.dtype is wanted and (kind != "fp16" or m.packs_half) and m.bits == layers[0].bits
                   for m, w in zip(layers, weights, strict=True)):
            return None
        stacked = torch.cat([w.detach() for w in weights])
        self.tensor = (torch.fbgemm_pack_gemm_matrix_fp16(stacked) if kind == "fp16" else
                       _quantize(stacked, layers[0].bits) if kind.startswith("int") else
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
    ``packs_half`` is set, in ``bits`` bits once ``quantize`` sets them, else reordered in its own dtype
    (``_kind``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.packs_half = False
        self.bits = 0  # 4 or 8: runs on the quantized kernel of that width (bfloat16 input)
        self._pack = _Pack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed(x)
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        return _run(packed[0], x, packed[1], self.bias)

    def _packed(self, x: torch.Tensor) -> tuple[str, Any] | None:
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
    cut.packs_half, cut.bits = layer.packs_half, layer.bits
    return cut


def use_half(module: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """Mark every ``Linear`` in ``module`` to infer on packed fp16 weights when its checkpoint ``state``
    stores them in 16 bits: fp16 then loses nothing that mattered (see the module docstring)."""
    if all(t.dtype in (torch.bfloat16, torch.float16) for t in state.values() if t.is_floating_point()):
        for m in module.modules():
            if isinstance(m, Linear):
                m.packs_half = FBGEMM
    return module


def run_dtype(model: nn.Module) -> str:
    """The dtype ``model`` runs in, named as ``core.names.RUN_DTYPES`` names it: ``int4`` once ``quantize``
    marked it, else its weights' (what picks a drafter's deployed shape, ``drafters.trained.shape_file``)."""
    if any(isinstance(m, Linear) and m.bits == 4 for m in model.modules()):
        return "int4"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def quantize(model: nn.Module, head: nn.Module | None = None) -> nn.Module:
    """Mark ``model`` (a bfloat16 one) to run in ``int4``: ``head`` (its LM head) on 8-bit weights, every
    other ``Linear`` whose shape the int4 kernel takes (inputs a whole number of groups, outputs of 16) on
    4-bit ones, the rest as they are; the weights stay, and the packs are made from them at the first
    call. InputError where torch lacks the kernels."""
    if not INT4:
        raise InputError("this torch has no CPU int4 and int8 weight kernels: run in bfloat16 instead")
    for m in model.modules():
        if m is head:
            m.bits = 8
        elif isinstance(m, Linear) and m.in_features % GROUP == 0 and m.out_features % INT4_ROWS == 0:
            m.bits = 4
    return model
