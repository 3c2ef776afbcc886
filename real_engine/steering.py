"""What a length policy's own work costs in the engine: ``LengthControlled`` (features, the policy's
choices while a chain is drafted, ranking, trimming, its feedback) timed around a drafter that costs
nothing, for the profile's ``samples.steering`` series (``core.cost_profile``), which the simulator
charges every iteration a policy steers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from core.cost_profile import profile_from_json
from policies import make_policy
from real_engine.decode import GREEDY
from real_engine.model import Output, Transformer
from real_engine.speculate import LengthControlled
from real_engine.timing import Bench
from real_engine.tree import DraftTree


class ScriptedDrafter:
    """A drafter that costs nothing: it proposes a prebuilt greedy chain of up to ``depth`` tokens, asking
    ``keep_drafting`` before each further token as the draft model's chain does, so that timing the
    machinery around it (``LengthControlled``, an iteration of the batched engine) times that alone."""

    model_seconds = 0.0

    def __init__(self, depth: int, vocab: int, device: torch.device) -> None:
        self.keep_drafting: Callable[[list[float]], bool] | None = None
        self.depth = depth
        q = torch.zeros(depth + 1, vocab, device=device)
        q[torch.arange(1, depth + 1), torch.arange(1, depth + 1)] = 1.0
        self.trees = [DraftTree.chain(0, torch.arange(1, k + 1, device=device), q[:k + 1], "iid",
                                      torch.full((k + 1,), 0.9, device=device)) for k in range(depth + 1)]

    def begin(self, *_: Any) -> None:
        """Nothing to start."""

    def propose(self, max_depth: int) -> DraftTree:
        """The chain up to where ``keep_drafting`` stops it (the draft model's rule, without forwards)."""
        laws: list[float] = []
        depth = min(self.depth, max_depth)
        for d in range(1, depth + 1):
            if d == depth:
                return self.trees[d]
            laws.append(0.9)
            if self.keep_drafting is not None and not self.keep_drafting(laws):
                return self.trees[d]
        return self.trees[0]

    def accept(self, *_: Any) -> None:
        """Nothing to follow."""


def steering_samples(target: Transformer, draft_tokens: Sequence[int], context: int, bench: Bench,
                     seed: int = 0) -> list[dict]:
    """Rows of ``samples.steering``: one iteration of ``LengthControlled`` steering a drafter that costs
    nothing (``ScriptedDrafter``) with a fixed length of ``drafted`` positions (0 to the longest of
    ``draft_tokens``) at ``context``, propose and accept, the first half of the chain accepted; timed when
    ``bench`` runs."""
    device = target.lm_head.weight.device
    flat = [{"context": c, "seconds": [1e-3]} for c in (0, 4096)]
    profile = profile_from_json({
        "schema_version": 1, "device": "steering", "dtype": "any",
        "models": {"target": "any", "drafters": {"draft-model": "any"}}, "derived_from": None,
        "samples": {"verify": [{"nodes": n, **row} for n in (1, 64) for row in flat], "vanilla": flat,
                    "draft": {"draft-model": [{"tokens": 1, "seconds": [1e-3]}]},
                    "update": {"head": [1.0], "full": [1.0]}}})
    out = Output(*(torch.zeros(1, 1, 1, device=device) for _ in range(3)))
    gen = torch.Generator(device=device).manual_seed(seed)
    prompt = torch.ones(context, dtype=torch.long, device=device)
    rows = []
    for drafted in range(max(draft_tokens) + 1):
        steered = LengthControlled(ScriptedDrafter(2 * max(draft_tokens), target.args.vocab_size, device),
                                   make_policy("fixed", {"length": drafted}), profile, "draft-model")
        steered.begin(prompt, out, GREEDY, gen, 2 * context)

        def step(steered: LengthControlled = steered, drafted: int = drafted) -> None:
            steered.propose(16)
            steered.accept(tuple(range(1, drafted // 2 + 1)), 1, out)
            steered.context = context

        rows.append({"drafted": drafted, "seconds": bench.add(step)})
    return rows
