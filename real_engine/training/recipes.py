"""The shipped recipes of the feature drafters, as ``specblock train specblock|eagle|medusa`` runs them.

From a target folder: ``sequences`` windows of ``seq_len`` tokens drawn (seeded) from the training
split of the corpus domains the target learnt, the target's rows for them cached under
``data_dir/<target fingerprint>`` (shared by the three drafters, resumable), then training. Medusa
also calibrates its heads on ``heldout`` windows of the corpus's held-out split, to choose its static
tree. The settings are those of the shipped drafters in ``data/models/<kind>``; ``overrides``
replaces any optimization field (``steps``, ``lr``, ``batch_size`` ...).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from core.files import write_json
from core.names import DOMAINS
from core.paths import DRAFTER_DATA
from real_engine.decode import make_drafter
from real_engine.drafters.eagle import TreeShape
from real_engine.model import Transformer, load_model
from real_engine.training.baselines import BaselineConfig, train_eagle, train_medusa
from real_engine.training.drafter_data import (
    DrafterData,
    prepare_drafter_data,
    target_fingerprint,
    training_windows,
)
from real_engine.training.rank_calibration import calibrate_specblock
from real_engine.training.specblock import SpecBlockTrainConfig, train_from_corpus
from real_engine.training.windows import heldout_windows

# SpecBlock and EAGLE-style train alike (issue 31): the same windows, steps, batches, schedule and warm
# start (a fresh drafter on the target's embeddings and head), both drafting the DRAFT_VOCAB tokens the
# target predicts most often, trained as deep as they draft: SpecBlock's M = 2 blocks of K = 4, EAGLE's
# training-time test unrolled over its 8-deep tree, both keeping 32 nodes.
DRAFT_VOCAB = 2048
FEATURE_STEPS = 1500
RECIPES: dict[str, SpecBlockTrainConfig | BaselineConfig] = {
    "specblock": SpecBlockTrainConfig(steps=FEATURE_STEPS, batch_size=4, lr=2e-3, starts=48,
                                      prefix_weight=1.0, draft_vocab=DRAFT_VOCAB, rank_balance=0.5,
                                      checkpoint_every=20),
    "eagle": BaselineConfig(steps=FEATURE_STEPS, batch_size=4, lr=2e-3, warmup=0.015, checkpoint_every=20,
                            scored=64),
    "medusa": BaselineConfig(steps=1200, batch_size=4, lr=2e-3, warmup=0.05, checkpoint_every=25, scored=64),
}
EAGLE_TREE = TreeShape(depth=8, top_k=4, total_tokens=32)  # unrolled as deep in training
MEDUSA_HEADS, MEDUSA_TREE = 4, 24  # heads and static-tree nodes


@dataclasses.dataclass(frozen=True)
class DataRecipe:
    """The target rows the drafters learn from: corpus windows and the target's top-k log-probabilities."""

    sequences: int = 1920
    seq_len: int = 256
    top_k: int = 32
    heldout: int = 32  # Medusa's calibration windows, spread over the domains
    on_policy: float = 0.5  # share of the training windows that the target continues itself


def prepare_data(target: Transformer, recipe: DataRecipe, data_dir: Path, split: str = "train", seed: int = 0,
                 progress: bool = True) -> DrafterData:
    """The target's rows for the recipe's training windows (``split="train"``, drawn with ``seed``) or
    its held-out ones, cached under ``data_dir`` (the folder ``train_from_corpus`` uses)."""
    if split == "train":
        windows, folder = training_windows(target, DOMAINS, recipe.seq_len, recipe.sequences, seed,
                                           recipe.on_policy, data_dir)
    else:
        folder = Path(data_dir) / target_fingerprint(target)[:12]
        per_domain = heldout_windows(recipe.seq_len - 1, -(-recipe.heldout // len(DOMAINS)))
        windows = torch.cat([per_domain[d] for d in DOMAINS])[:recipe.heldout]
        folder = folder.with_name(f"{folder.name}-heldout")
    on_policy = recipe.on_policy if split == "train" else 0.0
    return prepare_drafter_data(target, windows, folder, top_k=recipe.top_k, progress=progress,
                                on_policy=on_policy)


def train_drafter(kind: str, target_dir: str | Path, out: str | Path, run_dir: str | Path, *,
                  data_dir: str | Path = DRAFTER_DATA, recipe: DataRecipe = DataRecipe(),
                  overrides: dict[str, Any] | None = None, resume: bool = False, minutes: float | None = None,
                  progress: bool = True, init: str | Path | None = None) -> dict[str, Any]:
    """Train the ``kind`` drafter for the target in ``target_dir`` into ``out`` (checkpoints in
    ``run_dir``; ``minutes`` caps this call, ``resume`` continues; ``init`` warm-starts from a saved
    drafter of the kind, e.g. the one for an earlier version of the target); returns its training record."""
    if kind not in RECIPES:
        raise InputError(f"unknown drafter kind {kind!r}: use one of {', '.join(RECIPES)}")
    config = dataclasses.replace(RECIPES[kind], **(overrides or {}))
    target = load_model(target_dir)
    if init is not None:  # a wrong warm start fails before minutes of the target's rows are computed
        make_drafter(kind, target, folder=init, deployed=False)
    if kind == "specblock":
        record = train_from_corpus(target, out, run_dir, data_dir, sequences=recipe.sequences,
                                   seq_len=recipe.seq_len, domains=DOMAINS, top_k=recipe.top_k, config=config,
                                   resume=resume, minutes=minutes, progress=progress, init=init,
                                   on_policy=recipe.on_policy)
        if record["steps_done"] < config.steps:  # stopped by ``minutes``: calibrate once it is done
            return record
        heldout = prepare_data(target, recipe, Path(data_dir), "heldout", progress=progress)
        record["rank_calibration"] = calibrate_specblock(target, out, heldout, seed=config.seed)
        write_json(Path(out) / "training.json", record)
        return record
    data = prepare_data(target, recipe, Path(data_dir), seed=config.seed, progress=progress)
    if kind == "eagle":
        return train_eagle(target, data, out, config=config, tree=EAGLE_TREE, checkpoint=run_dir,
                           resume=resume, minutes=minutes, progress=progress, init=init,
                           draft_vocab=DRAFT_VOCAB)
    heldout = prepare_data(target, recipe, Path(data_dir), "heldout", progress=progress)
    return train_medusa(target, data, heldout, out, config=config, heads=MEDUSA_HEADS, own_heads=False,
                        tree_budget=MEDUSA_TREE, checkpoint=run_dir, resume=resume, minutes=minutes,
                        progress=progress, init=init)
