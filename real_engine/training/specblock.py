"""Training the SpecBlock drafter on data from its target (``training.drafter_data``).

A step takes a batch of sequences and, per sequence, ``starts`` random positions ``t`` where block 1
starts (conditioned on the target's features at ``t - 1``, on token ``t``), then ``blocks - 1``
later blocks, each from a random slot of the previous one (with that slot's own state, on the token
the slot predicts): :func:`~real_engine.drafters.unroll.unroll`, as inference runs it. Block 1's
slot 0 is the prefix row at ``t`` (always valid). Every position's prefix row is run (the blocks
attend to them), and each is the slot 0 of a block that could start there, so with
``prefix_weight > 0`` all of them are scored too: the first drafted token, the one every tree
hangs on, then learns from every position of the batch rather than from the sampled starts only.

- **Draft loss:** at a row predicting position ``i + 1``, the KL divergence from the target's law at
  ``i`` to the draft law, on the target's top-k support renormalized (the data stores only the top
  k): ``sum_j p_j (log p_j - log q_j)``.
- **One notion of a correct slot:** the target's token at a row is its argmax (the token greedy
  verification accepts); a slot is correct where its argmax in the drafting law (over the reduced
  vocabulary when the drafter has one) is that token and the sequence carries it, so that the rows
  after it stand for the context the teacher saw.
- **Valid-prefix mask** (:func:`valid_prefix`): a block row counts only where every earlier slot of
  its block was correct and the path into the block was valid up to its start slot, where the target's
  token was drafted at all (rank at most the widest bucket's 10): a later block learns from starts on
  side branches as inference makes them, not only from the argmax chain.
- **Rank loss:** cross-entropy of the rank head against the bucket of the target's token in the draft
  law (:func:`rank_labels`), under the same mask, with class weights ``frequency ** -rank_balance``
  (bucket 2 is rare), on both laws drafting may read: the full vocabulary and the drafting one, each
  summarized as drafting summarizes it (:func:`rank_loss`). The rank head reads detached inputs, so
  this loss never moves the drafter.

With a drafting vocabulary, only the LM head's drafted rows are trained (:class:`DraftedRows`): the saved
drafter keeps only those, and loading gives the others the target's values, so the others stay the
target's here too, and the head trained is the head deployed. (Over SmolLM2's 49,152-token vocabulary
the whole head's weight gradient and optimizer state would also be most of a step's work.)

AdamW, a cosine schedule with a linear warm-up over the first 1.5% of steps, gradient clipping,
fixed seeds (batch order and block starts are functions of the seed and the step, so a resumed run
reproduces an uninterrupted one). Checkpoints are safetensors plus JSON (never pickles).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, atomic_write, read_json, write_json
from core.paths import RUNS, SPECBLOCK_DATA
from real_engine.drafters.rank import bucket_of, rank_of
from real_engine.drafters.specblock import (
    SpecBlock,
    SpecBlockConfig,
    load_specblock,
    save_specblock,
    with_draft_vocab,
)
from real_engine.drafters.unroll import Unrolled, unroll
from real_engine.drafters.vocab import write_vocab
from real_engine.model import Transformer
from real_engine.packed import Linear
from real_engine.training.drafter_data import (
    DrafterData,
    frequent_targets,
    open_drafter_data,
    prepare_drafter_data,
    target_fingerprint,
    training_windows,
)
from real_engine.training.precision import PRECISION, FrozenHead, autocast, check_precision
from real_engine.training.progress import progress_bar


@dataclass(frozen=True)
class SpecBlockTrainConfig:
    """Optimization settings of :func:`train_specblock`."""

    steps: int = 1000
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.015  # fraction of steps with a linear warm-up
    blocks: int = 2  # M, blocks unrolled per start
    starts: int = 32  # block-1 start positions per sequence and step
    rank_weight: float = 1.0
    rank_balance: float = 0.0  # rank classes weighted by frequency ** -rank_balance (``balanced_weights``)
    prefix_weight: float = 0.0  # weight of the draft and rank losses on every prefix row (slot 0)
    draft_vocab: int = 0  # the saved drafter drafts the target's this many most frequent top tokens (0: all)
    # (a target vocabulary no larger than draft_vocab is drafted whole)
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    precision: str = PRECISION  # "32" or "bf16-mixed" (``training.precision``)

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if min(self.steps, self.batch_size, self.blocks, self.starts, self.checkpoint_every) < 1:
            raise InputError("steps, batch size, blocks, starts and checkpoint interval must all be >= 1")
        if not (self.lr > 0 and 0 <= self.warmup < 1 and self.weight_decay >= 0 and self.grad_clip > 0
                and self.prefix_weight >= 0 and self.draft_vocab >= 0 and 0 <= self.rank_balance <= 1):
            raise InputError("need lr > 0, 0 <= warmup < 1, weight_decay >= 0, grad_clip > 0, "
                             "prefix_weight >= 0, draft_vocab >= 0 and 0 <= rank_balance <= 1")


def learning_rate(step: int, config: SpecBlockTrainConfig) -> float:
    """Linear warm-up over ``warmup * steps`` steps (at least one), then cosine decay to zero."""
    warm = max(1, round(config.warmup * config.steps))
    if step < warm:
        return config.lr * (step + 1) / warm
    progress = (step - warm) / max(config.steps - warm, 1)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def valid_prefix(correct: torch.Tensor, drafted: torch.Tensor, start_slots: torch.Tensor) -> torch.Tensor:
    """Which block rows count: ``correct`` [..., M, K] (the row's argmax is the target's token),
    ``drafted`` [..., M, K] (the target's token is among the row's drafted children, a side branch when
    not its argmax), ``start_slots`` [..., M - 1] (block ``m + 1`` starts at that slot of block ``m``,
    on the target's token there) -> [..., M, K] bool.

    Row ``(m, k)`` is valid iff rows ``(m, 0..k-1)`` are correct and the path into block ``m`` was
    valid through its start slot, where the target's token was drafted (slot 0 of block 1 is always
    valid): later blocks learn from side-branch starts as inference makes them.
    """
    m = correct.shape[-2]
    ok = torch.cat((torch.ones_like(correct[..., :1]), correct[..., :-1]), dim=-1).cumprod(-1).bool()
    carry = torch.ones_like(correct[..., 0, 0])
    out = []
    for block in range(m):
        valid = carry[..., None] & ok[..., block, :]
        out.append(valid)
        if block < m - 1:
            through = valid & drafted[..., block, :]
            carry = through.gather(-1, start_slots[..., block, None]).squeeze(-1)
    return torch.stack(out, dim=-2)


def rank_labels(logits: torch.Tensor, tokens: torch.Tensor, edges: tuple[int, ...]) -> torch.Tensor:
    """Bucket of each target token's rank in the draft law (the rank head's label)."""
    return bucket_of(rank_of(logits, tokens), edges)


def draft_kl(logits: torch.Tensor, topk_logp: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """KL(target || draft) on the target's top-k support, renormalized ([...] from [..., V], [..., k])."""
    p_log = topk_logp.log_softmax(-1)
    q_log = logits.float().log_softmax(-1).gather(-1, topk_ids)
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def drafting_ranks(logits: torch.Tensor, tokens: torch.Tensor, draft_ids: torch.Tensor | None
                   ) -> torch.Tensor:
    """Rank of ``tokens`` in the law drafting sees: over ``draft_ids`` only when given (a token outside
    them is never drafted: rank ``V + 1``)."""
    if draft_ids is None:
        return rank_of(logits, tokens)
    where = torch.full((logits.shape[-1],), -1, dtype=torch.long, device=logits.device)
    where[draft_ids] = torch.arange(draft_ids.numel(), device=logits.device)
    inside = where[tokens]
    ranks = rank_of(logits[..., draft_ids], inside.clamp(min=0))
    return torch.where(inside >= 0, ranks, logits.shape[-1] + 1)


def balanced_weights(labels: torch.Tensor, buckets: int, balance: float) -> torch.Tensor:
    """Class weights ``frequency ** -balance`` over ``labels`` (0: none), scaled so that their mean over
    the labels is 1: rare buckets (branch wide, give up) count for more than their share."""
    freq = torch.bincount(labels, minlength=buckets).float().clamp(min=1) / max(labels.numel(), 1)
    weights = freq ** -balance
    return weights / (weights * freq).sum().clamp(min=1e-12)


def rank_loss(net: SpecBlock, hidden: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor,
              draft_ids: torch.Tensor | None, balance: float = 0.0) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
    """The rank head's class-weighted cross-entropy on rows (``hidden`` [N, H], full ``logits`` [N, V],
    the target's tokens [N]), averaged over the laws drafting may read: the full vocabulary and, with
    ``draft_ids``, the drafting vocabulary (the summary and the label from the law it reads, as
    drafting computes them). Returns the loss, and the labels and scores of the last view."""
    normed = net.norm(hidden)
    views = [(logits, rank_labels(logits, tokens, net.config.edges))]
    if draft_ids is not None:
        views.append((logits[..., draft_ids], bucket_of(drafting_ranks(logits, tokens, draft_ids),
                                                        net.config.edges)))
    losses = []
    for law, labels in views:
        scores = net.rank_head(normed, law).float()
        weights = balanced_weights(labels, scores.shape[-1], balance)
        losses.append(F.cross_entropy(scores, labels, weight=weights) if labels.numel() else scores.sum() * 0)
    return torch.stack(losses).mean(), labels, scores


class BlockRows(NamedTuple):
    """The rows of an unroll that training scores (see :func:`block_rows`)."""

    out: Unrolled
    flat: torch.Tensor  # [B, M * P * K] the sequence position of each block row (it predicts the next)
    best: torch.Tensor  # [B, M, P, K] the target's token at each row (its argmax)
    correct: torch.Tensor  # [B, M, P, K] the row's drafting argmax is that token, and the sequence's
    valid: torch.Tensor  # [B, M, P, K] the valid-prefix mask


def block_rows(net: SpecBlock, batch: dict[str, torch.Tensor], starts: torch.Tensor,
               start_slots: torch.Tensor, draft_ids: torch.Tensor | None = None) -> BlockRows:
    """Unroll ``net`` on ``batch`` and mark its rows (see :func:`specblock_loss`)."""
    tokens, ids = batch["tokens"], batch["topk_ids"]
    b, t = tokens.shape
    out = unroll(net, tokens, batch["features"], starts, start_slots)
    pos = out.positions.expand(b, -1, -1, -1)  # [B, M, P, K]
    in_range = pos < t - 1
    flat = pos.clamp(max=t - 2).flatten(1)
    best = ids[..., 0].long().gather(1, flat).view_as(pos)
    carried = tokens.gather(1, flat + 1).view_as(pos) == best
    ranks = drafting_ranks(out.logits.detach(), best, draft_ids)
    correct = (ranks == 1) & carried & in_range
    drafted = (ranks <= net.config.edges[-1]) & carried & in_range
    valid = valid_prefix(correct.transpose(1, 2), drafted.transpose(1, 2),
                         start_slots.T.expand(b, -1, -1)).transpose(1, 2) & in_range
    return BlockRows(out, flat, best, correct, valid)


def specblock_loss(net: SpecBlock, batch: dict[str, torch.Tensor], starts: torch.Tensor,
                   start_slots: torch.Tensor, rank_weight: float = 1.0, prefix_weight: float = 0.0,
                   draft_ids: torch.Tensor | None = None, balance: float = 0.0
                   ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The training loss of one batch and its parts: draft KL, rank CE, per-(block, slot) accuracy, and
    the rank head's confusion counts (row: the label's bucket, column: the predicted one) in the law
    drafting reads (over ``draft_ids`` when given). ``prefix_weight`` adds both losses, so weighted,
    over every prefix row as a slot 0; ``balance`` weights the rank classes (``balanced_weights``).

    A slot is *correct* where its argmax, in the drafting law, is the target's token (its argmax, the
    token greedy verification accepts) and the sequence carries that token (so the context of the
    rows after it is the one the teacher saw); the rank label is that token's rank bucket.
    """
    logp, ids = batch["topk_logp"], batch["topk_ids"]
    edges = net.config.edges
    out, flat, best, correct, valid = block_rows(net, batch, starts, start_slots, draft_ids)
    pos, logits = valid.shape, out.logits
    k = ids.shape[-1]
    row_logp = logp.gather(1, flat[..., None].expand(-1, -1, k)).view(*pos, k)[valid]
    row_ids = ids.gather(1, flat[..., None].expand(-1, -1, k)).view(*pos, k)[valid]
    kl_all = draft_kl(logits[valid], row_logp, row_ids)
    rank, labels, scores = rank_loss(net, out.states[valid], logits[valid].detach(), best[valid],
                                     draft_ids, balance)
    loss = kl_all.mean() + rank_weight * rank
    if prefix_weight:
        prefix_logits = net.token_logits(out.prefix[:, :-1])
        kl_prefix = draft_kl(prefix_logits, logp[:, :-1], ids[:, :-1])
        rank_prefix = rank_loss(net, out.prefix[:, :-1].flatten(0, 1), prefix_logits.detach().flatten(0, 1),
                                ids[:, :-1, 0].long().flatten(), draft_ids, balance)[0]
        loss = loss + prefix_weight * (kl_prefix.mean() + rank_weight * rank_prefix)
    with torch.no_grad():
        hits = (correct & valid).sum((0, 2)).float()
        tried = valid.sum((0, 2)).float()
        buckets = len(edges) + 1
        confusion = torch.bincount(labels * buckets + scores.argmax(-1), minlength=buckets * buckets)
        metrics = {"loss": float(loss), "kl": float(kl_all.mean()), "rank": float(rank),
                   "accuracy": (hits / tried.clamp(min=1)).tolist(), "valid": tried.tolist(),
                   "confusion": confusion.view(buckets, buckets).tolist()}
    return loss, metrics


class DraftedRows(nn.Module):
    """The LM head in training when the drafter keeps only its drafted rows (``save_specblock``): rows
    ``ids`` trained (``rows``), the others frozen at the target's (``base``, as loading fills them), their
    product taken as ``precision`` says (``FrozenHead``)."""

    def __init__(self, base: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor,
                 precision: str = PRECISION) -> None:
        super().__init__()
        self.base = FrozenHead(base, precision)
        self.register_buffer("ids", ids.clone(), persistent=False)
        self.rows = nn.Parameter(rows.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary: the frozen rows' product, the trained rows' written in."""
        return self.base(x).index_copy_(-1, self.ids, F.linear(x, self.rows).float())

    def folded(self, target: Transformer) -> Linear:
        """The head as one ``Linear`` (the target's rows, the trained ones written in), as the drafter saves
        and loads it."""
        weight = target.lm_head.weight.detach().to(self.rows.dtype)
        head = Linear(weight.shape[1], weight.shape[0], bias=False)
        head.weight = nn.Parameter(weight.index_copy(0, self.ids, self.rows.detach()))
        return head


def drafted_rows(net: SpecBlock, target: Transformer, draft_ids: torch.Tensor | None,
                 precision: str = PRECISION) -> SpecBlock:
    """``net`` training only its LM head's ``draft_ids`` rows (:class:`DraftedRows`), where the saved
    drafter keeps only those: a drafting vocabulary and the target's width. Otherwise ``net`` as it is."""
    if draft_ids is not None and net.config.hidden_size == net.config.target_hidden:
        net.lm_head = DraftedRows(target.lm_head.weight, net.lm_head.weight[draft_ids], draft_ids, precision)
    return net


@contextmanager
def folded(net: SpecBlock, target: Transformer) -> Iterator[SpecBlock]:
    """``net`` with a plain LM head while it is saved."""
    head = net.lm_head
    if isinstance(head, DraftedRows):
        net.lm_head = head.folded(target)
    try:
        yield net
    finally:
        net.lm_head = head


def _optimizer_state(optimizer: torch.optim.Optimizer, names: dict[torch.nn.Parameter, str]
                     ) -> dict[str, torch.Tensor]:
    out = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            out[f"{names[param]}::{key}"] = value.detach().cpu().contiguous()
    return out


def _load_optimizer_state(optimizer: torch.optim.Optimizer, net: SpecBlock,
                          state: dict[str, torch.Tensor]) -> None:
    for name, param in net.named_parameters():
        keys = {key.split("::")[1]: value for key, value in state.items() if key.split("::")[0] == name}
        if keys:
            optimizer.state[param] = {k: v.to(param.device) if k != "step" else v for k, v in keys.items()}


def _save_checkpoint(folder: Path, net: SpecBlock, target: Transformer, optimizer: torch.optim.Optimizer,
                     step: int, record: dict[str, Any]) -> None:
    names = {p: n for n, p in net.named_parameters()}
    with folded(net, target):
        save_specblock(net, folder, dtype=torch.float32)
    state = _optimizer_state(optimizer, names)
    atomic_write(folder / "optimizer.safetensors", lambda tmp: save_file(state, tmp))
    write_json(folder / "state.json", {**record, "step": step})


def train_specblock(target: Transformer, data: str | Path | DrafterData, out: str | Path,
                    run_dir: str | Path = RUNS / "specblock", *,
                    config: SpecBlockTrainConfig = SpecBlockTrainConfig(),
                    drafter: SpecBlockConfig | None = None, resume: bool = False,
                    minutes: float | None = None, progress: bool = True,
                    init: str | Path | None = None) -> dict[str, Any]:
    """Train a SpecBlock drafter for ``target`` on prepared ``data``; write it to ``out``.

    ``run_dir`` holds the latest checkpoint (float32 weights, AdamW state, step); with ``resume``
    training continues from it (same settings required). The final drafter (``save_specblock``,
    bfloat16) and ``out/training.json`` (settings, loss curve, final per-(block, slot) accuracy
    among valid rows) are written at the end. Returns that record. ``minutes`` caps this call's wall
    time (a shared machine): the run then stops early, checkpointed, and ``resume`` continues it.
    ``init`` warm-starts from a saved drafter (its shape; ``drafter`` is then ignored), e.g. the one
    trained for an earlier version of the target, with a fresh optimizer and schedule.
    """
    data = data if isinstance(data, DrafterData) else open_drafter_data(data)
    if data.meta.target != target_fingerprint(target):
        raise InputError("the drafter data was made with another target: prepare data with this target")
    out, ckpt = Path(out), Path(run_dir)
    record: dict[str, Any] = {"train": asdict(config), "data": asdict(data.meta), "losses": []}
    if resume and (ckpt / "state.json").exists():
        saved = read_json(ckpt / "state.json", MAX_RECORD_BYTES, "checkpoint record",
                          "train into a new folder")
        if (not isinstance(saved, dict) or type(saved.get("step")) is not int
                or saved.get("train") != record["train"] or saved.get("data") != record["data"]):
            raise InputError(f"{ckpt} was made with other settings or data: resume with the same ones, "
                             "or train into a new folder")
        net = load_specblock(ckpt, target).float().train()
        record, first = saved, saved["step"]
    elif init is not None:  # drafting's vocabulary cut is chosen again at the end
        net = with_draft_vocab(load_specblock(init, target), None).float().train()
        record["init_from"], first = str(init), 0
    else:
        net = SpecBlock.for_target(target, drafter, seed=config.seed).float().train()
        first = 0
    k, v = net.config.block_size, net.config.vocab_size
    order = frequent_targets(data, v, v)  # every token, the most frequent first
    draft_ids = order[:config.draft_vocab] if 0 < config.draft_vocab < v else None
    net = drafted_rows(net, target, draft_ids, config.precision)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    if first:
        try:
            _load_optimizer_state(optimizer, net, load_file(str(ckpt / "optimizer.safetensors")))
        except (SafetensorError, OSError) as exc:
            raise InputError(f"cannot read the optimizer state in {ckpt} ({exc}): train afresh") from exc
    t = data.meta.seq_len
    starts = min(config.starts, t - 1)
    batches = data.batches(config.batch_size, config.seed, first)
    began = time.perf_counter()
    metrics: dict[str, Any] = {}
    with progress_bar(progress) as bar:
        task = bar.add_task("specblock", total=config.steps, completed=first)
        for step in range(first, config.steps):
            batch = next(batches)
            device = net.queries.device
            batch = {name: value.to(device) for name, value in batch.items()}
            gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
            positions = torch.randperm(t - 1, generator=gen)[:starts].sort().values.to(device)
            slots = torch.randint(0, k, (config.blocks - 1, starts), generator=gen).to(device)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, config)
            with autocast(config.precision, device):
                loss, metrics = specblock_loss(net, batch, positions, slots, config.rank_weight,
                                               config.prefix_weight, draft_ids, config.rank_balance)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            optimizer.step()
            record["losses"].append([step, metrics["loss"], metrics["kl"], metrics["rank"]])
            bar.update(task, advance=1, description=f"specblock loss {metrics['loss']:.3f}")
            late = minutes is not None and time.perf_counter() - began > 60 * minutes
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps or late:
                _save_checkpoint(ckpt, net, target, optimizer, step + 1, record)
            if late:
                break
    if isinstance(net.lm_head, DraftedRows):
        net.lm_head = net.lm_head.folded(target)
    record["final"] = metrics
    record["steps_done"] = len(record["losses"])
    record["seconds_this_run"] = time.perf_counter() - began
    if draft_ids is not None:  # a vocabulary no larger is drafted whole
        with_draft_vocab(net, draft_ids)
    save_specblock(net.eval(), out)
    write_vocab(out, order, {"source": "the target's top token over the training data, then the input "
                                       "tokens' counts (training.drafter_data.frequent_targets)",
                             "data": asdict(data.meta)})
    write_json(out / "training.json", record)
    return record


def train_from_corpus(target: Transformer, out: str | Path, run_dir: str | Path = RUNS / "specblock",
                      data_dir: str | Path = SPECBLOCK_DATA, *, sequences: int = 512, seq_len: int = 256,
                      domains: tuple[str, ...] = ("code", "tests", "prose", "text"), top_k: int = 32,
                      config: SpecBlockTrainConfig = SpecBlockTrainConfig(), resume: bool = False,
                      minutes: float | None = None, progress: bool = True,
                      init: str | Path | None = None, on_policy: float = 0.0) -> dict[str, Any]:
    """The whole recipe for a loaded target: ``sequences`` windows (corpus, with a share ``on_policy`` of
    the target's own continuations), the target's rows for them under ``data_dir`` (resumable), then
    :func:`train_specblock` into ``out``."""
    windows, folder = training_windows(target, domains, seq_len, sequences, config.seed, on_policy, data_dir)
    data = prepare_drafter_data(target, windows, folder, top_k=top_k, progress=progress, on_policy=on_policy)
    return train_specblock(target, data, out, run_dir, config=config, resume=resume, minutes=minutes,
                           progress=progress, init=init)
