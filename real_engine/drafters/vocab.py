"""A drafter's reduced vocabulary: every token id in the order its drafting vocabulary takes them.

``draft_vocab.json`` in a drafter's folder holds ``{"ids": every token id, most frequent first, ...}``
(and how the order was made). Drafting with ``vocab`` tokens cuts the LM head to the first ``vocab``
ids (``packed.cut_rows``) and gives every other token zero probability, so verification stays
lossless. The draft model's order counts the target's top tokens over training windows
(``training.draft_model.write_token_order``); the feature drafters' the target's top tokens over their
training data (``training.drafter_data.frequent_targets``), so SpecBlock and EAGLE-style trained on the
same data draft from the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, read_json, write_json
from real_engine.drafters.trained import deployed_shape

VOCAB_FILE = "draft_vocab.json"


def load_vocab(folder: str | Path, count: int, kind: str = "draft-model") -> torch.Tensor:
    """The ``count`` most frequent token ids of the ``kind`` drafter in ``folder`` (its token order)."""
    path = Path(folder) / VOCAB_FILE
    fix = f"rewrite it with `specblock train {kind}`"
    if not path.is_file():
        raise InputError(f"no {VOCAB_FILE} in {folder}: a reduced drafting vocabulary needs the drafter's "
                         f"token order (`specblock train {kind}` writes it); drop the vocab option")
    try:
        ids = read_json(path, MAX_CONFIG_BYTES, "token order", fix)["ids"]
        ok = (isinstance(ids, list) and all(isinstance(i, int) and i >= 0 for i in ids)
              and len(set(ids)) == len(ids))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{path} is not a token order ({{\"ids\": [distinct token ids]}}): {fix} or "
                         "delete it")
    if not 1 <= count <= len(ids):
        raise InputError(f"a drafting vocabulary of {count} tokens: give 1 to {len(ids)}")
    return torch.tensor(ids[:count])


def write_vocab(folder: str | Path, ids: torch.Tensor, record: dict[str, Any]) -> Path:
    """Write ``folder/draft_vocab.json``: the order ``ids`` (every token id) and ``record`` (its source)."""
    return write_json(Path(folder) / VOCAB_FILE, {"ids": [int(i) for i in ids], **record})


def drafting_vocab(folder: str | Path, kind: str, vocab_size: int, count: int | None) -> torch.Tensor | None:
    """The tokens a ``kind`` drafter in ``folder`` drafts when asked for ``count``: None (its default) when
    ``count`` is None, every token when it is the vocabulary's size, else its ``count`` most frequent."""
    if count is None:
        return None
    if count == vocab_size:
        return torch.arange(vocab_size)
    return load_vocab(folder, count, kind)


def deployed_count(folder: str | Path, kind: str = "draft-model", dtype: str | None = None) -> int | None:
    """How many of its most frequent tokens the ``kind`` drafter in ``folder`` drafts as deployed for runs
    in ``dtype`` (the ``vocab`` of its saved shape, ``trained.deployed_shape``); None where it drafts every
    token."""
    count = deployed_shape(kind, folder, dtype).get("vocab")
    return None if count is None else int(count)


def deployed_vocab(folder: str | Path, kind: str = "draft-model", dtype: str | None = None
                   ) -> torch.Tensor | None:
    """The token ids the ``kind`` drafter in ``folder`` drafts as deployed for runs in ``dtype``
    (``deployed_count``), None where it drafts every token: what a profile times it drafting."""
    count = deployed_count(folder, kind, dtype)
    return None if count is None else load_vocab(folder, count, kind)
