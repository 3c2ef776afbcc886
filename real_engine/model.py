"""A Llama/Qwen3-compatible decoder in plain torch, loaded from a Hugging Face checkpoint folder.

Module names mirror Hugging Face's (``model.layers.0.self_attn.q_proj`` ...), so a checkpoint's
state dict loads as it is and a saved one loads in ``transformers`` too. One forward handles prefill,
single-token decoding and a whole draft tree (a boolean tree mask plus per-node positions), and
returns the logits with the hidden states of three layers (low, middle, high) that drafters use.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, atomic_write, read_json, write_json
from core.models import INDEX
from core.names import RUN_DTYPES
from real_engine.kv_cache import KVCache
from real_engine.packed import Fused, Linear, quantize, use_half
from real_engine.shared_embeddings import EMBEDDINGS_FROM, shared_tensors

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SHARD_BYTES = 20 * 2**20  # the largest weights file save_model writes: every shipped file stays under 30 MiB
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim")  # a config's sizes: positive integers


def _check_sizes(sizes: dict[str, Any]) -> None:
    """InputError naming the first of a config's sizes that is not a positive integer."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise InputError(f"config {name} = {value!r} is invalid: give a positive integer")


@dataclass(frozen=True)
class ModelArgs:
    """The shape of a decoder, in Hugging Face config names."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    model_type: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    feature_layers: tuple[int, int, int] = field(default=(-1, -1, -1))
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        _check_sizes({name: getattr(self, name) for name in SIZES})
        if self.model_type not in ARCHITECTURES:
            raise InputError(f"unsupported model_type {self.model_type!r}: "
                             f"use one of {sorted(ARCHITECTURES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise InputError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.feature_layers == (-1, -1, -1):
            n = self.num_hidden_layers
            object.__setattr__(self, "feature_layers", (min(1, n - 1), n // 2, max(n - 2, 0)))
        if any(not 0 <= i < self.num_hidden_layers for i in self.feature_layers):
            raise InputError(f"feature_layers {self.feature_layers} must index the model's layers")

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelArgs:
        """Read a Hugging Face ``config.json`` dict (Llama or Qwen3)."""
        _check_sizes({name: config[name] for name in SIZES if name in config})
        try:
            heads = config["num_attention_heads"]
            eos = config.get("eos_token_id")
            # transformers >= 5 nests the theta and the scaling in `rope_parameters`.
            rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
            theta = config.get("rope_theta", rope.pop("rope_theta", 10000.0))
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = {}
            return cls(
                vocab_size=config["vocab_size"],
                hidden_size=config["hidden_size"],
                intermediate_size=config["intermediate_size"],
                num_hidden_layers=config["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=config.get("num_key_value_heads") or heads,
                head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                model_type=config.get("model_type", "llama"),
                rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                rope_theta=theta,
                rope_scaling=rope or None,
                max_position_embeddings=config.get("max_position_embeddings", 4096),
                tie_word_embeddings=config.get("tie_word_embeddings", False),
                attention_bias=config.get("attention_bias", False),
                feature_layers=tuple(config.get("specblock_feature_layers", (-1, -1, -1))),
                bos_token_id=config.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
            )
        except KeyError as exc:
            raise InputError(f"config.json lacks {exc.args[0]!r}: give a Llama or Qwen3 config") from exc

    def to_hf(self) -> dict[str, Any]:
        """A ``config.json`` dict that ``transformers`` reads as the same architecture."""
        config = {k: v for k, v in asdict(self).items() if k != "feature_layers"}
        config["specblock_feature_layers"] = list(self.feature_layers)
        config["architectures"] = [ARCHITECTURES[self.model_type]]
        config["hidden_act"] = "silu"
        config["torch_dtype"] = "bfloat16"
        return config


class Output(NamedTuple):
    """What a forward returns: logits, the low/mid/high features (concatenated), the final hidden."""

    logits: torch.Tensor  # [B, T, V]
    features: torch.Tensor  # [B, T, 3H]
    hidden: torch.Tensor  # [B, T, H], after the final norm


class RMSNorm(nn.Module):
    """Root-mean-square layer norm: torch's own (one call; a decode step runs one norm per half-layer and
    costs more in calls than in arithmetic), which accumulates a 16-bit input in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps, self.shape = eps, (dim,)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.shape, self.weight, self.eps)


def rope_frequencies(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies of RoPE, with the ``linear`` and ``llama3`` scalings."""
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen) - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where((wavelen <= old / low) & (wavelen >= old / high), mid, scaled)
    elif kind != "default":
        raise InputError(f"unsupported rope scaling {kind!r}: use default, linear or llama3")
    return inv.float()


def rope(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and signed sine of RoPE at ``positions`` ([T] or [B, T]), shaped [T, 1, D] or [B, T, 1, D]
    to broadcast over [B, T, heads, D]. The sine is negated on the first half, so that rotating is
    one multiply-add with the halves swapped (``apply_rope``)."""
    angles = positions.to(inv_freq.dtype).unsqueeze(-1) * inv_freq
    cos = torch.cat((angles, angles), dim=-1).cos()
    sin = torch.cat((-angles, angles), dim=-1).sin()
    return cos.to(dtype).unsqueeze(-2), sin.to(dtype).unsqueeze(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ([B, T, heads, D]) by the half-split convention of Hugging Face checkpoints:
    ``x cos + (-x2, x1) sin``, with ``sin`` signed by ``rope``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention with optional Qwen3 q/k norms, reading and writing the KV cache."""

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.layer, self.heads, self.kv_heads, self.head_dim = (
            layer, args.num_attention_heads, args.num_key_value_heads, args.head_dim)
        bias = args.attention_bias
        self.q_proj = Linear(args.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = Linear(args.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(args.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.heads * self.head_dim, args.hidden_size, bias=False)
        self.qkv = Fused(self.q_proj, self.k_proj, self.v_proj)
        qwen3 = args.model_type == "qwen3"
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if qwen3 else None
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if qwen3 else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: KVCache | None) -> torch.Tensor:
        """``x`` [B, T, hidden]; ``cos, sin`` from ``rope``; ``mask`` as ``Transformer.forward`` builds it."""
        b, t, _ = x.shape
        h, kv = self.heads, self.kv_heads
        qkv = self.qkv(x).view(b, t, h + 2 * kv, self.head_dim)
        qk = qkv[:, :, :h + kv]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :, :h]), self.k_norm(qk[:, :, h:])), dim=2)
        qk = apply_rope(qk, cos, sin).transpose(1, 2)  # queries and keys rotated together
        q, k, v = qk[:, :h], qk[:, h:], qkv[:, :, h + kv:].transpose(1, 2)
        if cache is not None:  # attention runs in the cache's dtype (``Transformer.new_cache``)
            k, v = cache.write(self.layer, k, v)
            q = q.to(k.dtype)
        causal = mask is None and cache is None and t > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1).to(x.dtype))


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=False)
        self.gate_up = Fused(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention then pre-norm MLP, each with a residual."""

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(args, layer)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: KVCache | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Embeddings, decoder layers and the final norm (Hugging Face's ``model.`` prefix)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Transformer(nn.Module):
    """The target decoder: ``forward`` returns logits, low/mid/high features and the final hidden."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_frequencies(args), persistent=False)

    def new_cache(self, max_length: int, batch: int = 1) -> KVCache:
        """A cache sized for ``max_length`` positions, on this model's device and dtype, but in float32 for
        a 16-bit model on a CPU: attention runs in the cache's dtype, and torch's CPU attention is several
        times slower in 16 bits than in float32 at a decode step's few query rows."""
        a, w = self.args, self.lm_head.weight
        dtype = torch.float32 if w.device.type == "cpu" else w.dtype
        return KVCache(a.num_hidden_layers, batch, a.num_key_value_heads, a.head_dim, max_length, dtype,
                       w.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, tree_mask: torch.Tensor | None = None,
                head: nn.Module | None = None, last: int | None = None) -> Output:
        """Run ``tokens`` ([B, T]) at ``positions`` ([T] or [B, T]; default after the cache).

        With a cache the new tokens attend to the committed prefix and, among themselves, causally
        or by ``tree_mask`` ([T, T] bool, True where attention is allowed; or [T, length + T] to mask
        committed positions too, as a drafter expanding a tree depth by depth needs). The cache's
        pending region holds them afterwards: commit or ``keep`` it. ``head`` replaces the LM head (a
        drafter's head cut to a reduced vocabulary; the logits then have its width). ``last`` computes the
        logits of the last ``last`` positions only (a prefill needs none of the prompt's: the LM head over
        a long prompt costs more than the rest of the forward). The logits are float32 whatever the
        model's dtype: verification reads them as probabilities, and a 16-bit argmax or softmax is several
        times slower on a CPU.
        """
        t = tokens.shape[1]
        start = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(start, start + t, device=tokens.device)
        cos, sin = rope(self.inv_freq, positions, self.lm_head.weight.dtype)
        mask = self._mask(t, start, tree_mask, tokens.device) if cache is not None else None
        x = self.model.embed_tokens(tokens)
        feats = []
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache)
            if i in self.args.feature_layers:
                feats.append(x)
        by_layer = dict(zip(sorted(set(self.args.feature_layers)), feats, strict=True))
        features = torch.cat([by_layer[i] for i in self.args.feature_layers], dim=-1)
        hidden = self.model.norm(x)
        rows = hidden if last is None else hidden[:, -last:]
        return Output((self.lm_head if head is None else head)(rows).float(), features, hidden)

    @staticmethod
    def _mask(t: int, start: int, tree_mask: torch.Tensor | None,
              device: torch.device) -> torch.Tensor | None:
        """[T, start + T] bool: the committed prefix, then causal or tree attention among new tokens."""
        if tree_mask is None:
            if t == 1:
                return None
            tree_mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        elif tree_mask.shape[1] == start + t:
            return tree_mask.to(device)
        prefix = torch.ones(t, start, dtype=torch.bool, device=device)
        return torch.cat((prefix, tree_mask.to(device)), dim=1)


def _load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / INDEX
    if index.exists():
        fix = "re-save the checkpoint"
        weight_map = read_json(index, MAX_CONFIG_BYTES, "safetensors index", fix)
        try:
            shards = sorted(set(weight_map["weight_map"].values()))
        except (KeyError, AttributeError, TypeError) as exc:
            raise InputError(f"{index} is not a valid safetensors index: {fix}") from exc
    else:
        shards = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        path = folder / shard
        if not path.exists():
            raise InputError(f"missing weights file {path}: the checkpoint folder is incomplete")
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise InputError(f"cannot read {path} ({exc}): the file is corrupt; re-save or re-copy it"
                             ) from exc
    return state


def load_model(folder: str | Path, dtype: torch.dtype | str = torch.float32,
               device: str | torch.device = "cpu") -> Transformer:
    """Load a Hugging Face checkpoint folder (``config.json`` and ``*.safetensors``, sharded or not) to run
    in ``dtype``: a torch dtype or a name of ``RUN_DTYPES`` ("int4": bfloat16, its linears quantized by
    ``packed.quantize``)."""
    if isinstance(dtype, str) and dtype not in RUN_DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: use one of {', '.join(RUN_DTYPES)}")
    quantized = dtype == "int4"
    if quantized and torch.device(device).type != "cpu":
        raise InputError(f"int4 runs on torch's CPU kernels, not on {device}: use --device cpu, or --dtype "
                         "bfloat16 there")
    dtype = torch.bfloat16 if quantized else getattr(torch, dtype) if isinstance(dtype, str) else dtype
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise InputError(f"no config.json in {folder}: give a Hugging Face checkpoint folder")
    config = read_json(config_path, MAX_CONFIG_BYTES, "model config", "fix or re-save it")
    if not isinstance(config, dict):
        raise InputError(f"{config_path} is not a JSON object: give a Llama or Qwen3 config.json")
    args = ModelArgs.from_hf(config)
    state = _load_state_dict(folder)
    if EMBEDDINGS_FROM in config:  # a draft cut from its target reads these from the target's checkpoint
        state.update(shared_tensors(folder, config[EMBEDDINGS_FROM]))
    with torch.device("meta"):
        model = Transformer(args)
    if args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (args.tie_word_embeddings and k == "lm_head.weight")}
    missing = sorted(expected - state.keys())
    if missing:
        raise InputError(f"{folder} lacks weights such as {missing[0]!r}: it is not a complete "
                         f"{args.model_type} checkpoint")
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    wrong = next((k for k in sorted(expected) if state[k].shape != shapes[k]), None)
    if wrong is not None:
        raise InputError(f"{config_path} does not fit the weights in {folder}: {wrong} is "
                         f"{list(state[wrong].shape)} there but {list(shapes[wrong])} by the config: use the "
                         "config.json saved with these weights (vocab_size, hidden_size, heads, layers)")
    model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_frequencies(args)
    model = use_half(model, state).to(device=device, dtype=dtype).eval()
    return quantize(model, model.lm_head) if quantized else model


def save_model(model: Transformer, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
               max_shard_bytes: int = SHARD_BYTES, shared: dict[str, Any] | None = None) -> Path:
    """Save in Hugging Face layout: ``config.json`` and ``model.safetensors``, or, past
    ``max_shard_bytes``, shards ``model-0000i-of-0000n.safetensors`` with the index ``transformers``
    writes (``max_shard_size``), so that no weights file outgrows what a repository should hold. With
    ``shared`` (``shared_embeddings.share_entry``) the tensors it names are left to the target's
    checkpoint, and the config says where they are."""
    folder = Path(folder)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
             if shared is None or k not in shared["sha256"]}
    if model.args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():  # in module order; a tensor larger than a shard gets its own
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for name, shard in zip(names, shards, strict=True):
        atomic_write(folder / name, lambda tmp, shard=shard: save_file(shard, tmp, metadata={"format": "pt"}))
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        write_json(folder / INDEX, {"metadata": {"total_size": total},
                                    "weight_map": {k: n for n, shard in zip(names, shards, strict=True)
                                                   for k in shard}})
    stale = [folder / INDEX] if len(shards) == 1 else [folder / "model.safetensors"]
    stale += [p for p in folder.glob("model-*-of-*.safetensors") if p.name not in names]
    for path in stale:  # a previous save's files would shadow these (transformers reads a single file first)
        path.unlink(missing_ok=True)
    config = model.args.to_hf()
    if shared is not None:
        config[EMBEDDINGS_FROM] = shared
    write_json(folder / "config.json", config)
    return folder
