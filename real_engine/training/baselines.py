"""Training the EAGLE-style and Medusa-style baseline drafters on data from their target.

The data is the target's own view of the corpus, prepared once by ``training.drafter_data``:
per position its low/mid/high features, its final hidden state and its top-k log-probabilities. The
draft loss is the same as SpecBlock's (``training.specblock.draft_kl``: the KL from the target's law,
renormalized on its top-k support, to the draft law), so the three drafters are trained alike.

- **EAGLE, training-time test** (EAGLE-3): step 1 reads the target's features at every position
  ``i`` with the token ``x[i + 1]``; step ``s > 1`` reads the drafter's own step ``s - 1`` output with
  the token ``x[i + s]`` at position ``i + s - 1``, attending to the step-1 keys up to ``i`` and to
  its own earlier steps at ``i``, exactly as a draft node attends to the committed prefix and its
  ancestors. Step ``s`` at ``i`` is scored against the target's law at ``i + s``; gradients flow
  through the whole unroll.
- **Medusa:** head ``k`` at ``i`` is scored against the target's law at ``i + k + 1``. After
  training, rank accuracies of each head on held-out data choose the static tree
  (:func:`~real_engine.drafters.medusa.choose_tree`).

On a CPU the full-vocabulary head dominates a step, so ``scored`` can limit the loss to that many
random positions per sequence (every position still runs through the drafter). AdamW, a linear
warm-up over the first ``warmup`` fraction of steps then cosine decay, gradient clipping, fixed
seeds (the batch order and the scored positions are functions of the seed and the step, so a
resumed run reproduces an uninterrupted one); ``minutes`` caps one call's wall time, checkpointed, so
``resume`` continues it. The checkpoint (weights and AdamW state in safetensors, the step
and settings in JSON) goes to ``checkpoint`` (default ``out/checkpoint``); ``out`` gets the drafter
and ``training.json`` (settings, loss curve, final per-step or per-head agreement with the target).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, atomic_write, read_json, write_json
from real_engine.drafters.eagle import EagleNet, TreeShape, load_eagle, new_eagle, save_eagle
from real_engine.drafters.medusa import MedusaNet, choose_tree, load_medusa, new_medusa, save_medusa
from real_engine.drafters.vocab import write_vocab
from real_engine.model import Transformer
from real_engine.training.drafter_data import (
    DrafterData,
    frequent_targets,
    open_drafter_data,
    target_fingerprint,
)
from real_engine.training.precision import PRECISION, FrozenHead, autocast, check_precision
from real_engine.training.progress import progress_bar
from real_engine.training.specblock import draft_kl

Batch = dict[str, torch.Tensor]  # drafter_data fields: tokens, features, hidden, topk_logp, topk_ids
LossFn = Callable[[Batch, torch.Tensor | None], tuple[torch.Tensor, list[float]]]  # (batch, scored) -> loss
MEDUSA_RANKS = 10  # candidate ranks per head measured in calibration


@dataclass(frozen=True)
class BaselineConfig:
    """Optimization settings of :func:`train_eagle` and :func:`train_medusa`."""

    steps: int = 1000
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.015  # fraction of steps with a linear warm-up
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    scored: int = 0  # positions per sequence (random each step) whose loss counts; 0: all of them
    precision: str = PRECISION  # "32" or "bf16-mixed" (``training.precision``)

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if min(self.steps, self.batch_size, self.checkpoint_every) < 1 or self.scored < 0:
            raise InputError("steps, batch size and checkpoint interval must all be >= 1, scored >= 0")
        if not (self.lr > 0 and 0 <= self.warmup < 1 and self.weight_decay >= 0 and self.grad_clip > 0):
            raise InputError("need lr > 0, 0 <= warmup < 1, weight_decay >= 0 and grad_clip > 0")

    def lr_at(self, step: int) -> float:
        """Linear warm-up over ``warmup * steps`` steps (at least one), then cosine decay to zero."""
        warm = max(1, round(self.warmup * self.steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        return self.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(self.steps - warm, 1)))


class _GrowingKeys:
    """Stands in for the KV cache in training: concatenates each step's keys and values (autograd can
    differentiate that; the preallocated cache is written in place)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v


def eagle_loss(net: EagleNet, target: Transformer, batch: Batch, unroll: int,
               scored: torch.Tensor | None = None, head: nn.Module | None = None
               ) -> tuple[torch.Tensor, list[float]]:
    """Training-time-test loss (mean over ``unroll`` steps of the top-k KL) and each step's top-1
    agreement with the target, at the bases ``scored`` (sorted; default all), through the target's LM head
    (``head``: a ``FrozenHead`` of it; default the head itself). Every base still runs: later steps attend
    to them."""
    head = target.lm_head if head is None else head
    tokens = batch["tokens"]
    t = tokens.shape[1]
    n = t - 1  # bases: positions with a next token
    base = torch.arange(n, device=tokens.device)
    causal = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=tokens.device)
    keys, cond = _GrowingKeys(), net.fc(batch["features"][:, :n])
    losses, agreement = [], []
    for s in range(1, min(unroll, n) + 1):
        valid = n - s + 1  # bases i with a token x[i + s] and a target row at i + s
        with torch.no_grad():
            embeds = target.model.embed_tokens(tokens[:, (base + s).clamp_max(t - 1)])
        hidden = net(cond, embeds, base + s - 1, keys, torch.cat([causal, *[eye] * (s - 1)], dim=1))
        rows = base[:valid] if scored is None else scored[scored < valid]
        logits = net.logits(hidden[:, rows], head)
        ids = batch["topk_ids"][:, rows + s]
        losses.append(draft_kl(logits, batch["topk_logp"][:, rows + s], ids).mean())
        agreement.append(float((logits.argmax(-1) == ids[..., 0]).float().mean()))
        cond = hidden
    return torch.stack(losses).mean(), agreement


def medusa_loss(net: MedusaNet, target: Transformer, batch: Batch, scored: torch.Tensor | None = None,
                head: nn.Module | None = None) -> tuple[torch.Tensor, list[float]]:
    """Mean over heads of the top-k KL of head ``k`` at ``i`` to the target's law at ``i + k + 1``, and
    each head's top-1 agreement with the target, at the positions ``scored`` (default all), through the
    target's LM head (``head``: a ``FrozenHead`` of it; default the head itself)."""
    head = target.lm_head if head is None else head
    hidden, t = batch["hidden"], batch["hidden"].shape[1]
    every = torch.arange(t - 1, device=hidden.device)
    losses, agreement = [], []
    for k in range(min(net.heads, t - 1)):
        rows = every[:t - k - 1] if scored is None else scored[scored < t - k - 1]
        logits = net.head(k, hidden[:, rows], head)
        ids = batch["topk_ids"][:, rows + k + 1]
        losses.append(draft_kl(logits, batch["topk_logp"][:, rows + k + 1], ids).mean())
        agreement.append(float((logits.argmax(-1) == ids[..., 0]).float().mean()))
    return torch.stack(losses).mean(), agreement


@torch.no_grad()
def medusa_accuracies(net: MedusaNet, target: Transformer, data: DrafterData, sequences: int = 64,
                      batch_size: int = 8, ranks: int = MEDUSA_RANKS) -> list[list[float]]:
    """``acc[k][r]``: how often the target's most likely token at depth ``k + 1`` is head ``k``'s
    ``r``-th candidate (0-based; ties count in the token's favour), over the first ``sequences``."""
    device = target.lm_head.weight.device
    counts, totals = torch.zeros(net.heads, ranks), torch.zeros(net.heads)
    count = min(sequences, len(data))
    for first in range(0, count, batch_size):
        batch = data.batch(range(first, min(first + batch_size, count)))
        hidden, labels = batch["hidden"].to(device, target.lm_head.weight.dtype), batch["topk_ids"][..., 0]
        t = hidden.shape[1]
        for k in range(min(net.heads, t - 1)):
            logits = net.head(k, hidden[:, :t - k - 1], target.lm_head).float().cpu()
            label = labels[:, k + 1:]
            rank = (logits > logits.gather(-1, label[..., None])).sum(-1).flatten()
            counts[k] += torch.bincount(rank[rank < ranks], minlength=ranks).float()
            totals[k] += label.numel()
    return (counts / totals.clamp_min(1)[:, None]).tolist()


def _frozen(net: nn.Module) -> set[str]:
    """Names of the parameters training leaves alone (a target's tensors a drafter reads): not saved."""
    return {name for name, p in net.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _save_checkpoint(folder: Path, net: nn.Module, opt: torch.optim.Optimizer, step: int,
                     record: dict[str, Any]) -> None:
    frozen = _frozen(net)
    state = {f"net/{k}": v.detach().cpu().contiguous() for k, v in net.state_dict().items()
             if k not in frozen}
    for name, param in net.named_parameters():
        for key, value in opt.state.get(param, {}).items():
            state[f"opt/{name}/{key}"] = value.detach().cpu().contiguous()
    atomic_write(folder / "checkpoint.safetensors", lambda tmp: save_file(state, tmp))
    write_json(folder / "state.json", {**record, "step": step})


def _restore(folder: Path, net: nn.Module, opt: torch.optim.Optimizer, record: dict[str, Any]
             ) -> tuple[int, dict[str, Any]]:
    """Load weights and AdamW state from ``folder``: the step to continue from and the saved record."""
    try:
        saved = read_json(folder / "state.json", MAX_RECORD_BYTES, "checkpoint record", "train afresh")
        state = load_file(str(folder / "checkpoint.safetensors"))
    except (OSError, SafetensorError) as exc:
        raise InputError(f"cannot read the checkpoint in {folder} ({exc}): train afresh") from exc
    keys = ("train", "data", "drafter")
    same = isinstance(saved, dict) and all(saved.get(key) == record[key] for key in keys)
    if not same or type(saved.get("step")) is not int:
        raise InputError(f"{folder} was made with other settings or data: resume with the same ones, or "
                         "train into a new folder")
    missing = net.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net/")},
                                  strict=False).missing_keys
    lacking = sorted(set(missing) - _frozen(net))
    if lacking:
        raise InputError(f"{folder} lacks the drafter's {lacking[0]}: train afresh")
    params = dict(net.named_parameters())
    for key, value in state.items():
        if key.startswith("opt/"):
            name, field = key[4:].rsplit("/", 1)
            param = params[name]
            opt.state[param][field] = value if field == "step" else value.to(param.device)
    return int(saved["step"]), saved


def fit_drafter(net: nn.Module, loss_fn: LossFn, data: DrafterData, config: BaselineConfig,
                record: dict[str, Any], checkpoint: Path, resume: bool, progress: bool,
                minutes: float | None = None, heldout: DrafterData | None = None) -> dict[str, Any]:
    """The loop every drafter trained on the target's rows shares (its trainable parameters, by
    ``loss_fn``); returns the record with the loss curve, the last batch's agreement and, once every step
    is done and given ``heldout`` rows, its ``generalization``."""
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    first = 0
    if resume and (checkpoint / "state.json").exists():
        first, record = _restore(checkpoint, net, opt, record)
    device, t = next(net.parameters()).device, data.meta.seq_len
    batches = data.batches(config.batch_size, config.seed, first)
    began = time.perf_counter()
    net.train()
    agreement: list[float] = []
    with progress_bar(progress) as bar:
        task = bar.add_task(record["drafter"]["kind"], total=config.steps, completed=first)
        for step in range(first, config.steps):
            batch = {name: value.to(device) for name, value in next(batches).items()}
            for group in opt.param_groups:
                group["lr"] = config.lr_at(step)
            scored = None
            if config.scored:
                gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
                scored = torch.randperm(t - 1, generator=gen)[:config.scored].sort().values.to(device)
            with autocast(config.precision, device):
                loss, agreement = loss_fn(batch, scored)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, config.grad_clip)
            opt.step()
            record["losses"].append([step, loss.item()])
            shown = "/".join(f"{a:.2f}" for a in agreement)
            bar.update(task, advance=1, description=f"{record['drafter']['kind']} loss {loss.item():.3f} "
                                                    f"top-1 {shown}")
            late = minutes is not None and time.perf_counter() - began > 60 * minutes
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps or late:
                _save_checkpoint(checkpoint, net, opt, step + 1, record)
            if late:
                break
    net.eval()
    record["final_agreement"] = agreement
    record["seconds_this_run"] = time.perf_counter() - began
    if heldout is not None and record["losses"] and record["losses"][-1][0] + 1 == config.steps:
        record["generalization"] = generalization(loss_fn, data, heldout, config, device)
    return record


def generalization(loss_fn: LossFn, data: DrafterData, heldout: DrafterData, config: BaselineConfig,
                   device: torch.device, sequences: int = 32) -> dict[str, Any]:
    """The loss and top-1 agreement (``loss_fn`` at every position, without gradients) over ``sequences``
    training sequences spread evenly over ``data`` (its domains in their proportions) and over the first
    ``sequences`` of ``heldout``: what the drafter learned against what carries to text it never saw. A
    held-out agreement well below the training one means it memorized its windows: more data helps."""
    out: dict[str, Any] = {}
    for name, rows, picked in (
            ("train", data, torch.linspace(0, len(data) - 1, min(sequences, len(data))).round().long()),
            ("heldout", heldout, torch.arange(min(sequences, len(heldout))))):
        total, agreements = 0.0, torch.zeros(())
        with torch.no_grad(), autocast(config.precision, device):
            for chunk in picked.split(config.batch_size):
                batch = {k: v.to(device) for k, v in rows.batch(chunk.tolist()).items()}
                loss, agreement = loss_fn(batch, None)
                total += loss.item() * len(chunk)
                agreements = agreements + torch.tensor(agreement, dtype=torch.float64) * len(chunk)
        n = len(picked)
        out[name] = {"sequences": n, "loss": total / n, "agreement": (agreements / n).tolist()}
    return out


def target_data(target: Transformer, data: str | Path | DrafterData) -> DrafterData:
    """``data`` opened, refused unless it holds the rows of this (float32) ``target``."""
    if target.lm_head.weight.dtype != torch.float32:
        raise InputError("drafters train against a float32 target: load the target with dtype=torch.float32")
    data = data if isinstance(data, DrafterData) else open_drafter_data(data)
    if data.meta.target != target_fingerprint(target):
        raise InputError("the drafter data was made with another target: prepare data with this target")
    return data


def train_eagle(target: Transformer, data: str | Path | DrafterData, out: str | Path, *,
                config: BaselineConfig = BaselineConfig(), unroll: int | None = None, own_head: bool = False,
                tree: TreeShape | None = None, checkpoint: str | Path | None = None, resume: bool = False,
                minutes: float | None = None, progress: bool = True,
                init: str | Path | None = None, draft_vocab: int = 0,
                heldout: str | Path | DrafterData | None = None) -> dict[str, Any]:
    """Train an EAGLE-style drafter for the frozen ``target`` on prepared ``data`` with ``unroll``
    training-time-test steps (default: as deep as ``tree`` drafts); write it (with ``tree`` as its
    default tree shape, drafting the ``draft_vocab`` tokens the target predicts most often over the
    data, 0: all), its token order and ``training.json`` (with its ``generalization`` to ``heldout``
    rows, when given) to ``out``. Returns the training record.
    ``init`` warm-starts from a saved drafter (its head choice wins over ``own_head``) with a fresh
    optimizer and schedule. Training scores the whole vocabulary, as SpecBlock's does."""
    tree = tree or TreeShape()
    unroll = tree.depth if unroll is None else unroll
    if unroll < 1:
        raise InputError(f"unroll is {unroll}: give at least 1 training-time-test step")
    data, out = target_data(target, data), Path(out)
    heldout = None if heldout is None else target_data(target, heldout)
    target.requires_grad_(False)
    net = new_eagle(target, own_head, config.seed) if init is None else load_eagle(init, target)[0]
    net = net.float()
    record = {"train": asdict(config), "data": asdict(data.meta), "losses": [],
              "drafter": {"kind": "eagle", "unroll": unroll, "own_head": net.lm_head is not None,
                          "draft_vocab": draft_vocab},
              **({} if init is None else {"init_from": str(init)})}
    head = FrozenHead(target.lm_head.weight, config.precision)
    record = fit_drafter(net, lambda b, scored: eagle_loss(net, target, b, unroll, scored, head), data,
                         config, record, Path(checkpoint) if checkpoint is not None else out / "checkpoint",
                         resume, progress, minutes, heldout)
    v = net.args.vocab_size
    order = frequent_targets(data, v, v)
    net.with_draft_ids(order[:draft_vocab] if 0 < draft_vocab < v else None)
    save_eagle(net, out, tree)
    write_vocab(out, order, {"source": "the target's top token over the training data, then the input "
                                       "tokens' counts (training.drafter_data.frequent_targets)",
                             "data": asdict(data.meta)})
    write_json(out / "training.json", record)
    return record


def train_medusa(target: Transformer, data: str | Path | DrafterData, heldout: str | Path | DrafterData,
                 out: str | Path, *, config: BaselineConfig = BaselineConfig(), heads: int = 4,
                 own_heads: bool = True, tree_budget: int = 24, calibration_sequences: int = 64,
                 checkpoint: str | Path | None = None, resume: bool = False, minutes: float | None = None,
                 progress: bool = True, init: str | Path | None = None) -> dict[str, Any]:
    """Train ``heads`` Medusa heads for the frozen ``target`` on prepared ``data``, measure their rank
    accuracies on ``calibration_sequences`` of ``heldout`` and choose the static tree of
    ``tree_budget`` nodes; write heads, tree and ``training.json`` to ``out``. Returns the record
    (with ``tree`` and ``accuracies``). ``init`` warm-starts from saved heads (their count and head
    choice win) with a fresh optimizer and schedule."""
    if min(heads, tree_budget, calibration_sequences) < 1:
        raise InputError("Medusa training needs heads, tree budget and calibration sequences >= 1")
    data, heldout, out = target_data(target, data), target_data(target, heldout), Path(out)
    target.requires_grad_(False)
    net = new_medusa(target, heads, own_heads, config.seed) if init is None else load_medusa(init, target)[0]
    net = net.float()
    record = {"train": asdict(config), "data": asdict(data.meta), "losses": [],
              "drafter": {"kind": "medusa", "heads": net.heads, "own_heads": net.lm_heads is not None},
              **({} if init is None else {"init_from": str(init)})}
    head = FrozenHead(target.lm_head.weight, config.precision)
    record = fit_drafter(net, lambda b, scored: medusa_loss(net, target, b, scored, head), data, config,
                         record, Path(checkpoint) if checkpoint is not None else out / "checkpoint", resume,
                         progress, minutes, heldout)
    accuracies = medusa_accuracies(net, target, heldout, calibration_sequences, config.batch_size)
    tree = choose_tree(accuracies, tree_budget)
    save_medusa(net, tree, out, accuracies)
    record.update(tree=[list(n) for n in tree], accuracies=accuracies)
    write_json(out / "training.json", record)
    return record
