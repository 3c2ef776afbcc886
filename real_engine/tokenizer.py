"""Text to token ids and back, through a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library),
and a chat model's prompt through its chat template.

A model folder carries its own ``tokenizer.json``; the shipped models share the repository's
``data/tokenizer.json``, the fallback. The EOS id comes from the model's config when it names one, else
from the folder's ``tokenizer_config.json`` (its ``eos_token``), else from the tokenizer's usual
end-of-text token.

A chat model's folder also carries its chat template (``chat_template.jinja``, else the
``chat_template`` of ``tokenizer_config.json``), a Jinja template rendered as ``transformers``' own
``apply_chat_template`` renders it: in a sandbox, with ``trim_blocks`` and ``lstrip_blocks``, the named
special tokens (``bos_token``, ``eos_token``, ...) of ``tokenizer_config.json`` in scope, so the same
conversation gives the same text and the same ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES, read_text
from core.paths import TOKENIZER

EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")
"""The named special tokens ``transformers`` hands a chat template (its ``special_tokens_map``)."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_FILE = "tokenizer.json"  # a model folder's tokenizer, as Hugging Face names it
TOKENIZER_CONFIG = "tokenizer_config.json"


class Tokenizer:
    """Encodes and decodes text for one model, knows its EOS id, and renders its chat template."""

    def __init__(self, inner: HFTokenizer, eos_id: int | None = None, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None) -> None:
        self.inner = inner
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # e.g. "eos_token" -> "<|im_end|>"
        if eos_id is None:
            named = self.special_tokens.get("eos_token")
            candidates = ((named,) if named else ()) + EOS_TOKENS
            eos_id = next((i for i in map(inner.token_to_id, candidates) if i is not None), None)
        self.eos_id = eos_id
        self._compiled: tuple[str, jinja2.Template] | None = None  # the template text and its compiled form

    @classmethod
    def load(cls, folder: str | Path, vocab_size: int | None = None, eos_id: int | None = None,
             fallback: Path = TOKENIZER) -> Tokenizer:
        """The folder's ``tokenizer.json`` (else ``fallback``), checked to fit a ``vocab_size`` model, with
        the folder's chat template and named special tokens where it has them."""
        path = Path(folder) / TOKENIZER_FILE
        if not path.exists():
            path = fallback
        if not path.exists():
            raise InputError(f"no tokenizer.json in {folder} nor at {fallback}: copy the model's tokenizer "
                             "into its folder")
        fix = "give a valid Hugging Face tokenizer.json"
        text = read_text(path, MAX_TOKENIZER_BYTES, "tokenizer", fix)
        try:
            inner = HFTokenizer.from_str(text)
        except Exception as exc:  # the tokenizers library raises a bare Exception on a bad file
            raise InputError(f"cannot read {path} ({exc}): {fix}") from exc
        template, special = read_chat_files(Path(folder))
        tokenizer = cls(inner, eos_id, template, special)
        if vocab_size is not None and tokenizer.vocab_size > vocab_size:
            raise InputError(f"the tokenizer {path} has {tokenizer.vocab_size} tokens but the model only "
                             f"{vocab_size}: use the tokenizer the model was trained with")
        return tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.inner.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self.inner.decode(ids, skip_special_tokens=True)

    def apply_chat(self, text: str, system: str | None = None) -> str:
        """The prompt a chat model expects for one user message ``text`` (after an optional ``system``
        message), ending with the assistant's turn opened (``add_generation_prompt``); InputError when the
        model has no chat template or its template fails."""
        if self.chat_template is None:
            raise InputError("the model has no chat template: drop --chat")
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        messages.append({"role": "user", "content": text})
        try:
            if self._compiled is None or self._compiled[0] != self.chat_template:
                self._compiled = (self.chat_template, chat_environment().from_string(self.chat_template))
            return self._compiled[1].render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=True, **self.special_tokens)
        except jinja2.TemplateError as exc:
            raise InputError(f"the model's chat template failed ({exc}): fix its chat template or drop --chat"
                             ) from None

    def chat_encoder(self) -> Callable[[str], list[int]] | None:
        """How a chat prompt is tokenized (``trace.load_prompts``' ``chat_encode``): through the chat template
        where the model has one (``encode_chat``), else None (as plain text)."""
        return self.encode_chat if self.chat_template else None

    def encode_chat(self, text: str, system: str | None = None) -> list[int]:
        """Token ids of ``apply_chat(text, system)``: the template's special tokens (``<|im_start|>``, ...)
        map to their single ids, and nothing else is added, as ``apply_chat_template(tokenize=True)``."""
        return self.encode(self.apply_chat(text, system))


def chat_environment() -> ImmutableSandboxedEnvironment:
    """The sandbox a chat template renders in, as ``transformers`` sets it up: blocks trimmed, loop
    controls, a ``tojson`` that keeps non-ASCII text, ``raise_exception`` and ``strftime_now``."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env


def read_chat_files(folder: Path) -> tuple[str | None, dict[str, str]]:
    """A model folder's chat template (``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template``: a string, or a list of named templates of which ``default`` is taken) and the
    named special tokens of its ``tokenizer_config.json``; capped reads."""
    fix = "give the model's chat template and tokenizer_config.json as Hugging Face writes them"
    config_path = folder / TOKENIZER_CONFIG
    config = {}
    if config_path.is_file():  # not read_json: transformers writes model_max_length as a 31-digit integer
        text = read_text(config_path, MAX_CONFIG_BYTES, "tokenizer config", fix)
        try:
            config = json.loads(text, parse_int=lambda digits: int(digits) if len(digits) < 32 else 0)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{config_path}: not a JSON tokenizer config ({str(exc).splitlines()[0]}): "
                             f"{fix}") from None
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: not a JSON object: {fix}")
    special = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):  # a serialized AddedToken
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
    template_path = folder / CHAT_TEMPLATE_FILE
    if template_path.is_file():
        return read_text(template_path, MAX_CONFIG_BYTES, "chat template", fix), special
    template = config.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    if template is not None and not isinstance(template, str):
        raise InputError(f"{config_path}: its chat_template is not a template: {fix}")
    return template, special
