"""Continuous batching: many requests decode together, one target forward per iteration.

Each running request keeps its own KV cache, drafter, verifier and random generator, exactly as
``real_engine.decode.generate`` runs one alone. An iteration packs every request's root and draft tree
into one sequence (batch 1, ragged) that the target runs in one forward; attention is block-diagonal
(``RaggedCache``): a request's tokens see its own cache and its own tree, nothing of the others'. Each
request then verifies its own rows, keeps its accepted path in its cache and tells its drafter, so every
verifier stays lossless per request. Requests join between iterations after a prefill of their own and
leave when done; a request the engine cannot serve (empty prompt, too long for the context, unknown
verifier, a drafter another running request already uses) ends with an error and never disturbs the
others. Drafters that can share forwards do (``batch_key``, ``propose_together``): the draft model's
chains draft in lockstep, one packed forward per position over every chain still drafting. With
``steer`` (a serving policy, ``speculate.ServeSteering``) a chain drafts while the policy would verify
more of it, then every request's draft is trimmed before the forward to the length the policy gives it,
its most confident nodes (``speculate.ranked_nodes``), as a length policy trims one query's: lossless,
since both read only the draft's laws.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from core.errors import InputError
from real_engine.decode import GREEDY, MAX_TREE_NODES, check_request, cut_at_eos, prefill, settle
from real_engine.drafters.base import Drafter, clock, prompt_rows
from real_engine.kv_cache import KVCache
from real_engine.model import Output, Transformer
from real_engine.ragged import packed_forward
from real_engine.speculate import ranked_nodes, subtree
from real_engine.tree import DraftTree
from real_engine.verify import TorchSampler
from real_engine.warp import Sampling


@dataclass
class Request:
    """One request: its prompt, how many tokens to generate, its drafter (None: vanilla) and verifier."""

    prompt: Sequence[int]
    max_new_tokens: int = 64
    drafter: Drafter | None = None
    verifier: str = "greedy"
    sampling: Sampling = GREEDY
    eos_id: int | None = None
    seed: int = 0


@dataclass
class Result:
    """What became of a request: its tokens, per-iteration acceptance and tree sizes, when it was
    submitted, got its first token and finished (``clock`` seconds), or the error that rejected it."""

    tokens: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    submitted: float = 0.0
    first_token: float | None = None
    finished: float | None = None
    error: str | None = None

    @property
    def tau(self) -> float:
        """New tokens per target forward it took part in (bonus included)."""
        return len(self.tokens) / max(len(self.accepted), 1)


@dataclass
class _Running:
    """A request being decoded: its state between iterations."""

    request: Request
    result: Result
    cache: KVCache
    sampler: TorchSampler
    root: int
    tree: DraftTree | None = None
    original: list[int] | None = None  # the drafter's numbering of a trimmed tree's nodes


class Slot(NamedTuple):
    """What a serving policy sees of one running request at an iteration."""

    paths: list[float]  # its drafted nodes' path confidences, most confident first
    context: int  # tokens in its cache
    remaining: int  # tokens it has still to generate


class Steer(Protocol):
    """A serving policy's hold on the engine (``speculate.ServeSteering``)."""

    def plan(self, slots: Sequence[Slot], waiting: int) -> None:
        """Before drafting: the running requests (no drafts yet) and how many wait."""

    def keep(self, index: int, confidences: Sequence[float]) -> bool:
        """Whether request ``index``'s chain drafts one more position after ``confidences``."""

    def __call__(self, slots: Sequence[Slot], waiting: int) -> Sequence[int]:
        """After drafting: how many of each draft's nodes to verify."""


class BatchEngine:
    """Serves requests with continuous batching, at most ``max_batch`` decoding at once (see the module doc).

    ``submit`` queues a request and returns its id; ``step`` admits queued requests into free slots
    (each prefilled alone), then runs one iteration for every running request; ``results`` holds each
    request's ``Result`` (finished or not). With ``batch_drafting`` False every drafter proposes alone.
    ``steering`` adds up the seconds spent steering (the policy's plan and questions, ranking and trimming
    the drafts), which the serving simulator charges as measured here."""

    def __init__(self, model: Transformer, max_batch: int = 8, steer: Steer | None = None,
                 batch_drafting: bool = True) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InputError(f"max_batch = {max_batch!r} is invalid: give a positive integer")
        self.model, self.max_batch, self.steer = model, max_batch, steer
        self.batch_drafting = batch_drafting
        self.device = model.lm_head.weight.device
        self.results: dict[int, Result] = {}
        self.waiting: list[tuple[int, Request]] = []
        self.running: dict[int, _Running] = {}
        self.steering = 0.0

    @property
    def busy(self) -> bool:
        """Whether any request is queued or decoding."""
        return bool(self.waiting or self.running)

    def submit(self, request: Request) -> int:
        """Queue ``request``; its id. A request that cannot be served is finished at once with its error."""
        rid = len(self.results)
        self.results[rid] = Result(submitted=clock(self.device))
        try:
            prompt = torch.as_tensor(list(request.prompt), dtype=torch.long)
            check_request(self.model, prompt, request.drafter, request.verifier, request.sampling,
                          request.max_new_tokens)
        except (InputError, TypeError, ValueError) as exc:
            self._fail(rid, str(exc))
            return rid
        self.waiting.append((rid, request))
        return rid

    def step(self) -> list[int]:
        """Admit what fits, run one iteration of every running request; the ids that finished in it."""
        finished = self._admit()
        if self.running:
            finished += self._iterate()
        return finished

    def run(self) -> dict[int, Result]:
        """Step until every submitted request has finished; the results by id."""
        while self.busy:
            self.step()
        return self.results

    def _fail(self, rid: int, error: str) -> None:
        result = self.results[rid]
        result.error, result.finished = error, clock(self.device)

    def _admit(self) -> list[int]:
        finished = []
        while self.waiting and len(self.running) < self.max_batch:
            rid, request = self.waiting.pop(0)
            drafter = request.drafter
            if drafter is not None and any(r.request.drafter is drafter for r in self.running.values()):
                self._fail(rid, "this request's drafter is serving another running request: give each "
                                "request its own drafter")
                finished.append(rid)
                continue
            prompt = torch.as_tensor(list(request.prompt), dtype=torch.long, device=self.device)
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
            max_length = prompt.numel() + request.max_new_tokens
            cache = self.model.new_cache(max_length + (MAX_TREE_NODES if drafter is not None else 0))
            with torch.inference_mode():
                target = prefill(self.model, cache, prompt[:-1], prompt_rows(drafter))
                if drafter is not None:
                    drafter.begin(prompt, target, request.sampling, generator, max_length)
            self.running[rid] = _Running(request, self.results[rid], cache, TorchSampler(generator),
                                         int(prompt[-1]))
        return finished

    @torch.inference_mode()
    def _iterate(self) -> list[int]:
        finished = []
        if self.steer is not None:
            start = time.perf_counter()
            self.steer.plan([Slot([], s.cache.length, s.request.max_new_tokens - len(s.result.tokens))
                             for s in self.running.values()], len(self.waiting))
            self.steering += time.perf_counter() - start
        groups: dict[object, list[tuple[int, _Running, int]]] = {}
        for index, (rid, state) in enumerate(list(self.running.items())):
            remaining = state.request.max_new_tokens - len(state.result.tokens)
            drafter, depth = state.request.drafter, remaining - 1
            state.tree = None
            if drafter is None:
                continue
            if self.steer is not None:  # the chain drafts while the policy would verify more; any other
                if hasattr(drafter, "keep_drafting"):  # drafter drafts whole
                    drafter.keep_drafting = functools.partial(self._keep, index)
                depth = depth if self._keep(index, []) else 0
            key = getattr(drafter, "batch_key", None) if self.batch_drafting else None
            groups.setdefault(rid if key is None else (type(drafter), key), []).append((rid, state, depth))
        for members in groups.values():
            drafters = [state.request.drafter for _, state, _ in members]
            depths = [depth for _, _, depth in members]
            trees = (type(drafters[0]).propose_together(drafters, depths) if len(members) > 1
                     else [drafters[0].propose(depths[0])])
            for (rid, state, _), tree in zip(members, trees, strict=True):
                state.tree = tree
                if tree.size > MAX_TREE_NODES:
                    del self.running[rid]
                    self._fail(rid, f"a draft tree of {tree.size} nodes exceeds {MAX_TREE_NODES}: "
                                    "lower the tree budget, width or depth")
                    finished.append(rid)
        states = list(self.running.items())
        if not states:
            return finished
        if self.steer is not None:
            start = time.perf_counter()
            self._trim([s for _, s in states])
            self.steering += time.perf_counter() - start
        trees = [s.tree if s.tree is not None and s.tree.size > 1 else None for _, s in states]
        tokens = [t.tokens.to(self.device) if t is not None else torch.tensor([s.root], device=self.device)
                  for t, (_, s) in zip(trees, states, strict=True)]
        positions = [t.positions(s.cache.length).to(self.device) if t is not None
                     else torch.tensor([s.cache.length], device=self.device)
                     for t, (_, s) in zip(trees, states, strict=True)]
        local = [t.mask().to(self.device) if t is not None else torch.ones(1, 1, dtype=torch.bool,
                                                                             device=self.device)
                 for t in trees]
        out, counts = packed_forward(self.model, [s.cache for _, s in states], tokens, positions, local)
        now = clock(self.device)
        start = 0
        for (rid, state), tree, count in zip(states, trees, counts, strict=True):
            rows = Output(*(x[:, start:start + count] for x in out))
            start += count
            if self._advance(state, tree, rows, now):
                del self.running[rid]
                state.result.finished = now
                finished.append(rid)
        return finished

    def _keep(self, index: int, confidences: Sequence[float]) -> bool:
        """``steer.keep``, timed into ``steering``."""
        start = time.perf_counter()
        keep = self.steer.keep(index, confidences)
        self.steering += time.perf_counter() - start
        return keep

    def _trim(self, states: Sequence[_Running]) -> None:
        """Trim every request's draft to the length ``steer`` gives it."""
        ranked = [ranked_nodes(s.tree, s.request.sampling.greedy) if s.tree is not None and s.tree.size > 1
                  else ([], []) for s in states]
        slots = [Slot(list(products), s.cache.length, s.request.max_new_tokens - len(s.result.tokens))
                 for (_, products), s in zip(ranked, states, strict=True)]
        lengths = self.steer(slots, len(self.waiting))
        for (order, _), state, n in zip(ranked, states, lengths, strict=True):
            state.original = None
            keep = max(int(n), 0)
            if state.tree is not None and keep < state.tree.size - 1:  # else the draft is kept whole
                state.tree, state.original = subtree(state.tree, order[:keep])

    def _advance(self, state: _Running, tree: DraftTree | None, out: Output, now: float) -> bool:
        """Verify one request's rows, keep its path, tell its drafter; whether the request is done."""
        request, result = state.request, state.result
        path, token = settle(state.cache, out.logits[0], tree, request.verifier, request.sampling,
                             state.sampler)
        drafted = tree.tokens.tolist() if tree is not None else []
        new, stop = cut_at_eos([*(drafted[i] for i in path), token], request.eos_id,
                               request.max_new_tokens - len(result.tokens))
        result.accepted.append(len(path))
        result.tree_sizes.append(tree.size if tree is not None else 1)
        result.tokens.extend(new)
        if result.first_token is None:
            result.first_token = now
        stop = stop or len(result.tokens) >= request.max_new_tokens
        if request.drafter is not None and not stop:
            index = torch.tensor([0, *path], device=self.device)
            own = path if state.original is None else [state.original[i] for i in path]
            request.drafter.accept(own, token, Output(*(x[:, index] for x in out)))
        state.root = token
        return stop
