"""How closely an imported GGUF model matches transformers' own loading of the same file.

``compare_with_transformers`` loads the GGUF with ``transformers`` (``from_pretrained(dir,
gguf_file=name)``, float32) and the folder ``import_gguf`` made from it with the engine, and measures,
per prompt: whether the two tokenizers give the same ids, the largest logit difference at the last
position, and whether the first greedy tokens agree. The models are compared on the engine's ids, so a
tokenizer difference (transformers drops the ``smollm`` pre-tokenizer's digit split) does not hide a
model difference. It returns figures and asserts nothing: the tests assert on tiny models, and a
benchmark records the figures for a real file. ``transformers`` is imported only here, on call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from real_engine.decode import generate
from real_engine.model import load_model
from real_engine.tokenizer import Tokenizer


def load_transformers(gguf_path: Path) -> tuple[Any, Any]:
    """transformers' model (float32, eval) and tokenizer for the GGUF file at ``gguf_path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # optional: the test extra

    gguf_path = Path(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return model, tokenizer


def transformers_greedy(model: Any, ids: list[int], new_tokens: int) -> list[int]:
    """``new_tokens`` greedy tokens from transformers' ``generate``, not stopping at EOS (as the engine's
    ``generate`` with no ``eos_id``)."""
    model.generation_config.eos_token_id = None
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=new_tokens, pad_token_id=0)
    return out[0, len(ids):].tolist()


def compare_with_transformers(gguf_path: Path, folder: Path, prompts: Sequence[str], *,
                              new_tokens: int = 32) -> dict[str, Any]:
    """Per prompt: token ids equal, max |logit difference| at the last position (float32, on the
    engine's ids), and the first ``new_tokens`` greedy tokens equal (with how many agree from the start),
    between transformers on ``gguf_path`` and the engine on ``folder``; and each figure over all prompts."""
    theirs, their_tokenizer = load_transformers(Path(gguf_path))
    ours = load_model(folder, torch.float32)
    our_tokenizer = Tokenizer.load(folder)
    rows = []
    for prompt in prompts:
        ids = our_tokenizer.encode(prompt)
        other = their_tokenizer.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            mine = ours(torch.tensor([ids])).logits[0, -1].float()
            their = theirs(torch.tensor([ids])).logits[0, -1].float()
        greedy = list(generate(ours, ids, max_new_tokens=new_tokens).tokens)
        reference = transformers_greedy(theirs, ids, new_tokens)
        agree = next((i for i, (a, b) in enumerate(zip(greedy, reference, strict=False)) if a != b),
                     min(len(greedy), len(reference)))
        rows.append({"prompt_tokens": len(ids), "ids_equal": ids == other, "transformers_tokens": len(other),
                     "max_logit_diff": float((mine - their).abs().max()),
                     "same_argmax": int(mine.argmax()) == int(their.argmax()),
                     "greedy_equal": greedy == reference, "greedy_agree": agree})
    return {"prompts": rows, "new_tokens": new_tokens,
            "ids_equal": all(r["ids_equal"] for r in rows),
            "max_logit_diff": max((r["max_logit_diff"] for r in rows), default=0.0),
            "greedy_equal": all(r["greedy_equal"] for r in rows)}
