"""The training loop of the shipped language models (the target LM and the small draft model).

Packed token windows over the corpus (``windows.TokenWindows``), a warm-up + cosine AdamW loop with
gradient clipping, resumable checkpoints (safetensors + JSON, never pickles) and held-out evaluation
per domain. Without a teacher the loss is the next-token loss; with one (distillation) it is the KL to
the teacher's softmax plus a share of the next-token loss.

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
import tokenizers
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, atomic_write, read_json, write_json, write_text
from core.paths import CORPUS_MANIFEST, TOKENIZER
from real_engine.model import ModelArgs, Transformer, load_model, save_model
from real_engine.training.evaluation import decode_step_ms, heldout_loss, sample_completion
from real_engine.training.progress import progress_bar
from real_engine.training.windows import Rollouts, TokenWindows, heldout_windows, training_stream


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


# ----------------------------------------------------------------------------- the loop

RESUMABLE_CHANGES = ("steps", "minutes", "checkpoint_minutes", "log_every")


def _recipe(config: dict[str, Any]) -> dict[str, Any]:
    """A config without the fields a resumed run may change (schedule length, logging)."""
    return {k: v for k, v in config.items() if k not in RESUMABLE_CHANGES}


def corpus_data(cfg: TrainConfig) -> tuple[TokenWindows, dict[str, torch.Tensor]]:
    """The training windows over every domain's training split, and the periodic held-out windows."""
    windows = TokenWindows(training_stream(), cfg.seq_len, cfg.seed)
    return windows, heldout_windows(cfg.seq_len, cfg.eval_windows)


def _losses(model: Transformer, x: torch.Tensor, cfg: TrainConfig,
            teacher: Transformer | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's loss and its next-token part on windows ``x``; with a ``teacher``, the KL to its
    softmax (weighted ``kl_weight``) plus ``lm_weight`` times the next-token loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
        logits = model(x[:, :-1]).logits.float()
    ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    if teacher is None:
        return ce, ce
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
        target_logp = F.log_softmax(teacher(x[:, :-1]).logits.float(), dim=-1)
    kl = F.kl_div(F.log_softmax(logits, dim=-1).flatten(0, 1), target_logp.clone().flatten(0, 1),
                  log_target=True, reduction="batchmean")
    return cfg.kl_weight * kl + cfg.lm_weight * ce, ce


def train_loop(model: Transformer, cfg: TrainConfig, run_dir: Path, resume: bool, kind: str,
               windows: TokenWindows | Rollouts, evals: dict[str, torch.Tensor],
               teacher: Transformer | None = None, data_offset: int = 0) -> dict[str, Any]:
    """The shared loop, checkpointing into ``run_dir``; returns the loop state (step, curves, ...).

    With a ``teacher`` the loss is KL to its softmax plus a share of the next-token loss. The data stream
    starts ``data_offset`` windows in, so that a continued model reads on where its earlier run stopped.
    """
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
    model.train()
    with progress_bar(True) as bar:
        task = bar.add_task(kind, total=cfg.steps, completed=state["step"])
        while True:
            elapsed = start_elapsed + time.monotonic() - start_clock
            progress = state["step"] / cfg.steps if cfg.steps else elapsed / (60 * cfg.minutes)
            if progress >= 1.0:
                break
            lr = learning_rate(cfg, state["step"], progress)
            for group in opt.param_groups:
                group["lr"] = lr
            x = windows.batch(state.get("data_offset", 0) + state["position"], cfg.batch_size)
            loss, ce = _losses(model, x, cfg, teacher)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1
            state["position"] += cfg.batch_size
            state["elapsed_s"] = start_elapsed + time.monotonic() - start_clock
            bar.update(task, advance=1)
            if state["step"] % cfg.log_every == 0:
                row = {"step": state["step"], "tokens": state["step"] * tokens_per_step,
                       "loss": round(loss.item(), 4), "ce": round(ce.item(), 4),
                       "lr": round(lr, 6), "elapsed_s": round(state["elapsed_s"], 1)}
                state["loss_curve"].append(row)
                tok_s = state["position"] * cfg.seq_len / max(state["elapsed_s"], 1e-9)
                bar.update(task, description=f"{kind} loss {loss.item():.3f}, {tok_s:.0f} tokens/s")
                print(json.dumps(row), file=sys.stderr, flush=True)
            if time.monotonic() - last_ckpt > 60 * cfg.checkpoint_minutes:
                held = heldout_loss(model, evals)
                state["eval_curve"].append({"step": state["step"], "heldout_loss": held})
                print(json.dumps({"step": state["step"], "heldout_loss": held}), file=sys.stderr, flush=True)
                save_checkpoint(run_dir, model, opt, state)
                last_ckpt = time.monotonic()
    save_checkpoint(run_dir, model, opt, state)
    state["tokens_per_s"] = round(state["position"] * cfg.seq_len / max(state["elapsed_s"], 1e-9), 1)
    return state


# ----------------------------------------------------------------------------- starting and shipping

def continue_from(model: Transformer, init: Path | None) -> dict[str, Any]:
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


def _versions() -> dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "tokenizers": tokenizers.__version__}


def ship(model: Transformer, state: dict[str, Any], cfg: TrainConfig, out: Path,
         extra: dict[str, Any]) -> dict[str, Any]:
    """Save bf16 weights, the tokenizer and ``training_log.json`` into ``out``; return the log."""
    save_model(model, out)
    write_text(out / "tokenizer.json", TOKENIZER.read_text())
    full = heldout_windows(cfg.seq_len, cfg.final_eval_windows)
    shipped = load_model(out)  # evaluate what ships: the bf16 weights, computed in fp32
    log = {
        "kind": state["kind"], "config": asdict(cfg), "seed": cfg.seed, "versions": _versions(),
        "parameters": sum(p.numel() for p in shipped.parameters()),
        "corpus_sha256": json.loads(CORPUS_MANIFEST.read_text())["sha256"],
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
