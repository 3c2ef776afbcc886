"""Packed linears: the same function as nn.Linear (on fp16 weights for a half-marked layer, on its own float32
weights otherwise), repacked on every change."""

import copy

import pytest
import torch
import torch.nn.functional as F

from real_engine.model import ModelArgs, Transformer, load_model, save_model
from real_engine.packed import FBGEMM, ONEDNN, Fused, Linear, prepack, use_half

pytestmark = pytest.mark.skipif(not FBGEMM, reason="FBGEMM's fp16 kernel needs an x86 CPU with AVX2")


def _half_linear(seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    layer = Linear(64, 48, bias=True)
    with torch.no_grad():  # weights fp16 holds exactly, as a 16-bit checkpoint's are
        layer.weight.copy_(layer.weight.half().float())
    use_half(layer, {"weight": layer.weight.half()})
    return layer


@pytest.mark.parametrize("rows", [1, 2, 5, 17])
def test_packed_matches_linear_in_inference(rows: int) -> None:
    layer = _half_linear()
    x = torch.randn(1, rows, 64)
    with torch.inference_mode():
        assert layer._packed(x) is not None
        out = layer(x)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_training_and_unmarked_layers_use_plain_linear() -> None:
    layer = _half_linear()
    x = torch.randn(3, 64)
    assert layer._packed(x) is None  # autograd on
    layer(x).sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad():
        assert layer._packed(x.double()) is None


@pytest.mark.skipif(not ONEDNN, reason="oneDNN is not in this torch build")
@pytest.mark.parametrize("rows", [1, 5])
def test_unmarked_float32_layers_pack_their_own_weights_unrounded(rows: int) -> None:
    torch.manual_seed(0)
    plain = Linear(64, 48, bias=True)
    with torch.no_grad():
        plain.weight.add_(2.0**-20)  # float32 holds it, fp16 does not: a rounding pack would lose it
        plain.weight[0].fill_(1.0 + 2.0**-20)
    x = torch.ones(rows, 64)
    with torch.inference_mode():
        assert plain._packed(x)[0] == "fp32"
        out = plain(x)
    torch.testing.assert_close(out, F.linear(x, plain.weight, plain.bias), atol=1e-5, rtol=1e-6)
    assert not torch.equal(out[:, 0], (x @ plain.weight.half().float().T + plain.bias)[:, 0])


def test_in_place_update_and_copy_repack() -> None:
    layer = _half_linear()
    x = torch.randn(2, 64)
    with torch.no_grad():
        before = layer(x)
        layer.weight.mul_(2)  # a stale pack would return `before` again
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        twin = copy.deepcopy(layer)
        assert twin._pack.tensor is None and twin.packs_half
        twin.weight.zero_()
        torch.testing.assert_close(twin(x), twin.bias.expand(2, -1))
        assert not torch.allclose(layer(x), before)


def _fused(bias: bool) -> Fused:
    layers = [_half_linear(seed) for seed in range(3)]
    if not bias:
        for m in layers[1:]:
            m.bias = None
    return Fused(*layers)


def _separately(fused: Fused, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([F.linear(x, m.weight, m.bias) for m in fused.layers], dim=-1)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_layers_equal_each_layer_and_follow_changes(bias: bool) -> None:
    fused = _fused(bias)
    x = torch.randn(1, 5, 64)
    with torch.inference_mode():
        assert fused._pack.get(fused.layers, x) is not None
        out = fused(x)
        assert out.shape == (1, 5, 3 * 48)
        torch.testing.assert_close(out, _separately(fused, x), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        fused.layers[1].weight.mul_(-2)  # in place: a stale pack would still give `out`
        torch.testing.assert_close(fused(x), _separately(fused, x), atol=1e-5, rtol=1e-5)
        fused.layers[2].weight = torch.nn.Parameter(torch.zeros(48, 64))  # replaced
        torch.testing.assert_close(fused(x)[..., 96:], _separately(fused, x)[..., 96:], atol=1e-5, rtol=1e-5)
        fused.layers[0].bias.add_(1.0)  # a bias changed in place is followed too
        torch.testing.assert_close(fused(x), _separately(fused, x), atol=1e-5, rtol=1e-5)


def test_fused_layers_train_each_weight_and_copy_with_their_module() -> None:
    fused = _fused(bias=True)
    x = torch.randn(4, 64)
    assert fused._pack.get(fused.layers, x) is None  # autograd on: plain products
    fused(x).pow(2).sum().backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in fused.layers)
    args = ModelArgs(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Transformer(args)
    twin = copy.deepcopy(model)
    attn, twin_attn = model.model.layers[0].self_attn, twin.model.layers[0].self_attn
    assert twin_attn.qkv.layers == (twin_attn.q_proj, twin_attn.k_proj, twin_attn.v_proj)
    assert all(a is not b for a, b in zip(attn.qkv.layers, twin_attn.qkv.layers, strict=True))
    assert "model.layers.0.self_attn.q_proj.weight" in model.state_dict()
    assert not any("qkv" in k or "gate_up" in k for k in model.state_dict())


def test_only_sixteen_bit_checkpoints_pack(tmp_path) -> None:
    args = ModelArgs(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Transformer(args)
    half = load_model(save_model(model, tmp_path / "bf16"))
    full = load_model(save_model(model, tmp_path / "fp32", dtype=torch.float32))
    assert half.lm_head.packs_half and half.model.layers[0].mlp.up_proj.packs_half
    assert not any(m.packs_half for m in full.modules() if isinstance(m, Linear))
    exact = copy.deepcopy(half)
    for m in exact.modules():
        if isinstance(m, Linear):
            m.packs_half = False
    tokens = torch.randint(0, 64, (1, 9))
    with torch.inference_mode():
        assert half.lm_head._packed(torch.zeros(1, 32)) is not None
        torch.testing.assert_close(half(tokens).logits, exact(tokens).logits, atol=1e-4, rtol=0)


def test_prepack_packs_a_copy_before_its_first_inference_call(tmp_path) -> None:
    args = ModelArgs(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    half = load_model(save_model(Transformer(args), tmp_path / "bf16"))
    twin = copy.deepcopy(half)  # a trained copy: every pack starts empty

    def packs(model: Transformer) -> list:
        fused = [v for m in model.modules() for v in vars(m).values() if isinstance(v, Fused)]
        inside = {id(layer) for f in fused for layer in f.layers}
        alone = [m for m in model.modules() if isinstance(m, Linear) and id(m) not in inside]
        return [p._pack.tensor for p in (*fused, *alone)]

    assert all(pack is None for pack in packs(twin))
    prepack(twin)
    kept = packs(twin)
    assert all(pack is not None for pack in kept)  # every linear and fused product packed
    tokens = torch.randint(0, 64, (1, 5))
    with torch.inference_mode():
        torch.testing.assert_close(twin(tokens).logits, half(tokens).logits)
    assert all(a is b for a, b in zip(packs(twin), kept, strict=True))  # the first call repacked nothing
