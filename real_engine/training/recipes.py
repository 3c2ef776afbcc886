"""The shipped drafters' training recipes, as ``specblock train KIND`` runs them (``train_drafter``).

Each registered drafter names its recipe (``DrafterSpec.recipe``): a function of the target folder, the
output and checkpoint folders and a ``TrainRequest``. The toy family's draft model is distilled from the
target on the corpus; the feature drafters learn as follows. Given the target's own answers
(``TrainRequest.responses``, a real model's data), every drafter, the draft model cut from the target's
first layers included, learns from the target's rows for windows packed from them and from the corpus's
code re-tokenized (``prepare_data``).

From a target folder: ``sequences`` windows of ``seq_len`` tokens drawn (seeded) from the training
split of the corpus domains the target learnt, the target's rows for them cached under
``data_dir/<target fingerprint>`` (shared by the three drafters, resumable), then training. Medusa
also calibrates its heads on ``heldout`` windows of the corpus's held-out split, to choose its static
tree. The settings are those of the shipped drafters in ``data/models/<kind>``; ``overrides``
replaces any optimization field (``steps``, ``lr``, ``batch_size`` ...).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from core.files import write_json
from core.names import DOMAINS, drafter_spec, trainable_drafters
from core.paths import DRAFTER_DATA
from real_engine.decode import make_drafter
from real_engine.drafters.eagle import TreeShape
from real_engine.model import Transformer, load_model
from real_engine.tokenizer import TOKENIZER_FILE
from real_engine.training import draft_model as distil
from real_engine.training.baselines import BaselineConfig, train_eagle, train_medusa
from real_engine.training.distil_rows import train_cut_draft
from real_engine.training.drafter_data import (
    DrafterData,
    prepare_drafter_data,
    target_fingerprint,
    training_windows,
)
from real_engine.training.rank_calibration import calibrate_specblock
from real_engine.training.responses import response_windows
from real_engine.training.specblock import SpecBlockTrainConfig, train_from_corpus, train_specblock
from real_engine.training.windows import corpus_windows, heldout_windows

# SpecBlock and EAGLE-style train alike: the same windows, steps, batches, schedule and warm
# start (a fresh drafter on the target's embeddings and head), both drafting the DRAFT_VOCAB tokens the
# target predicts most often, trained as deep as they draft: SpecBlock's M = 2 blocks of K = 4, EAGLE's
# training-time test unrolled over its 8-deep tree, both keeping 32 nodes.
DRAFT_VOCAB = 2048
FEATURE_STEPS = 1500
SPECBLOCK = SpecBlockTrainConfig(steps=FEATURE_STEPS, batch_size=4, lr=2e-3, starts=48, prefix_weight=1.0,
                                 draft_vocab=DRAFT_VOCAB, rank_balance=0.5, checkpoint_every=20)
EAGLE = BaselineConfig(steps=FEATURE_STEPS, batch_size=4, lr=2e-3, warmup=0.015, checkpoint_every=20,
                       scored=64)
MEDUSA = BaselineConfig(steps=1200, batch_size=4, lr=2e-3, warmup=0.05, checkpoint_every=25, scored=64)
EAGLE_TREE = TreeShape(depth=8, top_k=4, total_tokens=32)  # unrolled as deep in training
MEDUSA_HEADS, MEDUSA_TREE = 4, 24  # heads and static-tree nodes
# A real target's draft model: its first CUT_LAYERS layers, distilled on the same rows (``distil_rows``).
# It trains every weight of two layers, where the feature drafters train one: on the feature drafters'
# windows it memorized them (``generalization``), so it learns from as many of the answers as fit.
CUT = BaselineConfig(steps=12000, batch_size=4, lr=5e-4, warmup=0.02, checkpoint_every=20, scored=64)
CUT_LAYERS = 2
CUT_SEQUENCES = 11000


@dataclasses.dataclass(frozen=True)
class DataRecipe:
    """The target rows the drafters learn from: corpus windows and the target's top-k log-probabilities."""

    sequences: int = 1920
    seq_len: int = 256
    top_k: int = 32
    heldout: int = 32  # Medusa's calibration windows, spread over the domains
    on_policy: float = 0.5  # share of the training windows that the target continues itself
    code_share: float = 0.25  # with responses: share of windows cut from the corpus's code, re-tokenized


def response_data_windows(responses: Path, recipe: DataRecipe, vocab: int, tokenizer: Path, split: str,
                          seed: int) -> torch.Tensor:
    """The windows a real model's drafters learn from: the target's own answers (``responses``) and, a
    share ``code_share`` of them, code, the shipped corpus's ``code`` domain tokenized with the target's
    ``tokenizer`` (its train split drawn with ``seed``, or its held-out split in order). Training takes
    the first response windows, held-out the ones after them."""
    train = split == "train"
    count = recipe.sequences if train else recipe.heldout
    code = round(recipe.code_share * count)
    trained = recipe.sequences - round(recipe.code_share * recipe.sequences)  # response windows trained on
    chat = response_windows(responses, recipe.seq_len, count - code, vocab, skip=0 if train else trained)
    if not code:
        return chat
    if train:
        extra = corpus_windows(("code",), recipe.seq_len, code, seed, tokenizer)
    else:
        extra = heldout_windows(recipe.seq_len - 1, code, ("code",), tokenizer)["code"]
    if len(extra) < code or int(extra.max()) >= vocab:
        raise InputError(f"the corpus's code tokenized with {tokenizer} gives {len(extra)} held-out windows "
                         f"within a vocabulary of {vocab}, not {code}: give the target's own tokenizer")
    return torch.cat([chat, extra])


def prepare_data(target: Transformer, recipe: DataRecipe, data_dir: Path, split: str = "train", seed: int = 0,
                 progress: bool = True, responses: Path | None = None, tokenizer: Path | None = None
                 ) -> DrafterData:
    """The target's rows for the recipe's training windows (``split="train"``, drawn with ``seed``) or
    its held-out ones, cached under ``data_dir`` (the folder ``train_from_corpus`` uses). With
    ``responses`` (a `specblock responses` folder) the windows are ``response_data_windows``, code cut
    with the target's ``tokenizer``."""
    if responses is not None:
        if tokenizer is None:
            raise InputError("training on responses needs the target's tokenizer.json for its code windows")
        windows = response_data_windows(responses, recipe, target.args.vocab_size, tokenizer, split, seed)
        digest = hashlib.sha256(windows.numpy().tobytes()).hexdigest()[:12]
        folder = Path(data_dir) / f"{target_fingerprint(target)[:12]}-responses-{digest}"
        return prepare_drafter_data(target, windows, folder, top_k=recipe.top_k, progress=progress)
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


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """What ``specblock train KIND`` asks of a drafter's recipe: optimization overrides (None keeps the
    recipe's), the data (``sequences``, ``on_policy``: the recipe's when None), a time cap, the cache of the
    target's rows, whether to resume, and a warm start."""

    steps: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    sequences: int | None = None
    on_policy: float | None = None
    minutes: float | None = None
    data_dir: Path = DRAFTER_DATA
    resume: bool = False
    init: Path | None = None
    progress: bool = True
    responses: Path | None = None  # a `specblock responses` folder: train on it instead of the toy corpus

    def overrides(self) -> dict[str, Any]:
        """The optimization fields it sets."""
        return {k: v for k, v in (("steps", self.steps), ("lr", self.lr), ("batch_size", self.batch_size))
                if v is not None}

    def data(self, sequences: int | None = None) -> DataRecipe:
        """The data recipe, with what the request sets: its ``sequences``, else the given count (a recipe's
        own), else the feature drafters' default."""
        given = (("sequences", self.sequences or sequences), ("on_policy", self.on_policy))
        return DataRecipe(**{k: v for k, v in given if v is not None})


def train_drafter(kind: str, target_dir: str | Path, out: str | Path, run_dir: str | Path,
                  request: TrainRequest = TrainRequest()) -> dict[str, Any]:
    """Train the registered drafter ``kind`` for the target in ``target_dir`` into ``out`` (checkpoints in
    ``run_dir``) by its recipe (``DrafterSpec.recipe``); returns its training record."""
    spec = drafter_spec(kind)
    if not spec.recipe:
        raise InputError(f"drafter {kind!r} has no training recipe: train one of "
                         f"{', '.join(trainable_drafters())}")
    return spec.load("recipe")(Path(target_dir), Path(out), Path(run_dir), request)


def _feature_start(kind: str, base: Any, target_dir: Path, request: TrainRequest) -> tuple[Transformer, Any]:
    """The target and the recipe's config ``base`` with the request's overrides; a wrong warm start
    (``init``) of drafter ``kind`` fails here, before minutes of the target's rows are computed."""
    config = dataclasses.replace(base, **request.overrides())
    target = load_model(target_dir)
    if request.init is not None:
        make_drafter(kind, target, folder=request.init, deployed=False)
    return target, config


def _data(target: Transformer, target_dir: Path, request: TrainRequest, split: str, seed: int,
          sequences: int | None = None) -> DrafterData:
    """``prepare_data`` for a request: its data recipe (``sequences``: the recipe's count, when the request
    sets none), cache and responses, the target's tokenizer."""
    return prepare_data(target, request.data(sequences), Path(request.data_dir), split, seed,
                        request.progress, request.responses, target_dir / TOKENIZER_FILE)


def specblock_recipe(target_dir: Path, out: Path, run_dir: Path, request: TrainRequest) -> dict[str, Any]:
    """SpecBlock: trained on the corpus windows (or the request's responses), then its rank head
    calibrated on held-out ones."""
    target, config = _feature_start("specblock", SPECBLOCK, target_dir, request)
    recipe = request.data()
    if request.responses is None:
        record = train_from_corpus(target, out, run_dir, request.data_dir, sequences=recipe.sequences,
                                   seq_len=recipe.seq_len, domains=DOMAINS, top_k=recipe.top_k, config=config,
                                   resume=request.resume, minutes=request.minutes, progress=request.progress,
                                   init=request.init, on_policy=recipe.on_policy)
    else:
        data = _data(target, target_dir, request, "train", config.seed)
        record = train_specblock(target, data, out, run_dir, config=config, resume=request.resume,
                                 minutes=request.minutes, progress=request.progress, init=request.init)
    if record["steps_done"] < config.steps:  # stopped by ``minutes``: calibrate once it is done
        return record
    heldout = _data(target, target_dir, request, "heldout", config.seed)
    record["rank_calibration"] = calibrate_specblock(target, out, heldout, seed=config.seed)
    write_json(Path(out) / "training.json", record)
    return record


def eagle_recipe(target_dir: Path, out: Path, run_dir: Path, request: TrainRequest) -> dict[str, Any]:
    """EAGLE-style: its training-time test unrolled over ``EAGLE_TREE``, on the reduced vocabulary."""
    target, config = _feature_start("eagle", EAGLE, target_dir, request)
    data = _data(target, target_dir, request, "train", config.seed)
    heldout = _data(target, target_dir, request, "heldout", config.seed)
    return train_eagle(target, data, out, config=config, tree=EAGLE_TREE, checkpoint=run_dir,
                       resume=request.resume, minutes=request.minutes, progress=request.progress,
                       init=request.init, draft_vocab=DRAFT_VOCAB, heldout=heldout)


def medusa_recipe(target_dir: Path, out: Path, run_dir: Path, request: TrainRequest) -> dict[str, Any]:
    """Medusa-style heads, their static tree chosen on held-out windows."""
    target, config = _feature_start("medusa", MEDUSA, target_dir, request)
    data = _data(target, target_dir, request, "train", config.seed)
    heldout = _data(target, target_dir, request, "heldout", config.seed)
    return train_medusa(target, data, heldout, out, config=config, heads=MEDUSA_HEADS, own_heads=False,
                        tree_budget=MEDUSA_TREE, checkpoint=run_dir, resume=request.resume,
                        minutes=request.minutes, progress=request.progress, init=request.init)


def draft_model_recipe(target_dir: Path, out: Path, run_dir: Path, request: TrainRequest) -> dict[str, Any]:
    """The draft model: for the toy family, a small model distilled from the target on the corpus
    (``real_engine.training.draft_model``); given the target's responses (a real model), the target's
    first layers distilled on the rows the feature drafters share (``distil_rows``)."""
    if request.responses is not None:
        if request.init is not None:
            raise InputError("a draft model cut from a real target starts from its layers: drop --init")
        target = load_model(target_dir)
        config = dataclasses.replace(CUT, **request.overrides())
        data, heldout = (_data(target, target_dir, request, split, config.seed, CUT_SEQUENCES)
                         for split in ("train", "heldout"))
        return train_cut_draft(target, target_dir, data, out, layers=CUT_LAYERS, config=config,
                               draft_vocab=DRAFT_VOCAB, checkpoint=run_dir, resume=request.resume,
                               minutes=request.minutes, progress=request.progress, heldout=heldout)
    given = {**request.overrides(), **{k: v for k, v in (("minutes", request.minutes),
                                                          ("on_policy", request.on_policy)) if v is not None}}
    config = dataclasses.replace(distil.DRAFT_MODEL, **given)
    return distil.train_draft_model(out, run_dir, target_dir, config, resume=request.resume,
                                    init=request.init)
