"""Training the shipped model family on the offline corpus: the target LM and the small draft model.

Shared pieces: packed token windows over the corpus (``TokenWindows``), a warm-up + cosine AdamW loop
with gradient clipping, resumable checkpoints (safetensors + JSON, never pickles) and held-out
evaluation per domain. ``train_target`` fits the next-token loss; ``train_draft_model`` distils the
finished target (KL to its softmax plus a share of the next-token loss).

The learning-rate schedule runs either over a fixed number of steps (reproducible) or over a wall-clock
budget (the run ends on time on a shared machine; the steps it took are recorded).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, atomic_write, read_json, write_json
from core.paths import DATA, TOKEN_CACHE, TOKENIZER
from real_engine import corpus
from real_engine.model import ModelArgs, Transformer, load_model, save_model


@dataclass(frozen=True)
class TrainConfig:
    """A model shape and its optimisation recipe."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 64
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    steps: int | None = None  # fixed schedule length; None: use `minutes`
    minutes: float = 60.0  # wall-clock budget when `steps` is None
    checkpoint_minutes: float = 5.0
    log_every: int = 10
    eval_windows: int = 4  # held-out windows per domain for the periodic evaluation
    final_eval_windows: int = 48  # held-out windows per domain for the reported figures
    kl_weight: float = 1.0  # draft model only: weight of KL(target || draft)
    lm_weight: float = 0.2  # draft model only: weight of the next-token loss
    on_policy: float = 0.0  # draft model only: share of each batch that the target continues itself
    bf16_autocast: bool = True  # forward passes under CPU bf16 autocast (fp32 weights and optimiser)

    def model_args(self, vocab_size: int, eos_id: int) -> ModelArgs:
        """The ``ModelArgs`` of this shape, with tied embeddings and EOS as BOS/EOS."""
        return ModelArgs(vocab_size=vocab_size, hidden_size=self.hidden_size,
                         intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                         num_attention_heads=self.num_attention_heads,
                         num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=eos_id, eos_token_id=eos_id)


# The shipped target: 15.7M parameters. Most of a 5M target's single-token step is per-call overhead
# rather than arithmetic (``benchmarks/forward_cost.py`` prints the share), and every forward pays it,
# so a draft model's forward cost half a step however narrow it was. Overhead grows with the layer
# count and arithmetic with the width squared, so a wider, deeper target makes drafting relatively
# cheap, as it is at scale.
TARGET = TrainConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=6,
                     num_key_value_heads=2, lr=1.5e-3, batch_size=8, warmup_steps=100, minutes=75.0)
# The earlier shipped shape, 5.0M parameters: a quick recipe for experiments on a small budget.
TARGET_5M = TrainConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, batch_size=4, warmup_steps=40, minutes=75.0)
TARGETS = {"16m": TARGET, "5m": TARGET_5M}
DRAFT_MODEL = TrainConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, lr=3e-3, minutes=25.0)


# ----------------------------------------------------------------------------- data

def prepare_data(data_dir: Path = DATA) -> dict[str, Any]:
    """Build the corpus manifest, the tokenizer and the prompt sets under ``data_dir``."""
    from core.files import write_text

    man = corpus.manifest()
    write_json(data_dir / "corpus_manifest.json", man)
    tok = corpus.train_tokenizer()
    write_text(data_dir / "tokenizer.json", tok.to_str())
    counts = {}
    for domain in corpus.DOMAINS:
        rows = corpus.prompt_set(tok, domain)
        write_text(data_dir / "prompts" / f"{domain}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        counts[domain] = len(rows)
    return {"corpus_sha256": man["sha256"], "vocab_size": tok.get_vocab_size(), "prompts": counts}


def token_stream(domain: str, split: str, tokenizer_path: Path = TOKENIZER) -> np.ndarray:
    """One domain's split as a uint16 token stream, cached under ``runs/tokens`` by tokenizer hash."""
    import hashlib

    tok_hash = hashlib.sha256(Path(tokenizer_path).read_bytes()).hexdigest()[:12]
    path = TOKEN_CACHE / f"{domain}-{split}-{tok_hash}-py{sys.version_info[0]}{sys.version_info[1]}.npy"
    if path.exists():
        return np.load(path, allow_pickle=False)
    tok = corpus.load_tokenizer(tokenizer_path)
    ids = corpus.encode_documents(tok, corpus.documents((domain,), split))
    atomic_write(path, lambda tmp: np.save(open(tmp, "wb"), ids, allow_pickle=False))  # noqa: SIM115
    return ids


class TokenWindows:
    """Non-overlapping ``seq_len + 1`` windows of a packed token stream, in a seeded order per epoch."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.count = (len(tokens) - 1) // seq_len
        if self.count < 1:
            raise InputError(f"the corpus has fewer than {seq_len + 1} tokens: use a shorter seq_len")
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def batch(self, position: int, size: int) -> torch.Tensor:
        """Windows ``position .. position + size`` of the endless seeded sequence, as [size, seq_len + 1]."""
        rows = []
        for p in range(position, position + size):
            epoch, index = divmod(p, self.count)
            if epoch != self._epoch:
                self._epoch = epoch
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.count)
            start = int(self._order[index]) * self.seq_len
            rows.append(self.tokens[start:start + self.seq_len + 1])
        return torch.from_numpy(np.stack(rows).astype(np.int64))


def check_on_policy(share: float, prefix: int, seq_len: int) -> None:
    """Refuse an on-policy share outside [0, 1] or a rollout prompt that leaves no token to generate."""
    if not 0.0 <= share <= 1.0:
        raise InputError(f"an on-policy share of {share}: give a fraction in [0, 1]")
    if not 1 <= prefix < seq_len:
        raise InputError(f"a rollout prompt of {prefix} tokens: give 1 to {seq_len - 1}")


class Rollouts:
    """Corpus windows of which the first ``share`` of each batch is continued by ``target`` itself after a
    ``prefix``-token corpus prompt: half of those rows greedily, half sampled at temperature 1.

    On-policy distillation data (DistillSpec, Zhou et al. 2024): speculative decoding verifies drafts
    against the target's own continuations, whose statistics (repeats included) corpus text lacks. A
    batch depends only on its position and the seed, so a resumed run draws the same rows.
    """

    def __init__(self, windows: TokenWindows, target: Transformer, share: float, prefix: int = 64) -> None:
        check_on_policy(share, prefix, windows.seq_len)
        self.windows, self.target, self.share, self.prefix = windows, target, share, prefix
        self.seq_len = windows.seq_len

    def batch(self, position: int, size: int) -> torch.Tensor:
        """``TokenWindows.batch`` with its first ``round(share * size)`` rows replaced by rollouts."""
        x = self.windows.batch(position, size)
        n = round(self.share * size)
        if n:
            gen = torch.Generator().manual_seed(self.windows.seed * 1_000_003 + position)
            sampled = torch.arange(n) >= (n + 1) // 2
            x[:n] = rollout(self.target, x[:n, :self.prefix], self.seq_len + 1, sampled, gen)
        return x


@torch.inference_mode()
def rollout(target: Transformer, prompts: torch.Tensor, total: int, sampled: torch.Tensor,
            gen: torch.Generator) -> torch.Tensor:
    """Continue ``prompts`` ([B, P]) to ``total`` tokens with ``target`` and a batched KV cache: rows where
    ``sampled`` ([B] bool) is True draw from its softmax, the others take its argmax."""
    b, start = prompts.shape
    cache = target.new_cache(total, batch=b)
    out = torch.empty(b, total, dtype=torch.long)
    out[:, :start] = prompts
    logits = target(prompts, cache=cache).logits[:, -1].float()
    cache.commit()
    for i in range(start, total):
        draw = torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
        out[:, i] = torch.where(sampled, draw, logits.argmax(-1))
        if i + 1 < total:
            logits = target(out[:, i:i + 1], cache=cache).logits[:, -1].float()
            cache.commit()
    return out


def heldout_windows(seq_len: int, max_windows: int | None) -> dict[str, torch.Tensor]:
    """Per domain, the held-out stream cut into consecutive ``seq_len + 1`` windows (capped)."""
    out = {}
    for domain in corpus.DOMAINS:
        ids = token_stream(domain, "heldout")
        n = (len(ids) - 1) // seq_len
        if max_windows is not None:
            n = min(n, max_windows)
        out[domain] = torch.from_numpy(
            np.stack([ids[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int64))
    return out


# ----------------------------------------------------------------------------- model and optimiser

def init_weights(model: Transformer, seed: int) -> None:
    """GPT-2 style initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2 layers)."""
    gen = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * model.args.num_hidden_layers)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def make_optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def learning_rate(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` as progress goes 0 -> 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(folder: Path, model: Transformer, opt: torch.optim.Optimizer,
                    state: dict[str, Any]) -> None:
    """Model, optimiser moments and loop state (step, data position, elapsed time, curves)."""
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()
               if not (model.args.tie_word_embeddings and k == "lm_head.weight")}
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            tensors[f"opt.{i}.{k}"] = v.detach().reshape(v.shape).contiguous()
    atomic_write(folder / "checkpoint.safetensors", lambda tmp: save_file(tensors, tmp))
    write_json(folder / "checkpoint.json", state)


def load_checkpoint(folder: Path, model: Transformer, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore what ``save_checkpoint`` wrote; returns the loop state."""
    meta = folder / "checkpoint.json"
    if not meta.exists():
        raise InputError(f"no checkpoint in {folder}: run without --resume to start fresh")
    tensors = load_file(str(folder / "checkpoint.safetensors"))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    opt_state = opt.state_dict()
    for i in range(len([p for g in opt_state["param_groups"] for p in g["params"]])):
        keys = [k for k in tensors if k.startswith(f"opt.{i}.")]
        if keys:
            opt_state["state"][i] = {k.split(".", 2)[2]: tensors[k] for k in keys}
    opt.load_state_dict(opt_state)
    return read_json(meta, MAX_RECORD_BYTES, "checkpoint record", "run without --resume to start fresh")


# ----------------------------------------------------------------------------- evaluation

@torch.inference_mode()
def heldout_loss(model: Transformer, windows: dict[str, torch.Tensor], batch: int = 8) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) per domain on held-out windows."""
    model.eval()
    out = {}
    for domain, w in windows.items():
        total, count = 0.0, 0
        for i in range(0, len(w), batch):
            x = w[i:i + batch]
            logits = model(x[:, :-1]).logits
            total += F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum").item()
            count += x[:, 1:].numel()
        out[domain] = round(total / count, 4)
    model.train()
    return out


@torch.inference_mode()
def top1_agreement(draft: Transformer, target: Transformer, windows: dict[str, torch.Tensor],
                   batch: int = 8) -> dict[str, float]:
    """Teacher-forced share of positions where the draft's argmax equals the target's, per domain."""
    draft.eval()
    out = {}
    for domain, w in windows.items():
        same, count = 0, 0
        for i in range(0, len(w), batch):
            x = w[i:i + batch, :-1]
            same += (draft(x).logits.argmax(-1) == target(x).logits.argmax(-1)).sum().item()
            count += x.numel()
        out[domain] = round(same / count, 4)
    draft.train()
    return out


@torch.inference_mode()
def decode_step_ms(model: Transformer, prefix: int = 128, steps: int = 32) -> float:
    """Median wall time of one single-token decode step after a ``prefix``-token prefill (KV cache)."""
    model.eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.args.vocab_size, (1, prefix + steps), generator=gen)
    cache = model.new_cache(prefix + steps)
    model(tokens[:, :prefix], cache=cache)
    cache.commit()
    times = []
    for i in range(prefix, prefix + steps):
        t = time.perf_counter()
        model(tokens[:, i:i + 1], cache=cache)
        cache.commit()
        times.append(time.perf_counter() - t)
    return round(1000 * float(np.median(times)), 3)


@torch.inference_mode()
def greedy_completion(model: Transformer, prompt: str, new_tokens: int = 64,
                      tokenizer_path: Path = TOKENIZER) -> str:
    """The model's greedy continuation of ``prompt`` (for inspecting the trained model)."""
    tok = corpus.load_tokenizer(tokenizer_path)
    ids = tok.encode(prompt).ids
    model.eval()
    cache = model.new_cache(len(ids) + new_tokens)
    logits = model(torch.tensor([ids]), cache=cache).logits
    cache.commit()
    out = []
    for _ in range(new_tokens):
        nxt = int(logits[0, -1].argmax())
        if nxt == model.args.eos_token_id:
            break
        out.append(nxt)
        logits = model(torch.tensor([[nxt]]), cache=cache).logits
        cache.commit()
    return tok.decode(out)


def sample_completion(model: Transformer, new_tokens: int = 64) -> dict[str, str]:
    """The greedy continuation of the first code prompt, recorded in the training log for inspection."""
    prompt = json.loads((DATA / "prompts" / "code.jsonl").read_text().splitlines()[0])
    return {"prompt_id": prompt["id"], "prompt": prompt["text"],
            "completion": greedy_completion(model, prompt["text"], new_tokens)}


# ----------------------------------------------------------------------------- training loops

def _versions() -> dict[str, str]:
    import tokenizers

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "tokenizers": tokenizers.__version__}


RESUMABLE_CHANGES = ("steps", "minutes", "checkpoint_minutes", "log_every")


def _recipe(config: dict[str, Any]) -> dict[str, Any]:
    """A config without the fields a resumed run may change (schedule length, logging)."""
    return {k: v for k, v in config.items() if k not in RESUMABLE_CHANGES}


def corpus_data(cfg: TrainConfig) -> tuple[TokenWindows, dict[str, torch.Tensor]]:
    """The training windows over every domain's training split, and the periodic held-out windows."""
    windows = TokenWindows(np.concatenate([token_stream(d, "train") for d in corpus.DOMAINS]),
                           cfg.seq_len, cfg.seed)
    return windows, heldout_windows(cfg.seq_len, cfg.eval_windows)


def train_loop(model: Transformer, cfg: TrainConfig, run_dir: Path, resume: bool, kind: str,
               windows: TokenWindows | Rollouts, evals: dict[str, torch.Tensor],
               teacher: Transformer | None = None, data_offset: int = 0) -> dict[str, Any]:
    """The shared loop, checkpointing into ``run_dir``; returns the loop state (step, curves, ...).

    With a ``teacher`` the loss is KL to its softmax plus a share of the next-token loss. The data stream
    starts ``data_offset`` windows in, so that a continued model reads on where its earlier run stopped.
    """
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    opt = make_optimizer(model, cfg)
    state: dict[str, Any] = {"step": 0, "position": 0, "elapsed_s": 0.0, "loss_curve": [], "eval_curve": [],
                             "config": asdict(cfg), "kind": kind, "data_offset": data_offset}
    if resume:
        state = load_checkpoint(run_dir, model, opt)
        if _recipe(state["config"]) != _recipe(asdict(cfg)):
            raise InputError(f"the checkpoint in {run_dir} was made with another model or recipe: resume "
                             "with the same options (only --minutes/--steps may change) or drop --resume")
        state["config"] = asdict(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    last_ckpt = time.monotonic()
    start_clock, start_elapsed = time.monotonic(), state["elapsed_s"]
    bar = tqdm(desc=kind, unit="step", total=cfg.steps, initial=state["step"], mininterval=20,
               file=sys.stderr)
    model.train()
    while True:
        elapsed = start_elapsed + time.monotonic() - start_clock
        progress = state["step"] / cfg.steps if cfg.steps else elapsed / (60 * cfg.minutes)
        if progress >= 1.0:
            break
        lr = learning_rate(cfg, state["step"], progress)
        for group in opt.param_groups:
            group["lr"] = lr
        x = windows.batch(state.get("data_offset", 0) + state["position"], cfg.batch_size)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            logits = model(x[:, :-1]).logits.float()
        ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss = ce
        if teacher is not None:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                        enabled=cfg.bf16_autocast):
                target_logp = F.log_softmax(teacher(x[:, :-1]).logits.float(), dim=-1)
            kl = F.kl_div(F.log_softmax(logits, dim=-1).flatten(0, 1), target_logp.clone().flatten(0, 1),
                          log_target=True, reduction="batchmean")
            loss = cfg.kl_weight * kl + cfg.lm_weight * ce
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["position"] += cfg.batch_size
        state["elapsed_s"] = start_elapsed + time.monotonic() - start_clock
        tok_s = state["position"] * cfg.seq_len / max(state["elapsed_s"], 1e-9)
        bar.update(1)
        if state["step"] % cfg.log_every == 0:
            row = {"step": state["step"], "tokens": state["step"] * tokens_per_step,
                   "loss": round(loss.item(), 4), "ce": round(ce.item(), 4),
                   "lr": round(lr, 6), "elapsed_s": round(state["elapsed_s"], 1)}
            state["loss_curve"].append(row)
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tok_s:.0f}", refresh=False)
            print(json.dumps(row), file=sys.stderr, flush=True)
        if time.monotonic() - last_ckpt > 60 * cfg.checkpoint_minutes:
            held = heldout_loss(model, evals)
            state["eval_curve"].append({"step": state["step"], "heldout_loss": held})
            print(json.dumps({"step": state["step"], "heldout_loss": held}), file=sys.stderr, flush=True)
            save_checkpoint(run_dir, model, opt, state)
            last_ckpt = time.monotonic()
    bar.close()
    save_checkpoint(run_dir, model, opt, state)
    state["tokens_per_s"] = round(state["position"] * cfg.seq_len / max(state["elapsed_s"], 1e-9), 1)
    return state


def _finish(model: Transformer, state: dict[str, Any], cfg: TrainConfig, out: Path,
            extra: dict[str, Any]) -> dict[str, Any]:
    """Save bf16 weights, the tokenizer and ``training_log.json`` into ``out``; return the log."""
    from core.files import write_text

    save_model(model, out)
    write_text(out / "tokenizer.json", TOKENIZER.read_text())
    full = heldout_windows(cfg.seq_len, cfg.final_eval_windows)
    shipped = load_model(out)  # evaluate what ships: the bf16 weights, computed in fp32
    log = {
        "kind": state["kind"], "config": asdict(cfg), "seed": cfg.seed, "versions": _versions(),
        "parameters": sum(p.numel() for p in shipped.parameters()),
        "corpus_sha256": json.loads((DATA / "corpus_manifest.json").read_text())["sha256"],
        "steps": state["step"], "tokens_seen": state["position"] * cfg.seq_len,
        "train_time_s": round(state["elapsed_s"], 1), "tokens_per_s": state["tokens_per_s"],
        "heldout_loss": heldout_loss(shipped, full),
        "heldout_tokens": {d: int(w[:, 1:].numel()) for d, w in full.items()},
        "decode_step_ms_fp32": decode_step_ms(shipped),
        "sample_completion": sample_completion(shipped),
        **extra,
        "loss_curve": state["loss_curve"], "eval_curve": state["eval_curve"],
    }
    write_json(out / "training_log.json", log)
    return log


def _continue_from(model: Transformer, init: Path | None) -> dict[str, Any]:
    """Load ``init``'s weights into ``model`` (same shape) to continue training; returns the log entries
    that say so."""
    if init is None:
        return {}
    start = load_model(init, dtype=torch.float32)
    if start.args != model.args:
        raise InputError(f"{init} has another shape than the recipe: continue a model of the same shape or "
                         "train from scratch without --init")
    model.load_state_dict(start.state_dict())
    log_path = Path(init) / "training_log.json"
    fix = "remove it or train from scratch without --init"
    earlier = read_json(log_path, MAX_RECORD_BYTES, "training log", fix) if log_path.exists() else {}
    counts = ("tokens_seen", "earlier_tokens_seen")
    if not (isinstance(earlier, dict) and all(type(earlier.get(k, 0)) is int for k in counts)):
        raise InputError(f"{log_path} is not a training log (a JSON object with token counts): {fix}")
    return {"init_from": str(init), "earlier_heldout_loss": earlier.get("heldout_loss"),
            "earlier_tokens_seen": sum(earlier.get(k, 0) for k in counts)}


def train_target(out: Path, run_dir: Path, cfg: TrainConfig = TARGET, resume: bool = False,
                 init: Path | None = None) -> dict[str, Any]:
    """Train the target LM from scratch, or continue an existing one (``init``), and ship it to ``out``.

    Continuing keeps the weights of ``init`` and starts a fresh optimiser and schedule (continued
    pre-training), reading the corpus on from where the earlier runs stopped (their tokens seen): on
    2 CPU cores, more tokens through the same model beat a new, larger one.
    """
    tok = corpus.load_tokenizer(TOKENIZER)
    eos = tok.token_to_id(corpus.EOS)
    model = Transformer(cfg.model_args(tok.get_vocab_size(), eos))
    init_weights(model, cfg.seed)
    extra = _continue_from(model, init)
    state = train_loop(model, cfg, run_dir, resume, "target", *corpus_data(cfg),
                       data_offset=extra.get("earlier_tokens_seen", 0) // cfg.seq_len)
    return _finish(model, state, cfg, out, extra)


def train_draft_model(out: Path, run_dir: Path, target_dir: Path, cfg: TrainConfig = DRAFT_MODEL,
                      resume: bool = False, init: Path | None = None) -> dict[str, Any]:
    """Distil the shipped target in ``target_dir`` into a small draft model (from scratch, or continuing
    the draft model in ``init``) and ship it to ``out``. With ``cfg.on_policy`` that share of every batch
    is the target's own continuation of a corpus prompt (``Rollouts``)."""
    teacher = load_model(target_dir)
    for p in teacher.parameters():
        p.requires_grad_(False)
    tok = corpus.load_tokenizer(TOKENIZER)
    if tok.get_vocab_size() != teacher.args.vocab_size:
        raise InputError(f"{target_dir} has vocabulary {teacher.args.vocab_size} but {TOKENIZER} has "
                         f"{tok.get_vocab_size()}: retrain the target with this tokenizer")
    model = Transformer(cfg.model_args(teacher.args.vocab_size, teacher.args.eos_token_id))
    init_weights(model, cfg.seed)
    extra = _continue_from(model, init)
    windows, evals = corpus_data(cfg)
    data = Rollouts(windows, teacher, cfg.on_policy) if cfg.on_policy else windows
    state = train_loop(model, cfg, run_dir, resume, "draft-model", data, evals, teacher=teacher,
                       data_offset=extra.get("earlier_tokens_seen", 0) // cfg.seq_len)
    agreement = top1_agreement(model, teacher, heldout_windows(cfg.seq_len, cfg.final_eval_windows))
    extra |= {"target": str(target_dir), "top1_agreement_with_target": agreement,
             "target_decode_step_ms_fp32": decode_step_ms(teacher)}
    log = _finish(model, state, cfg, out, extra)
    write_token_order(out, teacher, seed=cfg.seed)
    return log


def write_token_order(folder: Path, target: Transformer, windows: int = 1920, seq_len: int = 256,
                      seed: int = 0) -> Path:
    """Write ``folder/draft_vocab.json``: every token id by how often ``target`` predicts it (its top
    token) over ``windows`` seeded training windows, then by its count over the training splits of all
    corpus domains, then by id. A reduced drafting vocabulary takes its most frequent tokens from this
    order (``drafters.draft_model.load_vocab``), as SpecBlock's takes the target's top tokens."""
    from real_engine.drafter_data import rank_tokens
    from real_engine.drafters.draft_model import VOCAB_FILE

    v = target.args.vocab_size
    stream = np.concatenate([token_stream(d, "train") for d in corpus.DOMAINS])
    counts = np.bincount(stream, minlength=v)
    if counts.size != v:
        raise InputError(f"the corpus holds token ids beyond the vocabulary of {v}: retokenize it")
    data, top = TokenWindows(stream, seq_len, seed), torch.zeros(v, dtype=torch.long)
    with torch.inference_mode():
        for start in range(0, windows, 16):
            batch = data.batch(start, min(16, windows - start))[:, :-1]
            top += torch.bincount(target(batch).logits.argmax(-1).flatten(), minlength=v)
    order = rank_tokens(top, torch.from_numpy(counts.astype(np.int64)))
    return write_json(Path(folder) / VOCAB_FILE, {
        "ids": order.tolist(), "windows": windows, "seq_len": seq_len, "seed": seed,
        "source": "the target's top token over seeded training windows, then token counts over the "
                  "training split of every corpus domain",
        "corpus_sha256": json.loads((DATA / "corpus_manifest.json").read_text())["sha256"]})
