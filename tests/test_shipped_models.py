"""The shipped model family (``data/models/``): the target and the draft model load in the engine and in
transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from core.paths import MODELS
from real_engine.model import load_model

TOKENIZER = MODELS.parent / "tokenizer.json"
SHIPPED = ("target", "draft")
CODE = 'import os\n\n\ndef read_config(path):\n    """Return the config."""\n    with open(path) as f:\n'


def _folder(name: str) -> Path:
    folder = MODELS / name
    assert (folder / "config.json").is_file(), f"{folder} is missing: the repository ships it"
    return folder


@pytest.mark.parametrize("name", SHIPPED)
def test_engine_and_transformers_agree(name: str) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    folder = _folder(name)
    files = sorted(folder.glob("*.safetensors"))
    assert files and all(path.stat().st_size < 30 * 2**20 for path in files)  # sharded past 20 MiB
    for path in files:
        with safe_open(str(path), "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118 (not a dict)
    ids = torch.tensor([Tokenizer.from_file(str(folder / "tokenizer.json")).encode(CODE).ids])
    ours = load_model(folder).eval()
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        a = ours(ids).logits
        b = theirs(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_folder_is_complete(name: str) -> None:
    folder = _folder(name)
    assert (folder / "tokenizer.json").read_text() == TOKENIZER.read_text()
    log = json.loads((folder / "training_log.json").read_text())
    assert set(log["heldout_loss"]) == {"code", "tests", "prose", "text"}
    assert log["loss_curve"] and log["tokens_seen"] > 0
    config = json.loads((folder / "config.json").read_text())
    assert config["eos_token_id"] == 0 and config["tie_word_embeddings"]


def test_draft_model_shares_the_target_vocabulary_and_is_smaller() -> None:
    target, draft = load_model(_folder("target")), load_model(_folder("draft"))
    assert draft.args.vocab_size == target.args.vocab_size
    assert draft.args.eos_token_id == target.args.eos_token_id
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(draft) < count(target) / 2
    assert draft.args.num_hidden_layers < target.args.num_hidden_layers
