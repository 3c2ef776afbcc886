"""`specblock shapes`: the round-robin sweep of drafter shapes, the deployed shape that `make_drafter`
then uses, and one-line input errors. Tiny random models, CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.errors import InputError
from experiments.cli import main
from experiments.specbench.shapes import markdown, sweep
from real_engine.decode import make_drafter
from real_engine.drafters.specblock import SpecBlock, save_specblock
from real_engine.drafters.trained import deployed_shape, write_shape
from real_engine.model import load_model
from real_engine.packed import run_dtype


@pytest.fixture
def specblock_dir(tmp_path: Path, llama_dir: Path) -> Path:
    target = load_model(llama_dir)
    return save_specblock(SpecBlock.for_target(target, seed=0), tmp_path / "drafters" / "specblock",
                          dtype=torch.float32)


def test_every_shape_is_measured_against_vanilla_and_ranked(llama_dir: Path, specblock_dir: Path) -> None:
    target = load_model(llama_dir)
    grid = {"specblock": ({"blocks": 1, "budget": 4}, {"blocks": 2, "budget": 12})}
    prompts = [[5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10]]
    with torch.inference_mode():
        result = sweep(target, prompts, {"specblock": specblock_dir}, grid, max_new_tokens=10, progress=False)
    rows = result["drafters"]["specblock"]
    measured = sorted(tuple(r["shape"].items()) for r in rows)
    assert measured == sorted(tuple(s.items()) for s in grid["specblock"])
    assert [r["speedup"] for r in rows] == sorted((r["speedup"] for r in rows), reverse=True)
    for row in rows:
        assert row["tau"] >= 1
        assert row["pooled_speedup"] == pytest.approx(row["tokens_per_second"]
                                                      / result["vanilla_tokens_per_second"])
        low, high = row["speedup_quartiles"]  # the speedup is the median of per-prompt time ratios
        assert 0 < low <= row["speedup"] <= high
        assert row["same_as_vanilla"] == 1.0  # float32: any change would have stopped the sweep
    report = markdown(result, {"prompts": 1, "domains": ["code"], "max_new_tokens": 10, "dtype": "float32"})
    assert "(best)" in report and report.count("| blocks=") == 2 and "| 100% |" in report


def test_a_16_bit_target_counts_identical_outputs_instead_of_stopping(llama_dir: Path,
                                                                      specblock_dir: Path) -> None:
    """In bfloat16 a many-token verify and a one-token step round differently: the sweep reports each
    shape's share of outputs equal to vanilla's rather than calling a difference a bug."""
    target = load_model(llama_dir, torch.bfloat16)
    grid = {"specblock": ({"blocks": 1, "budget": 4},)}
    with torch.inference_mode():
        result = sweep(target, [[5, 6, 7, 8, 5, 6]], {"specblock": specblock_dir}, grid, max_new_tokens=10,
                       progress=False)
    assert 0.0 <= result["drafters"]["specblock"][0]["same_as_vanilla"] <= 1.0


def test_the_deployed_shape_is_the_default_and_options_override_it(llama_dir: Path,
                                                                   specblock_dir: Path) -> None:
    target = load_model(llama_dir)
    assert deployed_shape("specblock", specblock_dir) == {}
    assert make_drafter("specblock", target, folder=specblock_dir).blocks == 2  # the trained default
    write_shape("specblock", specblock_dir, {"blocks": 1, "budget": 8}, {"speedup": 1.1})
    drafter = make_drafter("specblock", target, folder=specblock_dir)
    assert (drafter.blocks, drafter.budget) == (1, 8)
    assert make_drafter("specblock", target, folder=specblock_dir, blocks=3).blocks == 3
    assert make_drafter("specblock", target, folder=specblock_dir, deployed=False).blocks == 2
    with pytest.raises(InputError, match="no shape option"):
        write_shape("specblock", specblock_dir, {"depth": 3}, {})
    for bad in ('{"shape": {"blocks": 0}}', '{"shape": {"depth": 2}}', "{", '{"blocks": 1}'):
        (specblock_dir / "drafting.json").write_text(bad)
        with pytest.raises(InputError, match=r"drafting\.json"):
            make_drafter("specblock", target, folder=specblock_dir)


@pytest.mark.parametrize(("args", "needle"), [
    (["--drafters", "none"], "no shapes to tune for 'none'"),
    (["--prompts", "0"], "--prompts 0 is invalid"),
    (["--drafters", "eagle"], "no trained eagle drafter"),
    (["--drafters", "draft-model"], "no draft model in"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], needle: str, llama_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["shapes", "--model", str(llama_dir), "--drafters-dir", str(tmp_path), "--out", str(tmp_path),
              *args])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and needle in err and len(err.splitlines()) == 1
    assert not list(tmp_path.glob("*.json"))


def test_the_draft_model_is_swept_and_deployed_from_its_folder(llama_dir: Path, tmp_path: Path) -> None:
    target = load_model(llama_dir)  # the tiny target drafts for itself: every shape is lossless
    grid = {"draft-model": ({"depth": 1, "width": 1}, {"depth": 2, "width": 2, "budget": 4})}
    with torch.inference_mode():
        result = sweep(target, [[5, 6, 7, 8, 5, 6]], {"draft-model": llama_dir}, grid, max_new_tokens=8,
                       progress=False, draft=target)
    assert sorted(r["shape"]["depth"] for r in result["drafters"]["draft-model"]) == [1, 2]
    folder = tmp_path / "draft"
    folder.mkdir()
    assert make_drafter("draft-model", target, target, folder=folder).depth == 4  # nothing deployed
    write_shape("draft-model", folder, {"depth": 2, "width": 2, "budget": 4}, {"speedup": 1.0})
    drafter = make_drafter("draft-model", target, target, folder=folder)
    assert (drafter.shape, drafter.depth, drafter.width, drafter.budget) == ("tree", 2, 2, 4)
    assert make_drafter("draft-model", target, target, folder=folder, width=1).shape == "chain"
    assert make_drafter("draft-model", target, target, folder=folder, deployed=False).shape == "chain"
    assert make_drafter("draft-model", target, target).shape == "chain"  # no folder: no deployed shape
    write_shape("draft-model", folder, {"depth": 6, "width": 1, "min_confidence": 0.7}, {"speedup": 1.0})
    drafter = make_drafter("draft-model", target, target, folder=folder)
    assert (drafter.shape, drafter.depth, drafter.min_confidence) == ("chain", 6, 0.7)
    assert make_drafter("draft-model", target, target, folder=folder, min_confidence=0).min_confidence == 0
    for bad in (1.5, -0.1, True, "0.5"):
        (folder / "drafting.json").write_text(json.dumps({"shape": {"depth": 2, "min_confidence": bad}}))
        with pytest.raises(InputError, match=r"drafting\.json"):
            make_drafter("draft-model", target, target, folder=folder)


def test_the_ngram_lookup_is_swept_and_deployed_without_weights(llama_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = load_model(llama_dir)
    folder = tmp_path / "drafters" / "ngram"
    plain = make_drafter("ngram", target, folder=folder)  # nothing deployed: the defaults
    assert (plain.depth, plain.max_ngram) == (4, 3)
    main(["shapes", "--model", str(llama_dir), "--drafters", "ngram", "--drafters-dir", str(folder.parent),
          "--out", str(tmp_path), "--prompts", "1", "--rounds", "1", "--max-new-tokens", "4", "--apply",
          "--json"])
    result = json.loads(capsys.readouterr().out)
    best = result["drafters"]["ngram"][0]["shape"]
    assert len(result["drafters"]["ngram"]) == 15 and deployed_shape("ngram", folder) == best
    drafter = make_drafter("ngram", target, folder=folder)
    assert (drafter.depth, drafter.max_ngram) == (best["depth"], best["max_ngram"])
    assert make_drafter("ngram", target, folder=folder, depth=5).depth == 5  # an option overrides it
    assert make_drafter("ngram", target, folder=folder, deployed=False).depth == 4


def test_shapes_timed_in_another_dtype_deploy_for_runs_in_it_alone(
        llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step's cost by rows differs by dtype, so does the fastest shape: `shapes --dtype D --apply` (D not
    the model's own) saves drafting-D.json, which a run in D reads before drafting.json, and no other."""
    folder = tmp_path / "drafters" / "ngram"
    write_shape("ngram", folder, {"depth": 2, "max_ngram": 2}, {"speedup": 1.0})  # the model's own dtype's
    main(["shapes", "--model", str(llama_dir), "--drafters", "ngram", "--drafters-dir", str(folder.parent),
          "--out", str(tmp_path), "--prompts", "1", "--rounds", "1", "--max-new-tokens", "4", "--apply",
          "--dtype", "bfloat16"])
    assert "-> drafting-bfloat16.json" in capsys.readouterr().out
    assert json.loads((folder / "drafting.json").read_text())["shape"] == {"depth": 2, "max_ngram": 2}
    write_shape("ngram", folder, {"depth": 7, "max_ngram": 1}, {"speedup": 1.0}, "bfloat16")  # a known one
    assert deployed_shape("ngram", folder, "bfloat16") == {"depth": 7, "max_ngram": 1}
    assert deployed_shape("ngram", folder, "int4") == deployed_shape("ngram", folder) == {"depth": 2,
                                                                                          "max_ngram": 2}
    for dtype, depth in (("float32", 2), ("bfloat16", 7), ("int4", 2)):  # int4: no shape of its own yet
        target = load_model(llama_dir, dtype)
        assert run_dtype(target) == dtype
        assert make_drafter("ngram", target, folder=folder).depth == depth


def test_a_deployed_specblock_chain_is_sampled_and_block_verified_at_temperature_one(
        llama_dir: Path, specblock_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["generate", "--model", str(llama_dir), "--drafter", "specblock", "--drafter-model",
            str(specblock_dir), "--prompt", "abcab", "--max-new-tokens", "6", "--temperature", "1", "--json"]

    def verifier(*extra: str) -> str | int:
        try:
            main([*base, *extra])
        except SystemExit as exc:
            return exc.code
        return json.loads(capsys.readouterr().out)["verifier"]

    assert verifier() == "rrs"  # the trained top-k tree
    assert verifier("--verifier", "block") == 2 and "--tree-width 1" in capsys.readouterr().err
    assert verifier("--tree-width", "1") == "block"  # a chain: sampled, so block verification applies
    write_shape("specblock", specblock_dir, {"blocks": 1, "width": 1, "budget": 4}, {"speedup": 1.0})
    assert verifier() == "block" and verifier("--verifier", "token") == "token"
    drafter = make_drafter("specblock", load_model(llama_dir), folder=specblock_dir)
    assert drafter.children == (1, 1, 1, 0) and drafter.budget == 4
