"""A draft model for a real target: its first layers, distilled on the target's own rows.

A draft model trained from scratch with a real model's 49k-token vocabulary would be mostly embedding
table, and a CPU session trains it on a few million tokens, where the target saw trillions. So the
draft model is cut from the target instead, as layer-skipping self-speculation does (Draft & Verify,
Zhang et al. 2024; LayerSkip, Elhoushi et al. 2024): the target's token embeddings, its first ``layers``
decoder layers, its final norm and its LM head, a model of the target's width and tokenizer. Its layers
and norm are then distilled on the rows every feature drafter shares (``drafter_data``: the target's
top-k law at every position of its own answers and of code), with the same top-k KL as they use
(``specblock.draft_kl``), so that the cut's last layer learns to stand in for the target's remaining ones.

The embeddings and head stay frozen and are not saved: the shipped folder holds the layers and norm
and names the target's tensors (``shared_embeddings``), so the draft costs a few MB of weights. Its
drafting vocabulary (``draft_vocab.json``) is the target's most frequent top tokens over the data, and
its deployed shape starts from ``DRAFT_VOCAB`` of them: the LM head over every token would cost as much
as the layers. The training loop, its checkpoints and ``--resume`` are the feature drafters'
(``baselines.fit_drafter``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from core.files import write_json
from real_engine.drafters.trained import write_shape
from real_engine.drafters.vocab import write_vocab
from real_engine.model import Transformer, save_model
from real_engine.shared_embeddings import share_entry
from real_engine.training.baselines import BaselineConfig, Batch, fit_drafter, target_data
from real_engine.training.drafter_data import DrafterData, frequent_targets
from real_engine.training.specblock import draft_kl

SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # read from the target, never trained or saved


def cut_draft(target: Transformer, layers: int) -> Transformer:
    """A draft model of the target's first ``layers`` layers and final norm (copies, to be trained) and its
    embeddings and LM head (the target's own tensors, frozen)."""
    if not 1 <= layers < target.args.num_hidden_layers:
        raise InputError(f"a draft model of {layers} layers: give 1 to {target.args.num_hidden_layers - 1}, "
                         "fewer than the target has")
    args = dataclasses.replace(target.args, num_hidden_layers=layers, feature_layers=(-1, -1, -1))
    draft = Transformer(args).to(target.lm_head.weight.device)
    ours = draft.state_dict()
    draft.load_state_dict({k: v.detach().clone() for k, v in target.state_dict().items()
                           if k in ours and k not in SHARED}, strict=False)
    draft.model.embed_tokens.weight = target.model.embed_tokens.weight
    draft.lm_head.weight = target.lm_head.weight
    return draft.float()


def draft_loss(draft: Transformer, batch: Batch, scored: torch.Tensor | None
               ) -> tuple[torch.Tensor, list[float]]:
    """The top-k KL of the draft's next-token law to the target's at the positions ``scored`` (default
    all), and its top-1 agreement with the target there."""
    hidden = draft(batch["tokens"], head=torch.nn.Identity()).logits
    rows = torch.arange(hidden.shape[1], device=hidden.device) if scored is None else scored
    logits = draft.lm_head(hidden[:, rows])
    ids = batch["topk_ids"][:, rows]
    loss = draft_kl(logits, batch["topk_logp"][:, rows], ids).mean()
    return loss, [float((logits.argmax(-1) == ids[..., 0]).float().mean())]


def train_cut_draft(target: Transformer, target_dir: Path, data: DrafterData, out: Path, *, layers: int,
                    config: BaselineConfig, draft_vocab: int, checkpoint: Path, resume: bool = False,
                    minutes: float | None = None, progress: bool = True,
                    heldout: DrafterData | None = None) -> dict[str, Any]:
    """Cut a ``layers``-layer draft model from ``target`` (in ``target_dir``), distil it on ``data`` and
    ship it to ``out`` with its token order and a deployed shape drafting ``draft_vocab`` tokens (0 or the
    whole vocabulary: no shape, every token); returns the training record, with its ``generalization``
    to ``heldout`` rows when given (a run stopped by ``minutes`` ships nothing: ``resume`` continues it)."""
    data = target_data(target, data)
    heldout = None if heldout is None else target_data(target, heldout)
    target.requires_grad_(False)
    draft = cut_draft(target, layers)
    record = {"train": asdict(config), "data": asdict(data.meta), "losses": [],
              "drafter": {"kind": "draft-model", "layers": layers, "cut_from": "the target's first layers",
                          "draft_vocab": draft_vocab}}
    record = fit_drafter(draft, lambda b, scored: draft_loss(draft, b, scored), data, config, record,
                         checkpoint, resume, progress, minutes, heldout)
    done = record["losses"][-1][0] + 1 if record["losses"] else 0
    record["steps_done"] = done
    if done < config.steps:
        return record
    out = Path(out)
    shared = SHARED[:1] if target.args.tie_word_embeddings else SHARED  # a tied head is the embeddings
    save_model(draft, out, shared=share_entry(out, target_dir, {k: target.state_dict()[k] for k in shared}))
    order = frequent_targets(data, target.args.vocab_size, target.args.vocab_size)
    write_vocab(out, order, {"source": "the target's top token over the training data, then the input "
                                       "tokens' counts (training.drafter_data.frequent_targets)",
                             "data": asdict(data.meta)})
    if 0 < draft_vocab < target.args.vocab_size:
        write_shape("draft-model", out, {"vocab": draft_vocab},
                    {"source": "the recipe's drafting vocabulary; `specblock shapes --apply` replaces it"})
    record["parameters_saved"] = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    write_json(out / "training.json", record)
    return record
