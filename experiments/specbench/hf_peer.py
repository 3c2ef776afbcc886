"""The ``transformers`` peer of the bench: plain ``generate`` and assisted generation
(``generate(..., assistant_model=draft)``) on the same two checkpoints, loaded with
``AutoModelForCausalLM``. ``transformers`` is a test-only dependency, so it is imported lazily.

Forward hooks count the target's forwards (each emits tokens: HF's prefill emits the first one, and
assisted generation verifies in the same forward as its prefill) and the assistant's forwards and
their time, so the peer's rows carry ``tau``, ``draft_calls`` and ``draft_share`` like ours.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from experiments.specbench.run import Config, Measurement


def transformers_available() -> bool:
    """Whether ``transformers`` can be imported."""
    try:
        import transformers  # noqa: F401  (optional: the test extra)
    except ImportError:
        return False
    return True


class HFPeer:
    """Runs ``transformers``' generate on the target, with or without the draft model as assistant."""

    def __init__(self, target_dir: Path, draft_dir: Path, device: str | torch.device) -> None:
        from transformers import AutoModelForCausalLM  # optional (the test extra): the HF peer alone
        from transformers.utils import logging

        logging.set_verbosity_error()
        logging.disable_progress_bar()
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
        self.draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).to(device).eval()
        self.device = torch.device(device)
        self.target_calls = self.draft_calls = 0
        self.draft_seconds, self._started = 0.0, 0.0
        self.target.register_forward_hook(self._target_done)
        self.draft.register_forward_pre_hook(self._draft_start)
        self.draft.register_forward_hook(self._draft_done)

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _target_done(self, *_: Any) -> None:
        self.target_calls += 1

    def _draft_start(self, *_: Any) -> None:
        self._started = self._sync()

    def _draft_done(self, *_: Any) -> None:
        self.draft_calls += 1
        self.draft_seconds += self._sync() - self._started

    def config(self) -> dict[str, Any]:
        """The assisted-generation settings in force: the assistant's own or else HF's defaults (the peer
        runs as shipped)."""
        gc = self.draft.generation_config
        defaults = getattr(gc, "_get_default_generation_params", dict)()
        keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        own = {k: getattr(gc, k, None) for k in keys}
        return {k: defaults.get(k) if v is None else v for k, v in own.items()}

    @torch.inference_mode()
    def run(self, config: Config, prompt: list[int], seed: int, max_new_tokens: int,
            eos_id: int | None) -> Measurement:
        """Generate after ``prompt`` with ``config.drafter`` ``hf-vanilla`` or ``hf-assisted``; ``eos_id``
        None runs the whole ``max_new_tokens`` without stopping (and without suppressing EOS)."""
        ids = torch.tensor([prompt], device=self.device)
        pad = self.target.config.eos_token_id if eos_id is None else eos_id
        kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "max_new_tokens": max_new_tokens,
                                  "min_new_tokens": 0, "eos_token_id": eos_id, "pad_token_id": pad}
        if config.temperature == 0:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=config.temperature, top_k=0, top_p=1.0)
        if config.drafter == "hf-assisted":
            kwargs["assistant_model"] = self.draft
        self.target_calls = self.draft_calls = 0
        self.draft_seconds = 0.0
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            start = self._sync()
            out = self.target.generate(ids, **kwargs)
            seconds = self._sync() - start
        tokens = tuple(out[0, ids.shape[1]:].tolist())
        return Measurement(tokens, seconds, self.draft_seconds, max(self.target_calls, 1),
                           draft_calls=self.draft_calls)
