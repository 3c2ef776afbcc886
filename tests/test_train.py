"""The training loop's mechanics on a synthetic token stream: windows, schedule, resume, distillation."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from core.errors import InputError
from real_engine.drafters.vocab import load_vocab
from real_engine.model import Transformer
from real_engine.training import drafter_data
from real_engine.training.draft_model import write_token_order
from real_engine.training.drafter_data import training_windows
from real_engine.training.loop import TrainConfig, init_weights, learning_rate, train_loop
from real_engine.training.target import TARGETS
from real_engine.training.windows import Rollouts, TokenWindows, corpus_windows, rollout

VOCAB = 64
STREAM = "real_engine.training.windows.token_stream"  # every corpus window is read through it
TINY = TrainConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                   num_key_value_heads=1, head_dim=32, seq_len=16, batch_size=2, warmup_steps=1,
                   min_lr_ratio=1.0, lr=1e-2, steps=4, log_every=1, checkpoint_minutes=1e9)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, 1000).astype(np.uint16)


def _model(cfg: TrainConfig = TINY) -> Transformer:
    model = Transformer(cfg.model_args(VOCAB, 0))
    init_weights(model, cfg.seed)
    return model


def _run(model, cfg, folder, tokens, resume=False, teacher=None):
    windows = TokenWindows(tokens, cfg.seq_len, cfg.seed)
    evals = {"code": windows.batch(0, 2)}
    return train_loop(model, cfg, folder, resume, "target", windows, evals, teacher=teacher)


def test_windows_cover_each_epoch_once_in_a_seeded_order(tokens) -> None:
    windows = TokenWindows(tokens, 16, seed=3)
    epoch = windows.batch(0, windows.count)
    starts = sorted(int(np.flatnonzero((tokens[:-16] == row[0].item()) & (tokens[1:-15] == row[1].item()))[0])
                    for row in epoch)
    assert len(set(starts)) == windows.count
    assert torch.equal(epoch, TokenWindows(tokens, 16, seed=3).batch(0, windows.count))
    assert not torch.equal(epoch, TokenWindows(tokens, 16, seed=4).batch(0, windows.count))
    assert not torch.equal(windows.batch(windows.count, 4), epoch[:4])  # a new epoch is reshuffled


def _greedy(model: Transformer, prompt: torch.Tensor, total: int) -> torch.Tensor:
    """Greedy continuation by full forwards without a cache: the reference for ``Rollouts``."""
    out = prompt.clone()
    while out.numel() < total:
        out = torch.cat((out, model(out[None]).logits[0, -1].argmax()[None]))
    return out


@torch.inference_mode()
def test_rollouts_continue_the_first_rows_with_the_target(tokens) -> None:
    """Of a batch of 8 at share 0.5, rows 0-1 are the target's greedy continuations of their corpus
    prompt, rows 2-3 sampled ones (same prompt, other tokens), rows 4-7 the corpus windows untouched;
    a position always gives the same batch (resume draws the same rows)."""
    target = _model().eval()
    windows = TokenWindows(tokens, TINY.seq_len, TINY.seed)
    rollouts = Rollouts(windows, target, 0.5, prefix=4)
    batch, corpus = rollouts.batch(6, 8), windows.batch(6, 8)
    assert torch.equal(batch[:, :4], corpus[:, :4]) and torch.equal(batch[4:], corpus[4:])
    for i in (0, 1):
        assert torch.equal(batch[i], _greedy(target, corpus[i, :4], TINY.seq_len + 1))
    for i in (2, 3):
        assert not torch.equal(batch[i], _greedy(target, corpus[i, :4], TINY.seq_len + 1))
    assert torch.equal(batch, rollouts.batch(6, 8))
    assert torch.equal(Rollouts(windows, target, 0.0, prefix=4).batch(6, 8), corpus)


@torch.inference_mode()
def test_sampled_rollouts_draw_from_the_targets_softmax(tokens) -> None:
    """The first sampled token of 600 rollouts of one prompt: its frequencies match the target's softmax
    (chi-square below the 0.999 quantile for 63 degrees of freedom, about 105). The final norm is scaled
    up so that the softmax is far from uniform and a wrong law shows."""
    target = _model().eval()
    target.model.norm.weight.mul_(5)
    windows = TokenWindows(tokens, TINY.seq_len, TINY.seed)
    prompt = windows.batch(0, 1)[:, :4].expand(600, 4)
    drawn = rollout(target, prompt, 6, torch.ones(600, dtype=torch.bool), torch.Generator().manual_seed(0))
    p = target(prompt[:1]).logits[0, -1].softmax(-1)
    assert float(p.max()) > 3 / VOCAB
    counts = torch.bincount(drawn[:, 4], minlength=VOCAB).float()
    assert float(((counts - 600 * p) ** 2 / (600 * p)).sum()) < 105


@pytest.mark.parametrize(("share", "prefix"), [(1.5, 4), (0.5, 0), (0.5, 16)])
def test_rollouts_reject_a_bad_share_or_prompt(tokens, share: float, prefix: int) -> None:
    with pytest.raises(InputError):
        Rollouts(TokenWindows(tokens, TINY.seq_len, TINY.seed), _model(), share, prefix)


def test_learning_rate_warms_up_then_decays() -> None:
    cfg = dataclasses.replace(TINY, warmup_steps=10, min_lr_ratio=0.1, lr=1.0)
    assert learning_rate(cfg, 0, 0.0) == pytest.approx(0.1)
    assert learning_rate(cfg, 10, 0.0) == pytest.approx(1.0)
    assert learning_rate(cfg, 50, 0.5) == pytest.approx(0.55)
    assert learning_rate(cfg, 99, 1.0) == pytest.approx(0.1)


def test_resumed_run_equals_uninterrupted_run(tmp_path, tokens) -> None:
    straight = _model()
    _run(straight, TINY, tmp_path / "a", tokens)
    _run(_model(), dataclasses.replace(TINY, steps=2), tmp_path / "b", tokens)
    resumed = _model(dataclasses.replace(TINY, seed=1))  # the weights must come from the checkpoint
    state = _run(resumed, TINY, tmp_path / "b", tokens, resume=True)
    assert state["step"] == 4 and state["position"] == 4 * TINY.batch_size
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_continued_run_reads_on_where_the_earlier_run_stopped(tmp_path, tokens) -> None:
    class Recorded(TokenWindows):
        def batch(self, position: int, size: int) -> torch.Tensor:
            self.positions.append(position)
            return super().batch(position, size)

    windows = Recorded(tokens, TINY.seq_len, TINY.seed)
    windows.positions = []
    state = train_loop(_model(), TINY, tmp_path, False, "target", windows, {"code": windows.batch(0, 2)},
                       data_offset=10)
    assert windows.positions[1:] == [10 + 2 * i for i in range(4)]  # after the eval batch
    assert state["position"] == 4 * TINY.batch_size and state["data_offset"] == 10


def test_distillation_loss_is_kl_plus_weighted_lm_loss(tmp_path, tokens) -> None:
    student = _model()
    teacher = copy.deepcopy(student).eval()  # identical: the KL term starts at zero
    cfg = dataclasses.replace(TINY, steps=1, lm_weight=0.25)
    row = _run(student, cfg, tmp_path, tokens, teacher=teacher)["loss_curve"][0]
    assert row["loss"] == pytest.approx(0.25 * row["ce"], abs=1e-3)


def test_bf16_autocast_trains_fp32_weights_close_to_a_fp32_run(tmp_path, tokens) -> None:
    """Autocast changes the forward's precision only: the weights and optimiser stay fp32, and a step's
    loss is the fp32 run's within bf16 rounding (and not bit-identical, so autocast did run)."""
    losses = []
    for autocast in (True, False):
        model = _model()
        cfg = dataclasses.replace(TINY, steps=2, bf16_autocast=autocast)
        losses.append([r["loss"] for r in _run(model, cfg, tmp_path / str(autocast), tokens)["loss_curve"]])
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[0] == pytest.approx(losses[1], abs=0.05)
    assert losses[0] != losses[1]


def test_target_recipes_are_sized_as_named() -> None:
    """The ``--size`` choices of ``specblock train target``: 16m, the shipped shape, 10 to 20M; 5m."""
    for name, low, high in (("16m", 15e6, 17e6), ("5m", 4.5e6, 5.5e6)):
        with torch.device("meta"):
            model = Transformer(TARGETS[name].model_args(8192, 0))
        count = sum(p.numel() for p in model.parameters())
        assert low < count < high, (name, count)


def test_the_token_order_ranks_the_targets_top_tokens_then_corpus_counts(tmp_path, monkeypatch) -> None:
    """``draft_vocab.json``: the target's top tokens over the windows by count, then the rest by count in
    the corpus, then by id; every id once, and the draft model's ``load_vocab`` reads its head."""
    stream = np.array([5] * 40 + [7] * 30 + [9] * 20 + list(range(VOCAB)), dtype=np.uint16)
    monkeypatch.setattr(STREAM, lambda domain, split, tokenizer=None: stream)
    class Target:  # its top token is 3 wherever its input is 9, else 0
        args = TINY.model_args(VOCAB, 0)

        def __call__(self, batch: torch.Tensor):
            logits = torch.zeros(*batch.shape, VOCAB)
            logits[..., 0] = 1.0
            logits[..., 3] = 2.0 * (batch == 9)
            return type("Out", (), {"logits": logits})

    target = Target()
    path = write_token_order(tmp_path, target, windows=4, seq_len=16)
    ids = json.loads(path.read_text())["ids"]
    assert sorted(ids) == list(range(VOCAB))
    assert ids[:5] == [0, 3, 5, 7, 9] and ids[5:8] == [1, 2, 4]  # by top count, corpus count, then id
    assert load_vocab(tmp_path, 2).tolist() == [0, 3]


@torch.inference_mode()
def test_drafter_windows_with_an_on_policy_share(tokens, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """At share 0.5 the odd windows become the target's continuations of their first 4 tokens (greedy,
    then sampled, alternately), the even ones stay corpus windows, and the rows are cached apart; the
    continuations are kept and read back for the same corpus windows, seed and prompt length only."""
    monkeypatch.setattr(STREAM, lambda domain, split, tokenizer=None: tokens)
    target = _model().eval()
    corpus = corpus_windows(["code"], 16, 8, seed=0)
    windows, folder = training_windows(target, ["code"], 16, 8, 0, 0.5, tmp_path, prefix=4)
    assert torch.equal(windows[::2], corpus[::2]) and torch.equal(windows[1::2, :4], corpus[1::2, :4])
    assert torch.equal(windows[1], _greedy(target, corpus[1, :4], 16))
    assert not torch.equal(windows[3], _greedy(target, corpus[3, :4], 16))
    plain, plain_folder = training_windows(target, ["code"], 16, 8, 0, 0.0, tmp_path, prefix=4)
    assert torch.equal(plain, corpus) and folder == plain_folder.with_name(plain_folder.name + "-onpolicy0.5")

    def no_rollouts(*args: object) -> None:
        raise AssertionError("the kept continuations were generated again")

    monkeypatch.setattr(drafter_data, "rollout", no_rollouts)  # kept: read back, not regenerated
    again, _ = training_windows(target, ["code"], 16, 8, 0, 0.5, tmp_path, prefix=4)
    assert torch.equal(again, windows)
    with pytest.raises(AssertionError, match="generated again"):  # another prompt length: not reused
        training_windows(target, ["code"], 16, 8, 0, 0.5, tmp_path, prefix=5)
    (folder / "windows.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(AssertionError, match="generated again"):  # unreadable: generated again
        training_windows(target, ["code"], 16, 8, 0, 0.5, tmp_path, prefix=4)
