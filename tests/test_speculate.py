"""Length policies in the live engine: confidence ranking, subtrees, losslessness of pruning, and
decisions that follow the policy file."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from test_fidelity import flat_profile  # made-up costs: no policy decision here rests on a measured profile

from core.errors import InputError
from policies import make_policy
from policies.features import tree_confidences
from real_engine import exact
from real_engine.decode import generate, make_drafter
from real_engine.model import ModelArgs, Transformer
from real_engine.speculate import LengthControlled, node_confidences, ranked_nodes, subtree
from real_engine.tree import DraftTree
from simulator.instances import random_instance


def _tree() -> DraftTree:
    """root -> a (0.9) -> c (0.5); root -> b (0.3) -> d (1.0); confidences through q."""
    q = torch.zeros(5, 4)
    q[0, 1], q[0, 2], q[1, 3], q[3, 0] = 0.9, 0.3, 0.5, 1.0
    return DraftTree(torch.tensor([0, 1, 3, 2, 0]), torch.tensor([-1, 0, 1, 0, 3]), q, "topk")


def test_ranking_is_by_path_product_and_ancestor_closed() -> None:
    tree = _tree()
    assert node_confidences(tree).tolist() == pytest.approx([1.0, 0.9, 0.5, 0.3, 1.0])
    order, products = ranked_nodes(tree)
    assert order == [1, 2, 3, 4]  # 0.9, 0.45, 0.3, 0.3 (the tie goes to the shallower node)
    assert products.tolist() == pytest.approx([0.9, 0.45, 0.3, 0.3])
    pruned, original = subtree(tree, order[:3])
    assert original == [0, 1, 2, 3]
    assert pruned.parents.tolist() == [-1, 0, 1, 0] and pruned.tokens.tolist() == [0, 1, 3, 2]
    assert torch.equal(pruned.q, tree.q[:4])
    with pytest.raises(InputError, match="ancestor-closed"):
        subtree(tree, [4])


def _pruned_law(
    verifier: str, inst, threshold: float, drafts: int = 1, rule: str = "iid"
) -> tuple[dict, set[int]]:
    """Exact output law when a confidence-threshold policy trims each draft (sampling, T > 0), and the
    set of lengths it chose."""
    policy = make_policy("threshold", {"threshold": threshold})
    law: dict = defaultdict(float)
    chosen = set()
    rows = exact._Rows(inst)
    for prob, paths in exact.draft_law(inst, drafts, rule):
        tree, p = exact.draft_tree(inst, paths, rule, rows)
        order, products = ranked_nodes(tree, greedy=False)
        n = policy.choose(tree_confidences(products), np.ones(len(order) + 1))
        chosen.add(n)
        pruned, keep = subtree(tree, order[:n])
        for out, w in exact.tree_output_law(verifier, pruned, p[keep]).items():
            law[out] += prob * w
    return dict(law), chosen


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trimming_sampled_chains_is_lossless(verifier: str, seed: int) -> None:
    inst = random_instance(3, 3, np.random.default_rng(seed), "mix")
    law, chosen = _pruned_law(verifier, inst, 0.25)
    assert exact.law_error(law, inst) < 1e-9
    assert len(chosen) > 1  # the threshold trimmed drafts to different lengths


@pytest.mark.parametrize("verifier", ["rrs", "token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trimming_topk_candidates_is_lossless(verifier: str, seed: int) -> None:
    inst = random_instance(3, 1, np.random.default_rng(seed), "mix")
    top = np.sort(inst.q(()))[::-1]
    law, chosen = _pruned_law(verifier, inst, float(top[:2].mean()), drafts=2, rule="topk")
    assert exact.law_error(law, inst) < 1e-9
    assert chosen == {1}  # one of the two candidates trimmed


def test_trimming_on_the_sampled_tokens_own_probability_is_lossy() -> None:
    """Why sampled children are ranked by their parent's law: trimming on q(x) itself biases the draft."""
    inst = random_instance(3, 3, np.random.default_rng(0), "mix")
    policy = make_policy("threshold", {"threshold": 0.3})
    law: dict = defaultdict(float)
    rows = exact._Rows(inst)
    for prob, paths in exact.draft_law(inst, 1, "iid"):
        tree, p = exact.draft_tree(inst, paths, "iid", rows)
        order, products = ranked_nodes(tree, greedy=True)  # q(x) of the sampled token
        pruned, keep = subtree(tree, order[: policy.choose(tree_confidences(products), np.ones(tree.size))])
        for out, w in exact.tree_output_law("token", pruned, p[keep]).items():
            law[out] += prob * w
    assert exact.law_error(dict(law), inst) > 1e-3


def test_the_law_check_catches_target_dependent_pruning() -> None:
    """Trimming where the target disagrees (peeking at p) is lossy: the check above can fail."""
    inst = random_instance(3, 3, np.random.default_rng(0), "mix")
    law: dict = defaultdict(float)
    rows = exact._Rows(inst)
    for prob, paths in exact.draft_law(inst, 1, "iid"):
        tree, p = exact.draft_tree(inst, paths, "iid", rows)
        tokens = tree.tokens.tolist()
        n = next((i for i in range(1, tree.size) if p[i - 1, tokens[i]] < 0.3), tree.size) - 1
        pruned, keep = subtree(tree, list(range(1, n + 1)))
        for out, w in exact.tree_output_law("token", pruned, p[keep]).items():
            law[out] += prob * w
    assert exact.law_error(dict(law), inst) > 1e-3


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
    )
    return Transformer(args).eval()


def test_policies_change_decisions_and_greedy_output_stays(tiny: Transformer) -> None:
    profile = flat_profile()
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1))
    vanilla = generate(tiny, prompt, max_new_tokens=40).tokens
    chosen = {}
    for kind, params in [
        ("fixed", {"length": 1}),
        ("fixed", {"length": 3}),
        ("libraspec", {}),
        ("threshold", {"threshold": 0.9}),
    ]:
        drafter = LengthControlled(
            make_drafter("draft-model", tiny, tiny, depth=6, width=3, budget=12),
            make_policy(kind, params),
            profile,
            "draft-model",
        )
        assert generate(tiny, prompt, drafter=drafter, max_new_tokens=40).tokens == vanilla
        chosen[kind, tuple(params.values())] = [n for _, n in drafter.decisions]
    assert set(chosen["fixed", (1,)]) == {1} and set(chosen["fixed", (3,)]) == {3}
    assert chosen["libraspec", ()] != chosen["fixed", (3,)]


def test_a_chain_stops_drafting_where_the_policy_stops(tiny: Transformer) -> None:
    profile = flat_profile()
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(2))
    vanilla = generate(tiny, prompt, max_new_tokens=30).tokens
    for kind, params, expect in [("fixed", {"length": 2}, {2}), ("threshold", {"threshold": 1.0}, {1})]:
        drafter = LengthControlled(
            make_drafter("draft-model", tiny, tiny, depth=6),
            make_policy(kind, params),
            profile,
            "draft-model",
        )
        before = drafter.model_seconds
        assert generate(tiny, prompt, drafter=drafter, max_new_tokens=30).tokens == vanilla
        assert {drafted for drafted, _ in drafter.decisions[:-1]} == expect  # drafted no further than kept
        assert drafter.model_seconds > before


def test_length_zero_skips_drafting(tiny: Transformer) -> None:
    profile = flat_profile()
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(3))
    for shape in ({"depth": 4}, {"depth": 3, "width": 2, "budget": 6}):
        inner = make_drafter("draft-model", tiny, tiny, **shape)
        drafter = LengthControlled(inner, make_policy("fixed", {"length": 0}), profile, "draft-model")
        out = generate(tiny, prompt, drafter=drafter, max_new_tokens=10)
        assert out.tokens == generate(tiny, prompt, max_new_tokens=10).tokens
        assert drafter.decisions == [(0, 0)] * 10 and inner.model_seconds == 0.0  # the draft model never ran


def test_adaptation_policy_is_refused_with_the_fix(tiny: Transformer) -> None:
    with pytest.raises(InputError, match="drafter updates"):
        LengthControlled(
            make_drafter("ngram", tiny), make_policy("cost-aware-bandit"), flat_profile(), "ngram"
        )


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_chain_stopped_by_its_laws_top_probability_is_lossless(verifier: str, seed: int) -> None:
    """The draft model's ``min_confidence`` stop: keep drafting while the latest position's law puts at
    least ``m`` on its top token. It reads laws only, so sampled chains stay lossless."""
    inst = random_instance(3, 3, np.random.default_rng(seed), "mix")
    m = min(inst.q(()).max(), float(np.median([inst.q((a,)).max() for a in range(3)])))  # root passes
    law: dict = defaultdict(float)
    lengths = set()
    rows = exact._Rows(inst)
    for prob, paths in exact.draft_law(inst, 1, "iid"):
        tree, p = exact.draft_tree(inst, paths, "iid", rows)
        tops = tree.q[:-1].max(-1).values.tolist()  # position d's law is row d - 1
        n = next((d for d in range(1, tree.size) if tops[d - 1] < m), tree.size - 1)
        lengths.add(n)
        pruned, keep = subtree(tree, list(range(1, n + 1)))
        for out, w in exact.tree_output_law(verifier, pruned, p[keep]).items():
            law[out] += prob * w
    assert exact.law_error(dict(law), inst) < 1e-9
    assert len(lengths) > 1  # the stop cut drafts at different depths


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_chain_cut_at_its_first_token_off_the_guesses_is_lossless(verifier: str, seed: int) -> None:
    """A staged chain with one forward (``DraftModelDrafter(staged=1)``) drafts on while each sampled token
    equals the n-gram guess for its position: the stop depends on the drafted prefix, not on the target,
    so the sampled chain stays lossless."""
    inst = random_instance(3, 3, np.random.default_rng(seed), "mix")
    guesses = [int(np.argmax(inst.q(()))), 1, 0]
    law: dict = defaultdict(float)
    lengths = set()
    rows = exact._Rows(inst)
    for prob, paths in exact.draft_law(inst, 1, "iid"):
        tree, p = exact.draft_tree(inst, paths, "iid", rows)
        drafted = tree.tokens[1:].tolist()
        n = next((d for d in range(1, len(drafted)) if drafted[d - 1] != guesses[d - 1]), len(drafted))
        lengths.add(n)
        pruned, keep = subtree(tree, list(range(1, n + 1)))
        for out, w in exact.tree_output_law(verifier, pruned, p[keep]).items():
            law[out] += prob * w
    assert exact.law_error(dict(law), inst) < 1e-9
    assert lengths == {1, 2, 3}
