"""Online adaptation: feedback recording and buffers, the KL-regularized updates, the swap under
concurrent decoding, the revert rule, losslessness while adapting, and the stream runner. Tiny random
target and SpecBlock drafter, CPU."""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading

import pytest
import torch
from time_limits import limit

from core.errors import InputError
from policies.adaptation import FULL, HEAD, SKIP, BanditParams, CostAwareBandit
from policies.base import make_policy
from policies.features import ADAPT_INDEX
from real_engine.adapt import AdaptConfig, reference_kl, update_drafter, usable_cores
from real_engine.adapter import Adapter
from real_engine.decode import Iteration, generate
from real_engine.drafters.rank import rank_of
from real_engine.drafters.specblock import SpecBlock, SpecBlockConfig, SpecBlockDrafter
from real_engine.drafters.unroll import unroll
from real_engine.feedback import FeedbackDrafter
from real_engine.model import ModelArgs, Transformer
from real_engine.stream_server import StreamServer, run_stream

VOCAB = 48


@pytest.fixture(scope="module")
def target() -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return Transformer(args).eval()


def drafter(target: Transformer, seed: int = 1) -> SpecBlockDrafter:
    """A random drafter whose rank head always branches (4 children per slot): deep trees, many rejections.
    Its widest bucket ends at rank 30 of the 48 tokens, so that its misses go to both buffers."""
    config = dataclasses.replace(SpecBlockConfig.for_target(target.args), edges=(1, 4, 30))
    net = SpecBlock.for_target(target, config, seed=seed).eval()
    with torch.no_grad():
        net.rank_head.down.bias.copy_(torch.tensor((0.0, 20.0, 0.0, -20.0)))
    return SpecBlockDrafter(net, blocks=2, starts=2, budget=12)


def prompt(seed: int, length: int = 12) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def checksum(net: SpecBlock) -> float:
    return sum(float(p.detach().double().sum()) for p in net.parameters())


def states(net: SpecBlock) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.state_dict().items()}


def serve(adapter: Adapter, target: Transformer, seed: int, tokens: int = 24, domain: str = "code",
          hook=None) -> tuple[tuple[int, ...], dict[str, float]]:
    out = generate(target, prompt(seed), drafter=adapter.drafter, max_new_tokens=tokens, on_iteration=hook)
    return out.tokens, adapter.end_query(out.stats, domain)


def test_feedback_rows_and_buffers_fill_from_rejections(target: Transformer) -> None:
    adapter = Adapter(drafter(target), AdaptConfig(head_capacity=3, full_capacity=1000, top_k=8),
                      domains=("code", "prose"))
    iterations: list[Iteration] = []
    tokens, info = serve(adapter, target, 3, hook=iterations.append)
    # the last iteration ends the query before the drafter hears the verdict
    cut = [it for it in iterations[:-1] if len(it.path) < int(it.tree.depths.max())]
    roots = [it.context_length for it in cut]
    assert len(roots) >= 8
    feedback = adapter.full.items[0][0]
    assert feedback.rejected == tuple(roots) and adapter.trigger == len(roots)
    # each signal goes to one buffer: the full one takes its root, the head one its last accepted row
    assert len(feedback.full_roots) >= 3 and len(feedback.head_rows) >= 4
    assert len(feedback.full_roots) + len(feedback.head_rows) == len(roots)
    rows = {it.context_length: it.context_length + len(it.path) for it in cut}
    assert sorted([rows[r] for r in feedback.full_roots] + list(feedback.head_rows)) == sorted(rows.values())
    assert feedback.head_states.shape == (len(feedback.head_rows), adapter.drafter.net.config.hidden_size)
    assert [r for _, r in adapter.full.items] == list(feedback.full_roots)
    assert [r for _, r in adapter.head.items] == list(feedback.head_rows[-3:])  # the oldest left
    assert adapter.head.fill == 1.0 and adapter.full.fill == pytest.approx(len(feedback.full_roots) / 1000)
    obs = adapter.features()
    assert obs[ADAPT_INDEX["trigger"]] == len(roots) and obs[ADAPT_INDEX["head_fill"]] == 1.0
    assert obs[ADAPT_INDEX["recent_tau"]] == info["tau"] and list(obs[6:]) == [1.0, 0.0]
    # the recorded rows are the target's own over the committed sequence
    assert feedback.tokens.tolist() == prompt(3) + list(tokens[:feedback.tokens.numel() - 12])
    with torch.no_grad():
        full = target(feedback.tokens[None])
    torch.testing.assert_close(feedback.features[:-1].float(), full.features[0, :-1].bfloat16().float(),
                               atol=2e-2, rtol=2e-2)
    top = full.logits[0, :-1].float().log_softmax(-1).topk(8, dim=-1)
    torch.testing.assert_close(feedback.topk_logp[:-1], top.values, atol=1e-4, rtol=1e-4)
    assert torch.equal(feedback.topk_ids[:-1, 0], top.indices[:, 0])
    # a head update drains the head buffer only; a full update both
    assert adapter.apply(SKIP) is False
    assert adapter.apply(HEAD) is True
    report = adapter.wait()
    assert report is not None and report.kind == "head" and report.positions == 3 and report.fill == 1.0
    assert report.rows == 3 and report.starts == 0 and report.loss_after < report.loss_before
    assert len(adapter.head) == 0 and len(adapter.full) == len(feedback.full_roots) and adapter.trigger == 0
    assert adapter.apply(HEAD) is False  # nothing buffered for it
    assert adapter.apply(FULL) is True
    adapter.wait()
    assert not adapter.training
    assert len(adapter.full) == 0 and adapter.reports[-1].positions == len(feedback.full_roots)
    with pytest.raises(InputError):
        adapter.apply(7)


def test_a_signal_goes_to_the_buffer_its_rank_picks_with_the_state_drafting_computed(
        target: Transformer) -> None:
    """Where a draft was cut short at the root (nothing accepted), the law cut short is block 1's slot 0
    there: what ``unroll`` computes at that start. The target's next token ranks within the widest
    bucket (30): a head signal, with that slot's state; past it: a full one."""
    recorder = FeedbackDrafter(drafter(target), top_k=8)
    iterations: list[Iteration] = []
    generate(target, prompt(4), drafter=recorder, max_new_tokens=32, on_iteration=iterations.append)
    feedback = recorder.take("code")
    net = recorder.net
    at_root = [it.context_length for it in iterations[:-1] if not it.path and it.tree.size > 1]
    assert len(at_root) >= 6
    with torch.no_grad():
        features = target(feedback.tokens[None]).features
        starts = torch.tensor(at_root)
        out = unroll(net, feedback.tokens[None], features, starts, starts.new_zeros(0, len(at_root)))
        ranks = rank_of(out.logits[0, 0, :, 0], feedback.tokens[starts + 1]).tolist()
    head = {root: i for i, root in enumerate(feedback.head_rows)}
    assert {root for root, rank in zip(at_root, ranks, strict=True) if rank <= 30} == set(head) & set(at_root)
    assert {root for root, rank in zip(at_root, ranks, strict=True) if rank > 30} == (
        set(feedback.full_roots) & set(at_root))
    assert 0 < len(set(head) & set(at_root)) < len(at_root)
    for root in set(head) & set(at_root):
        torch.testing.assert_close(feedback.head_states[head[root]], out.prefix[0, root], atol=1e-4,
                                   rtol=1e-4)


def test_a_head_update_trains_the_heads_on_the_stored_states_without_the_body(
        target: Transformer, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = Adapter(drafter(target), AdaptConfig(head_capacity=1000))
    for seed in range(2):
        serve(adapter, target, seed)
    data = adapter.head.drain()
    live = adapter.drafter.net
    before = states(live)

    def body(*args: object, **kwargs: object) -> None:
        raise AssertionError("a head update ran the drafter's body")

    monkeypatch.setattr(SpecBlock, "forward", body)
    new, report = update_drafter(live, data, "head", AdaptConfig(head_steps=6, head_lr=3e-3), seed=0)
    assert report.steps == 6 and report.rows == sum(len(rows) for _, rows in data) > 0
    assert report.loss_after < report.loss_before and report.kl_first == pytest.approx(0.0, abs=1e-6)
    changed = {n for n, v in new.state_dict().items() if not torch.equal(v, before[n])}
    assert changed and all(n.startswith(("lm_head.", "rank_head.")) for n in changed)
    assert all(torch.equal(v, before[k]) for k, v in live.state_dict().items())  # the live one only read


def test_kl_term_zero_after_copy_positive_after_update_and_it_restrains(target: Transformer) -> None:
    logits = torch.randn(3, 5, VOCAB)
    assert float(reference_kl(logits, logits.clone())) == pytest.approx(0.0, abs=1e-6)
    assert float(reference_kl(logits, logits + torch.randn_like(logits))) > 0.01
    adapter = Adapter(drafter(target), AdaptConfig(full_capacity=1000))
    for seed in range(2):
        serve(adapter, target, seed)
    data = list(adapter.full.drain())
    live = adapter.drafter.net
    before = states(live)
    kls = {}
    for weight in (0.0, 20.0):
        config = AdaptConfig(kl_weight=weight, full_steps=6, full_lr=3e-3)
        new, report = update_drafter(live, data, "full", config, seed=0)
        assert report.kl_first == pytest.approx(0.0, abs=1e-6) and report.kl > 0 and report.steps == 6
        assert report.loss_after < report.loss_before
        # starts "all": every committed position from a query's first buffered rejection on, but its last
        assert report.windows == len(data) and report.starts == sum(
            feedback.tokens.numel() - 1 - min(rejected) for feedback, rejected in data)
        assert report.rows == sum(feedback.tokens.numel() - max(0, min(rejected) - config.context)
                                  for feedback, rejected in data)
        kls[weight] = report.kl
        assert new is not live and checksum(new) != checksum(live)
    assert kls[20.0] < 0.5 * kls[0.0]  # the KL term holds the update near the pre-update drafter
    for name, value in live.state_dict().items():  # the live network was only read
        assert torch.equal(value, before[name]), name
    assert new.embed is live.embed  # the target's embeddings are shared, not copied


def test_swap_is_atomic_under_concurrent_decoding(target: Transformer) -> None:
    adapter = Adapter(drafter(target), AdaptConfig(full_capacity=64, full_steps=3, revert_windows=0))
    seen: list[list[tuple[int, float]]] = []
    overlapped = 0  # queries during which an update finished and queued its weights

    def look(_iteration: Iteration) -> None:
        seen[-1].append((id(adapter.drafter.net), checksum(adapter.drafter.net)))
        finished[-1].append(len(adapter.reports))

    finished: list[list[int]] = []
    # Overlaps come from a race between the trainer thread and decoding: 4-7 queries here find 3, but an
    # update that runs relatively slower (a busier core) spans queries and finishes in fewer of them
    # (3x slower: 26 queries); the loop stops at the third overlap, so the long bound costs nothing.
    for seed in range(240):
        adapter.apply(FULL)  # trains in the background while this query decodes
        seen.append([])
        finished.append([])
        serve(adapter, target, seed, tokens=32, hook=look)
        overlapped += len(set(finished[-1])) > 1
        if overlapped >= 3:
            break
    adapter.wait()
    assert overlapped >= 3
    for query in seen:
        assert len(set(query)) == 1  # one network, unchanged, from the first iteration to the last
    assert len({query[0] for query in seen}) >= 3  # and new weights did go live between queries


def test_revert_after_three_falling_windows(target: Transformer) -> None:
    adapter = Adapter(drafter(target), AdaptConfig(window=1, revert_windows=3))
    original = adapter.drafter.net
    snapshot = states(original)

    def window(tau: float) -> None:
        out = generate(target, prompt(5), drafter=adapter.drafter, max_new_tokens=8)
        adapter.end_query(dataclasses.replace(out.stats, tau=tau), "code")

    def perturbed() -> SpecBlock:
        net = SpecBlock.for_target(target, seed=9).eval()
        net.load_state_dict(original.state_dict())
        with torch.no_grad():
            net.lm_head.weight.add_(1.0)
        return net

    window(2.0)  # the drafter as loaded: the last good one, tau 2.0
    adapter.drafter.offer(bad := perturbed())
    for tau in (1.9, 1.8):
        window(tau)
        assert adapter.drafter.net is bad and adapter.reverts == 0
    window(1.7)  # the third falling window in a row
    assert adapter.reverts == 1
    window(1.7)  # the next query runs the last good drafter again
    assert adapter.drafter.net is original
    assert all(torch.equal(v, snapshot[k]) for k, v in original.state_dict().items())
    # a window that does not fall makes the new drafter the last good one: later falls keep it
    adapter.drafter.offer(better := perturbed())
    for tau in (1.6, 1.8, 1.7, 1.6, 1.5, 1.4):
        window(tau)
    assert adapter.drafter.net is better and adapter.reverts == 1


def test_greedy_output_is_vanilla_while_adapting(target: Transformer) -> None:
    adapter = Adapter(drafter(target), AdaptConfig(head_capacity=16, full_capacity=32, full_lr=5e-3,
                                                   head_lr=5e-3, revert_windows=0))
    checksums = set()
    for seed, action in zip(range(6), (SKIP, FULL, HEAD, FULL, HEAD, FULL), strict=True):
        adapter.apply(action)
        adapter.wait()
        tokens, _ = serve(adapter, target, seed, tokens=30)
        checksums.add(checksum(adapter.drafter.net))
        assert tokens == generate(target, prompt(seed), max_new_tokens=30).tokens
    assert adapter.drafter.syncs == 5 and len(checksums) == 6  # every update changed the live drafter


def test_run_stream_rows_and_policies(target: Transformer) -> None:
    stream = [("code" if i < 4 else "prose", prompt(i)) for i in range(8)]
    rows = run_stream(target, drafter(target), stream, make_policy("always", {"update": "head"}),
                      config=AdaptConfig(head_capacity=8), max_new_tokens=12)
    assert [r["domain"] for r in rows] == [d for d, _ in stream]
    assert rows[0]["update"] is None and all(r["update"]["kind"] == "head" for r in rows[1:])
    assert all(r["update_seconds"] > 0 for r in rows[1:]) and rows[0]["update_seconds"] == 0
    assert rows[-1]["syncs"] == 7 and all(r["new_tokens"] == 12 for r in rows)
    never = run_stream(target, drafter(target), stream, make_policy("never"), max_new_tokens=12)
    assert all(r["update"] is None and r["syncs"] == 0 for r in never)
    bandit = make_policy("cost-aware-bandit", {"warmup": 2, "saturation": 0.5, "cooldown": 0}, seed=0)
    config = AdaptConfig(head_capacity=8, clock="cpu")
    rows = run_stream(target, drafter(target), stream, bandit, config=config, max_new_tokens=12)
    assert all(r["action"] == "skip" for r in rows[:2]) and any(r["update"] for r in rows[2:])
    with pytest.raises(InputError):
        run_stream(target, drafter(target), stream, bandit, config=AdaptConfig(clock="cpu"), overlap=True)


def test_stream_servers_taking_turns_serve_as_whole_streams(target: Transformer) -> None:
    stream = [("code" if i < 3 else "prose", prompt(i)) for i in range(6)]
    config = AdaptConfig(head_capacity=8)
    always = make_policy("always", {"update": "head"})
    alone = run_stream(target, drafter(target), stream, always, config=config, max_new_tokens=12)
    servers = [StreamServer(target, drafter(target), [d for d, _ in stream], make_policy(kind, params),
                            config=config, max_new_tokens=12)
               for kind, params in (("never", {}), ("always", {"update": "head"}))]
    turns = [[server.serve(i, d, p) for server in servers] for i, (d, p) in enumerate(stream)]
    for server in servers:
        server.close()
    keys = ("action", "tau", "new_tokens", "iterations", "syncs", "head_fill", "trigger")
    assert [{k: r[k] for k in keys} for _, r in turns] == [{k: r[k] for k in keys} for r in alone]
    assert all(n["syncs"] == 0 and n["update"] is None for n, _ in turns)


def test_an_adapting_drafter_drafts_the_whole_vocabulary(target: Transformer) -> None:
    from real_engine.drafters.specblock import with_draft_vocab

    live = drafter(target)
    with_draft_vocab(live.net, torch.arange(10, 30))
    adapter = Adapter(live, AdaptConfig(full_capacity=1000))
    assert adapter.drafter.net.config.draft_vocab == 0 and "draft_ids" not in adapter.drafter.net.state_dict()
    serve(adapter, target, 0)
    hidden = torch.randn(2, adapter.drafter.net.config.hidden_size)
    with torch.no_grad():
        assert adapter.drafter.net.draft_heads(hidden).logits.shape[-1] == VOCAB


class SteadyBandit(CostAwareBandit):
    """The cost-aware bandit told the same tau after every query: every window it closes is good."""

    def observe(self, obs, action, reward, info) -> None:
        super().observe(obs, action, reward, {**info, "tau": 2.0})


@pytest.mark.parametrize("window, cooldown", [(4, 1), (2, 2)])
def test_the_last_good_checkpoint_is_a_network_its_window_measured(target: Transformer, window: int,
                                                                    cooldown: int) -> None:
    # warm-up 1, then a head update at query 1 (network N1 serves queries 1 and 2). Window 4, cooldown 1:
    # the next update, at query 3, closes N1's window early, after N2 went live for query 3; window 2,
    # cooldown 2: N1's window closes full at query 2. Either way N1 is the network the window measured.
    params = BanditParams(warmup=1, cold_start_events=100, epsilon_start=0.0, epsilon_end=0.0,
                          cooldown=cooldown, saturation=0.0, s_min=0.0, window=window)
    server = StreamServer(target, drafter(target), ["code"], SteadyBandit(params, seed=0),
                          config=AdaptConfig(head_capacity=4, full_capacity=4), max_new_tokens=24)
    served = []  # the network that served each query
    for index in range(4):
        row = server.serve(index, "code", prompt(index))
        served.append(server.adapter.drafter.net)
        if row["checkpoint"]:
            break
    assert row["checkpoint"] and index == (3 if window == 4 else 2)
    assert served[0] is not served[1] is served[2]  # N1 went live at query 1 and served query 2
    assert window == 2 or served[3] is not served[2]  # N2 went live at query 3
    server.adapter.revert()  # the last good network goes live at the next query
    assert server.adapter.drafter.newest() is served[1]


def test_overlapped_updates_train_on_their_own_core_beside_decoding(target: Transformer, monkeypatch) -> None:
    cores = sorted(usable_cores())
    if len(cores) < 2:
        pytest.skip("pinning the trainer to its own core needs two cores")
    seen: list[set[int]] = []

    def pinned_update(*args, **kwargs):
        seen.append(os.sched_getaffinity(0))  # the trainer thread's cores
        return update_drafter(*args, **kwargs)

    monkeypatch.setattr("real_engine.adapter.update_drafter", pinned_update)
    stream = [("code" if i < 5 else "prose", prompt(i)) for i in range(10)]
    config = AdaptConfig(full_capacity=32, full_steps=2, revert_windows=0, trainer_core=cores[-1])
    rows = run_stream(target, drafter(target), stream, make_policy("always", {"update": "full"}),
                      config=config, max_new_tokens=24, overlap=True)
    assert seen and all(s == {cores[-1]} for s in seen)
    assert os.sched_getaffinity(0) == set(cores)  # pinning the trainer left the caller's cores alone
    assert all(r["update_seconds"] == 0.0 for r in rows)  # overlapped training is not charged to queries
    trained = [kind for r in rows for kind in r["trained"]]
    # every update is listed in the row of the query it finished during (or the last row, after it)
    assert trained and set(trained) == {"full"} and len(trained) == len(seen)
    assert sum(r["train_seconds"] for r in rows) > 0
    for before, row in itertools.pairwise(rows):
        # an update is recorded where its network went live
        assert (row["update"] is not None) == (row["syncs"] > before["syncs"])
    with pytest.raises(InputError, match="trainer_core"):
        AdaptConfig(trainer_core=max(cores) + 1)


def test_training_is_true_while_an_update_runs(target: Transformer, monkeypatch) -> None:
    """What ``experiments.adapt.serve`` waits on to re-time decoding: no update training beside it."""
    import real_engine.adapter as adapter_module

    release = threading.Event()

    def held(*args, **kwargs):
        release.wait(timeout=limit(60))
        return update_drafter(*args, **kwargs)

    monkeypatch.setattr(adapter_module, "update_drafter", held)
    adapter = Adapter(drafter(target), AdaptConfig(head_capacity=3, full_capacity=1000, top_k=8),
                      domains=("code", "prose"))
    serve(adapter, target, 3)
    assert not adapter.training
    assert adapter.apply(FULL) is True
    assert adapter.training and adapter.apply(HEAD) is False  # one update at a time
    release.set()
    adapter.wait()
    assert not adapter.training and adapter.reports[-1].kind == "full"
