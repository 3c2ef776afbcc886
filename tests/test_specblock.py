"""SpecBlock: masks (by perturbation), training/inference agreement, rank features and labels, trees,
training, checkpoints, and greedy equivalence through the decode loop. Tiny random target, CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

from core.errors import InputError
from real_engine.decode import generate
from real_engine.drafters import rank
from real_engine.drafters.specblock import (
    SpecBlock,
    SpecBlockDrafter,
    load_specblock,
    save_specblock,
    with_draft_vocab,
)
from real_engine.drafters.unroll import unroll
from real_engine.model import ModelArgs, Output, Transformer
from real_engine.training import specblock as ts
from real_engine.training.drafter_data import open_drafter_data, prepare_drafter_data
from real_engine.warp import Sampling

VOCAB = 48


@pytest.fixture(scope="module")
def target() -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return Transformer(args).eval()


def branching(target: Transformer, bias: tuple[float, ...] = (0.0, 20.0, 0.0, -20.0),
              seed: int = 1) -> SpecBlock:
    """A random drafter whose rank head always predicts the bucket with the largest ``bias``."""
    net = SpecBlock.for_target(target, seed=seed).eval()
    with torch.no_grad():
        net.rank_head.down.bias.copy_(torch.tensor(bias))
    return net


def sequence(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- rank features, labels, buckets


def test_summary_of_a_hand_made_distribution() -> None:
    p = torch.tensor([0.4, 0.2, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01, 0.006, 0.004])
    lp = p.double().log()
    want = [*lp[:10].tolist(), float(lp[0] - lp[1]), float(lp[3] - lp[4]), float(lp[0] - lp[9]), 0.4,
            -sum(x * math.log(x) for x in p.tolist())]
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))  # token order is irrelevant
    got = rank.summary(p.log()[order][None])
    assert got.shape == (1, 15)
    assert torch.allclose(got[0].double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)


def test_ranks_and_buckets_exact() -> None:
    logits = torch.tensor([[5.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]])
    tokens = torch.tensor([0, 1, 2, 3, 4, 9, 10, 11])
    ranks = rank.rank_of(logits.expand(8, -1), tokens)
    assert ranks.tolist() == [1, 2, 2, 4, 5, 10, 11, 12]  # ties share the better rank
    assert rank.bucket_of(ranks).tolist() == [0, 1, 1, 1, 2, 2, 3, 3]
    labels = ts.rank_labels(logits.expand(8, -1), tokens, rank.EDGES)
    assert torch.equal(labels, torch.tensor([0, 1, 1, 1, 2, 2, 3, 3]))


def test_valid_prefix_mask_exact() -> None:
    correct = torch.tensor([
        [[1, 1, 0, 1], [1, 1, 1, 1]],  # block 1 wrong at slot 2
        [[1, 1, 1, 1], [1, 0, 1, 1]],
        [[1, 1, 1, 1], [1, 1, 1, 1]],
    ], dtype=torch.bool)
    starts = torch.tensor([[1], [3], [2]])
    got = ts.valid_prefix(correct, correct, starts)
    want = torch.tensor([
        [[1, 1, 1, 0], [1, 1, 1, 1]],  # slot 1 right through the start: block 2 counts
        [[1, 1, 1, 1], [1, 1, 0, 0]],
        [[1, 1, 1, 1], [1, 1, 1, 1]],
    ], dtype=torch.bool)
    assert torch.equal(got, want)
    # starting block 2 after the wrong slot cuts it entirely; the mask carries through three blocks
    assert ts.valid_prefix(correct[:1], correct[:1], torch.tensor([[2]]))[0, 1].tolist() == [False] * 4
    three = torch.tensor([[[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]]], dtype=torch.bool)
    assert ts.valid_prefix(three, three, torch.tensor([[3, 0]]))[0].tolist() == [
        [True] * 4, [True, False, False, False], [False] * 4]
    # a side branch: slot 2 missed the argmax but drafted the target's token among its children, so a
    # block started there learns (its own slot 3 does not: slot 2 was wrong); one never drafted does not
    side = correct[:1].clone()
    drafted = side | torch.tensor([[[0, 0, 1, 0], [0, 0, 0, 0]]], dtype=torch.bool)
    assert ts.valid_prefix(side, drafted, torch.tensor([[2]]))[0].tolist() == [
        [True, True, True, False], [True] * 4]
    assert ts.valid_prefix(side, side, torch.tensor([[2]]))[0, 1].tolist() == [False] * 4


def test_drafting_ranks_and_balanced_weights() -> None:
    """Ranks in the drafting law count only its tokens (a token outside it is never drafted); class
    weights ``frequency ** -balance`` average 1 over the labels and favour the rare classes."""
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])
    ids = torch.tensor([3, 1, 0, 7])
    tokens = torch.tensor([0, 3, 7, 2])
    full = ts.drafting_ranks(logits.expand(4, -1), tokens, None)
    cut = ts.drafting_ranks(logits.expand(4, -1), tokens, ids)
    assert full.tolist() == [1, 4, 8, 3] and cut.tolist() == [1, 3, 4, 13]
    labels = torch.tensor([0] * 8 + [1, 1, 3, 2])
    w = ts.balanced_weights(labels, 4, 0.5)
    freq = torch.tensor([8, 2, 1, 1]) / 12
    assert float((w * freq).sum()) == pytest.approx(1.0) and w[0] < w[1] < w[2] == w[3]
    assert ts.balanced_weights(labels, 4, 0.0).tolist() == pytest.approx([1.0] * 4)


# ---------------------------------------------------------------- attention masks by perturbation


def test_inputs_do_not_depend_on_the_scale_of_the_conditioning_or_the_embedding(target: Transformer) -> None:
    """Target features are hundreds of times longer than token embeddings: both are normalized before
    the fusion, so neither drowns the other (scaling either leaves the row inputs unchanged)."""
    net = SpecBlock.for_target(target, seed=1)
    cond = torch.randn(5, net.config.hidden_size)
    tokens, slots = sequence(5, 3), torch.arange(5) % net.config.block_size
    with torch.no_grad():
        base = net.inputs(cond, tokens, slots)
        torch.testing.assert_close(net.inputs(300.0 * cond, tokens, slots), base, rtol=1e-4, atol=1e-5)
        louder = SpecBlock(net.config, 10.0 * target.model.embed_tokens.weight)  # the embedding 10x longer
        louder.load_state_dict(net.state_dict())
        torch.testing.assert_close(louder.inputs(cond, tokens, slots), base, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(net.inputs(cond.flip(0), tokens, slots), base)


def test_a_slot_never_sees_later_slots(target: Transformer) -> None:
    net = branching(target)
    tokens, starts, slots = sequence(24, 3)[None], torch.tensor([2, 9, 15]), torch.tensor([[3, 1, 2]])
    feats = target(tokens).features
    with torch.no_grad():
        base = unroll(net, tokens, feats, starts, slots)
        for k in range(1, net.config.block_size):
            saved = net.queries[k].clone()
            net.queries[k] += 1.0  # changes every slot-k row input, in every block
            out = unroll(net, tokens, feats, starts, slots)
            net.queries[k] = saved
            assert torch.equal(out.logits[:, 0, :, :k], base.logits[:, 0, :, :k])
            assert not torch.allclose(out.logits[:, 0, :, k], base.logits[:, 0, :, k])


def test_a_branch_never_sees_another_branch_or_the_future(target: Transformer) -> None:
    net = branching(target)
    tokens, starts, slots = sequence(24, 4)[None], torch.tensor([2, 12]), torch.tensor([[3, 3]])
    feats = target(tokens).features
    # Start 2's blocks cover positions 2..9 and read tokens up to 6, features up to 1; start 12's
    # blocks come later. Perturb everything from position 7 on (tokens) and 2 on (features).
    tokens2, feats2 = tokens.clone(), feats.clone()
    tokens2[:, 7:] = (tokens2[:, 7:] + 1) % VOCAB
    feats2[:, 2:] += 1.0
    with torch.no_grad():
        a = unroll(net, tokens, feats, starts, slots)
        b = unroll(net, tokens2, feats2, starts, slots)
    assert torch.equal(a.logits[:, :, 0], b.logits[:, :, 0])
    assert not torch.allclose(a.logits[:, :, 1], b.logits[:, :, 1])


def _recorded_proposal(net: SpecBlock, drafter: SpecBlockDrafter, prompt: torch.Tensor,
                       target_out: Output, monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[list[torch.Tensor], rank.BucketTree, list[int]]:
    """Propose once, recording the slot logits of each block forward and the block-2 starts."""
    logits, seen = [], {}
    heads, starts = net.draft_heads, rank.BucketTree.starts

    def record_heads(hidden: torch.Tensor) -> object:
        out = heads(hidden)
        logits.append(out.logits.clone())
        return out

    def record_starts(self: rank.BucketTree, created: list[int], count: int) -> list[int]:
        seen["tree"], seen["starts"] = self, starts(self, created, count)
        return seen["starts"]

    monkeypatch.setattr(net, "draft_heads", record_heads)
    monkeypatch.setattr(rank.BucketTree, "starts", record_starts)
    drafter.begin(prompt, target_out, Sampling(), torch.Generator(), 64)
    drafter.propose(16)
    monkeypatch.undo()
    return logits, seen["tree"], seen["starts"]


def test_inference_blocks_equal_the_training_unroll(target: Transformer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block the drafter runs at inference (batched over branches, on a KV cache) equals the
    training unroll of that branch alone: the tree mask hides the other branches exactly."""
    net = branching(target)
    seq, t, k = sequence(30, 5), 9, net.config.block_size
    drafter = SpecBlockDrafter(net, blocks=2, starts=16, budget=200)
    logits, tree, starts = _recorded_proposal(net, drafter, seq[:t + 1], target(seq[None, :t]), monkeypatch)
    assert len(starts) == 4 * 3 + 1  # 3 side branches per slot and the chain's end
    with torch.no_grad():
        first = unroll(net, seq[None], target(seq[None]).features, torch.tensor([t]), torch.tensor([[0]]))
        assert torch.allclose(first.logits[0, 0, 0], logits[0], atol=1e-5)
        for i, node in enumerate(starts):
            depth = tree.depths[node]
            x = seq.clone()
            x[t + depth] = tree.tokens[node]  # the branch's start token, as the sequence's
            out = unroll(net, x[None], target(x[None]).features, torch.tensor([t]),
                         torch.tensor([[depth - 1]]))
            assert torch.allclose(out.logits[0, 1, 0], logits[1][i * k:(i + 1) * k], atol=1e-5)


def test_accepted_tokens_become_prefix_rows(target: Transformer) -> None:
    """After ``accept`` the next block 1 equals the unroll at the new root over the committed text."""
    net = branching(target, (20.0, 0.0, 0.0, -20.0))  # a plain chain
    seq, t = sequence(30, 6), 7
    drafter = SpecBlockDrafter(net, blocks=1)
    drafter.begin(seq[:t + 1], target(seq[None, :t]), Sampling(), torch.Generator(), 64)
    tree = drafter.propose(8)
    path = [1, 2]
    x = seq.clone()
    x[t + 1:t + 3] = tree.tokens[path]
    rows = target(x[None])
    drafter.accept(path, int(x[t + 3]), Output(*(r[:, t:t + 3] for r in rows)))
    assert drafter.propose(0).size == 1  # nothing drafted: the root waits as a prefix row
    drafter.accept([], int(x[t + 4]), Output(*(r[:, t + 3:t + 4] for r in rows)))
    recorded = []
    heads = net.draft_heads
    net.draft_heads = lambda h: recorded.append(heads(h).logits) or heads(h)
    try:
        drafter.propose(8)
    finally:
        del net.draft_heads
    with torch.no_grad():
        out = unroll(net, x[None], rows.features, torch.tensor([t + 4]), torch.tensor([[0]]))
    assert torch.allclose(out.logits[0, 0], recorded[0], atol=1e-5)


# ---------------------------------------------------------------- trees


def test_bucket_tree_branching_and_budget() -> None:
    vocab = 30
    top_ids = [list(range(s * 10, s * 10 + 10)) for s in range(4)]
    top_logp = [[-0.1 * (j + 1) - s for j in range(10)] for s in range(4)]
    tree = rank.BucketTree(root=99, max_depth=16)
    created = tree.extend(0, [0, 1, 2, 3], [0, 1, 2, 3], top_logp, top_ids)
    # slot 0: 1 child; slot 1: 4 children of the chain node; slot 2: 10; slot 3 says stop
    assert len(created) == 1 + 4 + 10
    assert [len([n for n in created if tree.parents[n] == p]) for p in (0, 1, 2)] == [1, 4, 10]
    assert tree.stopped == {created[5]}  # the chain node after slot 2
    assert tree.starts(created, 3) == [3, 4, 5]  # best side branches of slot 1 (the stopped node is out)
    laws = torch.eye(4, vocab)
    for budget in (1, 5, 15, 40):
        draft = tree.build(budget, laws)
        assert draft.size == 1 + min(budget, 15)
        assert set(draft.parents.tolist()[1:]) <= set(range(draft.size))
        assert draft.child_rule == "topk" and draft.q.shape == (draft.size, vocab)
    draft = tree.build(15, laws)
    assert draft.paths()[0] == [1, 2, 3]  # the chain first
    assert draft.tokens.tolist()[:4] == [99, 0, 10, 20]
    assert torch.equal(draft.q[0], laws[0]) and not draft.q[3].any()  # q zero where nothing was kept


@pytest.mark.parametrize("bias,fanout,shape", [
    ((20.0, 0.0, 0.0, -20.0), {1}, {"starts": 1.0, "blocks": 2}),  # a chain: one leaf starts block 2
    ((0.0, 20.0, 0.0, -20.0), {4}, {"starts": 2.0, "blocks": 2}),  # many leaves: the 2 best start it
    ((0.0, 0.0, 20.0, -20.0), {10}, {"starts": 2.0, "blocks": 2}),
    ((0.0, 0.0, 0.0, 20.0), set(), {"starts": 1.0, "blocks": 1})])  # no children: block 2 never runs
def test_drafter_trees_follow_buckets_and_budget(target: Transformer, bias: tuple[float, ...],
                                                 fanout: set[int], shape: dict[str, float]) -> None:
    seq = sequence(12, 7)
    for budget in (3, 12, 500):
        drafter = SpecBlockDrafter(branching(target, bias), blocks=2, starts=2, budget=budget)
        assert drafter.shapes is None  # nothing recorded unless a caller attaches a list
        drafter.shapes = []
        drafter.begin(seq, target(seq[None, :-1]), Sampling(), torch.Generator(), 64)
        tree = drafter.propose(16)
        assert drafter.shapes == [shape]  # what the cost profile charges this proposal
        assert tree.size <= budget + 1 and tree.child_rule == "topk" and tree.q.shape == (tree.size, VOCAB)
        if budget == 500:
            counts = {len(tree.children(n)) for n in range(tree.size)} - {0}
            assert counts == fanout
            assert int(tree.depths.max()) <= 2 * drafter.k


# ---------------------------------------------------------------- decoding


@pytest.mark.parametrize("verifier", ["greedy", "rrs"])
def test_greedy_output_equals_vanilla(target: Transformer, verifier: str) -> None:
    for seed, bias in [(0, (0.0, 20.0, 0.0, -20.0)), (1, (0.0, 0.0, 0.0, 0.0)), (2, (20.0, 0.0, 0.0, -20.0))]:
        prompt = sequence(5 + seed, 10 + seed)
        vanilla = generate(target, prompt, max_new_tokens=25)
        drafter = SpecBlockDrafter(branching(target, bias, seed), blocks=3, starts=3, budget=24)
        spec = generate(target, prompt, drafter=drafter, verifier=verifier, max_new_tokens=25)
        assert spec.tokens == vanilla.tokens
        assert drafter.model_seconds > 0 and max(spec.stats.tree_sizes) > 1


def test_sampled_decoding_runs(target: Transformer) -> None:
    drafter = SpecBlockDrafter(branching(target), budget=16)
    out = generate(target, sequence(6, 20), drafter=drafter, verifier="rrs", sampling=Sampling(1.0),
                   max_new_tokens=20, seed=3)
    again = generate(target, sequence(6, 20), drafter=SpecBlockDrafter(branching(target), budget=16),
                     verifier="rrs", sampling=Sampling(1.0), max_new_tokens=20, seed=3)
    assert len(out.tokens) == 20 and out.tokens == again.tokens


# ---------------------------------------------------------------- data, training, checkpoints


@pytest.fixture(scope="module")
def data(target: Transformer, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("data")
    seqs = torch.randint(0, VOCAB, (12, 20), generator=torch.Generator().manual_seed(1))
    return prepare_drafter_data(target, seqs, folder, top_k=8, chunk_size=5, progress=False), seqs


def test_drafter_data_rows_and_resume(target: Transformer, data) -> None:
    prepared, seqs = data
    batch = prepared.batch([0, 7])
    with torch.no_grad():
        out = target(seqs[[0, 7]])
    assert torch.equal(batch["tokens"], seqs[[0, 7]])
    assert torch.allclose(batch["features"], out.features, atol=0.05, rtol=0.02)
    top = out.logits.log_softmax(-1).topk(8)
    assert torch.equal(batch["topk_ids"], top.indices) and torch.allclose(batch["topk_logp"], top.values)
    chunk = prepared.folder / "chunk_00001.safetensors"
    before = chunk.read_bytes()
    chunk.unlink()
    again = prepare_drafter_data(target, seqs, prepared.folder, top_k=8, chunk_size=5, progress=False)
    assert chunk.read_bytes() == before and len(again) == 12
    with pytest.raises(InputError):
        prepare_drafter_data(target, seqs[:6], prepared.folder, top_k=8, chunk_size=5, progress=False)


def test_training_reduces_the_loss_deterministically(target: Transformer, data, tmp_path) -> None:
    prepared, _ = data
    config = ts.SpecBlockTrainConfig(steps=12, batch_size=4, starts=8, lr=1e-2, checkpoint_every=12)
    fixed = prepared.batch(range(12))
    starts, slots = torch.arange(0, 18, 2), torch.tensor([[0, 1, 2, 3, 3, 2, 1, 0, 3]])

    def loss_of(net: SpecBlock) -> float:
        with torch.no_grad():
            return ts.specblock_loss(net.float(), fixed, starts, slots)[0].item()

    before = loss_of(SpecBlock.for_target(target, seed=0))
    record = ts.train_specblock(target, prepared, tmp_path / "a", tmp_path / "ra", config=config,
                                progress=False)
    after = loss_of(load_specblock(tmp_path / "a", target))
    assert after < before - 0.1
    again = ts.train_specblock(target, prepared, tmp_path / "b", tmp_path / "rb", config=config,
                               progress=False)
    assert again["losses"] == record["losses"]
    # the token order is saved beside it; a reduced vocabulary drafts its first tokens
    small = ts.SpecBlockTrainConfig(steps=1, starts=4, draft_vocab=12, rank_balance=0.5)
    cut = ts.train_specblock(target, prepared, tmp_path / "c", tmp_path / "rc", progress=False, config=small)
    order = json.loads((tmp_path / "c" / "draft_vocab.json").read_text())["ids"]
    assert sorted(order) == list(range(VOCAB)) and cut["steps_done"] == 1
    assert load_specblock(tmp_path / "c", target).draft_ids.tolist() == order[:12]


def test_prefix_rows_add_their_slot_zero_losses(target: Transformer, data) -> None:
    prepared, _ = data
    net = SpecBlock.for_target(target, seed=0).float()
    batch = prepared.batch([0, 1])
    starts, slots = torch.tensor([2, 9]), torch.tensor([[1, 3]])
    with torch.no_grad():
        plain = ts.specblock_loss(net, batch, starts, slots)[0]
        weighted = ts.specblock_loss(net, batch, starts, slots, prefix_weight=0.5)[0]
        heads = net.heads(unroll(net, batch["tokens"], batch["features"], starts, slots).prefix[:, :-1])
        ids = batch["topk_ids"][:, :-1]
        kl = ts.draft_kl(heads.logits, batch["topk_logp"][:, :-1], ids).mean()
        labels = ts.rank_labels(heads.logits, ids[..., 0], net.config.edges)
        ce = torch.nn.functional.cross_entropy(heads.buckets.flatten(0, 1), labels.flatten())
    # every prefix row is a slot 0 predicting the next position, the target's law there its teacher
    assert weighted.item() == pytest.approx((plain + 0.5 * (kl + ce)).item(), rel=1e-5)
    with pytest.raises(InputError, match="prefix_weight"):
        ts.SpecBlockTrainConfig(prefix_weight=-1.0)


def test_resume_continues_exactly(target: Transformer, data, tmp_path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    prepared, _ = data
    config = ts.SpecBlockTrainConfig(steps=8, batch_size=4, starts=6, lr=3e-3, checkpoint_every=4)
    whole = ts.train_specblock(target, prepared, tmp_path / "whole", tmp_path / "rwhole", config=config,
                               progress=False)
    loss, calls = ts.specblock_loss, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 5:  # dies during step 6, after the checkpoint at step 4
            raise KeyboardInterrupt
        return loss(*args, **kwargs)

    monkeypatch.setattr(ts, "specblock_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ts.train_specblock(target, prepared, tmp_path / "cut", tmp_path / "rcut", config=config,
                           progress=False)
    monkeypatch.undo()
    resumed = ts.train_specblock(target, prepared, tmp_path / "cut", tmp_path / "rcut", config=config,
                                 resume=True, progress=False)
    assert [row[0] for row in resumed["losses"]] == list(range(8))
    assert resumed["losses"] == whole["losses"]
    with pytest.raises(InputError):
        ts.train_specblock(target, prepared, tmp_path / "cut", tmp_path / "rcut",
                           config=ts.SpecBlockTrainConfig(steps=9), resume=True, progress=False)


def test_save_load_round_trip_and_bad_files(target: Transformer, tmp_path) -> None:
    net = branching(target)
    save_specblock(net, tmp_path / "d", dtype=torch.float32)
    loaded = load_specblock(tmp_path / "d", target)
    assert "embed" not in loaded.state_dict()
    assert loaded.embed.data_ptr() == target.model.embed_tokens.weight.data_ptr()  # shared, not copied
    for name, value in net.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name
    prompt = sequence(6, 30)
    a = generate(target, prompt, drafter=SpecBlockDrafter(net), max_new_tokens=12)
    b = generate(target, prompt, drafter=SpecBlockDrafter(loaded), max_new_tokens=12)
    assert a.stats.accepted == b.stats.accepted
    with pytest.raises(InputError):
        load_specblock(tmp_path / "missing", target)
    config = tmp_path / "d" / "config.json"
    good = config.read_text()
    config.write_text(good.replace('"specblock-v2"', '"specblock-v1"'))
    with pytest.raises(InputError, match="retrain it"):  # weights of the raw fusion do not fit this version
        load_specblock(tmp_path / "d", target)
    config.write_text(good)
    (tmp_path / "d" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputError):
        load_specblock(tmp_path / "d", target)
    (tmp_path / "d" / "config.json").write_text("{")
    with pytest.raises(InputError):
        load_specblock(tmp_path / "d", target)
    other = Transformer(ModelArgs(vocab_size=VOCAB + 2, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=8))
    save_specblock(net, tmp_path / "e")
    with pytest.raises(InputError):
        load_specblock(tmp_path / "e", other)
    with pytest.raises(InputError):
        open_drafter_data(tmp_path / "e")


def test_qwen3_target_with_tied_embeddings(qwen3_dir) -> None:
    from real_engine.model import load_model

    target = load_model(qwen3_dir)
    prompt = torch.tensor([5, 17, 3, 60, 2])
    drafter = SpecBlockDrafter(branching(target, (0.0, 20.0, 0.0, -20.0)), budget=20)
    assert generate(target, prompt, drafter=drafter, max_new_tokens=16).tokens == \
        generate(target, prompt, max_new_tokens=16).tokens


def test_smaller_drafter_and_bad_settings(target: Transformer, tmp_path) -> None:
    from real_engine.drafters.specblock import SpecBlockConfig

    config = SpecBlockConfig.for_target(target.args, hidden_size=16, num_layers=1, block_size=3)
    net = SpecBlock.for_target(target, config, seed=2).eval()
    assert net.lm_head.weight.shape == (VOCAB, 16) and len(net.shifts) == 0
    save_specblock(net, tmp_path / "small")
    prompt = sequence(6, 40)
    drafter = SpecBlockDrafter(load_specblock(tmp_path / "small", target), blocks=3)
    assert generate(target, prompt, drafter=drafter, max_new_tokens=15).tokens == \
        generate(target, prompt, max_new_tokens=15).tokens
    with pytest.raises(InputError):
        SpecBlockConfig.for_target(target.args, hidden_size=12)  # not a multiple of the head size
    with pytest.raises(InputError):
        SpecBlockDrafter(net, children=(1, 4, 10))
    with pytest.raises(InputError):
        SpecBlockDrafter(net, budget=0)


def test_rank_confusion_counts_labels_by_row_and_predictions_by_column(target: Transformer) -> None:
    from experiments.specbench.run import rank_confusion

    net = branching(target, bias=(0.0, 0.0, 0.0, 20.0))  # the rank head always predicts bucket 3
    out = rank_confusion(target, net, [sequence(16, 3).tolist(), sequence(12, 4).tolist()], seed=0)
    counts = torch.tensor(out["confusion"])
    assert counts.shape == (4, 4) and int(counts.sum()) == out["positions"] > 0
    assert int(counts[:, :3].sum()) == 0  # every prediction in column 3 ...
    assert int(counts[:3, 3].sum()) > 0  # ... while the labels (rows) spread over the buckets
    assert out["accuracy"] == pytest.approx(int(counts[3, 3]) / out["positions"])


# ---------------------------------------------------------------- reduced drafting vocabulary


def test_a_reduced_vocabulary_drafts_only_its_tokens_and_stays_lossless(target: Transformer) -> None:
    ids = torch.tensor([5, 3, 40, 7, 11, 2, 30, 21, 9, 17, 44, 1, 0, 28, 33, 12])
    net = with_draft_vocab(branching(target), ids)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[ids] = False
    for sampling in (Sampling(0.0), Sampling(1.0)):
        drafter = SpecBlockDrafter(net, blocks=2, starts=3, budget=24)
        prompt = sequence(7, 50)
        with torch.no_grad():
            drafter.begin(prompt, target(prompt[None, :-1]), sampling, torch.Generator().manual_seed(0), 40)
        tree = drafter.propose(8)
        assert tree.size > 1 and set(tree.tokens[1:].tolist()) <= set(ids.tolist())
        expanded = tree.q.sum(-1) > 0
        assert torch.all(tree.q[:, outside] == 0)
        assert torch.allclose(tree.q[expanded].sum(-1), torch.ones(int(expanded.sum())))
    for verifier in ("greedy", "rrs"):
        prompt = sequence(6, 51)
        spec = generate(target, prompt, drafter=SpecBlockDrafter(net, budget=16), verifier=verifier,
                        max_new_tokens=25)
        assert spec.tokens == generate(target, prompt, max_new_tokens=25).tokens


def test_the_cut_head_follows_the_weights_and_survives_a_round_trip(target: Transformer, tmp_path) -> None:
    from safetensors import safe_open

    ids = torch.arange(20, 40)
    net = with_draft_vocab(branching(target), ids)
    hidden = torch.randn(3, net.config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(net.draft_heads(hidden).logits, net.heads(hidden).logits[:, ids])
        net.lm_head.weight.mul_(2.0)  # an online update changes the head in place
        assert torch.allclose(net.draft_heads(hidden).logits, net.heads(hidden).logits[:, ids])
    save_specblock(net, tmp_path / "d")
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("draft_ids").dtype == torch.long  # token ids are never rounded to 16 bits
    loaded = load_specblock(tmp_path / "d", target)
    assert loaded.config.draft_vocab == 20 and torch.equal(loaded.draft_ids, ids)
    whole = with_draft_vocab(loaded, None)
    assert whole.config.draft_vocab == 0 and "draft_ids" not in whole.state_dict()
    with torch.no_grad():
        assert torch.equal(whole.draft_heads(hidden).logits, whole.heads(hidden).logits)
    for bad in (torch.tensor([1, 1, *range(2, 12)]), torch.arange(VOCAB - 5, VOCAB + 6),
                torch.arange(5)):
        with pytest.raises(InputError):
            with_draft_vocab(branching(target), bad)


def test_frequent_targets_rank_the_targets_top_tokens(target: Transformer, data) -> None:
    from real_engine.training.drafter_data import frequent_targets

    prepared, seqs = data
    with torch.no_grad():
        top = target(seqs).logits.argmax(-1).flatten()
    counts = torch.bincount(top, minlength=VOCAB)
    ids = frequent_targets(prepared, 12, VOCAB)
    assert ids.unique().numel() == 12
    assert counts[ids].tolist() == sorted(counts[ids].tolist(), reverse=True)
    rest = torch.tensor([i for i in range(VOCAB) if i not in ids])
    assert int(counts[ids].min()) >= int(counts[rest].max())
    with pytest.raises(InputError):
        frequent_targets(prepared, 0, VOCAB)


def test_a_reduced_vocabulary_saves_only_the_heads_drafted_rows(target: Transformer, tmp_path) -> None:
    """With a drafting vocabulary the file holds the LM head's ``draft_ids`` rows alone; loading takes the
    others from the target's head, and the loaded drafter drafts exactly as the saved one."""
    from safetensors import safe_open

    from real_engine.drafters.specblock import HEAD_ROWS

    net = with_draft_vocab(branching(target), torch.tensor([7, 3, 11, 0, 5, 9, 2, 8, 1, 4, 6, 10]))
    with torch.no_grad():
        net.lm_head.weight.add_(0.5)  # trained away from the target's head everywhere
    save_specblock(net, tmp_path / "d", dtype=torch.float32)
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and f.get_slice(HEAD_ROWS).get_shape() == [12, 32]  # noqa: SIM118
    loaded = load_specblock(tmp_path / "d", target)
    ids = net.draft_ids
    assert torch.equal(loaded.lm_head.weight[ids], net.lm_head.weight[ids])
    rest = torch.ones(VOCAB, dtype=torch.bool)
    rest[ids] = False
    assert torch.equal(loaded.lm_head.weight[rest], target.lm_head.weight[rest])
    prompt = sequence(6, 30)
    a = generate(target, prompt, drafter=SpecBlockDrafter(net), max_new_tokens=12)
    b = generate(target, prompt, drafter=SpecBlockDrafter(loaded), max_new_tokens=12)
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


def test_training_saves_the_drafting_vocabulary_it_was_asked_for(target: Transformer, data, tmp_path) -> None:
    from real_engine.training.drafter_data import frequent_targets

    prepared, _ = data
    for asked, kept in ((12, 12), (VOCAB, 0), (4 * VOCAB, 0)):  # a vocabulary no larger is drafted whole
        config = ts.SpecBlockTrainConfig(steps=1, batch_size=2, starts=4, draft_vocab=asked,
                                         checkpoint_every=1)
        ts.train_specblock(target, prepared, tmp_path / f"d{asked}", tmp_path / f"r{asked}", config=config,
                           progress=False)
        saved = load_specblock(tmp_path / f"d{asked}", target)
        assert saved.config.draft_vocab == kept
        if kept:
            assert torch.equal(saved.draft_ids, frequent_targets(prepared, kept, VOCAB))

