"""The target LM's recipes and its pre-training on the offline corpus (``specblock train target``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.paths import TOKENIZER
from real_engine.model import Transformer
from real_engine.training import corpus
from real_engine.training.loop import TrainConfig, continue_from, corpus_data, init_weights, ship, train_loop

# The shipped target: 15.7M parameters. Most of a 5M target's single-token step is per-call overhead
# rather than arithmetic (``benchmarks/forward_cost.py`` prints the share), and every forward pays it,
# so a draft model's forward cost a large share of a step however narrow it was. Overhead grows with the layer
# count and arithmetic with the width squared, so a wider, deeper target makes drafting relatively
# cheap, as it is at scale.
TARGET = TrainConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=6,
                     num_key_value_heads=2, lr=1.5e-3, batch_size=8, warmup_steps=100, minutes=75.0)
# The earlier shipped shape, 5.0M parameters: a quick recipe for experiments on a small budget.
TARGET_5M = TrainConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, batch_size=4, warmup_steps=40, minutes=75.0)
TARGETS = {"16m": TARGET, "5m": TARGET_5M}


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
    extra = continue_from(model, init)
    state = train_loop(model, cfg, run_dir, resume, "target", *corpus_data(cfg),
                       data_offset=extra.get("earlier_tokens_seen", 0) // cfg.seq_len)
    return ship(model, state, cfg, out, extra)
