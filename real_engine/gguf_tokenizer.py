"""The tokenizer a GGUF file describes, as a Hugging Face ``tokenizer.json``, and the way back.

A GGUF carries no ``tokenizer.json``: llama.cpp stores the vocabulary (``tokenizer.ggml.tokens``), each
token's kind (``token_type``: 1 normal, 3 control, 4 user-defined, 5 unused), the BPE merges and the
name of the pre-tokenizer (``tokenizer.ggml.pre``) as metadata. ``build_tokenizer`` turns a byte-level
BPE vocabulary (``tokenizer.ggml.model = "gpt2"``) back into a ``tokenizers`` BPE, with the split that
pre-tokenizer name stands for; ``folder_vocab`` reads a checkpoint folder's ``tokenizer.json`` into the
same fields for ``export_gguf``. Only byte-level BPE is handled: SentencePiece vocabularies
(``"llama"``) are refused with a message.

The pre-tokenizers are llama.cpp's, as each model's own ``tokenizer.json`` has them: ``smollm`` splits
digits one by one before GPT-2's byte-level regex (transformers' GGUF loader leaves the digit split
out), ``gpt2``/``default`` is GPT-2's regex alone, and the ``llama3`` and ``qwen2`` families split by
their regex (the strings transformers' ``gguf_tokenizer_mapping`` uses) with ``ignore_merges`` for the
``llama3`` family, as llama.cpp and Llama 3's own tokenizer do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES, read_text
from real_engine.tokenizer import TOKENIZER_FILE

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp's token types
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama-bpe": LLAMA3_SPLIT, "llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT,
          "smaug-bpe": LLAMA3_SPLIT, "dbrx": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT,
          "deepseek-r1-qwen": QWEN2_SPLIT}
"""Pre-tokenizer names whose split is one regex, then bytes (no regex of ByteLevel's own)."""
PRE_TOKENIZERS = ("gpt2", "default", "smollm", *SPLITS)
"""Every ``tokenizer.ggml.pre`` value the import understands (a file without one means ``default``)."""


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character table: each byte as a printable character (how byte-level tokens are
    spelled)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


def pre_tokenizer(pre: str) -> Any:
    """The ``tokenizers`` pre-tokenizer llama.cpp's ``pre`` name stands for; InputError for another."""
    if pre in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in SPLITS:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise InputError(f"the GGUF's pre-tokenizer {pre!r} is not supported: use a file whose "
                     f"tokenizer.ggml.pre is one of {', '.join(PRE_TOKENIZERS)}")


def build_tokenizer(tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], pre: str, *,
                    bos_id: int | None = None, add_bos: bool = False) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` from a GGUF's vocabulary fields.

    Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
    tokens, so that both are matched whole in text as llama.cpp matches them. A normal token spelled
    outside the byte alphabet is respelled into it (as transformers does); added tokens keep their text.
    With ``add_bos`` the post-processor prepends BOS when special tokens are asked for."""
    alphabet = set(byte_alphabet().values())
    spell = byte_alphabet()
    vocab: dict[str, int] = {}
    for index, (token, kind) in enumerate(zip(tokens, token_types, strict=True)):
        if kind not in (CONTROL, USER_DEFINED) and not set(token) <= alphabet:
            token = "".join(spell[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            raise InputError(f"the GGUF's merge {merge!r} is not two tokens of its vocabulary: the file's "
                             "tokenizer is corrupt; re-convert the model")
        pairs.append((parts[0], parts[1]))
    try:
        model = models.BPE(vocab, pairs, dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False,
                           ignore_merges=SPLITS.get(pre) == LLAMA3_SPLIT)
    except Exception as err:  # the tokenizers library raises a bare Exception on a bad vocabulary
        raise InputError(f"cannot build the GGUF's tokenizer ({err}): re-convert the model") from err
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=[bos, "$A"], pair=[bos, "$A", bos, "$B"], special_tokens=[(bos, bos_id)])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [AddedToken(token, special=kind == CONTROL, normalized=False)
             for token, kind in zip(tokens, token_types, strict=True) if kind in (CONTROL, USER_DEFINED)]
    tokenizer.add_special_tokens([t for t in added if t.special])
    tokenizer.add_tokens([t for t in added if not t.special])
    if tokenizer.get_vocab_size(with_added_tokens=True) > len(tokens):  # an added token past the vocabulary
        raise InputError(f"the GGUF's tokenizer does not fit its vocabulary of {len(tokens)} tokens: the "
                         "file's tokenizer is corrupt; re-convert the model")
    return tokenizer


def tokenizer_config(tokens: Sequence[str], ids: dict[str, int | None], *, add_bos: bool, max_length: int,
                     chat_template: str | None) -> dict[str, Any]:
    """``tokenizer_config.json`` for the folder: the special tokens by their text, BOS adding, the chat
    template where the file has one (``ids`` maps bos/eos/unk/pad to token ids or None)."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos,
                              "add_eos_token": False, "clean_up_tokenization_spaces": False,
                              "model_max_length": max_length}
    for role in ("bos", "eos", "unk", "pad"):
        index = ids.get(role)
        config[f"{role}_token"] = tokens[index] if index is not None else None
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def _pre_name(spec: Any) -> str | None:
    """The llama.cpp name of a ``tokenizer.json`` pre-tokenizer, or None for one it has no name for."""
    if not isinstance(spec, dict):
        return None
    if spec.get("type") == "ByteLevel" and spec.get("use_regex", True):
        return "gpt2"
    steps = spec.get("pretokenizers") if spec.get("type") == "Sequence" else None
    if not isinstance(steps, list) or len(steps) != 2 or not all(isinstance(s, dict) for s in steps):
        return None
    first, second = steps
    if second.get("type") != "ByteLevel":
        return None
    if first.get("type") == "Digits" and first.get("individual_digits") and second.get("use_regex", True):
        return "smollm"
    pattern = first.get("pattern")
    regex = pattern.get("Regex") if isinstance(pattern, dict) else None
    if first.get("type") == "Split" and not second.get("use_regex", True):
        return next((name for name, split in SPLITS.items() if split == regex), None)
    return None


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def folder_vocab(folder: Path, vocab_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """The GGUF tokenizer fields of a checkpoint folder: tokens, token types, merges, pre-tokenizer name,
    special token ids, BOS adding and chat template; InputError when its ``tokenizer.json`` is not a
    byte-level BPE one of the pre-tokenizers above, or is larger than the model's vocabulary.

    Ids the tokenizer leaves unused up to ``vocab_size`` are filled with ``[PAD<i>]`` tokens of type
    unused, as llama.cpp's converter does."""
    fix = "export a model whose tokenizer.json is a byte-level BPE (GPT-2, SmolLM2, Llama 3 or Qwen2 style)"
    path = folder / TOKENIZER_FILE
    try:
        spec = json.loads(read_text(path, MAX_TOKENIZER_BYTES, "tokenizer", fix))
    except ValueError as err:
        raise InputError(f"{path}: not a JSON tokenizer ({err}): {fix}") from None
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise InputError(f"{path}: the tokenizer is not a BPE: {fix}")
    pre = _pre_name(spec.get("pre_tokenizer"))
    if pre is None:
        raise InputError(f"{path}: its pre-tokenizer has no llama.cpp name: {fix}")
    added: dict[str, int] = {}
    try:
        by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
        for token in spec.get("added_tokens") or []:
            by_id[token["id"]] = (token["content"], CONTROL if token.get("special") else USER_DEFINED)
            added[token["content"]] = token["id"]
        size = max(vocab_size, max(by_id, default=-1) + 1)
    except (KeyError, TypeError, AttributeError) as err:
        raise InputError(f"{path}: malformed vocabulary or added tokens ({err!r}): {fix}") from None
    if not all(isinstance(i, int) and i >= 0 and isinstance(t, str) for i, (t, _) in by_id.items()):
        raise InputError(f"{path}: a token id is not a non-negative integer: {fix}")
    if size > vocab_size:
        raise InputError(f"{path}: the tokenizer has ids up to {size - 1} but the model only {vocab_size} "
                         f"embeddings: {fix}")
    tokens = [by_id.get(i, (f"[PAD{i}]", UNUSED)) for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    settings: dict[str, Any] = {}
    settings_path = folder / "tokenizer_config.json"
    if settings_path.is_file():  # not read_json: transformers writes model_max_length with 31 digits
        try:
            settings = json.loads(read_text(settings_path, MAX_CONFIG_BYTES, "tokenizer config", fix),
                                  parse_int=lambda digits: int(digits) if len(digits) < 32 else 0)
        except (ValueError, RecursionError) as err:
            raise InputError(f"{settings_path}: not a JSON tokenizer config ({str(err).splitlines()[0]}): "
                             f"{fix}") from None
        if not isinstance(settings, dict):
            raise InputError(f"{settings_path}: not a JSON object: {fix}")
    lookup = {**model["vocab"], **added}

    def special(role: str) -> int | None:
        text = _token_text(settings.get(f"{role}_token"))
        if text in lookup:
            return lookup[text]
        value = config.get(f"{role}_token_id")
        value = value[0] if isinstance(value, list) and value else value
        return value if isinstance(value, int) and 0 <= value < size else None

    jinja = folder / "chat_template.jinja"  # transformers' own file first, as transformers reads them
    template = (read_text(jinja, MAX_CONFIG_BYTES, "chat template", fix) if jinja.is_file() else
                settings.get("chat_template"))
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    return {"tokens": [t for t, _ in tokens], "token_types": [k for _, k in tokens], "merges": merges,
            "pre": pre, "ids": {role: special(role) for role in ("bos", "eos", "unk", "pad")},
            "add_bos": add_bos if isinstance(add_bos := settings.get("add_bos_token"), bool) else None,
            "chat_template": template if isinstance(template, str) else None}
