"""Serving policies in the live batched engine: every request's draft trimmed to the length the policy
gives it, from the observation the simulator builds, and the output still that of vanilla decoding."""

from __future__ import annotations

import numpy as np
import pytest

from core.cost_profile import resolve_profile
from core.errors import InputError
from core.paths import CPU_PROFILE
from policies import make_policy
from policies.features import serve_slots
from real_engine.batch import BatchEngine, Request
from real_engine.decode import generate, make_drafter
from real_engine.model import Transformer
from real_engine.speculate import ServeSteering


class Recorder:
    """A serving policy stand-in: fixed lengths, keeping every observation it saw."""

    kind = "batch-table"

    def __init__(self, lengths: list[int]) -> None:
        self.lengths, self.seen = lengths, []

    def act(self, obs: np.ndarray) -> np.ndarray:
        self.seen.append(obs)
        return np.array(self.lengths)


@pytest.mark.parametrize("kind", ["batch-table", "libraspec-batch", "threshold-batch", "goodput"])
def test_steered_batches_decode_as_vanilla(target: Transformer, draft: Transformer, kind: str) -> None:
    prompts = [[5, 9, 2, 5, 9, 2], [7, 7, 3], [11, 4, 11, 4, 11], [3, 1, 4, 1, 5]]
    steer = ServeSteering(make_policy(kind), resolve_profile(CPU_PROFILE), "draft-model", max_batch=3)
    engine = BatchEngine(target, max_batch=3, steer=steer)
    for prompt in prompts:
        engine.submit(Request(prompt, 12, make_drafter("draft-model", target, draft, depth=4, width=2,
                                                       budget=6)))
    results = engine.run()
    for rid, prompt in enumerate(prompts):
        assert results[rid].tokens == list(generate(target, prompt, max_new_tokens=12).tokens)
    assert steer.decisions and all(1 <= running <= 3 for running, _ in steer.decisions)


def test_each_request_verifies_at_most_its_length(target: Transformer, draft: Transformer) -> None:
    """Lengths 2 and 0: the first request's trees keep at most 2 nodes besides the root, the second
    decodes plainly; the observation shows both requests, their contexts and the costs."""
    policy = Recorder([2, 0, 0])
    steer = ServeSteering(make_policy("batch-table"), resolve_profile(CPU_PROFILE), "draft-model", 3)
    steer.policy = policy
    engine = BatchEngine(target, max_batch=3, steer=steer)
    for prompt, new in (([5, 9, 2, 5], 12), ([7, 7, 3], 4)):  # the second leaves first: slots stay put
        engine.submit(Request(prompt, new, make_drafter("draft-model", target, draft, depth=4, width=2,
                                                        budget=6)))
    results = engine.run()
    assert max(results[0].tree_sizes) <= 3 and set(results[1].tree_sizes) == {1}
    first = serve_slots(policy.seen[0])
    assert policy.seen[0][0] == 2 and first[:2, 0].tolist() == [1, 1] and first[2, 0] == 0
    assert first[0, 1] == 3 and first[1, 1] == 2  # each request's cache: its prompt but the root
    assert policy.seen[0][3] > 0  # the batched verify's base cost


def test_only_a_serving_policy_steers(target: Transformer) -> None:
    with pytest.raises(InputError, match="not a serving policy"):
        ServeSteering(make_policy("libraspec"), resolve_profile(CPU_PROFILE), "draft-model", 4)
