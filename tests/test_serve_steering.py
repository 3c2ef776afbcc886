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
from policies.serving import keeps_drafting
from real_engine.batch import BatchEngine, Request
from real_engine.decode import generate, make_drafter
from real_engine.drafters.draft_model import DraftModelDrafter
from real_engine.model import Transformer
from real_engine.speculate import ServeSteering
from real_engine.tree import DraftTree
from simulator.rollout import Outcome, run_serve, serve_drafts
from simulator.spec_serve import Arrivals, SpecServeEnv


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


@pytest.mark.parametrize("together", [False, True], ids=["alone", "lockstep"])
def test_chains_draft_while_the_policy_would_verify_more(target: Transformer, draft: Transformer,
                                                         together: bool, monkeypatch) -> None:
    """The engine's rule is ``keeps_drafting`` on the planned batch (the simulator's, ``serve_drafts``): a
    chain drafts position k + 1 exactly when the policy, shown its first k confidences and a certain next
    one, would verify more than k; it stops at the first no, or where the request ends. Alike whether the
    chains draft alone or in lockstep."""
    steer = ServeSteering(make_policy("threshold-batch", {"threshold": 0.02, "max_length": 6}),
                          resolve_profile(CPU_PROFILE), "draft-model", max_batch=2)
    engine = BatchEngine(target, max_batch=2, steer=steer, batch_drafting=together)
    seen: list[tuple[np.ndarray, int, list[float], int]] = []
    owners: dict[int, int] = {}  # drafter -> its request
    lockstep: list[int] = []  # chains drafting at each lockstep proposal

    def record(drafters: list[DraftModelDrafter], depths: list[int], trees: list[DraftTree]) -> None:
        for drafter, depth, tree in zip(drafters, depths, trees, strict=True):
            laws = tree.confidence[1:].tolist() if tree.size > 1 else []
            seen.append((steer.obs.copy(), list(engine.running).index(owners[id(drafter)]), laws, depth))

    def propose(self: DraftModelDrafter, depth: int, own=DraftModelDrafter.propose) -> DraftTree:
        tree = own(self, depth)
        record([self], [depth], [tree])
        return tree

    def propose_together(drafters: list[DraftModelDrafter], depths: list[int],
                         own=DraftModelDrafter.propose_together, plain=DraftModelDrafter.propose
                         ) -> list[DraftTree]:
        with monkeypatch.context() as inner:  # a depth-0 chain proposes alone inside: record it once
            inner.setattr(DraftModelDrafter, "propose", plain)
            trees = own(drafters, depths)
        record(drafters, depths, trees)
        lockstep.append(sum(d > 0 for d in depths))
        return trees

    monkeypatch.setattr(DraftModelDrafter, "propose", propose)
    monkeypatch.setattr(DraftModelDrafter, "propose_together", staticmethod(propose_together))
    for prompt in ([5, 9, 2, 5, 9, 2], [7, 7, 3]):
        drafter = make_drafter("draft-model", target, draft, depth=16)
        owners[id(drafter)] = engine.submit(Request(prompt, 10, drafter))
    results = engine.run()
    assert all(not r.error for r in results.values())
    assert any(len(laws) >= 2 for _, _, laws, _ in seen) and any(depth == 0 for *_, depth in seen)
    for obs, index, laws, depth in seen:
        assert all(keeps_drafting(steer.policy, obs, index, laws[:k]) for k in range(len(laws)))
        assert len(laws) == depth or not keeps_drafting(steer.policy, obs, index, laws)
    assert (max(lockstep) == 2) if together else not lockstep


def test_serve_drafts_follows_the_rule_per_request() -> None:
    """A fixed table drafts its length for every running request, up to what each can draft; a length-0
    table drafts nothing, asking once per request."""
    at_once = Arrivals(np.zeros(4), np.full(4, 20), np.full(4, 8), np.zeros(4, dtype=int))
    env = SpecServeEnv(max_batch=3, arrivals=at_once)
    obs, _ = env.reset(seed=0)
    assert serve_slots(obs)[:, 0].tolist() == [1, 1, 1]
    available = np.array([16, 2, 0])
    drafted, calls = serve_drafts(make_policy("batch-table", {"l3": 3}), obs, available)
    assert drafted.tolist() == [3, 2, 0] and calls == 4 + 2
    drafted, calls = serve_drafts(make_policy("batch-table", {"l3": 0}), obs, available)
    assert drafted.tolist() == [0, 0, 0] and calls == 2


def test_run_serve_charges_steering_per_iteration_and_per_question() -> None:
    """With every request admitted at once the episode does not depend on the clock: each steered
    iteration adds ``iteration_seconds``, each question ``decision_seconds``, and nothing else moves."""
    at_once = Arrivals(np.zeros(3), np.full(3, 20), np.full(3, 12), np.zeros(3, dtype=int))
    policy = make_policy("batch-table", {"l1": 3, "l2": 3, "l3": 3})

    def run(iteration: float, question: float) -> Outcome:
        return run_serve(policy, SpecServeEnv(max_batch=3, arrivals=at_once), 0, iteration, question)

    free, steps, questions = run(0.0, 0.0), run(1.0, 0.0), run(0.0, 1.0)
    assert steps.tokens == questions.tokens == free.tokens and steps.iterations == free.iterations
    charged, asked = round(steps.seconds - free.seconds, 6), round(questions.seconds - free.seconds, 6)
    assert 1 <= charged == int(charged) < asked == int(asked)  # at least one question per iteration
    assert run(2.0, 0.5).seconds - free.seconds == pytest.approx(2 * charged + 0.5 * asked)
