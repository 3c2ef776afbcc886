"""Text to token ids and back, through a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).

A model folder carries its own ``tokenizer.json``; the shipped models share the repository's
``data/tokenizer.json``, the fallback. The EOS id comes from the model's config when it names one,
else from the tokenizer's usual end-of-text token.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from core.errors import InputError
from core.files import MAX_TOKENIZER_BYTES, read_text
from core.paths import TOKENIZER

EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")


class Tokenizer:
    """Encodes and decodes text for one model, and knows its EOS id."""

    def __init__(self, inner: HFTokenizer, eos_id: int | None = None) -> None:
        self.inner = inner
        if eos_id is None:
            eos_id = next((i for i in map(inner.token_to_id, EOS_TOKENS) if i is not None), None)
        self.eos_id = eos_id

    @classmethod
    def load(cls, folder: str | Path, vocab_size: int | None = None, eos_id: int | None = None,
             fallback: Path = TOKENIZER) -> Tokenizer:
        """The folder's ``tokenizer.json`` (else ``fallback``), checked to fit a ``vocab_size`` model."""
        path = Path(folder) / "tokenizer.json"
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
        tokenizer = cls(inner, eos_id)
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
