"""Edges of `specblock pipeline`: one writer per run folder, unwritable --out, a corrupt run.json, and the
age of the cost profile a resumed run reuses. No model is loaded: the steps are faked where they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from time_limits import limit

from core.errors import InputError
from core.paths import REPO
from experiments.folders import LOCK, PROFILE_MAX_AGE_HOURS, hold
from experiments.pipeline import run as pipeline
from experiments.pipeline.deploy import against_best_fixed
from experiments.pipeline.run import QUICK, STEPS, run_pipeline

DEPLOY = {"policies": {}, "fidelity_error": 0.1, "fidelity_error_ci": [0.05, 0.2], "worst_error": 0.3,
          "rank_agreement": {}, "against_best_fixed": {}}


def specblock(*args: str) -> subprocess.CompletedProcess:
    """The command line, in this interpreter (a hang fails the test at its time limit)."""
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], capture_output=True, text=True,
                          timeout=limit(150), cwd=REPO)


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.fixture
def models(tmp_path: Path) -> list[str]:
    """``--model`` and ``--draft-model`` options naming folders that pass the model check."""
    for name in ("target", "draft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    return ["--model", str(tmp_path / "target"), "--draft-model", str(tmp_path / "draft")]


def finished_run(out: Path, profile_hours: float | None, dated: bool = True) -> None:
    """A run folder whose every step is recorded, its cost profile measured ``profile_hours`` ago."""
    out.mkdir()
    steps = {name: {"seconds": 1.0, "summary": {}} for name in STEPS}
    (out / "run.json").write_text(json.dumps({"plan": asdict(QUICK), "steps": steps}))
    (out / "deploy.json").write_text(json.dumps(DEPLOY))
    if profile_hours is None:
        return
    taken = datetime.now(timezone.utc) - timedelta(hours=profile_hours)
    profile = out / "cost_profile.json"
    profile.write_text(json.dumps({"schema": 1, **({"measurement": {"date": taken.isoformat()}} if dated
                                                    else {})}))
    os.utime(profile, (taken.timestamp(), taken.timestamp()))


def fake_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace every step by one that records its name (the profile step writes a profile dated now)."""
    ran: list[str] = []

    def step(name: str):
        def run(run: pipeline.Run) -> dict:
            ran.append(name)
            if name == "profile":
                now = datetime.now(timezone.utc).isoformat()
                run.path("cost_profile.json").write_text(json.dumps({"measurement": {"date": now}}))
            if name == "deploy":
                run.path("deploy.json").write_text(json.dumps(DEPLOY))
            return {"fake": name}
        return run

    for name in STEPS:
        monkeypatch.setitem(pipeline.STEP_FUNCTIONS, name, step(name))
    return ran


def resume(out: Path, tmp_path: Path, log: list[str]) -> dict:
    return run_pipeline(out, QUICK, resume=True, model_dir=tmp_path / "target", draft_dir=tmp_path / "draft",
                        log=log.append)


def test_a_fresh_profile_is_reused_and_its_age_stated(tmp_path: Path, models: list[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out, log = tmp_path / "run", []
    finished_run(out, 1.0)
    ran = fake_steps(monkeypatch)
    before = (out / "run.json").read_text()
    summary = resume(out, tmp_path, log)
    assert ran == [] and (out / "run.json").read_text() == before
    assert summary["profile_reused"] is True
    assert summary["profile_age_hours"] == pytest.approx(1.0, abs=0.05)
    assert any("reusing cost_profile.json, measured 1.0 h ago" in line for line in log), log
    assert not (out / LOCK).exists()


@pytest.mark.parametrize("dated", [True, False])  # the measurement date, else the file's time
def test_a_stale_profile_is_measured_again_with_the_steps_that_read_it(
        dated: bool, tmp_path: Path, models: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out, log = tmp_path / "run", []
    finished_run(out, PROFILE_MAX_AGE_HOURS + 4, dated)
    ran = fake_steps(monkeypatch)
    summary = resume(out, tmp_path, log)
    assert ran == ["profile", "simulate", "tune", "deploy", "report"]  # models and traces kept
    assert summary["profile_reused"] is False and summary["profile_age_hours"] < 0.1
    assert any("measured 10.0 h ago, over the 6 h limit" in line for line in log), log
    steps = json.loads((out / "run.json").read_text())["steps"]
    assert set(steps) == set(STEPS) and steps["profile"]["summary"] == {"fake": "profile"}


def test_a_missing_profile_is_measured_again(tmp_path: Path, models: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out, log = tmp_path / "run", []
    finished_run(out, None)
    ran = fake_steps(monkeypatch)
    resume(out, tmp_path, log)
    assert ran[0] == "profile" and any("is missing" in line for line in log), log


@pytest.mark.parametrize("text", [
    "{not json",
    "[1, 2]",
    json.dumps({"plan": asdict(QUICK)}),
    json.dumps({"plan": asdict(QUICK), "steps": ["models"]}),
    json.dumps({"plan": asdict(QUICK), "steps": {"bogus": {"seconds": 1}}}),
    json.dumps({"plan": asdict(QUICK), "steps": {"models": {"seconds": "soon"}}}),
])
def test_a_corrupt_run_record_is_one_line(text: str, tmp_path: Path, models: list[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(text)
    proc = specblock("pipeline", "--quick", "--resume", "--out", str(out), *models)
    assert_one_line_exit_2(proc, "pipeline run record", "choose another --out")


def test_a_held_run_folder_refuses_a_second_writer(tmp_path: Path, models: list[str]) -> None:
    out = tmp_path / "run"
    with hold(out):
        proc = specblock("pipeline", "--quick", "--out", str(out), *models)
    assert_one_line_exit_2(proc, "in use by process", str(os.getpid()), "choose another --out")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_an_out_that_cannot_be_a_folder_is_one_line(where: str, tmp_path: Path, models: list[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker if where == "file" else blocker / "run"
    proc = specblock("pipeline", "--quick", "--out", str(out), *models)
    assert_one_line_exit_2(proc, str(blocker), "choose a folder")


def test_a_read_only_parent_is_refused_before_any_work(tmp_path: Path, models: list[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # As root a chmod'ed folder stays writable, so the permission check itself is made to say no.
    monkeypatch.setattr("experiments.folders.os.access", lambda path, mode: False)
    ran = fake_steps(monkeypatch)
    with pytest.raises(InputError, match="not writable"):
        run_pipeline(tmp_path / "run", QUICK, model_dir=tmp_path / "target", draft_dir=tmp_path / "draft")
    assert ran == [] and not (tmp_path / "run").exists()


def test_a_bad_address_fails_before_any_step(tmp_path: Path, models: list[str]) -> None:
    proc = specblock("pipeline", "--quick", "--out", str(tmp_path / "run"), "--address", "nowhere", *models)
    assert_one_line_exit_2(proc, "ray start --head")
    assert not (tmp_path / "run").exists()


def test_every_step_loads_the_models_in_the_models_own_dtype(tmp_path: Path) -> None:
    import dataclasses

    import torch

    from core.models import TOY

    half = dataclasses.replace(TOY, dtype="bfloat16")  # as SmolLM2 is declared
    run = pipeline.Run(tmp_path, QUICK, TOY.target, TOY.draft_model, model=half)
    loaded = run.models()
    assert loaded["target"].lm_head.weight.dtype is torch.bfloat16
    assert loaded["draft"].lm_head.weight.dtype is torch.bfloat16


def test_the_quick_plan_serves_no_adaptation_stream_and_says_where_one_is(tmp_path: Path) -> None:
    from core.models import TOY

    run = pipeline.Run(tmp_path, QUICK, TOY.target, TOY.draft_model, model=TOY)
    note = pipeline._adaptation(run)
    assert list(note) == ["skipped"] and "specblock adapt-live --quick --model toy-16m" in note["skipped"]
    assert not any(tmp_path.iterdir())  # nothing served, nothing written


def test_pipeline_runs_passes_the_model_to_each_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import pipeline_runs

    seen = []

    def fake(argv: list[str], **_: object) -> subprocess.CompletedProcess:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout='{"x": 1}', stderr="")

    monkeypatch.setattr(pipeline_runs.subprocess, "run", fake)
    assert pipeline_runs.run_once(tmp_path / "r", False, "smollm2-135m") == {"x": 1}
    argv = seen[0]
    assert argv[argv.index("--model") + 1] == "smollm2-135m" and "--quick" in argv and "--resume" not in argv
    pipeline_runs.run_once(tmp_path / "r", True, "smollm2-135m", resume=True)
    assert "--resume" in seen[1] and "--quick" not in seen[1]


def test_not_drafting_counts_as_the_fixed_length_0() -> None:
    """Where vanilla beats every fixed length the adaptive policies are held to it (a fixed policy of
    length 0 decodes alike but pays for its decisions); vanilla itself is no adaptive policy."""
    speeds = {"vanilla": 64.0, "tuned-fixed": 61.0, "fixed-2": 52.0, "tuned-threshold": 60.0}
    rows = {n: {"measured_tokens_per_second": v} for n, v in speeds.items()}
    boot = {n: np.full(8, v) for n, v in speeds.items()}
    kinds = {"tuned-fixed": "fixed", "fixed-2": "fixed", "tuned-threshold": "threshold"}
    against = against_best_fixed(rows, boot, kinds)
    assert against["best_fixed"] == "vanilla" and list(against["policies"]) == ["tuned-threshold"]
    assert against["policies"]["tuned-threshold"]["ratio"] == pytest.approx(60 / 64)
    faster = {**rows, "fixed-2": {"measured_tokens_per_second": 70.0}}
    assert against_best_fixed(faster, {**boot, "fixed-2": np.full(8, 70.0)}, kinds)["best_fixed"] == "fixed-2"


def test_the_pipeline_drafts_over_the_draft_models_deployed_vocabulary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import torch

    from core.models import TOY
    from real_engine.drafters.trained import write_shape

    folder = tmp_path / "draft"
    shutil.copytree(TOY.draft_model, folder)
    assert pipeline.Run(tmp_path, QUICK, TOY.target, folder, model=TOY).drafter().vocab is None
    write_shape("draft-model", folder, {"depth": 8, "width": 1, "staged": 1, "lookup": 3, "vocab": 64},
                {"source": "a test"})
    run = pipeline.Run(tmp_path, QUICK, TOY.target, folder, model=TOY)
    drafter = run.drafter()
    assert drafter.vocab.numel() == 64  # the deployed vocabulary
    assert (drafter.depth, drafter.staged, drafter.lookup) == (QUICK.depth, 0, 0)  # policies set the chain

    class Timed(Exception):
        pass

    def measure(*_: object, draft_vocab: object = None, **__: object) -> None:
        raise Timed(draft_vocab)

    monkeypatch.setattr(pipeline.prof, "measure", measure)
    with pytest.raises(Timed) as timed:  # the profile times the chain the steps draft
        pipeline._measure_profile(run, tmp_path / "profile.json")
    assert torch.equal(timed.value.args[0], drafter.vocab)
