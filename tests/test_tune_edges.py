"""Edges of `specblock tune`: a bad --address fails fast, resume reads only JSON records, one writer per
study folder, unwritable --out, and a --samples cap."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
from time_limits import limit

from core.errors import InputError
from core.paths import PAPER_PROFILE, REPO
from experiments.folders import LOCK, hold
from experiments.tuning.tune import MAX_SAMPLES, TRIALS, Traffic, make_setting, tune_policies

SETTING = make_setting("length", PAPER_PROFILE, queries=16, chunks=2, traffic=Traffic())
KINDS = ("threshold", "fixed")
SMALL = ["length", "--samples", "2", "--queries", "8", "--chunks", "1", "--profile", str(PAPER_PROFILE)]


def specblock(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The command line in this interpreter (a hang fails the test at its time limit)."""
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], capture_output=True, text=True,
                          timeout=limit(150), cwd=REPO, env=env)


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Marker:
    """Unpickling this creates the folder ``path``: proof that a file was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return os.mkdir, (str(self.path),)


@pytest.mark.parametrize("address", ["closed", "no-port-here", "localhost:99999", "auto"])
def test_a_bad_address_fails_fast_with_one_line(address: str, tmp_path: Path) -> None:
    empty = tmp_path / "raytmp"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(empty)}
    address = f"127.0.0.1:{closed_port()}" if address == "closed" else address
    proc = specblock("tune", *SMALL, "--address", address, "--out", str(tmp_path / "s"), env=env)
    assert_one_line_exit_2(proc, "ray start --head", "drop --address")
    assert not (tmp_path / "s").exists()  # checked before any work


def test_a_port_that_is_not_ray_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        proc = specblock("tune", *SMALL, "--address", address, "--out", str(tmp_path / "s"))
    assert_one_line_exit_2(proc, "not a Ray cluster", "ray start --head")


def test_a_grpc_server_that_is_not_ray_is_refused_within_the_join_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.tuning import ray_session

    monkeypatch.setattr(ray_session, "CONNECT_SECONDS", 3)
    with socket.socket() as server:  # answers the HTTP/2 preface with a SETTINGS frame, then says nothing
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(1)
        port = server.getsockname()[1]

        def settings_then_silence() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    conn, _ = server.accept()
                    conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
                    accepted.append(conn)

        stop, accepted = threading.Event(), []
        thread = threading.Thread(target=settings_then_silence, daemon=True)
        thread.start()
        try:
            with pytest.raises(InputError, match=r"no answer within 3 s.*ray start --head"):
                ray_session.check_address(f"127.0.0.1:{port}")
        finally:
            stop.set()
            thread.join()
            for conn in accepted:
                conn.close()


def test_a_running_cluster_is_joined(ray_session: None, tmp_path: Path) -> None:
    import ray

    address = ray.get_runtime_context().gcs_address  # the test session's Ray, as `ray start` would run it
    proc = specblock("tune", *SMALL, "--policy-kind", "fixed", "--address", address,
                        "--out", str(tmp_path / "s"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["trials_run"] == 2 and address in proc.stderr


def test_huge_samples_are_refused_up_front(tmp_path: Path) -> None:
    args = ["--samples", "100000000", *SMALL[3:]]
    proc = specblock("tune", "length", *args, "--out", str(tmp_path / "s"))
    assert_one_line_exit_2(proc, str(MAX_SAMPLES))


def test_resume_runs_only_unrecorded_trials(ray_session: None, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from ray import tune

    whole = tune_policies(SETTING, KINDS, samples=3, out=tmp_path / "whole")
    cut = tmp_path / "cut"  # the same study, interrupted after four of its six trials
    shutil.copytree(whole.out, cut)
    for name in ("00001.json", "00004.json"):
        (cut / TRIALS / name).unlink()
    for name in ("results.parquet", "results.csv", "best_policy.json", "best_threshold.json",
                 "best_fixed.json"):
        (cut / name).unlink()
    study = json.loads((cut / "study.json").read_text())
    (cut / "study.json").write_text(json.dumps({"config": study["config"]}))

    def restore(*args: object, **kwargs: object) -> None:
        raise AssertionError("Tuner.restore was called")

    monkeypatch.setattr(tune.Tuner, "restore", restore)
    resumed = tune_policies(SETTING, KINDS, samples=3, out=cut, resume=True)
    assert resumed.trials_run == 2 and resumed.summary()["trials"] == 6
    assert resumed.best == whole.best and resumed.best_by_kind == whole.best_by_kind
    pd.testing.assert_frame_equal(resumed.table, whole.table)
    assert (cut / "best_policy.json").read_text() == (whole.out / "best_policy.json").read_text()


def test_resume_never_unpickles_a_planted_tuner_pkl(ray_session: None, tmp_path: Path) -> None:
    out, marker = tmp_path / "study", tmp_path / "unpickled"
    config = {"setting": SETTING.describe(), "kinds": ["fixed"], "samples": 2, "search": "random",
              "scheduler": "fifo"}
    (out / "ray" / "study").mkdir(parents=True)
    (out / "study.json").write_text(json.dumps({"config": config}))
    (out / "ray" / "study" / "tuner.pkl").write_bytes(pickle.dumps(Marker(marker)))
    resumed = tune_policies(SETTING, ("fixed",), samples=2, out=out, resume=True)
    assert not marker.exists()
    assert resumed.trials_run == 2 and (out / "best_policy.json").exists()


def test_a_bad_trial_record_is_named(tmp_path: Path) -> None:
    out = tmp_path / "study"
    config = {"setting": SETTING.describe(), "kinds": ["fixed"], "samples": 2, "search": "random",
              "scheduler": "fifo"}
    (out / TRIALS).mkdir(parents=True)
    (out / "study.json").write_text(json.dumps({"config": config}))
    for text, problem in (("{not json", "not a JSON trial record"), ("[1, 2]", "wrong shape"),
                          (json.dumps({"index": 0, "policy": {"kind": "fixed", "params": {"length": 99}},
                                       "tokens_per_second": 1.0, "tau": 1.0, "chunks": 2, "error": None}),
                           "another configuration")):
        (out / TRIALS / "00000.json").write_text(text)
        with pytest.raises(InputError, match=problem):
            tune_policies(SETTING, ("fixed",), samples=2, out=out, resume=True)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "study.json").write_text("{oops")
    with pytest.raises(InputError, match="not a JSON study record"):
        tune_policies(SETTING, ("fixed",), samples=2, out=bad, resume=True)


def test_a_held_study_folder_refuses_a_second_writer(tmp_path: Path) -> None:
    out = tmp_path / "study"
    with hold(out):
        proc = specblock("tune", *SMALL, "--out", str(out))
    assert_one_line_exit_2(proc, "in use by process", str(os.getpid()), "choose another --out")
    assert not (out / LOCK).exists() and not (out / "study.json").exists()


def test_a_lock_dies_with_its_holder(tmp_path: Path) -> None:
    out = tmp_path / "folder"
    code = ("import sys, time\nfrom experiments.folders import hold\nheld = hold(sys.argv[1])\n"
            "held.__enter__()\nprint('held', flush=True)\ntime.sleep(120)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                             cwd=REPO)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"in use by process {child.pid} "), hold(out):
            pass
    finally:
        child.send_signal(signal.SIGKILL)  # a crash: no clean-up runs
        child.wait(timeout=limit(30))
    assert (out / LOCK).exists()  # left behind, but no longer locked
    with hold(out):
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_an_out_that_cannot_be_a_folder_is_one_line(where: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker if where == "file" else blocker / "study"
    proc = specblock("tune", *SMALL, "--out", str(out))
    assert_one_line_exit_2(proc, str(blocker), "choose a folder")


def test_a_read_only_parent_is_refused_before_any_work(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # As root a chmod'ed folder stays writable, so the permission check itself is made to say no.
    monkeypatch.setattr("experiments.folders.os.access", lambda path, mode: False)
    with pytest.raises(InputError, match="not writable"):
        tune_policies(SETTING, ("fixed",), samples=2, out=tmp_path / "study")
    assert not (tmp_path / "study").exists()
