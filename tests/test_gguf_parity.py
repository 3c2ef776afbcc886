"""Parity with transformers' own GGUF loading, on a tiny random Llama GGUF written here.

The GGUF mixes Q4_1 matrices, a Q8_0 embedding and F32 tensors (as SmolLM2's file does) and carries a
byte-level BPE trained on a few lines and a chat template. transformers loads the file
(``from_pretrained(dir, gguf_file=...)``); the engine loads what ``import_gguf`` made of it. The
model's weights are large enough (initializer range 0.5) that its logits are peaked: greedy decoding is
decided by margins far above float32 rounding, so 64 greedy tokens can be compared exactly.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from real_engine.decode import generate
from real_engine.gguf import export_gguf, import_gguf
from real_engine.gguf_parity import compare_with_transformers, load_transformers, transformers_greedy
from real_engine.gguf_tokenizer import build_tokenizer, pre_tokenizer
from real_engine.model import load_model
from real_engine.tokenizer import Tokenizer as OurTokenizer

CORPUS = ["In 2024 the team shipped 12345 units; in 2023, 9876.",
          "def area(r):\n    return 3.14159 * r * r\n", "The year 1999 came after 1998 and before 2000.",
          "hello world, hello there, general Kenobi",
          "for i in range(2024):\n    total += i * 42\n"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PROMPTS = ["In 2024 the team", "def area(r):\n    return", "hello world, general Kenobi 1999",
           "<|im_start|>user\nHow many units?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tied Llama saved by transformers, with a 300-token byte-level BPE (GPT-2's pre-tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("parity") / "source"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.5,
                         rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
         "add_bos_token": False, "chat_template": TEMPLATE,
         "model_max_length": 1000000000000000019884624838656}))  # as transformers writes "no limit"
    return folder


@pytest.fixture(scope="module")
def gguf_file(source: Path) -> Path:
    """The GGUF: Q4_1 matrices, a Q8_0 embedding, one F32 matrix, F32 norms."""
    return export_gguf(source, source.parent / "tiny.gguf", quant="Q4_1",
                       overrides={"token_embd.weight": "Q8_0", "blk.0.attn_v.weight": "F32"})


@pytest.fixture(scope="module")
def imported(gguf_file: Path) -> Path:
    import_gguf(gguf_file, gguf_file.parent / "imported", name="tiny")
    return gguf_file.parent / "imported"


@pytest.fixture(scope="module")
def reference(gguf_file: Path) -> tuple[Any, Any]:
    """transformers' model and tokenizer on the GGUF file."""
    return load_transformers(gguf_file)


def test_the_file_mixes_tensor_types(gguf_file: Path) -> None:
    reader = gguf.GGUFReader(gguf_file)
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    assert kinds == {"Q4_1": 13, "Q8_0": 1, "F32": 6}
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt2"
    assert "output.weight" not in {t.name for t in reader.tensors}


def test_prompt_token_ids_match(imported: Path, reference: tuple[Any, Any]) -> None:
    ours, theirs = OurTokenizer.load(imported), reference[1]
    for prompt in [*PROMPTS, "Ünïcödé ✓ 3.14159\n\n\tx", "<|endoftext|>2024<|im_end|>"]:
        assert ours.encode(prompt) == theirs.encode(prompt, add_special_tokens=False), prompt


def test_chat_template_renders_the_same_ids(imported: Path, reference: tuple[Any, Any]) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "How many units in 2024?"}]
    ours = AutoTokenizer.from_pretrained(imported)
    assert ours.chat_template == reference[1].chat_template == TEMPLATE
    rendered = ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == reference[1].apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = reference[1].encode(rendered, add_special_tokens=False)
    assert OurTokenizer.load(imported).encode(rendered) == ids


def test_last_position_logits_agree(imported: Path, reference: tuple[Any, Any]) -> None:
    model, tokenizer = load_model(imported, torch.float32), OurTokenizer.load(imported)
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)])
        with torch.no_grad():
            ours, theirs = model(ids).logits[0, -1], reference[0](ids).logits[0, -1]
        assert float((ours - theirs).abs().max()) < 1e-3, prompt
        assert float(ours.std()) > 1.0  # peaked: far from float noise


def test_64_greedy_tokens_are_identical(imported: Path, reference: tuple[Any, Any]) -> None:
    model, tokenizer = load_model(imported, torch.float32), OurTokenizer.load(imported)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        ours = list(generate(model, ids, drafter=None, max_new_tokens=64).tokens)
        assert len(ours) == 64
        assert ours == transformers_greedy(reference[0], ids, 64), prompt


def test_compare_with_transformers_reports_parity(gguf_file: Path, imported: Path) -> None:
    report = compare_with_transformers(gguf_file, imported, PROMPTS[:2], new_tokens=8)
    assert report["ids_equal"] and report["greedy_equal"] and report["max_logit_diff"] < 1e-3
    assert [row["greedy_agree"] for row in report["prompts"]] == [8, 8]


def test_smollm_splits_digits_one_by_one_and_gpt2_does_not(gguf_file: Path) -> None:
    reader = gguf.GGUFReader(gguf_file)
    fields = [reader.fields[f"tokenizer.ggml.{key}"].contents() for key in ("tokens", "token_type", "merges")]
    smollm, gpt2, llama3 = (build_tokenizer(*fields, pre) for pre in ("smollm", "gpt2", "llama-bpe"))
    assert [smollm.decode([i]) for i in smollm.encode("2024").ids] == ["2", "0", "2", "4"]
    assert len(gpt2.encode("2024").ids) < 4 and gpt2.decode(gpt2.encode("2024").ids) == "2024"
    pieces = llama3.pre_tokenizer.pre_tokenize_str("12345 units")
    assert [piece for piece, _ in pieces] == ["123", "45", "Ġunits"]
    assert json.loads(smollm.to_str())["pre_tokenizer"] == {  # SmolLM2's own tokenizer.json
        "type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


@pytest.mark.parametrize("pre", ["smollm", "llama-bpe", "qwen2"])
def test_export_names_the_pre_tokenizer_and_import_rebuilds_it(source: Path, tmp_path: Path,
                                                                pre: str) -> None:
    folder = tmp_path / "source"
    shutil.copytree(source, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    carrier = Tokenizer(models.BPE())
    carrier.pre_tokenizer = pre_tokenizer(pre)
    spec["pre_tokenizer"] = json.loads(carrier.to_str())["pre_tokenizer"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    path = export_gguf(folder, tmp_path / "pre.gguf")
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == pre
    import_gguf(path, tmp_path / "back", name="back")
    rebuilt = json.loads((tmp_path / "back" / "tokenizer.json").read_text())
    assert rebuilt["pre_tokenizer"] == spec["pre_tokenizer"]
    text = "In 2024 the team shipped 12345 units"
    assert OurTokenizer.load(tmp_path / "back").encode(text) == Tokenizer.from_str(json.dumps(spec)).encode(
        text, add_special_tokens=False).ids


def test_a_qwen3_gguf_matches_transformers(source: Path, tmp_path: Path) -> None:
    """Qwen3 (q/k norms, no row permutation in llama.cpp's converter): logits as transformers has them.
    Head dimension 128, Qwen3's default: transformers' GGUF loader does not read ``attention.key_length``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path / "qwen3"
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, rope_theta=1000000.0, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2))
    with torch.no_grad():
        for name, param in model.named_parameters():  # norms away from 1, so that a swap shows
            noise = torch.randn_like(param)
            param.copy_(1 + 0.3 * noise if "norm" in name else 0.3 * noise)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    path = export_gguf(folder, tmp_path / "qwen3.gguf", quant="Q8_0")
    import_gguf(path, tmp_path / "imported", name="qwen3")
    theirs, _ = load_transformers(path)
    ours = load_model(tmp_path / "imported", torch.float32)
    ids = torch.tensor([OurTokenizer.load(tmp_path / "imported").encode(PROMPTS[0])])
    with torch.no_grad():
        gap = (ours(ids).logits - theirs(ids).logits).abs().max()
    assert float(gap) < 1e-3
