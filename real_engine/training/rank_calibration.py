"""Calibrating SpecBlock's rank head: one offset per bucket on its scores, chosen on held-out windows.

The buckets are sharply imbalanced (the paper: 75% of rows rank 1, under 6% each for ranks 5 to 10
and for the give-up bucket), so a head trained by cross-entropy, even class-weighted, seldom predicts
the rare ones, and the tree then never branches wide. An offset per bucket added to the head's scores
in drafting (``SpecBlockConfig.bucket_bias``) trades one bucket's precision for its recall; a
coordinate search chooses the offsets that maximize the macro F1 of the four buckets on calibration
windows of the corpus's held-out split (the rows training scores: valid-prefix rows of M blocks
unrolled from every position, :func:`~real_engine.training.specblock.block_rows`), and the report
gives the confusion matrix, per-bucket precision, recall and F1 before and after on windows the
offsets were not chosen on.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.files import write_json
from real_engine.drafters.specblock import FORMAT, SpecBlock, load_specblock
from real_engine.model import Transformer
from real_engine.training.drafter_data import DrafterData
from real_engine.training.specblock import block_rows, rank_loss

GRID = np.round(np.arange(-4.0, 6.01, 0.25), 2)  # offsets the search tries for each bucket


@torch.inference_mode()
def rank_rows(net: SpecBlock, data: DrafterData, windows: range, blocks: int = 2, seed: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
    """The rank head's scores (without offsets) in the law drafting reads, and the labels, over the
    valid rows of ``blocks`` blocks unrolled from every position of the ``windows`` of ``data`` (each
    later block from a seeded random slot)."""
    draft_ids = net.draft_ids if net.config.draft_vocab else None
    gen = torch.Generator().manual_seed(seed)
    scores, labels = [], []
    for index in windows:
        batch = {k: v.to(net.lm_head.weight.device) for k, v in data.batch([index]).items()}
        batch["features"] = batch["features"].float()
        t = batch["tokens"].shape[1]
        starts = torch.arange(t - 1)
        slots = torch.randint(0, net.config.block_size, (blocks - 1, t - 1), generator=gen)
        rows = block_rows(net, batch, starts, slots, draft_ids)
        valid = rows.valid
        _, label, score = rank_loss(net, rows.out.states[valid], rows.out.logits[valid],
                                    rows.best[valid], draft_ids)
        scores.append(score.float().numpy())
        labels.append(label.numpy())
    return np.concatenate(scores), np.concatenate(labels)


def confusion(scores: np.ndarray, labels: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """[label bucket, predicted bucket] counts with ``bias`` added to the scores."""
    buckets = scores.shape[1]
    predicted = (scores + bias).argmax(1)
    return np.bincount(labels * buckets + predicted, minlength=buckets * buckets).reshape(buckets, buckets)


def bucket_report(counts: np.ndarray) -> dict[str, Any]:
    """Per-bucket precision, recall, F1 and support, macro F1 and accuracy of a confusion matrix."""
    hits = np.diag(counts).astype(float)
    predicted, support = counts.sum(0), counts.sum(1)
    precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
    recall = np.divide(hits, support, out=np.zeros_like(hits), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(hits), where=total > 0)
    return {"confusion": counts.tolist(), "precision": precision.round(4).tolist(),
            "recall": recall.round(4).tolist(), "f1": f1.round(4).tolist(), "support": support.tolist(),
            "predicted": predicted.tolist(), "macro_f1": round(float(f1[support > 0].mean()), 4),
            "accuracy": round(float(hits.sum() / max(counts.sum(), 1)), 4)}


def fit_bias(scores: np.ndarray, labels: np.ndarray, passes: int = 3) -> np.ndarray:
    """Offsets (bucket 0's fixed at 0) maximizing the macro F1 on these rows: coordinate search over
    ``GRID``, ``passes`` rounds; ties keep the smaller offset."""
    bias = np.zeros(scores.shape[1])
    best = bucket_report(confusion(scores, labels, bias))["macro_f1"]
    for _ in range(passes):
        for bucket in range(1, scores.shape[1]):
            for value in GRID:
                trial = bias.copy()
                trial[bucket] = value
                f1 = bucket_report(confusion(scores, labels, trial))["macro_f1"]
                if f1 > best + 1e-9 or (f1 >= best - 1e-9 and abs(value) < abs(bias[bucket])):
                    best, bias = f1, trial
    return bias


def calibrate_specblock(target: Transformer, folder: str | Path, heldout: DrafterData, seed: int = 0
                        ) -> dict[str, Any]:
    """Choose the drafter in ``folder``'s bucket offsets on the first half of ``heldout``'s windows and
    save them in its ``config.json``; returns the record: the offsets, and the bucket report without and
    with them on the second half (held-out for the offsets too)."""
    folder = Path(folder)
    net = load_specblock(folder, target).float()
    half = len(heldout) // 2
    fit_scores, fit_labels = rank_rows(net, heldout, range(half), seed=seed)
    bias = fit_bias(fit_scores, fit_labels)
    scores, labels = rank_rows(net, heldout, range(half, len(heldout)), seed=seed + 1)
    net.config = replace(net.config, bucket_bias=tuple(float(b) for b in bias))
    write_json(folder / "config.json", {"format": FORMAT, **asdict(net.config)})
    return {"bucket_bias": bias.tolist(), "windows": {"fit": half, "report": len(heldout) - half},
            "rows": {"fit": int(fit_labels.size), "report": int(labels.size)},
            "without": bucket_report(confusion(scores, labels, np.zeros_like(bias))),
            "with": bucket_report(confusion(scores, labels, bias))}
