"""SpecBlock training with a drafting vocabulary trains only its LM head's drafted rows: the others stay the
target's, as the saved drafter (which keeps only the drafted rows) gets them back on loading."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from core.errors import InputError
from real_engine.drafters.specblock import load_specblock
from real_engine.model import Transformer
from real_engine.training import specblock as ts
from real_engine.training.drafter_data import frequent_targets, prepare_drafter_data

DRAFTED = 12


@pytest.fixture(scope="module")
def data(target: Transformer, tmp_path_factory: pytest.TempPathFactory):
    """The tiny target's rows for 12 random windows."""
    seqs = torch.randint(0, target.args.vocab_size, (12, 20), generator=torch.Generator().manual_seed(1))
    return prepare_drafter_data(target, seqs, tmp_path_factory.mktemp("data"), top_k=8, chunk_size=5,
                                progress=False)


def test_drafted_rows_head_equals_the_whole_head_with_those_rows() -> None:
    torch.manual_seed(0)
    base, ids = torch.randn(50, 8), torch.tensor([3, 7, 1])
    head = ts.DraftedRows(base, base[ids] + 1, ids, "32")
    whole = base.index_copy(0, ids, base[ids] + 1).requires_grad_()
    x = torch.randn(4, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    head(x).square().sum().backward()
    (x2 @ whole.T).square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)
    assert torch.allclose(head.rows.grad, whole.grad[ids], atol=1e-5)
    assert [name for name, _ in head.named_parameters()] == ["rows"]  # no gradient, no optimizer state else
    fast = ts.DraftedRows(base, base[ids] + 1, ids)  # mixed precision (the default): frozen rows in bf16
    assert fast.base.weight.dtype == torch.bfloat16 and fast(x).dtype == torch.float32
    torch.testing.assert_close(fast(x), x @ whole.T, rtol=0.02, atol=0.05)
    torch.testing.assert_close(fast(x)[:, ids], x @ whole[ids].T)  # the trained rows in float32


def test_training_moves_only_the_drafted_rows(target: Transformer, data, tmp_path) -> None:
    config = ts.SpecBlockTrainConfig(steps=3, batch_size=4, starts=6, lr=1e-2, draft_vocab=DRAFTED,
                                     checkpoint_every=3)
    ts.train_specblock(target, data, tmp_path / "out", tmp_path / "run", config=config, progress=False)
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))["lm_head.weight"]  # the whole head
    ids = frequent_targets(data, DRAFTED, target.args.vocab_size)
    others = torch.ones(target.args.vocab_size, dtype=torch.bool)
    others[ids] = False
    assert torch.equal(trained[others], target.lm_head.weight.detach()[others])
    assert not torch.allclose(trained[ids], target.lm_head.weight.detach()[ids])
    saved = load_specblock(tmp_path / "out", target)  # the deployed head is the one trained
    assert torch.allclose(saved.lm_head.weight.float(), trained, atol=1e-2)


def test_resume_with_a_drafting_vocabulary_continues_exactly(target: Transformer, data, tmp_path) -> None:
    config = ts.SpecBlockTrainConfig(steps=6, batch_size=4, starts=6, lr=3e-3, draft_vocab=DRAFTED,
                                     checkpoint_every=3)
    whole = ts.train_specblock(target, data, tmp_path / "whole", tmp_path / "rwhole", config=config,
                               progress=False)
    ts.train_specblock(target, data, tmp_path / "cut", tmp_path / "rcut", config=config, progress=False,
                       minutes=1e-9)  # stops after its first step, checkpointed
    resumed = ts.train_specblock(target, data, tmp_path / "cut", tmp_path / "rcut", config=config,
                                 resume=True, progress=False)
    assert resumed["losses"] == whole["losses"]


def test_mixed_precision_is_the_recipes_and_float32_stays(target: Transformer, data, tmp_path) -> None:
    losses = {}
    for precision in ("32", "bf16-mixed"):
        config = ts.SpecBlockTrainConfig(steps=1, batch_size=4, starts=6, draft_vocab=DRAFTED,
                                         precision=precision)
        record = ts.train_specblock(target, data, tmp_path / precision, tmp_path / f"r{precision}",
                                    config=config, progress=False)
        losses[precision] = record["losses"][0][1]
    assert ts.SpecBlockTrainConfig().precision == "bf16-mixed"
    assert losses["32"] != losses["bf16-mixed"]  # the products ran in bfloat16
    assert losses["bf16-mixed"] == pytest.approx(losses["32"], rel=0.05)
    with pytest.raises(InputError, match="precision"):
        ts.SpecBlockTrainConfig(precision="16")
