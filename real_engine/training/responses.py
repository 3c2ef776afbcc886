"""Self-distillation responses: the target's own continuations of training prompts, the data EAGLE and
Medusa-2 train their drafters on (a drafter learns to predict what its target writes, not what a dataset's
authors wrote).

``respond`` decodes prompt rows (a model's ``training/<domain>.jsonl``, through the chat template where a
row says so) with continuous batching (``real_engine.batch``): each prompt is answered greedily or, for a
seeded ``sampled`` share of them, sampled at temperature 1, up to ``max_new_tokens`` or the end of turn.
Responses are appended batch by batch to ``<out>/responses.jsonl`` (one object a line: ``id``,
``domain``, ``sampled``, ``prompt`` and ``response`` token ids), and ``<out>/state.json`` records the plan
and how many rows are complete after each batch. A run stopped by ``minutes`` (or killed) resumes with
``resume``: rows past the recorded count (a batch cut short) are dropped and the remaining prompts
answered; a finished run does nothing; a run of another plan is refused.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, read_json, read_text, write_json
from real_engine.batch import BatchEngine, Request
from real_engine.model import Transformer
from real_engine.prompts import PromptRow
from real_engine.warp import Sampling

RESPONSES, STATE = "responses.jsonl", "state.json"
FORMAT = "specblock-responses-v1"
MAX_RESPONSES_BYTES = 1 << 30  # every ShareGPT training prompt with a 256-token answer: about 30 MiB


@dataclass(frozen=True)
class ResponsePlan:
    """How the prompts are answered: tokens per response, the share answered by sampling (temperature 1)
    instead of greedily, requests decoding together, and the seed of the sampled share and its draws."""

    max_new_tokens: int = 256
    sampled: float = 0.5
    batch: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.batch < 1:
            raise InputError(f"max_new_tokens {self.max_new_tokens} and batch {self.batch}: give 1 or more")
        if not 0 <= self.sampled <= 1:
            raise InputError(f"the sampled share {self.sampled} is not in [0, 1]: give a share such as 0.5")


def sampled_rows(count: int, plan: ResponsePlan) -> list[bool]:
    """Which of ``count`` prompts are answered by sampling: a seeded draw of ``plan.sampled`` of them."""
    draw = random.Random(plan.seed)
    return [draw.random() < plan.sampled for _ in range(count)]


def _done(out: Path, plan: ResponsePlan, prompts: Sequence[PromptRow], resume: bool) -> int:
    """How many rows a previous run of this plan completed (0 for a fresh folder); InputError for a folder
    holding another plan's or prompts' run, or a run not asked to resume."""
    state_path = out / STATE
    if not state_path.exists():
        if (out / RESPONSES).exists():
            raise InputError(f"{out} holds {RESPONSES} without {STATE}: give an empty or new --out")
        if resume:
            raise InputError(f"{out} holds no responses run to resume: drop --resume")
        return 0
    state = read_json(state_path, MAX_RECORD_BYTES, "responses state", "give an empty or new --out")
    expected = {"format": FORMAT, "plan": asdict(plan), "prompts": [p.name for p in prompts]}
    if not isinstance(state, dict) or {k: state.get(k) for k in expected} != expected:
        raise InputError(f"{out} holds responses of another plan or prompt list: give a new --out, or the "
                         "same plan and prompts")
    done = state.get("done")
    if isinstance(done, bool) or not isinstance(done, int) or not 0 <= done <= len(prompts):
        raise InputError(f"{state_path}: \"done\" is not a count of 0 to {len(prompts)}: give a new --out")
    if done < len(prompts) and not resume:
        raise InputError(f"{out} holds an unfinished run ({done} of {len(prompts)} prompts): add --resume")
    return done


def _keep(path: Path, rows: int) -> None:
    """Cut ``path`` to its first ``rows`` lines (a batch cut short past them is dropped)."""
    if not path.exists():
        return
    with path.open("rb") as file:
        lines = file.readlines()[:rows]
    if len(lines) < rows:
        raise InputError(f"{path} holds {len(lines)} responses, fewer than its state's {rows}: give a new "
                         "--out")
    path.write_bytes(b"".join(lines))


def respond(target: Transformer, prompts: Sequence[PromptRow], encode: Callable[[PromptRow], list[int]],
            out: str | Path, plan: ResponsePlan = ResponsePlan(), *, eos_id: int | None = None,
            minutes: float | None = None, resume: bool = False,
            log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Answer ``prompts`` (tokenized by ``encode``) with ``target`` into ``out`` (see the module doc);
    returns the state: the plan, the prompt ids, how many are done, the tokens written and the seconds."""
    if not prompts:
        raise InputError("no prompts to answer: give a model whose prompt sets have a training split")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = _done(out, plan, prompts, resume)
    _keep(out / RESPONSES, done)
    sampled = sampled_rows(len(prompts), plan)
    state = {"format": FORMAT, "plan": asdict(plan), "prompts": [p.name for p in prompts], "done": done}
    start, cap = time.perf_counter(), None if minutes is None else 60 * minutes
    while done < len(prompts) and (cap is None or time.perf_counter() - start < cap):
        chunk = range(done, min(done + plan.batch, len(prompts)))
        engine = BatchEngine(target, max_batch=plan.batch)
        tokens = {i: encode(prompts[i]) for i in chunk}
        ids = {engine.submit(Request(tokens[i], plan.max_new_tokens, eos_id=eos_id, seed=plan.seed + i,
                                     sampling=Sampling(1.0 if sampled[i] else 0.0))): i for i in chunk}
        results = engine.run()
        lines = []
        for rid, i in ids.items():
            if results[rid].error:
                raise InputError(f"prompt {prompts[i].name}: {results[rid].error}")
            row = {"id": prompts[i].name, "domain": prompts[i].domain, "sampled": sampled[i],
                   "prompt": tokens[i], "response": results[rid].tokens}
            lines.append(json.dumps(row) + "\n")
        with (out / RESPONSES).open("a", encoding="utf-8") as file:
            file.writelines(lines)
        done = chunk.stop
        state["done"] = done
        write_json(out / STATE, state)
        log(f"{done}/{len(prompts)} prompts answered")
    return {**state, "seconds": time.perf_counter() - start}


def response_windows(folder: str | Path, seq_len: int, count: int, vocab: int, skip: int = 0) -> torch.Tensor:
    """``count`` windows of ``seq_len`` tokens ([count, seq_len]) after the first ``skip``, cut from the
    complete rows of the responses in ``folder``: each prompt and its response, in file order, packed end
    to end (as corpus windows run across documents). InputError when the folder holds no responses run,
    too few tokens, or ids outside the target's ``vocab``."""
    folder = Path(folder)
    fix = f"answer more prompts (`specblock responses --resume --out {folder}`) or ask for fewer sequences"
    state = read_json(folder / STATE, MAX_RECORD_BYTES, "responses state",
                      "give a `specblock responses` folder")
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("done"), int):
        raise InputError(f"{folder} holds no `specblock responses` run: give the folder one wrote")
    lines = read_text(folder / RESPONSES, MAX_RESPONSES_BYTES, "responses", "give the folder of a responses "
                      "run").splitlines()[:state["done"]]
    stream: list[int] = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            tokens = [*row["prompt"], *row["response"]]
        except (ValueError, TypeError, KeyError):
            raise InputError(f"{folder / RESPONSES}, line {number}: not a responses row: give the folder of "
                             "a `specblock responses` run") from None
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            raise InputError(f"{folder / RESPONSES}, line {number}: token ids must be non-negative integers")
        stream += tokens
    need = (skip + count) * seq_len
    if len(stream) < need:
        raise InputError(f"{folder} holds {len(stream)} tokens, fewer than the {need} of {skip + count} "
                         f"windows of {seq_len}: {fix}")
    windows = torch.tensor(stream[skip * seq_len:need], dtype=torch.long).view(count, seq_len)
    if int(windows.max()) >= vocab:
        raise InputError(f"{folder} holds token ids beyond the target's vocabulary of {vocab}: give the "
                         "responses of this target's model")
    return windows
