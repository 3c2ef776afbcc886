"""What a trained language model is judged by: held-out loss per domain, top-1 agreement with its
target, the time of a decode step, and a greedy completion to read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from core.paths import PROMPTS, TOKENIZER
from real_engine.model import Transformer
from real_engine.training import corpus


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
    prompt = json.loads((PROMPTS / "code.jsonl").read_text().splitlines()[0])
    return {"prompt_id": prompt["id"], "prompt": prompt["text"],
            "completion": greedy_completion(model, prompt["text"], new_tokens)}
