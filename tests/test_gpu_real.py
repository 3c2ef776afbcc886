"""The GPU check's real-model preparation, on a CPU: a GGUF cut into parts a device run can carry, joined
and checked there, converted, decoded with every drafter trained for it, and profiled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_gguf import checkpoint

from core.cost_profile import load_profile
from core.errors import InputError
from experiments import gpu_check
from experiments.gpu_real import join_parts, real_checkpoint, split_file
from real_engine.gguf import export_gguf


def test_parts_join_into_the_file_and_a_bad_part_writes_nothing(tmp_path: Path) -> None:
    original = tmp_path / "model.gguf"
    original.write_bytes(bytes(range(256)) * 40 + b"tail")
    manifest = split_file(original, tmp_path / "parts", part_bytes=1000)
    parts = sorted((tmp_path / "parts").glob("model.gguf.part[0-9]*"))
    assert len(parts) == 11 and all(p.stat().st_size <= 1000 for p in parts)
    joined = join_parts(manifest, tmp_path / "device")
    assert joined.read_bytes() == original.read_bytes()
    parts[3].write_bytes(parts[3].read_bytes()[::-1])  # same size, other bytes
    with pytest.raises(InputError, match="part03 is corrupt"):
        join_parts(manifest, tmp_path / "again")
    parts[3].unlink()
    with pytest.raises(InputError, match="carry every part"):
        join_parts(manifest, tmp_path / "again")
    assert not (tmp_path / "again").exists() or not any((tmp_path / "again").iterdir())
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "bytes": data["bytes"] + 1}))
    with pytest.raises(InputError, match="not a parts manifest"):
        join_parts(manifest, tmp_path / "again")
    with pytest.raises(InputError, match="give a checkpoint folder"):
        real_checkpoint(original.with_suffix(".bin"), tmp_path / "model")


def test_the_real_model_section_converts_decodes_and_profiles(tmp_path: Path) -> None:
    source = checkpoint(tmp_path / "src")
    manifest = split_file(export_gguf(source, tmp_path / "model.gguf"), tmp_path / "carried", 200_000)
    drafters = tmp_path / "drafters"  # none trained: vanilla and n-gram decode, random drafters are timed
    drafters.mkdir()
    found = gpu_check.real_model(torch.device("cpu"), gpu_check.REAL_TINY, manifest, drafters,
                                 tmp_path / "device" / "smollm2-135m", seed=0)
    assert (tmp_path / "device" / "smollm2-135m" / "config.json").is_file()
    decoding = found["decoding"]
    assert [c["name"] for c in decoding["configs"]] == ["vanilla", "ngram"] and decoding["all_equal"]
    assert set(decoding["skipped"]) == set(gpu_check.REAL_DRAFTERS) - {"ngram"}
    assert "random weights" in found["profile"]["models"]["drafters"]["specblock"]
    (tmp_path / "profile.json").write_text(json.dumps(found["profile"]))
    profile = load_profile(tmp_path / "profile.json")
    assert {"specblock", "eagle"} <= set(profile.drafters)
    again = real_checkpoint(manifest, tmp_path / "device" / "smollm2-135m")  # converted once, then reused
    assert again == tmp_path / "device" / "smollm2-135m"
