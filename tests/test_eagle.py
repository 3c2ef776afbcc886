"""The EAGLE-style drafter: its EAGLE-2 dynamic tree, branch isolation, training, save/load, decoding."""

from __future__ import annotations

import json

import pytest
import torch

from core.errors import InputError
from real_engine.decode import generate, prefill
from real_engine.drafters.eagle import (
    EagleDrafter,
    TreeShape,
    eagle_drafter,
    load_eagle,
    new_eagle,
    save_eagle,
)
from real_engine.model import ModelArgs, Output, Transformer
from real_engine.training.baselines import BaselineConfig, eagle_loss, generalization, train_eagle
from real_engine.training.drafter_data import DrafterData, prepare_drafter_data
from real_engine.warp import Sampling, warp

VOCAB = 48


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_target(kind: str = "llama", seed: int = 0) -> Transformer:
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, model_type=kind)
    torch.manual_seed(seed)
    return Transformer(args).eval()


def started(target: Transformer, net, shape: TreeShape, prompt: torch.Tensor,
            sampling: Sampling | None = None) -> EagleDrafter:
    sampling = sampling or Sampling(temperature=1.0)
    drafter = EagleDrafter(net, target, shape)
    cache = target.new_cache(64)
    with torch.no_grad():
        out = prefill(target, cache, prompt[:-1])
        drafter.begin(prompt, out, sampling, torch.Generator().manual_seed(0), 64)
    return drafter


def propose(drafter: EagleDrafter, depth: int):
    with torch.no_grad():
        return drafter.propose(depth)


def path_probability(tree, node: int) -> float:
    """Cumulative draft probability of ``node`` from the tree's own q rows (temperature 1: q = softmax)."""
    prob = 1.0
    while node > 0:
        parent = int(tree.parents[node])
        prob *= float(tree.q[parent, tree.tokens[node]])
        node = parent
    return prob


def test_dynamic_tree_respects_depth_width_budget_and_is_the_most_likely_subtree():
    target = tiny_target()
    net = new_eagle(target, seed=1)
    prompt = torch.tensor([3, 9, 4, 17, 8])
    full = propose(started(target, net, TreeShape(depth=3, top_k=3, total_tokens=100), prompt), 3)
    # Everything grown is kept: k children of the root, then k children of each of k frontier nodes.
    assert full.size == 1 + 3 + 9 + 9
    assert int(full.depths.max()) == 3
    for depth in (1, 2):
        expanded = [n for n in range(full.size) if int(full.depths[n]) == depth and full.children(n)]
        assert len(expanded) == 3  # the frontier is top_k wide
    for node in range(full.size):
        kids = full.children(node)
        if kids:
            # The children are the top-k tokens of the node's law, most likely first.
            assert full.tokens[kids].tolist() == full.q[node].topk(3).indices.tolist()
            assert float(full.q[node].sum()) == pytest.approx(1.0, abs=1e-5)
        else:
            assert float(full.q[node].abs().sum()) == 0.0
    # The frontier at each depth is the top-k of its depth by cumulative probability.
    probs = [path_probability(full, n) for n in range(full.size)]
    for depth in (1, 2):
        level = [n for n in range(full.size) if int(full.depths[n]) == depth]
        ranked = sorted(level, key=lambda n: -probs[n])
        assert set(ranked[:3]) == {n for n in ranked if full.children(n)}

    pruned = propose(started(target, net, TreeShape(depth=3, top_k=3, total_tokens=7), prompt), 3)
    assert pruned.size == 1 + 7
    assert all(0 <= int(p) < i for i, p in enumerate(pruned.parents.tolist()) if i)  # parents kept, first
    # The kept nodes are the 7 most likely of the full tree (same token paths).
    def strings(tree):
        out = {}
        for n in range(1, tree.size):
            path, node = [], n
            while node > 0:
                path.append(int(tree.tokens[node]))
                node = int(tree.parents[node])
            out[tuple(path[::-1])] = path_probability(tree, n)
        return out
    full_paths, kept = strings(full), strings(pruned)
    assert set(kept) == set(sorted(full_paths, key=lambda s: -full_paths[s])[:7])
    for node in range(pruned.size):  # depth-first numbering, most likely sibling first
        kids = pruned.children(node)
        assert kids == sorted(kids, key=lambda k: -float(pruned.q[node, pruned.tokens[k]]))
    assert propose(started(target, net, TreeShape(4, 2, 30), prompt), 2).depths.max() == 2  # max_depth cuts


def test_each_node_sees_only_its_own_branch():
    """Every forwarded node's law equals the law computed on its path alone (no tree, no cache), so a
    frontier node attends to the committed prefix and its ancestors only, never to another branch."""
    target = tiny_target("qwen3", seed=2)
    net = new_eagle(target, seed=3)
    prompt = torch.tensor([5, 1, 30, 7, 7, 12])
    sampling = Sampling(temperature=1.0)
    tree = propose(started(target, net, TreeShape(depth=4, top_k=3, total_tokens=60), prompt, sampling), 4)

    def causal(cond: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        t = len(tokens)
        embeds = target.model.embed_tokens(torch.tensor(tokens))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        return net(cond[None], embeds[None], torch.arange(t), None, mask)[0]

    with torch.no_grad():
        feats = target(prompt[None, :-1]).features[0]
        for node in range(tree.size):
            if not tree.children(node):
                continue
            path, n = [], node
            while n > 0:
                path.append(int(tree.tokens[n]))
                n = int(tree.parents[n])
            cond, tokens = net.fc(feats), prompt[1:].tolist()
            hidden = causal(cond, tokens)
            for token in reversed(path):  # the drafter's own output at the parent conditions the child
                cond, tokens = torch.cat((cond, hidden[-1:])), [*tokens, token]
                hidden = causal(cond, tokens)
            law = warp(net.logits(hidden[-1], target.lm_head), sampling)
            torch.testing.assert_close(tree.q[node], law, atol=2e-5, rtol=1e-4)


def test_after_accept_the_drafter_equals_a_fresh_start_on_the_committed_sequence():
    target = tiny_target()
    net = new_eagle(target, seed=6)
    shape = TreeShape(depth=3, top_k=3, total_tokens=9)
    seq = [2, 7, 1, 8, 2, 8]
    drafter = started(target, net, shape, torch.tensor(seq))
    tree = propose(drafter, 3)
    for take, token in ((2, 11), (0, 30), (3, 5)):
        path = tree.paths()[0][:take]
        root = len(seq) - 1
        seq = [*seq, *tree.tokens[path].tolist(), token]
        with torch.no_grad():
            rows = target(torch.tensor([seq[:-1]]))
        drafter.accept(path, token, Output(*(x[:, root:] for x in rows)))
        tree = propose(drafter, 3)
        fresh = propose(started(target, net, shape, torch.tensor(seq)), 3)
        assert tree.tokens.tolist() == fresh.tokens.tolist()
        assert tree.parents.tolist() == fresh.parents.tolist()
        torch.testing.assert_close(tree.q, fresh.q, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("verifier", ["greedy", "rrs"])
def test_greedy_decoding_with_eagle_equals_vanilla(verifier):
    target = tiny_target()
    net = new_eagle(target, seed=4)
    for prompt in ([7], [1, 2, 3, 4, 5, 6, 7, 8], [40, 40, 2, 40, 40, 2]):
        vanilla = generate(target, prompt, max_new_tokens=24)
        drafter = EagleDrafter(net, target, TreeShape(depth=3, top_k=2, total_tokens=6))
        out = generate(target, prompt, drafter=drafter, verifier=verifier, max_new_tokens=24)
        assert out.tokens == vanilla.tokens
        assert max(out.stats.tree_sizes) <= 7 and drafter.model_seconds > 0
    sampling, name = Sampling(temperature=0.8, top_k=8), "block" if verifier == "greedy" else verifier
    sampled = generate(target, [1, 2, 3], drafter=drafter, verifier=name, sampling=sampling,
                       max_new_tokens=24, seed=1)
    assert len(sampled.tokens) == 24  # temperature > 0 drafts and verifies through the same protocol


def test_a_few_training_steps_reduce_the_loss(tmp_path):
    target = tiny_target()
    sequences = torch.randint(0, VOCAB, (16, 20), generator=torch.Generator().manual_seed(0))
    data = prepare_drafter_data(target, sequences, tmp_path / "data", top_k=8, chunk_size=8, progress=False)
    probe = data.batch(range(8, 16))
    fresh = new_eagle(target, seed=0).float()
    with torch.no_grad():
        before, _ = eagle_loss(fresh, target, probe, unroll=3)
        # Scoring every base is the default; scoring a subset changes the loss.
        torch.testing.assert_close(eagle_loss(fresh, target, probe, 3, torch.arange(19))[0], before)
        assert float(eagle_loss(fresh, target, probe, 3, torch.tensor([0, 5, 17]))[0]) != float(before)
    config = BaselineConfig(steps=16, batch_size=4, lr=5e-3, checkpoint_every=8)
    record = train_eagle(target, data, tmp_path / "eagle", config=config, unroll=3, progress=False)
    trained, _ = load_eagle(tmp_path / "eagle", target)
    with torch.no_grad():
        after, agreement = eagle_loss(trained, target, probe, unroll=3)
    assert len(record["losses"]) == 16 and len(record["final_agreement"]) == 3 and len(agreement) == 3
    assert float(after) < float(before) - 0.1
    assert json.loads((tmp_path / "eagle" / "training.json").read_text())["drafter"]["unroll"] == 3
    # unrolled as deep as its tree drafts by default; its reduced vocabulary and token order are saved
    deep = train_eagle(target, data, tmp_path / "deep", config=BaselineConfig(steps=1, checkpoint_every=1),
                       tree=TreeShape(depth=5, top_k=2, total_tokens=8), progress=False, draft_vocab=12)
    assert deep["drafter"]["unroll"] == 5
    loaded, _ = load_eagle(tmp_path / "deep", target)
    order = json.loads((tmp_path / "deep" / "draft_vocab.json").read_text())["ids"]
    assert sorted(order) == list(range(VOCAB)) and loaded.draft_ids.tolist() == order[:12]
    assert json.loads((tmp_path / "deep" / "config.json").read_text())["draft_vocab"] == 12


def _rows(target: Transformer, folder, trained: int, held: int) -> tuple[DrafterData, DrafterData]:
    """The target's rows for ``trained`` and ``held`` random sequences of 20 tokens."""
    gen = torch.Generator().manual_seed(1)
    return tuple(prepare_drafter_data(target, torch.randint(0, VOCAB, (n, 20), generator=gen), folder / name,
                                      top_k=8, chunk_size=8, progress=False)
                 for name, n in (("train", trained), ("held", held)))


def test_generalization_weighs_training_sequences_spread_evenly_and_the_held_out_ones(tmp_path):
    """``generalization`` scores ``sequences`` training sequences spread evenly (first and last included)
    and the first held-out ones, every position, batches of unequal size weighed by their sequences."""
    target = tiny_target()
    data, heldout = _rows(target, tmp_path, 12, 9)
    calls = []

    def loss_fn(batch, scored):
        calls.append(scored)
        tokens = batch["tokens"].float()
        return tokens.mean(), [float(tokens[:, 0].mean()), float(tokens[:, -1].mean())]

    config = BaselineConfig(batch_size=4, precision="32")
    seen = generalization(loss_fn, data, heldout, config, torch.device("cpu"), sequences=5)
    for name, rows in (("train", data.batch([0, 3, 6, 8, 11])), ("heldout", heldout.batch(range(5)))):
        tokens = rows["tokens"].float()
        assert seen[name]["sequences"] == 5
        assert seen[name]["loss"] == pytest.approx(float(tokens.mean()))
        ends = [float(tokens[:, 0].mean()), float(tokens[:, -1].mean())]
        assert seen[name]["agreement"] == pytest.approx(ends)
    assert calls == [None] * 4


def test_training_records_the_trained_drafters_generalization(tmp_path):
    """A finished run given held-out rows records ``generalization`` in its record and ``training.json``;
    the trained drafter (saved in bfloat16) gives about the same loss there."""
    target = tiny_target()
    data, heldout = _rows(target, tmp_path, 12, 6)
    config = BaselineConfig(steps=3, batch_size=4, checkpoint_every=3, lr=5e-3, precision="32")
    record = train_eagle(target, data, tmp_path / "eagle", config=config, unroll=2, progress=False,
                         heldout=heldout)
    seen = record["generalization"]
    assert seen == json.loads((tmp_path / "eagle" / "training.json").read_text())["generalization"]
    trained, _ = load_eagle(tmp_path / "eagle", target)
    with torch.no_grad():
        loss, agreement = eagle_loss(trained, target, heldout.batch(range(6)), unroll=2)
    assert seen["heldout"]["sequences"] == 6 and seen["train"]["sequences"] == 12
    assert seen["heldout"]["loss"] == pytest.approx(float(loss), rel=1e-2) and len(agreement) == 2
    unfinished = train_eagle(target, data, tmp_path / "cut", config=config, unroll=2, progress=False,
                             heldout=heldout, minutes=0)
    assert "generalization" not in unfinished


def test_a_reduced_vocabulary_drafts_only_its_tokens_and_stays_lossless(tmp_path):
    """Drafting from the ``vocab`` tokens: every drafted token and all of ``q``'s mass lie among them,
    greedy output still equals vanilla's, and the builder's ``vocab`` option reads the folder's token
    order (the vocabulary's size: every token)."""
    target = tiny_target()
    net = new_eagle(target, seed=4)
    ids = torch.tensor([5, 7, 11, 3, 29, 30, 31, 40])
    drafter = EagleDrafter(net, target, TreeShape(depth=3, top_k=3, total_tokens=12), ids)
    prompt = torch.tensor([3, 9, 4, 17, 8])
    cache = target.new_cache(64)
    with torch.no_grad():
        drafter.begin(prompt, prefill(target, cache, prompt[:-1]), Sampling(), torch.Generator(), 64)
        tree = drafter.propose(3)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[ids] = False
    assert set(tree.tokens[1:].tolist()) <= set(ids.tolist()) and tree.size == 13
    assert float(tree.q[:, outside].abs().sum()) == 0.0
    for prompt in ([7], [40, 40, 2, 40, 40, 2]):
        vanilla = generate(target, prompt, max_new_tokens=20)
        fresh = EagleDrafter(net, target, TreeShape(depth=3, top_k=2, total_tokens=6), ids)
        assert generate(target, prompt, drafter=fresh, max_new_tokens=20).tokens == vanilla.tokens
    save_eagle(net.with_draft_ids(ids), tmp_path, TreeShape(depth=2, top_k=2, total_tokens=4))
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"ids": list(range(VOCAB))[::-1]}))
    assert eagle_drafter(tmp_path, target).vocab.tolist() == ids.tolist()  # the saved default
    assert eagle_drafter(tmp_path, target, vocab=10).vocab.tolist() == list(range(47, 37, -1))
    assert eagle_drafter(tmp_path, target, vocab=VOCAB).vocab is None  # every token
    with pytest.raises(InputError, match="give 1 to 48"):
        eagle_drafter(tmp_path, target, vocab=VOCAB + 1)
    with pytest.raises(InputError, match="distinct token ids"):
        EagleDrafter(net, target, TreeShape(), torch.tensor([1, 1]))


@pytest.mark.parametrize("own_head", [False, True])
def test_save_load_round_trip_gives_the_same_drafts(tmp_path, own_head):
    target = tiny_target()
    net = new_eagle(target, own_head=own_head, seed=5)
    shape = TreeShape(depth=3, top_k=2, total_tokens=5)
    save_eagle(net, tmp_path, shape, dtype=torch.float32)
    loaded, loaded_shape = load_eagle(tmp_path, target)
    assert loaded_shape == shape and (loaded.lm_head is not None) == own_head
    prompt = torch.tensor([4, 8, 15, 16, 23])
    a = propose(started(target, net, shape, prompt), 3)
    b = propose(started(target, loaded, shape, prompt), 3)
    assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
    torch.testing.assert_close(a.q, b.q)
    assert eagle_drafter(tmp_path, target, top_k=3).shape == TreeShape(depth=3, top_k=3, total_tokens=5)


def test_bad_files_and_mismatched_targets_are_input_errors(tmp_path):
    target = tiny_target()
    save_eagle(new_eagle(target), tmp_path)
    wider = Transformer(ModelArgs(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    with pytest.raises(InputError, match="hidden size"):
        load_eagle(tmp_path, wider)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["tree"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="config\\.json"):
        load_eagle(tmp_path, target)
    with pytest.raises(InputError, match="depth"):
        TreeShape(depth=0)
