"""How long the requests of `specblock serve-bench` are: their prompts and the new tokens each asks for.

A request's prompt is a held-out prompt's tokens cut to their last ``CONTEXT_TOKENS`` (the prompt cap).
The new tokens it asks for are set by ``--lengths``:

- ``fixed``: ``--tokens`` for every request;
- ``dataset``: the length in tokens of the dataset's reference answer to its prompt (ShareGPT's reply to
  the opening turn, HumanEval's canonical solution: ``real_engine.prompts``), capped at ``--tokens``, as
  vLLM's serving benchmark replays ShareGPT's prompt and output lengths. A prompt without a reference
  answer, or with one shorter than ``MIN_OUTPUT`` tokens, is left out of the draw, as vLLM's benchmark
  prunes requests of fewer than 4 output tokens.

The default is ``dataset`` where the held-out prompts carry reference answers (the real prompt sets) and
``fixed`` where none does (the toy family's). No torch, no numpy: the command's options read it before
the engine loads.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import InputError
from real_engine.prompts import Prompt

CONTEXT_TOKENS = 96
"""The prompt cap: a request's prompt is its held-out prompt's last ``CONTEXT_TOKENS`` tokens."""
FIXED, DATASET = "fixed", "dataset"
LENGTHS = (FIXED, DATASET)
MIN_OUTPUT = 4
"""Under dataset lengths, the shortest reference answer, in tokens, that a drawn prompt may have."""


def default_lengths(prompts: Sequence[Prompt]) -> str:
    """``dataset`` where any of ``prompts`` carries a reference answer, else ``fixed``."""
    return DATASET if any(p.reference_tokens is not None for p in prompts) else FIXED


def servable(prompts: Sequence[Prompt], lengths: str) -> list[Prompt]:
    """The prompts an arrival draw picks from: every one under fixed lengths; under dataset lengths those
    whose reference answer holds ``MIN_OUTPUT`` tokens or more. InputError naming the fix when none is."""
    if lengths == FIXED:
        return list(prompts)
    kept = [p for p in prompts if p.reference_tokens is not None and p.reference_tokens >= MIN_OUTPUT]
    if not kept:
        raise InputError(f"--lengths {DATASET}: none of the {len(prompts)} held-out prompts carries a "
                         f"reference answer of {MIN_OUTPUT} tokens or more (the toy family's prompt sets "
                         f"carry none): use --lengths {FIXED}, or a model on the real prompt sets, whose "
                         "answers `specblock models fetch` extracts")
    return kept


def output_length(prompt: Prompt, lengths: str, tokens: int) -> int:
    """The new tokens ``prompt``'s request asks for: ``tokens`` (the cap) under fixed lengths, its reference
    answer's length capped at ``tokens`` under dataset lengths (``prompt`` one of ``servable``'s)."""
    if lengths == FIXED:
        return tokens
    if prompt.reference_tokens is None:
        raise ValueError(f"prompt {prompt.name!r} has no reference answer to take its length from")
    return min(prompt.reference_tokens, tokens)


def summary(values: Sequence[int]) -> dict[str, float]:
    """The mean, least and greatest of ``values``: how the drawn lengths are recorded."""
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}
