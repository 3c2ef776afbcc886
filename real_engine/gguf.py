"""GGUF files in and out: ``import_gguf`` converts a llama.cpp Llama or Qwen3 GGUF into a Hugging Face
checkpoint folder the engine loads; ``export_gguf`` writes such a folder back to a GGUF.

Import dequantizes every tensor (``gguf.quants``) into the folder's dtype, renames llama.cpp's tensors
to Hugging Face's, and undoes the row permutation llama.cpp's converter applies to a Llama's query and
key projections (its rope rotates interleaved pairs; a Qwen3 is converted unpermuted). The folder gets
the weights (sharded as ``save_model`` shards), ``config.json``, ``tokenizer.json`` and
``tokenizer_config.json`` (``real_engine.gguf_tokenizer``) and the ``MANIFEST``. It is built in a hidden
sibling folder and renamed into place, so a failure leaves nothing behind.

Every check a bad file can fail comes first (``real_engine.gguf_header`` checks the header against the
file before ``GGUFReader`` runs; then the architecture, the metadata, every tensor's name, type and shape,
and the tokenizer), so a bad file costs an InputError and no large allocation.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, atomic_write, check_size, file_sha256, read_json, write_json
from core.models import INDEX, MANIFEST
from core.names import DTYPES
from real_engine.gguf_header import CORRUPT, MAX_GGUF_BYTES, Entry, field, read, scan
from real_engine.gguf_tokenizer import build_tokenizer, folder_vocab, tokenizer_config
from real_engine.model import SHARD_BYTES, ModelArgs, load_model
from real_engine.tokenizer import TOKENIZER_FILE

ARCHITECTURES = ("llama", "qwen3")
EXPORT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")  # what gguf.quants quantizes to
_CHUNK_VALUES = 1 << 22  # values dequantized at a time (gguf's numpy temporaries are several times this)
Plan = list[tuple[str, str, tuple[int, ...]]]  # (GGUF name, Hugging Face name, shape) of each tensor
# llama.cpp's per-layer tensor names -> Hugging Face's, in the module order of real_engine.model
_LAYER = (("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
          ("attn_output", "self_attn.o_proj"), ("attn_q_norm", "self_attn.q_norm"),
          ("attn_k_norm", "self_attn.k_norm"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
          ("ffn_down", "mlp.down_proj"), ("attn_norm", "input_layernorm"),
          ("ffn_norm", "post_attention_layernorm"))


def _plan(args: ModelArgs) -> Plan:
    """(GGUF name, Hugging Face name, shape) of every tensor of a model of shape ``args``, in module order."""
    h, hd, v, inner = args.hidden_size, args.head_dim, args.vocab_size, args.intermediate_size
    q, kv = args.num_attention_heads * hd, args.num_key_value_heads * hd
    shapes = {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
              "attn_q_norm": (hd,), "attn_k_norm": (hd,), "ffn_gate": (inner, h), "ffn_up": (inner, h),
              "ffn_down": (h, inner), "attn_norm": (h,), "ffn_norm": (h,)}
    plan = [("token_embd.weight", "model.embed_tokens.weight", (v, h))]
    for i in range(args.num_hidden_layers):
        for ours, theirs in _LAYER:
            if ours in ("attn_q_norm", "attn_k_norm") and args.model_type != "qwen3":
                continue
            plan.append((f"blk.{i}.{ours}.weight", f"model.layers.{i}.{theirs}.weight", shapes[ours]))
            if args.attention_bias and ours in ("attn_q", "attn_k", "attn_v"):
                plan.append((f"blk.{i}.{ours}.bias", f"model.layers.{i}.{theirs}.bias", shapes[ours][:1]))
    plan.append(("output_norm.weight", "model.norm.weight", (h,)))
    if not args.tie_word_embeddings:
        plan.append(("output.weight", "lm_head.weight", (v, h)))
    return plan


def _permute(weight: torch.Tensor, heads: int, *, undo: bool) -> torch.Tensor:
    """llama.cpp's query/key row permutation (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``), or
    its inverse: each head's rows from half-split to interleaved rotary pairs."""
    rows = weight.shape[0]
    split = (heads, rows // heads // 2, 2) if undo else (heads, 2, rows // heads // 2)
    return weight.reshape(*split, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape).contiguous()


def _decimal(value: float) -> float:
    """A float32 metadata value as its shortest decimal (1e-06, not 9.99999997e-07): the same float32."""
    return float(str(np.float32(value)))


def _permuted_heads(args: ModelArgs, name: str) -> int:
    """How many heads llama.cpp permutes GGUF tensor ``name`` by: a Llama's query and key projections
    (weights and biases), by query and key heads; 0 for every other tensor and for a Qwen3."""
    role = name.split(".")[2] if name.startswith("blk.") else ""
    if args.model_type != "llama" or role not in ("attn_q", "attn_k"):
        return 0
    return args.num_attention_heads if role == "attn_q" else args.num_key_value_heads


def _config(reader: gguf.GGUFReader, path: Path, arch: str, found: dict[str, Entry], vocab: int
            ) -> tuple[ModelArgs, dict[str, Any]]:
    """The model's shape from the metadata, and the extra ``config.json`` fields (rope, pad id)."""
    def key(name: str, kind: type = int, default: Any = ...) -> Any:
        return field(reader, path, f"{arch}.{name}", kind, default)

    layers, hidden, heads = key("block_count"), key("embedding_length"), key("attention.head_count")
    if not 1 <= layers <= len(found) // 9:
        raise InputError(f"{path}: {arch}.block_count = {layers} does not fit the file's {len(found)} "
                         f"tensors: {CORRUPT}")
    if heads < 1 or hidden < 1:
        raise InputError(f"{path}: {arch}.embedding_length and attention.head_count must be positive: "
                         f"{CORRUPT}")
    head_dim = (key("attention.key_length", int, None) or key("rope.dimension_count", int, None)
                or hidden // heads)
    rotary = key("rope.dimension_count", int, head_dim)
    if rotary != head_dim or key("attention.value_length", int, head_dim) != head_dim:
        raise InputError(f"{path}: rope over {rotary} of {head_dim} head dimensions (or values of another "
                         "width) is not supported: use a model with full rotary heads")
    scaling = key("rope.scaling.type", str, "none")
    if scaling not in ("none", "linear"):
        raise InputError(f"{path}: rope scaling {scaling!r} is not supported: use a model without rope "
                         "scaling or with linear scaling")
    factors = found.get("rope_freqs.weight")
    if factors is not None:
        tensor = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        if factors.kind != "F32" or not np.all(np.asarray(tensor.data) == 1.0):
            raise InputError(f"{path}: per-frequency rope factors (rope_freqs.weight, Llama 3.1-style rope "
                             "scaling) are not supported: use a model without rope scaling")
    theta = _decimal(key("rope.freq_base", float, 10000.0))
    rope = {"rope_type": "default"}
    if scaling == "linear":
        rope = {"rope_type": "linear", "factor": _decimal(key("rope.scaling.factor", float))}
    if key("vocab_size", int, vocab) != vocab:
        raise InputError(f"{path}: {arch}.vocab_size disagrees with its {vocab} tokens: {CORRUPT}")
    ids = {role: field(reader, path, f"tokenizer.ggml.{name}_token_id", int, None)
           for role, name in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))}
    if any(i is not None and not 0 <= i < vocab for i in ids.values()):
        raise InputError(f"{path}: a special token id is outside the vocabulary of {vocab}: {CORRUPT}")
    sizes = {"intermediate_size": key("feed_forward_length"),
             "max_position_embeddings": key("context_length"),
             "num_key_value_heads": key("attention.head_count_kv", int, heads),
             "rms_norm_eps": _decimal(key("attention.layer_norm_rms_epsilon", float))}
    try:
        args = ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            head_dim=head_dim, model_type=arch, rope_theta=theta,
            rope_scaling=rope if scaling == "linear" else None,
            tie_word_embeddings="output.weight" not in found, attention_bias="blk.0.attn_q.bias" in found,
            bos_token_id=ids["bos"], eos_token_id=ids["eos"], **sizes)
    except InputError as err:  # a size of 0, or query heads not a multiple of key-value heads
        raise InputError(f"{path}: {err}") from None
    return args, {"rope_parameters": {"rope_theta": theta, **rope}, "ids": ids}


def _check_tensors(path: Path, plan: Plan, found: dict[str, Entry]) -> None:
    """InputError for a missing, unexpected or misshapen tensor."""
    expected = {name for name, _, _ in plan}
    missing = next((name for name, _, _ in plan if name not in found), None)
    if missing is not None:
        raise InputError(f"{path}: tensor {missing!r} is missing: the file is not a complete model of the "
                         "shape its metadata gives; convert it again")
    extra = next((name for name in found if name not in expected and name != "rope_freqs.weight"), None)
    if extra is not None:
        raise InputError(f"{path}: unexpected tensor {extra!r}: only plain Llama and Qwen3 decoders are "
                         "supported; use such a model")
    for name, _, shape in plan:
        if found[name].shape != shape:
            raise InputError(f"{path}: tensor {name!r} is {list(found[name].shape)} but the metadata makes "
                             f"it {list(shape)}: the file's metadata and weights disagree; convert it again")


def _dequantize(tensor: Any, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The values of a GGUF tensor in ``dtype``, dequantized a slab of rows at a time."""
    kind = tensor.tensor_type
    rows = np.asarray(tensor.data).reshape(-1, tensor.data.shape[-1])
    cols = shape[-1]
    out = torch.empty(rows.shape[0], cols, dtype=dtype)
    step = max(1, _CHUNK_VALUES // cols)
    for start in range(0, rows.shape[0], step):
        values = gguf.quants.dequantize(rows[start:start + step], kind)
        out[start:start + step] = torch.from_numpy(np.array(values, dtype=np.float32).reshape(-1, cols))
    return out.reshape(shape)


def _shards(sizes: list[tuple[str, int]]) -> list[list[str]]:
    """``save_model``'s sharding: in order, a new shard when the next tensor would pass ``SHARD_BYTES``."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, nbytes in sizes:
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _write_weights(reader: gguf.GGUFReader, args: ModelArgs, plan: Plan, folder: Path, dtype: str,
                   progress: Callable[[int, int], None] | None) -> None:
    """Dequantize into safetensors shards one shard at a time (a shard's tensors in memory, no more)."""
    torch_dtype = getattr(torch, dtype)
    itemsize = torch.empty(0, dtype=torch_dtype).element_size()
    tensors = {t.name: t for t in reader.tensors}
    by_hf = {hf: (name, shape) for name, hf, shape in plan}
    shards = _shards([(hf, math.prod(shape) * itemsize) for _, hf, shape in plan])
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    done = 0
    for file_name, shard in zip(names, shards, strict=True):
        state = {}
        for hf in shard:
            name, shape = by_hf[hf]
            weight = _dequantize(tensors[name], shape, torch_dtype)
            heads = _permuted_heads(args, name)
            if heads:
                weight = _permute(weight, heads, undo=True)
            state[hf] = weight
            done += 1
            if progress is not None:
                progress(done, len(plan))
        save_file(state, str(folder / file_name), metadata={"format": "pt"})
    if len(shards) > 1:
        total = sum(math.prod(shape) * itemsize for _, _, shape in plan)
        write_json(folder / INDEX, {"metadata": {"total_size": total},
                                    "weight_map": {hf: n for n, shard in zip(names, shards, strict=True)
                                                   for hf in shard}})


def import_gguf(path: Path, dest: Path, *, name: str, dtype: str = "float32", source: str | None = None,
                progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Convert the Llama or Qwen3 GGUF at ``path`` into a Hugging Face checkpoint folder ``dest`` (weights
    in ``dtype``, config, tokenizer, chat template, ``MANIFEST``); the manifest's summary. ``progress``
    is called with (tensors done, tensors) as the weights are written. Everything a bad file can get wrong
    is an InputError raised before anything large is allocated or anything is left in ``dest.parent``."""
    path, dest = Path(path), Path(dest)
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if dest.exists() or dest.is_symlink():
        raise InputError(f"{dest} is already taken: choose another --name or delete it")
    check_size(path, MAX_GGUF_BYTES, "GGUF file", "give a GGUF model file of at most 64 GiB")
    entries = scan(path, path.stat().st_size)
    reader = read(path, entries)
    found = {e.name: e for e in entries}
    arch = field(reader, path, "general.architecture", str)
    if arch not in ARCHITECTURES:
        raise InputError(f"{path}: architecture {arch!r} is not supported: use a "
                         f"{' or '.join(ARCHITECTURES)} model")
    model = field(reader, path, "tokenizer.ggml.model", str)
    if model != "gpt2":
        raise InputError(f"{path}: tokenizer {model!r} is not supported: use a model with a byte-level BPE "
                         "tokenizer (tokenizer.ggml.model = 'gpt2')")
    tokens = field(reader, path, "tokenizer.ggml.tokens", list)
    types = field(reader, path, "tokenizer.ggml.token_type", list, [1] * len(tokens))
    if not tokens or not all(isinstance(t, str) for t in tokens) or len(types) != len(tokens):
        raise InputError(f"{path}: tokenizer.ggml.tokens and token_type must be lists of the same length: "
                         f"{CORRUPT}")
    args, extra = _config(reader, path, arch, found, len(tokens))
    plan = _plan(args)
    _check_tensors(path, plan, found)
    pre = field(reader, path, "tokenizer.ggml.pre", str, "default")
    add_bos = field(reader, path, "tokenizer.ggml.add_bos_token", bool, False)
    try:
        tokenizer = build_tokenizer(tokens, types, field(reader, path, "tokenizer.ggml.merges", list, []),
                                    pre, bos_id=extra["ids"]["bos"], add_bos=add_bos)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
    template = field(reader, path, "tokenizer.chat_template", str, None)
    counts = dict(sorted(Counter(e.kind for e in entries).items()))
    parameters = sum(math.prod(shape) for _, _, shape in plan)
    summary = {"name": name, "architecture": arch, "tensor_types": counts, "parameters": parameters,
               "vocab_size": len(tokens), "layers": args.num_hidden_layers, "hidden_size": args.hidden_size,
               "dtype": dtype, "chat": template is not None, "source": source or f"gguf {path.resolve()}",
               "sha256": file_sha256(path), "file": path.name}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        _write_weights(reader, args, plan, tmp, dtype, progress)
        config = {**args.to_hf(), "rope_parameters": extra["rope_parameters"], "hidden_act": "silu",
                  "pad_token_id": extra["ids"]["pad"], "attention_dropout": 0.0, "torch_dtype": dtype,
                  "dtype": dtype}
        if arch == "llama":
            config["mlp_bias"] = False
        write_json(tmp / "config.json", config)
        tokenizer.save(str(tmp / TOKENIZER_FILE))
        write_json(tmp / "tokenizer_config.json", tokenizer_config(
            tokens, extra["ids"], add_bos=add_bos, max_length=args.max_position_embeddings,
            chat_template=template))
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write_json(tmp / MANIFEST, {**summary, "created": created,
                                    "summary": f"imported from {path.name} ({arch}, {args.num_hidden_layers} "
                                               f"layers x {args.hidden_size}, {len(tokens):,} tokens)"})
        os.chmod(tmp, 0o777 & ~_umask())
        if dest.exists():
            raise InputError(f"{dest} is already taken: choose another --name or delete it")
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def export_gguf(folder: Path, path: Path, *, quant: str = "F32", overrides: Mapping[str, str] | None = None
                ) -> Path:
    """Write the Llama (or Qwen3) checkpoint ``folder`` (ours or transformers') as a GGUF at ``path``, as
    llama.cpp's converter writes one: its metadata keys, the tokenizer of the folder's byte-level BPE
    ``tokenizer.json``, a Llama's query and key rows permuted. Weights are stored as ``quant`` (one of
    ``EXPORT_TYPES``), or per GGUF tensor name as ``overrides`` says; 1-D tensors (norms, biases) are
    always F32, and a matrix whose rows are not whole blocks falls back to F16, as in llama.cpp."""
    folder, path = Path(folder), Path(path)
    for kind in (quant, *(overrides or {}).values()):
        if kind not in EXPORT_TYPES:
            raise InputError(f"unknown GGUF tensor type {kind!r} to export: use one of "
                             f"{', '.join(EXPORT_TYPES)}")
    config = read_json(folder / "config.json", MAX_CONFIG_BYTES, "model config", "fix or re-save it")
    model = load_model(folder, torch.float32)
    args = model.args
    rope = args.rope_scaling or {}
    scaling = rope.get("rope_type", rope.get("type", "default"))
    if scaling not in ("default", "linear"):
        raise InputError(f"{folder}: rope scaling {scaling!r} has no GGUF metadata key (llama.cpp stores it "
                         "as per-frequency factors, which import does not read): export a model without it")
    vocab = folder_vocab(folder, args.vocab_size, config)
    state = model.state_dict()
    plan = _plan(args)
    stray = sorted(set(overrides or {}) - {name for name, _, _ in plan})
    if stray:
        raise InputError(f"{stray[0]!r} is not a tensor of this model's GGUF: name tensors as llama.cpp does "
                         "(token_embd.weight, blk.0.attn_q.weight, output.weight ...)")

    def write(tmp: str) -> None:
        writer = gguf.GGUFWriter(tmp, args.model_type)
        try:
            _add_metadata(writer, folder.name, args, vocab, quant)
            for name, hf, _shape in plan:
                weight = state[hf].detach().float()
                heads = _permuted_heads(args, name)
                if heads:
                    weight = _permute(weight, heads, undo=False)
                _add_tensor(writer, name, weight.numpy(), (overrides or {}).get(name, quant))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()

    atomic_write(path, write)
    return path


def _add_metadata(writer: gguf.GGUFWriter, name: str, args: ModelArgs, vocab: dict[str, Any], quant: str
                  ) -> None:
    """The metadata llama.cpp's converter writes for a Llama or Qwen3: the shape, rope and tokenizer."""
    arch = args.model_type
    writer.add_name(name)
    writer.add_type("model")
    writer.add_block_count(args.num_hidden_layers)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_attention_heads)
    writer.add_head_count_kv(args.num_key_value_heads)
    if arch == "qwen3" or args.head_dim * args.num_attention_heads != args.hidden_size:
        writer.add_key_length(args.head_dim)  # as llama.cpp's converter: where the config sets it
        writer.add_value_length(args.head_dim)
    writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    if args.rope_scaling:  # linear: export_gguf refuses the others
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(args.rope_scaling["factor"])
    writer.add_layer_norm_rms_eps(args.rms_norm_eps)
    writer.add_vocab_size(args.vocab_size)
    writer.add_file_type(getattr(gguf.LlamaFileType, "ALL_F32" if quant == "F32" else
                                 "MOSTLY_F16" if quant == "F16" else f"MOSTLY_{quant}"))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_types"])
    writer.add_token_merges(vocab["merges"])
    ids = vocab["ids"]
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        if ids[role] is not None:
            add(ids[role])
    if vocab["add_bos"] is not None:
        writer.add_add_bos_token(vocab["add_bos"])
    if vocab["chat_template"] is not None:
        writer.add_chat_template(vocab["chat_template"])


def _add_tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray, kind: str) -> None:
    """Add ``values`` stored as ``kind`` (F32 for 1-D, F16 for rows that are not whole blocks)."""
    qtype = gguf.GGMLQuantizationType[kind]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if values.ndim < 2:
        qtype = gguf.GGMLQuantizationType.F32
    elif values.shape[-1] % block:
        qtype = gguf.GGMLQuantizationType.F16
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        writer.add_tensor(name, gguf.quants.quantize(values, qtype))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
