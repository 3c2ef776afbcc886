"""SpecBlock's rank head in drafting: the starts it chooses, its calibrated bucket offsets, and the
calibration that picks them on held-out windows (``training.rank_calibration``)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from core.errors import InputError
from real_engine.drafters import rank
from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter, load_specblock, save_specblock
from real_engine.model import Transformer
from real_engine.training import rank_calibration as rc
from real_engine.training.drafter_data import prepare_drafter_data
from real_engine.warp import Sampling


def test_the_rank_head_chooses_the_next_blocks_starts() -> None:
    """A node's belief is the product over its path of its slot's bucket probability shared over that
    bucket's ranks; block starts go to the leaves the rank head believes in, not the likeliest ones."""
    assert rank.rank_belief(1, [0.5, 0.3, 0.12, 0.08]) == 0.5
    assert rank.rank_belief(3, [0.5, 0.3, 0.12, 0.08]) == pytest.approx(0.1)
    assert rank.rank_belief(7, [0.5, 0.3, 0.12, 0.08]) == pytest.approx(0.02)
    assert rank.rank_belief(11, [0.5, 0.3, 0.12, 0.08]) == 0.0
    tree = rank.BucketTree(root=99, max_depth=16)
    top_logp = [[-0.1, -3.0, -3.5, -4.0], [-0.05, -5.0, -6.0, -7.0]]
    top_ids = [[1, 2, 3, 4], [5, 6, 7, 8]]
    created = tree.extend(0, [0, 1], [1, 0], top_logp, top_ids, [[0.1, 0.9, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # root -> 4 children (slot 0 says ranks 2-4 are likely); the chain goes on from the first
    assert tree.beliefs == pytest.approx([1.0, 0.1, 0.3, 0.3, 0.3, 0.1])
    leaves = [n for n in created if n not in tree.expanded_by]
    assert max(leaves, key=lambda n: tree.scores[n]) == 5  # the chain's end is the likeliest leaf ...
    assert tree.starts(created, 2) == [2, 3]  # ... but the side branches get the next blocks


def test_calibrated_bucket_offsets_move_the_rank_heads_choice(target: Transformer) -> None:
    """``bucket_bias`` is added to the rank head's scores in drafting only: a large give-up offset stops
    every chain at the root; a bias of the wrong length is refused."""
    seq = torch.randint(0, target.args.vocab_size, (12,), generator=torch.Generator().manual_seed(7))
    net = SpecBlock.for_target(target, seed=1).eval()
    with torch.no_grad():  # the head alone would branch (bucket 1) at every slot
        net.rank_head.down.bias.copy_(torch.tensor([0.0, 20.0, 0.0, -20.0]))
    net.config = dataclasses.replace(net.config, bucket_bias=(0.0, 0.0, 0.0, 50.0))
    drafter = SpecBlockDrafter(net, blocks=2, starts=2, budget=16)
    drafter.begin(seq, target(seq[None, :-1]), Sampling(), torch.Generator(), 64)
    assert drafter.propose(8).size == 1
    with torch.no_grad():
        hidden = torch.randn(3, net.config.hidden_size)
        assert torch.equal(net.heads(hidden).buckets.argmax(-1), torch.ones(3, dtype=torch.long))
    with pytest.raises(InputError, match="one offset per rank bucket"):
        dataclasses.replace(net.config, bucket_bias=(1.0, 2.0))


def test_bucket_report_and_the_offset_search() -> None:
    """Precision, recall and F1 per bucket from a confusion matrix, exactly; on scores that under-rate
    bucket 2 by a constant, the search finds offsets that recover it and raise the macro F1."""
    report = rc.bucket_report(np.array([[8, 2, 0, 0], [1, 3, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]]))
    assert report["precision"] == [pytest.approx(8 / 9, abs=1e-4), 0.5, 0.0, 1.0]
    assert report["recall"] == [0.8, 0.75, 0.0, 0.5] and report["support"] == [10, 4, 0, 2]
    assert report["macro_f1"] == pytest.approx(np.mean([2 * (8 / 9) * 0.8 / (8 / 9 + 0.8), 0.6,
                                                        2 / 3]), abs=1e-4)  # bucket 2 has no support
    rng = np.random.default_rng(0)
    labels = rng.choice(4, size=4000, p=[0.7, 0.15, 0.1, 0.05])
    scores = np.eye(4)[labels] * 2.0 + rng.normal(0, 0.5, size=(4000, 4))
    scores[:, 2] -= 3.0  # hardly ever predicted as it stands
    before = rc.bucket_report(rc.confusion(scores, labels, np.zeros(4)))
    bias = rc.fit_bias(scores, labels)
    after = rc.bucket_report(rc.confusion(scores, labels, bias))
    assert before["predicted"][2] < 10 and after["predicted"][2] > 300 and bias[0] == 0
    assert after["macro_f1"] > before["macro_f1"] + 0.2 and after["recall"][2] > 0.8


def test_calibration_saves_offsets_chosen_on_one_half_and_reports_the_other(target: Transformer,
                                                                            tmp_path) -> None:
    seqs = torch.randint(0, target.args.vocab_size, (6, 20), generator=torch.Generator().manual_seed(1))
    held = prepare_drafter_data(target, seqs, tmp_path / "held", top_k=8, chunk_size=3, progress=False)
    save_specblock(SpecBlock.for_target(target, seed=3), tmp_path / "sb", dtype=torch.float32)
    record = rc.calibrate_specblock(target, tmp_path / "sb", held)
    saved = json.loads((tmp_path / "sb" / "config.json").read_text())
    assert saved["bucket_bias"] == record["bucket_bias"] and len(record["bucket_bias"]) == 4
    assert record["windows"] == {"fit": 3, "report": 3} and record["rows"]["report"] > 0
    for key in ("without", "with"):
        assert np.array(record[key]["confusion"]).sum() == record["rows"]["report"]
    assert load_specblock(tmp_path / "sb", target).config.bucket_bias == tuple(record["bucket_bias"])
