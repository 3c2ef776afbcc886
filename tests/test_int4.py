"""int4 (``real_engine.packed.quantize``, ``load_model(..., "int4")``): decoder layers on 4-bit weights in
groups of 32 and the LM head on 8-bit rows. A Q4_1 block's weights give back the block's own codes, and
a row computes the same alone or with others."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.errors import InputError
from real_engine.decode import generate, make_drafter
from real_engine.model import load_model
from real_engine.packed import GROUP, INT4, INT4_MOST_ROWS, Linear, _quantize, quantize

pytestmark = pytest.mark.skipif(not INT4, reason="this torch lacks the CPU int4 and int8 weight kernels")


def _q4_1(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights as a Q4_1 file's blocks dequantize (d * q + m, the block's minimum coded 0 and its maximum
    15), and their codes."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, cols // GROUP, GROUP), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15
    d = torch.rand(rows, cols // GROUP, 1, generator=gen) * 0.01 + 0.002
    m = -8 * d + 0.002 * torch.randn(rows, cols // GROUP, 1, generator=gen)
    return (d * codes + m).view(rows, cols), codes.view(rows, cols)


def test_a_q4_1_blocks_weights_give_back_its_codes() -> None:
    weight, codes = _q4_1(48, 96)
    packed, scales, _ = _quantize(weight.bfloat16(), 4)  # from the bfloat16 weights a 16-bit model holds
    scale, zero = (scales[..., i].float().t().repeat_interleave(GROUP, dim=1) for i in (0, 1))
    dequantized = (codes - 8) * scale + zero
    # the identity's rows read every weight back through the kernel: each equals its code's value (a code
    # off by one would be off by a whole step d, several percent of the weight)
    eye = torch.eye(96, dtype=torch.bfloat16)
    back = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, GROUP, scales).float().t()
    torch.testing.assert_close(back, dequantized.bfloat16().float(), rtol=2 ** -7, atol=1e-6)
    # d and m come back as bfloat16 (the kernel's format): about as close to the file as bfloat16 weights
    error, rounding = (dequantized - weight).abs().mean(), (weight.bfloat16().float() - weight).abs().mean()
    assert error <= 2 * rounding


@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_computes_the_same_alone_or_with_others(bits: int) -> None:
    torch.manual_seed(0)
    layer, odd = Linear(64, 48, bias=True).bfloat16(), Linear(64, 40).bfloat16()
    quantize(torch.nn.Sequential(layer, odd), head=layer if bits == 8 else None)
    assert layer.bits == bits and odd.bits == 0  # 40 outputs: not a shape the int4 kernel packs
    x = torch.randn(1, INT4_MOST_ROWS, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert layer._packed(x)[0] == f"int{bits}"
        together = layer(x)
        alone = torch.cat([layer(x[:, i:i + 1]) for i in range(x.shape[1])], dim=1)
    assert torch.equal(together, alone)
    reference = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    torch.testing.assert_close(together.float(), reference, rtol=0.1, atol=0.1)  # a 4- or 8-bit rounding


@pytest.mark.parametrize("bits", [4, 8])
def test_many_rows_run_on_the_dequantized_weights(bits: int) -> None:
    """Past ``INT4_MOST_ROWS`` rows a quantized layer runs on its codes' weights in bfloat16: the product
    its kernel gives, up to that rounding."""
    torch.manual_seed(0)
    layer = Linear(64, 48, bias=True).bfloat16()
    quantize(layer, head=layer if bits == 8 else None)
    x = torch.randn(1, 3 * INT4_MOST_ROWS, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        many = layer(x)
        few = torch.cat([layer(x[:, i:i + INT4_MOST_ROWS]) for i in range(0, x.shape[1], INT4_MOST_ROWS)], 1)
    torch.testing.assert_close(many.float(), few.float(), rtol=0.02, atol=0.02)
    codes_weights = layer._pack.tensor[2]
    assert codes_weights.dtype is torch.bfloat16 and not torch.equal(many, few)  # another kernel's rounding


def test_an_int4_model_quantizes_its_layers_and_head_and_decodes_near_its_bfloat16_self(
        llama_dir: Path, draft_dir: Path) -> None:
    """Loaded in int4: the decoder layers on 4 bits, the LM head on 8, activations bfloat16; its logits stay
    near the bfloat16 model's (a 4-bit rounding, not another model), and speculative decoding runs on it.
    Greedy equality with vanilla is not asserted here: as in bfloat16, attention's rows round differently
    in a verify than in one-token steps, so outputs can part at near-ties (float32 proves losslessness)."""
    target, plain = load_model(llama_dir, "int4"), load_model(llama_dir, "bfloat16")
    linears = [m for m in target.modules() if isinstance(m, Linear)]
    assert target.lm_head.bits == 8 and all(m.bits == 4 for m in linears if m is not target.lm_head)
    assert target.lm_head.weight.dtype is torch.bfloat16
    prompt = [5, 9, 13, 5, 9, 13, 5, 9, 2, 7]
    with torch.inference_mode():
        ours, reference = (m(torch.tensor([prompt])).logits for m in (target, plain))
        # random weights are 4 bits' worst case (each layer off by about 8%); another model is about 1.4 away
        assert float((ours - reference).norm() / reference.norm()) < 0.35
        drafter = make_drafter("draft-model", target, load_model(draft_dir, "int4"))
        assert len(generate(target, prompt, drafter=drafter, max_new_tokens=24).tokens) == 24  # the new ones


def test_an_unknown_dtype_is_refused(llama_dir: Path) -> None:
    with pytest.raises(InputError, match="use one of float32, bfloat16, float16, int4"):
        load_model(llama_dir, "int3")
    with pytest.raises(InputError, match="CPU kernels, not on cuda"):  # refused, not run unquantized
        load_model(llama_dir, "int4", "cuda")
