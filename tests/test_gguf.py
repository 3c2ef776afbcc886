"""GGUF import and export: round trips, the Q/K permutation, K-quants, Qwen3, and every bad input.

Every model here is tiny and random (a 300-token byte-level BPE trained on a few lines, hidden 64, two
layers, 4 query / 2 key-value heads) and every GGUF is written by the test, with ``export_gguf`` or
with ``gguf``'s own writer; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from time_limits import limit
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import real_engine.gguf as gguf_module
from core.errors import InputError
from core.models import MANIFEST, imported_spec
from real_engine.gguf import export_gguf, import_gguf
from real_engine.model import ModelArgs, Transformer, load_model, save_model
from real_engine.tokenizer import Tokenizer as OurTokenizer

CORPUS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog in 2024.",
          "hello world, hello there; 12345 + 678 = 13023", "for i in range(10):\n    print(i * i)\n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
Q = gguf.GGMLQuantizationType


def save_tokenizer(folder: Path, vocab: int = 300) -> None:
    """A byte-level BPE trained on ``CORPUS`` (GPT-2's pre-tokenizer), its config and chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
         "chat_template": TEMPLATE}))


def checkpoint(folder: Path, kind: str = "llama", *, tied: bool = False, bias: bool = False,
               vocab: int = 320, seed: int = 0, rope: dict[str, Any] | None = None, hidden: int = 64) -> Path:
    """A random model saved by ``save_model`` in float32, every weight random (norms around 1, so a
    swapped norm shows), with the BPE tokenizer (its 300 tokens padded to ``vocab`` by export)."""
    folder.mkdir(parents=True, exist_ok=True)
    args = ModelArgs(vocab_size=vocab, hidden_size=hidden, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, model_type=kind,
                     rms_norm_eps=1e-5, rope_theta=50000.0, max_position_embeddings=256,
                     tie_word_embeddings=tied, attention_bias=bias, bos_token_id=1, eos_token_id=2,
                     rope_scaling=rope)
    torch.manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.2 * noise if "norm" in name else 0.1 * noise)
    save_model(model, folder, dtype=torch.float32)
    save_tokenizer(folder)
    return folder


def rewrite(src: Path, dst: Path, *, keys: dict[str, Any] | None = None, drop: tuple[str, ...] = (),
            tensors: dict[str, tuple[np.ndarray, Any]] | None = None, arch: str | None = None) -> Path:
    """Copy the GGUF ``src`` to ``dst`` with gguf's writer: metadata ``keys`` set ((value, type)) or
    dropped (None), tensors in ``drop`` left out, ``tensors`` replaced or added ((array, raw ggml type))."""
    reader = gguf.GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch or old_arch)
    keys = keys or {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in keys:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, value in keys.items():
        if value is not None:
            writer.add_key_value(key, value[0], value[1])
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        data, raw = (tensors or {}).get(tensor.name, (np.array(tensor.data), tensor.tensor_type))
        writer.add_tensor(tensor.name, data, raw_dtype=None if raw in (Q.F32, Q.F16) else raw)
    for name, (data, raw) in (tensors or {}).items():
        if name not in {t.name for t in reader.tensors}:
            writer.add_tensor(name, data, raw_dtype=None if raw in (Q.F32, Q.F16) else raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def patch_tensor(path: Path, name: str, *, kind: int | None = None, dim0: int | None = None) -> None:
    """Overwrite tensor ``name``'s ggml type or first dimension in the header, in place."""
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    dims = struct.unpack_from("<I", data, at)[0]
    if dim0 is not None:
        struct.pack_into("<Q", data, at + 4, dim0)
    if kind is not None:
        struct.pack_into("<I", data, at + 4 + 8 * dims, kind)
    path.write_bytes(bytes(data))


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """``convert_hf_to_gguf.py``'s ``LlamaModel.permute``, written out independently."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def llama_cpp_unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``llama_cpp_permute`` (transformers' ``reverse_permute``)."""
    return (weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def state(folder: Path) -> dict[str, torch.Tensor]:
    """The engine's float32 state dict of a checkpoint folder."""
    return dict(load_model(folder).state_dict())


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The untied tiny Llama every round trip starts from."""
    return checkpoint(tmp_path_factory.mktemp("llama") / "src")


@pytest.fixture(scope="module")
def llama_gguf(llama: Path) -> Path:
    """Its F32 GGUF, the file the bad-input tests corrupt."""
    return export_gguf(llama, llama.parent / "f32.gguf")


@pytest.fixture
def nest(tmp_path: Path) -> Path:
    """An empty folder the destination goes into: after a failure it must still be empty."""
    folder = tmp_path / "models"
    folder.mkdir()
    return folder


def refuse(path: Path, nest: Path, match: str, **kwargs: Any) -> None:
    """import_gguf raises InputError matching ``match`` (one line) and leaves ``nest`` empty."""
    with pytest.raises(InputError, match=match) as info:
        import_gguf(path, nest / "model", name="model", **kwargs)
    assert "\n" not in str(info.value)
    assert list(nest.iterdir()) == []


def test_f32_round_trip_is_exact(llama: Path, llama_gguf: Path, nest: Path) -> None:
    calls: list[tuple[int, int]] = []
    summary = import_gguf(llama_gguf, nest / "m", name="m", progress=lambda i, n: calls.append((i, n)))
    folder = nest / "m"
    original, imported = state(llama), state(folder)
    assert original.keys() == imported.keys()
    assert all(torch.equal(original[k], imported[k]) for k in original)
    ids = torch.tensor([[5, 17, 99, 250, 3, 310]])
    with torch.no_grad():
        assert torch.equal(load_model(llama)(ids).logits, load_model(folder)(ids).logits)
    assert calls[-1] == (len(original), len(original)) and len(calls) == len(original)
    assert summary["architecture"] == "llama" and summary["tensor_types"] == {"F32": len(original)}
    assert summary["sha256"] == hashlib.sha256(llama_gguf.read_bytes()).hexdigest()
    assert summary["parameters"] == sum(t.numel() for t in original.values())
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["chat"] and manifest["source"].startswith("gguf") and manifest["created"]
    spec = imported_spec(folder)
    assert spec is not None and spec.chat and spec.dtype == "float32"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["rms_norm_eps"] == 1e-5
    assert config["rope_parameters"] == {"rope_theta": 50000.0, "rope_type": "default"}
    assert (config["bos_token_id"], config["eos_token_id"], config["tie_word_embeddings"]) == (1, 2, False)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == TEMPLATE and settings["eos_token"] == "<|im_end|>"
    ours = OurTokenizer.load(folder, vocab_size=320)
    source = Tokenizer.from_file(str(llama / "tokenizer.json"))
    for text in [*CORPUS, "<|im_start|>user\nhi 2024<|im_end|>", "Ünïcödé ✓"]:
        assert ours.encode(text) == source.encode(text, add_special_tokens=False).ids
        assert ours.decode(ours.encode(text)) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")


def test_llama_query_and_key_rows_are_permuted_in_the_file(llama: Path, llama_gguf: Path) -> None:
    weights = {t.name: np.array(t.data) for t in gguf.GGUFReader(llama_gguf).tensors}
    original = state(llama)
    q = original["model.layers.0.self_attn.q_proj.weight"].numpy()
    k = original["model.layers.0.self_attn.k_proj.weight"].numpy()
    assert not np.array_equal(weights["blk.0.attn_q.weight"], q)
    assert np.array_equal(weights["blk.0.attn_q.weight"], llama_cpp_permute(q, 4))
    assert np.array_equal(weights["blk.0.attn_k.weight"], llama_cpp_permute(k, 2))
    assert np.array_equal(weights["blk.0.attn_v.weight"], original["model.layers.0.self_attn.v_proj.weight"])


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1", "Q4_0", "F16"])
def test_quantized_round_trip_is_within_quantization_error(llama: Path, nest: Path, quant: str) -> None:
    path = export_gguf(llama, nest.parent / f"{quant}.gguf", quant=quant)
    summary = import_gguf(path, nest / "m", name="m", dtype="float32")
    assert summary["tensor_types"] == {"F32": 5, quant: 16}
    original, imported = state(llama), state(nest / "m")
    reader = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name, weight in original.items():
        if weight.ndim == 1:
            assert torch.equal(weight, imported[name]), name
            continue
        span = float(weight.max() - weight.min())
        step = {"Q8_0": span / 127, "Q4_1": span / 15, "Q4_0": span / 7, "F16": 1e-3}[quant]
        assert float((weight - imported[name]).abs().max()) <= step, name
    embed = gguf.quants.dequantize(np.array(reader["token_embd.weight"].data), Q[quant])
    assert np.array_equal(imported["model.embed_tokens.weight"].numpy(), embed)
    ids = torch.tensor([[5, 17, 99, 250, 3]])
    with torch.no_grad():
        exact, rounded = load_model(llama)(ids).logits, load_model(nest / "m")(ids).logits
    similarity = torch.nn.functional.cosine_similarity(exact.flatten(), rounded.flatten(), dim=0)
    assert not torch.equal(exact, rounded)
    assert float(similarity) > {"Q8_0": 0.999, "F16": 0.99999, "Q4_1": 0.9, "Q4_0": 0.8}[quant]


def test_every_supported_type_dequantizes_as_gguf_does(llama: Path, llama_gguf: Path, nest: Path) -> None:
    """One tensor per type: those gguf quantizes (from the real weights), and Q4_K and Q6_K, which it
    cannot, as raw random blocks whose float16 scale fields are finite and small."""
    rng = np.random.default_rng(0)
    weights = {t.name: np.array(t.data) for t in gguf.GGUFReader(llama_gguf).tensors}
    raw = {name: (gguf.quants.quantize(weights[name], kind), kind) for name, kind in (
        ("blk.0.ffn_up.weight", Q.BF16), ("blk.1.ffn_up.weight", Q.F16), ("blk.0.ffn_gate.weight", Q.Q5_0),
        ("blk.1.ffn_gate.weight", Q.Q5_1), ("blk.0.attn_v.weight", Q.Q4_0), ("blk.1.attn_v.weight", Q.Q8_0),
        ("blk.0.attn_q.weight", Q.Q4_1))}
    for name, kind, scale_at in (("blk.0.ffn_down.weight", Q.Q4_K, (0, 2)),  # d and dmin
                                 ("blk.1.ffn_down.weight", Q.Q6_K, (208,))):  # d, after ql, qh, scales
        blocks = rng.integers(0, 256, size=(64, gguf.GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
        for at in scale_at:
            blocks[:, at:at + 2] = rng.uniform(1e-4, 1e-2, size=(64, 1)).astype(np.float16).view(np.uint8)
        raw[name] = (blocks, kind)
    path = rewrite(llama_gguf, nest.parent / "types.gguf", tensors=raw)
    summary = import_gguf(path, nest / "m", name="m")
    assert summary["tensor_types"] == {"BF16": 1, "F16": 1, "F32": 12, "Q4_0": 1, "Q4_1": 1, "Q4_K": 1,
                                       "Q5_0": 1, "Q5_1": 1, "Q6_K": 1, "Q8_0": 1}
    imported = state(nest / "m")
    hf = {"ffn_up": "mlp.up_proj", "ffn_gate": "mlp.gate_proj", "ffn_down": "mlp.down_proj",
          "attn_v": "self_attn.v_proj", "attn_q": "self_attn.q_proj"}
    for name, (data, kind) in raw.items():
        _, layer, role, _ = name.split(".")
        expected = np.asarray(gguf.quants.dequantize(data, kind), dtype=np.float32)
        if role == "attn_q":  # back from llama.cpp's row order
            expected = llama_cpp_unpermute(expected, 4)
        assert np.isfinite(expected).all()
        assert np.array_equal(imported[f"model.layers.{layer}.{hf[role]}.weight"].numpy(), expected), name
    original = state(llama)["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(imported["model.layers.0.mlp.up_proj.weight"], original.bfloat16().float())


def test_qwen3_imports_unpermuted_tied_and_in_bfloat16(tmp_path: Path, nest: Path) -> None:
    source = checkpoint(tmp_path / "qwen3", "qwen3", tied=True, seed=3)
    path = export_gguf(source, tmp_path / "qwen3.gguf")
    weights = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
    original = state(source)
    assert "output.weight" not in weights and "blk.0.attn_q_norm.weight" in weights
    assert np.array_equal(weights["blk.0.attn_q.weight"], original["model.layers.0.self_attn.q_proj.weight"])
    summary = import_gguf(path, nest / "q", name="q")
    assert summary["architecture"] == "qwen3"
    imported = state(nest / "q")
    assert all(torch.equal(original[k], imported[k]) for k in original)
    config = json.loads((nest / "q" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["tie_word_embeddings"]
    import_gguf(path, nest / "half", name="half", dtype="bfloat16")
    saved = load_file(str(nest / "half" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16} and "lm_head.weight" not in saved
    assert json.loads((nest / "half" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    half = load_model(nest / "half")
    assert torch.equal(half.model.layers[1].self_attn.k_norm.weight, original[
        "model.layers.1.self_attn.k_norm.weight"].bfloat16().float())


def test_attention_biases_and_linear_rope_scaling_round_trip(tmp_path: Path, nest: Path) -> None:
    source = checkpoint(tmp_path / "bias", bias=True, seed=5, rope={"rope_type": "linear", "factor": 4.0})
    path = export_gguf(source, tmp_path / "bias.gguf")
    assert gguf.GGUFReader(path).fields["llama.rope.scaling.factor"].contents() == 4.0
    import_gguf(path, nest / "b", name="b")
    original, imported = state(source), state(nest / "b")
    assert "model.layers.0.self_attn.k_proj.bias" in imported
    assert all(torch.equal(original[k], imported[k]) for k in original)
    config = json.loads((nest / "b" / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_theta": 50000.0, "rope_type": "linear", "factor": 4.0}
    ids = torch.tensor([list(range(3, 200, 7))])
    with torch.no_grad():
        assert torch.equal(load_model(source)(ids).logits, load_model(nest / "b")(ids).logits)


def test_rows_that_are_not_whole_blocks_are_exported_as_f16(tmp_path: Path, nest: Path) -> None:
    source = checkpoint(tmp_path / "odd", hidden=48)  # rows of 48 values: not whole Q8_0 blocks of 32
    path = export_gguf(source, tmp_path / "odd.gguf", quant="Q8_0")
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert kinds["blk.0.attn_q.weight"] == "F16" and kinds["blk.0.ffn_down.weight"] == "Q8_0"
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    import_gguf(path, nest / "odd", name="odd")
    original, imported = state(source), state(nest / "odd")
    q = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(imported[q], original[q].half().float())


def test_large_models_are_sharded(llama: Path, llama_gguf: Path, nest: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_module, "SHARD_BYTES", 64 * 1024)
    import_gguf(llama_gguf, nest / "m", name="m")
    assert len(list((nest / "m").glob("model-*-of-*.safetensors"))) > 1
    assert (nest / "m" / "model.safetensors.index.json").is_file()
    original, imported = state(llama), state(nest / "m")
    assert all(torch.equal(original[k], imported[k]) for k in original)


def test_a_failure_midway_leaves_nothing(llama_gguf: Path, nest: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(gguf_module, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        import_gguf(llama_gguf, nest / "m", name="m")
    assert list(nest.iterdir()) == []


def test_a_taken_name_is_refused_and_left_alone(llama_gguf: Path, nest: Path) -> None:
    (nest / "model").mkdir()
    (nest / "model" / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="already taken: choose another --name or delete it"):
        import_gguf(llama_gguf, nest / "model", name="model")
    assert [p.name for p in nest.iterdir()] == ["model"]
    assert (nest / "model" / "keep.txt").read_text() == "mine"


def test_missing_file_folder_and_bad_dtype(llama_gguf: Path, nest: Path, tmp_path: Path) -> None:
    refuse(tmp_path / "absent.gguf", nest, "no such GGUF file")
    refuse(tmp_path, nest, "is a folder")
    refuse(llama_gguf, nest, "unknown dtype 'int8'", dtype="int8")


def test_not_a_gguf_and_truncated_files(llama_gguf: Path, nest: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + bytes(100))
    refuse(junk, nest, "not a GGUF file")
    junk.write_bytes(b"GGUF")
    refuse(junk, nest, "too short")
    data = llama_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    for size in (30, 200, 3000, len(data) // 2, len(data) - 1):
        cut.write_bytes(data[:size])
        refuse(cut, nest, "truncated or corrupt")
    cut.write_bytes(data[:-100])
    refuse(cut, nest, "'output.weight' .* runs past the end of the file")


def test_corrupt_headers_give_input_errors_only(llama_gguf: Path, tmp_path: Path) -> None:
    """Bytes overwritten across the header: each file imports or gives an InputError, never another
    exception (a hang or an allocation in proportion to a garbage count would time the test out)."""
    data = llama_gguf.read_bytes()
    rng = np.random.default_rng(1)
    tokens, table = data.index(b"tokenizer.ggml.tokens"), data.index(b"token_embd.weight") - 8
    places = [*rng.integers(4, tokens, size=30), *rng.integers(tokens, table, size=10),
              *rng.integers(table, table + 1200, size=30)]  # the keys, the vocabulary, the tensor table
    for trial, at in enumerate(places):
        width = int(rng.integers(1, 9))
        bad = bytearray(data)
        bad[at:at + width] = rng.integers(0, 256, size=width, dtype=np.uint8).tobytes()
        path = tmp_path / f"bad{trial}.gguf"
        path.write_bytes(bytes(bad))
        try:
            import_gguf(path, tmp_path / f"out{trial}", name="x")
        except InputError as err:
            assert "\n" not in str(err)
        assert not list(tmp_path.glob(".out*"))


def header(tensors: int, keys: int) -> bytes:
    """A GGUF v3 header declaring these counts."""
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, keys)


def text(value: str) -> bytes:
    """A GGUF string: its length, then its bytes."""
    return struct.pack("<Q", len(value)) + value.encode()


CRAFTED = {
    "tensor count": (header(2**60, 0), "declares 1,152,921,504,606,846,976 tensors"),
    "key count": (header(0, 2**60), "keys, more than the file"),
    "string length": (header(0, 1) + text("general.name") + struct.pack("<IQ", 8, 2**60), "claims"),
    "scalar array": (header(0, 1) + text("a") + struct.pack("<IIQ", 9, 0, 2**60), "items takes the arrays"),
    "string array": (header(0, 1) + text("a") + struct.pack("<IIQ", 9, 8, 2**40), "items takes the arrays"),
    "array in the cap": (header(0, 1) + text("a") + struct.pack("<IIQ", 9, 5, 1000), "needs 4,000 bytes"),
    "dimensions": (header(1, 0) + text("t") + struct.pack("<I", 2**32 - 1), "dimensions, not 1 to 4"),
    "10**12 values": (header(1, 0) + text("t") + struct.pack("<IQQIQ", 2, 10**6, 10**6, 0, 0), "smaller"),
    "10**9 values": (header(1, 0) + text("t") + struct.pack("<IQQIQ", 2, 10**5, 10**4, 0, 0), "runs past"),
    "unknown type": (header(1, 0) + text("t") + struct.pack("<IQIQ", 1, 32, 99, 0), "type 99, which"),
    "key name": (header(0, 1) + struct.pack("<Q", 2**62), "over the 1,024 limit"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_headers_are_refused_fast_and_small(case: str, nest: Path, tmp_path: Path) -> None:
    head, match = CRAFTED[case]
    path = tmp_path / "crafted.gguf"
    path.write_bytes(head + bytes(64))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        refuse(path, nest, match)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < limit(5)
    assert peak < 64 * 2**20


def test_unsupported_architecture_tokenizer_and_tensor_types(llama_gguf: Path, nest: Path, tmp_path: Path
                                                             ) -> None:
    string = gguf.GGUFValueType.STRING
    refuse(rewrite(llama_gguf, tmp_path / "a.gguf", arch="gemma2"), nest, "architecture 'gemma2' is not supp")
    spm = rewrite(llama_gguf, tmp_path / "t.gguf", keys={"tokenizer.ggml.model": ("llama", string)})
    refuse(spm, nest, "tokenizer 'llama' is not supported")
    pre = rewrite(llama_gguf, tmp_path / "p.gguf", keys={"tokenizer.ggml.pre": ("tekken", string)})
    refuse(pre, nest, "pre-tokenizer 'tekken' is not supported: use a file whose tokenizer.ggml.pre is one")
    q2 = np.zeros((64, gguf.GGML_QUANT_SIZES[Q.Q2_K][1]), dtype=np.uint8)
    path = rewrite(llama_gguf, tmp_path / "q2.gguf", tensors={"blk.0.ffn_down.weight": (q2, Q.Q2_K)})
    refuse(path, nest, r"'blk.0.ffn_down.weight' is stored as Q2_K, which is not supported: use a file "
                       r"quantized to one of F32, F16, BF16, Q8_0")
    rope = rewrite(llama_gguf, tmp_path / "r.gguf", keys={"llama.rope.scaling.type": ("yarn", string)})
    refuse(rope, nest, "rope scaling 'yarn' is not supported")


def test_byte_sizes_that_disagree_with_shape_and_type(llama_gguf: Path, nest: Path, tmp_path: Path) -> None:
    path = tmp_path / "size.gguf"
    path.write_bytes(llama_gguf.read_bytes())
    patch_tensor(path, "blk.0.attn_norm.weight", kind=int(Q.Q8_0))  # 64 F32 values -> 68 bytes of Q8_0
    refuse(path, nest, "byte size disagrees with its shape and type")
    path.write_bytes(llama_gguf.read_bytes())
    patch_tensor(path, "blk.0.attn_norm.weight", kind=int(Q.Q4_K))  # 64 values: not one 256-value block
    refuse(path, nest, "rows of 64 values, not a whole number of Q4_K blocks of 256")
    path.write_bytes(llama_gguf.read_bytes())
    patch_tensor(path, "output_norm.weight", dim0=80)
    refuse(path, nest, "byte size disagrees|runs past the end")


def test_missing_tensors_and_metadata(llama_gguf: Path, nest: Path, tmp_path: Path) -> None:
    refuse(rewrite(llama_gguf, tmp_path / "t.gguf", drop=("blk.1.ffn_up.weight",)), nest,
           "tensor 'blk.1.ffn_up.weight' is missing")
    refuse(rewrite(llama_gguf, tmp_path / "k.gguf", keys={"llama.block_count": None}), nest,
           "the metadata lacks 'llama.block_count'")
    refuse(rewrite(llama_gguf, tmp_path / "v.gguf", keys={"tokenizer.ggml.tokens": None}), nest,
           "lacks 'tokenizer.ggml.tokens'")
    extra = rewrite(llama_gguf, tmp_path / "e.gguf",
                    tensors={"blk.0.attn_output.bias": (np.zeros(64, np.float32), Q.F32)})
    refuse(extra, nest, "unexpected tensor 'blk.0.attn_output.bias': only plain Llama and Qwen3")


def test_shapes_that_disagree_with_the_metadata(llama_gguf: Path, nest: Path, tmp_path: Path) -> None:
    u32 = gguf.GGUFValueType.UINT32
    refuse(rewrite(llama_gguf, tmp_path / "h.gguf", keys={"llama.attention.head_count": (2, u32)}), nest,
           r"'blk.0.attn_q.weight' is \[64, 64\] but the metadata makes it \[32, 64\]")
    refuse(rewrite(llama_gguf, tmp_path / "f.gguf", keys={"llama.feed_forward_length": (128, u32)}), nest,
           r"'blk.0.ffn_gate.weight' is \[256, 64\] but the metadata makes it \[128, 64\]")
    refuse(rewrite(llama_gguf, tmp_path / "b.gguf", keys={"llama.block_count": (10**9, u32)}), nest,
           "block_count = 1000000000 does not fit the file's 21 tensors")
    refuse(rewrite(llama_gguf, tmp_path / "w.gguf",
                   keys={"llama.embedding_length": ("64", gguf.GGUFValueType.STRING)}), nest,
           "'llama.embedding_length' is str '64', not int")


@pytest.mark.parametrize(("change", "match"), [
    (lambda folder: None, "unknown GGUF tensor type 'Q2_K'"),
    (lambda folder: (folder / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}'), "not a BPE"),
])
def test_export_refusals(llama: Path, tmp_path: Path, change: Callable[[Path], Any], match: str) -> None:
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((llama / name).read_bytes())
    change(folder)
    with pytest.raises(InputError, match=match):
        export_gguf(folder, tmp_path / "out.gguf", quant="Q2_K" if "Q2_K" in match else "F32")
    assert not (tmp_path / "out.gguf").exists()


def test_export_refuses_llama3_rope_scaling_and_stray_overrides(llama_dir: Path, llama: Path,
                                                                tmp_path: Path) -> None:
    with pytest.raises(InputError, match="rope scaling 'llama3'"):
        export_gguf(llama_dir, tmp_path / "x.gguf")
    with pytest.raises(InputError, match=r"'blk\.9\.attn_q\.weight' is not a tensor"):
        export_gguf(llama, tmp_path / "x.gguf", overrides={"blk.9.attn_q.weight": "Q8_0"})
    assert not list(tmp_path.iterdir())
