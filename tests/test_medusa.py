"""The Medusa-style drafter: the static tree from calibration accuracies, heads, training, save/load."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

from core.errors import InputError
from real_engine.decode import generate, prefill
from real_engine.drafters.medusa import (
    MedusaDrafter,
    choose_tree,
    expected_length,
    load_medusa,
    medusa_drafter,
    new_medusa,
    save_medusa,
)
from real_engine.model import ModelArgs, Transformer
from real_engine.training.baselines import BaselineConfig, medusa_loss, train_medusa
from real_engine.training.drafter_data import DrafterData, prepare_drafter_data
from real_engine.warp import Sampling, warp

VOCAB = 48


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_target(seed: int = 0) -> Transformer:
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(seed)
    return Transformer(args).eval()


def random_heads(target: Transformer, heads: int = 3, own_heads: bool = True, seed: int = 1):
    net = new_medusa(target, heads, own_heads, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in net.blocks:  # the fresh blocks are zero: give the heads distinct laws
            block.weight.copy_(0.5 * torch.randn(block.weight.shape, generator=gen))
    return net.eval()


def test_static_tree_is_the_expected_one_on_a_hand_made_case():
    acc = [[0.6, 0.2], [0.5, 0.1]]
    # Path probabilities: (0) .6, (0,0) .3, (1) .2, (1,0) .1, (0,1) .06, (1,1) .02.
    assert choose_tree(acc, 1) == [(0,)]
    assert choose_tree(acc, 3) == [(0,), (1,), (0, 0)]
    assert choose_tree(acc, 4) == [(0,), (1,), (0, 0), (1, 0)]
    assert expected_length(choose_tree(acc, 3), acc) == pytest.approx(1.1)
    assert choose_tree(acc, 100) == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
    # Optimal among every parent-closed tree of the same size.
    nodes = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
    for size in range(1, 6):
        trees = itertools.combinations(nodes, size)
        closed = [t for t in trees if all(len(n) == 1 or n[:-1] in t for n in t)]
        best = max(expected_length(t, acc) for t in closed)
        assert expected_length(choose_tree(acc, size), acc) == pytest.approx(best)
    assert choose_tree([[0.5, 0.0], [0.0]], 5) == [(0,)]  # never-accepted nodes only cost verification
    with pytest.raises(InputError, match="accuracies"):
        choose_tree([[1.5]], 3)


def test_heads_shapes_and_initial_law():
    target = tiny_target()
    own, shared = new_medusa(target, heads=3), new_medusa(target, heads=3, own_heads=False)
    hidden = torch.randn(2, 5, 32)
    with torch.no_grad():
        logits = own(hidden, target.lm_head)
        assert logits.shape == (2, 5, 3, VOCAB) and shared(hidden, target.lm_head).shape == (2, 5, 3, VOCAB)
        # Fresh heads start as the target's own next-token head (zero residual blocks).
        for k in range(3):
            torch.testing.assert_close(logits[:, :, k], target.lm_head(hidden))
        net = random_heads(target, own_heads=False)  # the batched shared-head path equals head by head
        each = torch.stack([net.head(k, hidden, target.lm_head) for k in range(3)], dim=-2)
        torch.testing.assert_close(net(hidden, target.lm_head), each)
    assert sum(p.numel() for p in own.parameters()) == 3 * (32 * 32 + 32 + 32 * VOCAB)
    assert sum(p.numel() for p in shared.parameters()) == 3 * (32 * 32 + 32)


def test_proposal_lays_the_static_tree_over_each_heads_candidates():
    target = tiny_target()
    net = random_heads(target)
    tree = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    drafter = MedusaDrafter(net, target, tree)
    prompt = torch.tensor([5, 9, 2, 33])
    sampling = Sampling(temperature=0.8, top_k=10)
    with torch.no_grad():
        out = prefill(target, target.new_cache(32), prompt[:-1])
        drafter.begin(prompt, out, sampling, torch.Generator(), 32)
        draft = drafter.propose(3)
        logits = net(out.hidden[0, -1], target.lm_head)
    top = logits.topk(2, dim=-1).indices
    # Depth-first, lower ranks first: (0,) (0,0) (0,0,0) (0,1) (1,) (1,0).
    assert draft.parents.tolist() == [-1, 0, 1, 2, 1, 0, 5]
    assert draft.tokens.tolist() == [33, top[0, 0], top[1, 0], top[2, 0], top[1, 1], top[0, 1], top[1, 0]]
    assert draft.child_rule == "topk"
    laws = warp(logits, sampling)
    torch.testing.assert_close(draft.q[[0, 1, 2, 5]], laws[[0, 1, 2, 1]])  # the head drafting the children
    assert float(draft.q[[3, 4, 6]].abs().sum()) == 0.0  # leaves draft nothing
    assert drafter.propose(1).size == 3 and drafter.propose(0).size == 1  # max_depth cuts the tree
    ran = []
    for k, head in enumerate(net.lm_heads):
        head.register_forward_hook(lambda *_, k=k: ran.append(k))
    with torch.no_grad():
        shallow = MedusaDrafter(net, target, [(0,), (1,)])
        shallow.begin(prompt, out, sampling, torch.Generator(), 32)
        shallow.propose(3)  # a one-deep tree needs head 0 only
        torch.testing.assert_close(net(out.hidden[0, -1], target.lm_head, 2), logits[:2])
    assert ran == [0, 0, 1]


@pytest.mark.parametrize("verifier", ["greedy", "rrs"])
def test_greedy_decoding_with_medusa_equals_vanilla(verifier):
    target = tiny_target()
    net = random_heads(target, heads=3, own_heads=False)
    tree = choose_tree([[0.5, 0.2, 0.1], [0.4, 0.2], [0.3]], 8)
    for prompt in ([7], [1, 2, 3, 4, 5, 6, 7, 8], [40, 40, 2, 40, 40, 2]):
        vanilla = generate(target, prompt, max_new_tokens=24)
        drafter = MedusaDrafter(net, target, tree)
        out = generate(target, prompt, drafter=drafter, verifier=verifier, max_new_tokens=24)
        assert out.tokens == vanilla.tokens
        assert max(out.stats.tree_sizes) == 9 and drafter.model_seconds > 0
    sampling, name = Sampling(temperature=0.8, top_k=8), "block" if verifier == "greedy" else verifier
    sampled = generate(target, [1, 2, 3], drafter=drafter, verifier=name, sampling=sampling,
                       max_new_tokens=24, seed=1)
    assert len(sampled.tokens) == 24  # temperature > 0 drafts and verifies through the same protocol


class Interrupted(Exception):
    pass


class StopsAfter(DrafterData):
    """The same data, but its batch stream breaks off after ``limit`` batches (a killed run)."""

    limit = 6

    def batches(self, batch_size, seed, first_step=0):
        for i, batch in enumerate(super().batches(batch_size, seed, first_step)):
            if i == self.limit:
                raise Interrupted
            yield batch


def test_training_reduces_the_loss_calibrates_a_tree_and_resumes_exactly(tmp_path):
    target = tiny_target()
    gen = torch.Generator().manual_seed(0)
    data = prepare_drafter_data(target, torch.randint(0, VOCAB, (16, 20), generator=gen), tmp_path / "train",
                                top_k=8, chunk_size=8, progress=False)
    heldout = prepare_drafter_data(target, torch.randint(0, VOCAB, (8, 20), generator=gen), tmp_path / "held",
                                   top_k=8, chunk_size=8, progress=False)
    probe = heldout.batch(range(8))
    with torch.no_grad():
        before, _ = medusa_loss(new_medusa(target, 3).float(), target, probe)
    config = BaselineConfig(steps=12, batch_size=4, lr=1e-2, checkpoint_every=6, scored=10)
    record = train_medusa(target, data, heldout, tmp_path / "medusa", config=config, heads=3, tree_budget=5,
                          calibration_sequences=8, progress=False)
    net, tree = load_medusa(tmp_path / "medusa", target)
    with torch.no_grad():
        after, agreement = medusa_loss(net, target, probe)
    assert float(after) < float(before) - 0.05 and len(agreement) == 3
    acc = record["accuracies"]
    assert len(acc) == 3 and all(len(row) == 10 and 0 <= sum(row) <= 1 + 1e-6 for row in acc)
    assert tree == choose_tree(acc, 5) and [list(n) for n in tree] == record["tree"]
    saved = json.loads((tmp_path / "medusa" / "config.json").read_text())
    assert saved["accuracies"] == acc and saved["tree"] == record["tree"]

    # A run killed after 6 steps and resumed ends with the uninterrupted run's weights, bit for bit.
    with pytest.raises(Interrupted):
        train_medusa(target, StopsAfter(data.folder, data.meta), heldout, tmp_path / "again", config=config,
                     heads=3, tree_budget=5, calibration_sequences=8, progress=False)
    train_medusa(target, data, heldout, tmp_path / "again", config=config, heads=3, tree_budget=5,
                 calibration_sequences=8, resume=True, progress=False)
    whole = load_file(str(tmp_path / "medusa" / "checkpoint" / "checkpoint.safetensors"))
    resumed = load_file(str(tmp_path / "again" / "checkpoint" / "checkpoint.safetensors"))
    assert whole.keys() == resumed.keys()
    for key, value in whole.items():
        assert torch.equal(value, resumed[key]), key
    other = BaselineConfig(steps=12, batch_size=4, lr=2e-2, checkpoint_every=6)
    with pytest.raises(InputError, match="other settings"):
        train_medusa(target, data, heldout, tmp_path / "again", config=other, heads=3, resume=True,
                     progress=False)


def test_save_load_round_trip_and_bad_input(tmp_path):
    target = tiny_target()
    net = random_heads(target, own_heads=False)
    tree = [(0,), (0, 0), (1,)]
    save_medusa(net, tree, tmp_path, [[0.5, 0.2], [0.3, 0.1], [0.2, 0.1]], dtype=torch.float32)
    loaded, loaded_tree = load_medusa(tmp_path, target)
    assert loaded_tree == [(0,), (1,), (0, 0)] and loaded.heads == 3 and loaded.lm_heads is None
    for key, value in net.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)
    assert medusa_drafter(tmp_path, target, budget=4).tree == [(0,), (1,), (0, 0), (1, 0)]  # re-chosen
    with pytest.raises(InputError, match="prefixes"):
        save_medusa(net, [(0, 0)], tmp_path / "bad")
    with pytest.raises(InputError, match="prefixes"):
        MedusaDrafter(net, target, [(0,), (0, 0), (0, 0, 0, 0)])  # deeper than the heads
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="hidden size"):
        load_medusa(tmp_path, target)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(InputError, match="not a JSON Medusa heads config"):
        load_medusa(tmp_path, target)
