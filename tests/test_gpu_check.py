"""The GPU check runs end to end with only torch, numpy and safetensors importable (tiny CPU mode).

A fresh interpreter marks every package the GPU machine lacks as absent (``None`` in ``sys.modules``:
imports fail and ``importlib.util.find_spec`` finds nothing, which torch's own optional probes
expect; a ``sys.meta_path`` finder that raises breaks those probes), then runs
``python -m experiments.gpu_check --device cpu --tiny``; the profile it writes must load with
``core.cost_profile`` here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from time_limits import limit

from core.cost_profile import load_profile
from core.paths import REPO, TARGET
from experiments import gpu_check
from real_engine.decode import GREEDY, prefill, speculative_step
from real_engine.tree import DraftTree
from real_engine.verify import TorchSampler

BLOCKED = ("pandas", "cvxpy", "gymnasium", "ray", "click", "tqdm", "pyarrow", "scipy", "tokenizers", "rich",
           "matplotlib", "transformers", "clarabel", "highspy")
GUARD = f"""
import runpy, sys
BLOCKED = {BLOCKED!r}
assert not set(BLOCKED) & {{m.split(".")[0] for m in sys.modules}}
sys.modules.update(dict.fromkeys(BLOCKED))  # None: imports fail and find_spec says absent, as if uninstalled
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def guarded(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` in a fresh interpreter where the blocked packages are absent."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("OUT", None)
    return subprocess.run([sys.executable, "-c", GUARD, module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=limit(300))


def test_the_guard_catches_an_indirect_import() -> None:
    run = guarded("simulator.traces")  # the simulator package pulls in gymnasium
    assert run.returncode != 0 and "ModuleNotFoundError: import of gymnasium halted" in run.stderr


def test_the_cost_profile_schema_needs_no_simulator() -> None:
    run = guarded("core.cost_profile")  # the engine reads profiles without gymnasium, ray or pandas
    assert run.returncode == 0, run.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("gpu_check")
    return out, guarded("experiments.gpu_check", "--device", "cpu", "--tiny", "--out", str(out))


def test_tiny_check_runs_without_the_missing_packages(tiny_run) -> None:
    out, run = tiny_run
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())["results"]
    assert results["errors"] == {} and results["environment"]["cuda_available"] is False
    assert results["overlap"] == {"skipped": "CUDA streams need a GPU"}
    if (TARGET / "config.json").is_file():
        shipped = results["shipped"]
        assert shipped["all_equal"] and shipped["skipped"] == {}  # every drafter decodes vanilla's tokens
        assert [c["name"] for c in shipped["configs"]] == ["vanilla", *gpu_check.SHIPPED_DRAFTERS]


def test_the_written_profile_loads_with_the_simulator(tiny_run) -> None:
    out, run = tiny_run
    assert run.returncode == 0, run.stderr[-3000:]
    [path] = out.glob("*_tiny_check.json")
    profile = load_profile(path)
    grid = gpu_check.TINY.grid
    assert profile.fits["verify"].axes[0].tolist() == list(grid.nodes)
    assert profile.fits["verify"].axes[1].tolist() == list(grid.contexts)
    assert profile.fits["draft"]["specblock"].axes[1].tolist() == list(grid.specblock_blocks)
    assert profile.fits["draft"]["eagle"].axes[0].tolist() == list(grid.eagle_depths)
    assert profile.draft_shapes["eagle"] == {"top_k": gpu_check.TINY.eagle.top_k,
                                             "total_tokens": gpu_check.TINY.eagle.total_tokens}
    assert profile.update_seconds("full") > 0 and profile.block_size == 4
    assert profile.step_seconds("specblock", range(9), 24.0).shape == (9,)


def test_tiny_mode_needs_an_output_folder(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(["--device", "cpu", "--tiny"])
    assert exit_info.value.code == 2 and "--out" in capsys.readouterr().err


def test_overlap_jobs_verify_as_the_decode_loop_and_update_the_drafter() -> None:
    plan = gpu_check.TINY
    target, specblock, _ = gpu_check.random_target(plan, torch.device("cpu"), torch.float32, seed=0)
    verify, update = gpu_check.overlap_jobs(plan, target, specblock, seed=0)
    first = verify()
    assert verify() == first  # the cache is back at the context after every step
    context = plan.grid.contexts[-1]
    gen = torch.Generator().manual_seed(0)  # the same draws as overlap_jobs
    tree = DraftTree.chain(1, torch.randint(1, plan.args.vocab_size, (min(32, max(plan.grid.nodes)) - 1,),
                                            generator=gen))
    cache = target.new_cache(context + 600)
    with torch.inference_mode():
        prefill(target, cache, torch.randint(1, plan.args.vocab_size, (context,), generator=gen))
        _, path, token, _ = speculative_step(target, cache, tree, "greedy", GREEDY, TorchSampler())
    assert (path, token) == first
    before = [p.detach().clone() for p in specblock.parameters()]
    losses = [float(update()) for _ in range(2)]
    assert all(np.isfinite(losses))
    assert all(torch.equal(a, b) for a, b in zip(before, specblock.parameters(), strict=True))  # a copy
