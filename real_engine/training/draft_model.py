"""The small draft model: distilled from the shipped target on the corpus (``specblock train
draft-model``), and its token order, from which a reduced drafting vocabulary takes its tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import InputError
from core.paths import CORPUS_MANIFEST, TOKENIZER
from real_engine.drafters.vocab import write_vocab
from real_engine.model import Transformer, load_model
from real_engine.training import corpus
from real_engine.training.drafter_data import rank_tokens
from real_engine.training.evaluation import decode_step_ms, top1_agreement
from real_engine.training.loop import TrainConfig, continue_from, corpus_data, init_weights, ship, train_loop
from real_engine.training.windows import Rollouts, TokenWindows, heldout_windows, training_stream

DRAFT_MODEL = TrainConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, lr=3e-3, minutes=25.0)


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
    extra = continue_from(model, init)
    windows, evals = corpus_data(cfg)
    data = Rollouts(windows, teacher, cfg.on_policy) if cfg.on_policy else windows
    state = train_loop(model, cfg, run_dir, resume, "draft-model", data, evals, teacher=teacher,
                       data_offset=extra.get("earlier_tokens_seen", 0) // cfg.seq_len)
    agreement = top1_agreement(model, teacher, heldout_windows(cfg.seq_len, cfg.final_eval_windows))
    extra |= {"target": str(target_dir), "top1_agreement_with_target": agreement,
             "target_decode_step_ms_fp32": decode_step_ms(teacher)}
    log = ship(model, state, cfg, out, extra)
    write_token_order(out, teacher, seed=cfg.seed)
    return log


def write_token_order(folder: Path, target: Transformer, windows: int = 1920, seq_len: int = 256,
                      seed: int = 0) -> Path:
    """Write ``folder/draft_vocab.json``: every token id by how often ``target`` predicts it (its top
    token) over ``windows`` seeded training windows, then by its count over the training splits of all
    corpus domains, then by id. A reduced drafting vocabulary takes its most frequent tokens from this
    order (``drafters.vocab.load_vocab``), as SpecBlock's takes the target's top tokens."""
    v = target.args.vocab_size
    stream = training_stream()
    counts = np.bincount(stream, minlength=v)
    if counts.size != v:
        raise InputError(f"the corpus holds token ids beyond the vocabulary of {v}: retokenize it")
    data, top = TokenWindows(stream, seq_len, seed), torch.zeros(v, dtype=torch.long)
    with torch.inference_mode():
        for start in range(0, windows, 16):
            batch = data.batch(start, min(16, windows - start))[:, :-1]
            top += torch.bincount(target(batch).logits.argmax(-1).flatten(), minlength=v)
    order = rank_tokens(top, torch.from_numpy(counts.astype(np.int64)))
    return write_vocab(folder, order, {
        "windows": windows, "seq_len": seq_len, "seed": seed,
        "source": "the target's top token over seeded training windows, then token counts over the "
                  "training split of every corpus domain",
        "corpus_sha256": json.loads(CORPUS_MANIFEST.read_text())["sha256"]})
