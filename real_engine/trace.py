"""Record acceptance traces from the live engine: one row per decoding iteration (``simulator.traces``).

Each prompt of ``data/prompts/<domain>.jsonl`` is decoded by ``decode.generate`` with a fresh drafter;
its ``on_iteration`` callback hands over every iteration's draft tree and verdict. Per drafted node
the row holds its depth, its parent (-1 for the root's children), its confidence (the drafter's
probability of the node's token given its parent: ``DraftTree.confidence``, else ``q[parent, token]``),
its rank bucket (-1: the tree carries none), whether it is on the accepted path; per iteration the
context length, the accepted count and the draft and verify seconds. Traces are recorded on each
domain's *calibration* prompts, and its *evaluation* prompts are held out for measuring policies
(``real_engine.prompts``: by the rows' split, else by the file's halves).

A *probed* trace (``record(probe=True)``, greedy decoding only) has a row at every text position: the
drafter drafts at each step while the target decodes plainly (``Probe``), and each draft's accepted
path is the greedy verifier's, read off the generated text afterwards (``greedy_path``). Greedy text
does not depend on how much is speculated, so a simulated length policy can walk such a trace as the
engine walks the text (``simulator.replay``), where the rows of a decode that verified its drafts only
hold the positions that decode started iterations at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from core.errors import InputError
from core.paths import PROMPTS
from real_engine.decode import GREEDY, Iteration, Stats, generate
from real_engine.drafters.base import Drafter
from real_engine.model import Output, Transformer
from real_engine.prompts import PARTS, Prompt, encode_row, interleave, read_prompt_set, select_part
from real_engine.tree import DraftTree
from real_engine.warp import Sampling


def prompt_domains(folder: Path = PROMPTS) -> tuple[str, ...]:
    """Domains that have a prompt file in ``folder``."""
    return tuple(sorted(p.stem for p in folder.glob("*.jsonl")))


def load_prompts(domains: Sequence[str], count: int, encode: Callable[[str], list[int]],
                 part: str = "calibration", max_tokens: int | None = None, folder: Path = PROMPTS,
                 chat_encode: Callable[[str], list[int]] | None = None) -> list[Prompt]:
    """The first ``count`` prompts of each domain's ``part``, domains interleaved; ``max_tokens`` keeps
    only each prompt's last tokens (to fit a short model context).

    A file whose rows carry a ``"split"`` (the real prompt sets) gives the rows of that split; one whose
    rows carry none (the toy family's) gives its first half as calibration, its second as evaluation.
    Chat rows (``"chat": true``) are tokenized by ``chat_encode`` (the model's chat template) when given.
    A row's reference answer (the real prompt sets') is counted in tokens by ``encode``, uncut.
    """
    if part not in PARTS:
        raise InputError(f"unknown prompt part {part!r}: use one of {', '.join(PARTS)}")
    if not domains:
        raise InputError(f"no domains given: name at least one of {', '.join(prompt_domains(folder))}")
    if count < 1:
        raise InputError(f"{count} prompts per domain is too few: give at least 1")
    per_domain = []
    for domain in domains:
        path = folder / f"{domain}.jsonl"
        if not path.is_file():
            raise InputError(f"no prompt file for domain {domain!r} ({path}): use one of "
                             f"{', '.join(prompt_domains(folder))}")
        chosen = select_part(read_prompt_set(path, domain), part, path)
        prompts = [Prompt(row.name, domain,
                          tuple(encode_row(row, encode, chat_encode)[-max_tokens if max_tokens else 0:]),
                          None if row.reference is None else len(encode(row.reference)))
                   for row in chosen[:count]]
        per_domain.append([p for p in prompts if p.tokens])
    return interleave(per_domain)


def node_columns(iteration: Iteration) -> dict[str, np.ndarray]:
    """The node columns of one iteration's tree (root excluded, in the drafter's node order)."""
    tree = iteration.tree
    parents = tree.parents[1:].cpu().numpy().astype(np.int64)
    tokens = tree.tokens[1:].cpu()
    size = tree.size - 1
    if tree.confidence is not None:
        confidences = tree.confidence[1:].double().cpu().numpy()
    elif tree.q is None or size == 0:
        confidences = np.ones(size)
    else:
        rows = tree.parents[1:].to(tree.q.device)
        confidences = tree.q[rows, tokens.to(tree.q.device)].double().cpu().numpy()
    on_path = np.zeros(size, dtype=bool)
    on_path[np.asarray(iteration.path, dtype=np.int64) - 1] = True
    buckets = tree.rank_buckets
    return {"depths": tree.depths[1:].cpu().numpy().astype(np.int64), "parents": parents - 1,
            "confidences": np.clip(confidences, 0.0, 1.0),
            "rank_buckets": (np.full(size, -1, dtype=np.int64) if buckets is None
                             else buckets[1:].cpu().numpy().astype(np.int64)),
            "on_path": on_path}


def iteration_row(iteration: Iteration, query_id: int, domain: str, drafter: str,
                  index: int) -> dict[str, Any]:
    """One trace row (the columns of ``simulator.traces.SCHEMA``)."""
    return {"query_id": query_id, "domain": domain, "drafter": drafter, "iteration": index,
            "context_length": iteration.context_length, **node_columns(iteration),
            "accepted": len(iteration.path), "draft_seconds": iteration.draft_seconds,
            "verify_seconds": iteration.verify_seconds}


@dataclass(frozen=True)
class Recording:
    """A trace and, per query, the decode loop's stats (for throughput and consistency checks)."""

    traces: pd.DataFrame
    stats: tuple[Stats, ...]
    prompts: tuple[Prompt, ...]


class Probe:
    """A drafter that drafts at every position and verifies nothing: each step it keeps ``drafter``'s
    proposal (``trees``) and hands the decode loop the root alone, so the target decodes plainly; it then
    tells ``drafter`` that none of its draft was accepted, as a rejection at the first node would."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.trees: list[DraftTree] = []

    @property
    def model_seconds(self) -> float:
        """The wrapped drafter's model time."""
        return self.drafter.model_seconds

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Start the wrapped drafter."""
        self.drafter.begin(prompt, target, sampling, generator, max_length)

    def propose(self, max_depth: int) -> DraftTree:
        """Keep the wrapped drafter's proposal; propose nothing."""
        tree = self.drafter.propose(max_depth)
        self.trees.append(tree)
        return DraftTree(tree.tokens[:1], tree.parents[:1])

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """The plain step's token follows a draft none of which was accepted."""
        self.drafter.accept((), token, target)


def greedy_path(tree: DraftTree, text: Sequence[int]) -> tuple[int, ...]:
    """The nodes the greedy verifier accepts of ``tree`` when the target's greedy text after its root is
    ``text``: from the root, the first child holding the next token of the text, as deep as they go."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path: list[int] = []
    node = 0
    for token in text:
        node = next((i for i in range(node + 1, len(tokens)) if parents[i] == node and tokens[i] == token), 0)
        if not node:
            break
        path.append(node)
    return tuple(path)


@torch.inference_mode()
def record(target: Transformer, prompts: Sequence[Prompt], new_drafter: Callable[[], Drafter], drafter: str,
           *, verifier: str = "greedy", sampling: Sampling = GREEDY, max_new_tokens: int = 128,
           eos_id: int | None = None, seed: int = 0, probe: bool = False,
           progress: Callable[[int, Stats], None] | None = None) -> Recording:
    """Decode every prompt with a fresh drafter from ``new_drafter`` and record each iteration; with
    ``probe``, decode plainly and record a draft at every position (``Probe``; greedy decoding only).

    Query ``i`` uses seed ``seed + i``; ``progress`` is called after each query.
    """
    if not prompts:
        raise InputError("no prompts to trace: give at least one domain with prompts")
    if probe and (verifier != "greedy" or sampling != GREEDY):
        raise InputError("a probed trace reads each draft's accepted path off the greedy text: record it "
                         "with the greedy verifier at temperature 0, or without probing")
    rows: list[dict[str, Any]] = []
    stats = []
    for query, prompt in enumerate(prompts):
        made = new_drafter()
        probed = Probe(made) if probe else None
        steps: list[Iteration] = []
        out = generate(target, list(prompt.tokens), drafter=made if probed is None else probed,
                       verifier=verifier, sampling=sampling, max_new_tokens=max_new_tokens, eos_id=eos_id,
                       seed=seed + query, on_iteration=steps.append)
        if probed is not None:
            steps = [replace(it, tree=tree, path=greedy_path(tree, out.tokens[i:]))
                     for i, (it, tree) in enumerate(zip(steps, probed.trees, strict=True))]
        rows.extend(iteration_row(it, query, prompt.domain, drafter, i) for i, it in enumerate(steps))
        stats.append(out.stats)
        if progress is not None:
            progress(query, out.stats)
    return Recording(pd.DataFrame(rows), tuple(stats), tuple(prompts))
