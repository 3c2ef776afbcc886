"""`specblock simulate` says where it runs: the shipped profile's device and date, a probe of this
machine's vanilla step against it, `--no-probe`, and `--measure` (profile this machine first)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest
from test_simulate_cli import run
from time_limits import limit

from core.cost_profile import load_profile
from core.paths import CPU_PROFILE, MODELS, PAPER_PROFILE, REPO, TARGET, TRACES
from experiments.commands import simulate

WHERE_KEYS = {"profile_device", "profile_date", "profile_date_source", "profile_clock", "profile_threads",
              "profile_torch", "this_device", "probe", "measured_here"}
PROBE_KEYS = {"context", "this_machine_ms", "profile_ms", "ratio", "clock", "threads", "runs",
              "steps_per_run", "wall_seconds"}
shipped = pytest.mark.skipif(not (CPU_PROFILE.exists() and (TARGET / "config.json").is_file()),
                             reason="needs the shipped profile and target model")


@pytest.fixture
def short_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulate, "PROBE_SECONDS", 0.2)  # the cores are shared: time only briefly


@shipped
def test_json_carries_where_and_the_probe(capsys, short_probe):
    import torch

    threads = torch.get_num_threads()
    code, out, err = run(["--queries", "4", "--json"], capsys)
    assert code == 0, err
    assert err == ""  # with --json, everything is in the one JSON object
    data = json.loads(out)
    assert data["profile"] == str(CPU_PROFILE)
    where = data["where"]
    assert set(where) == WHERE_KEYS
    shipped_json = json.loads(CPU_PROFILE.read_text())
    assert where["profile_device"] == shipped_json["device"]
    assert where["profile_clock"] == shipped_json["measurement"]["clock"]
    assert where["profile_threads"] == shipped_json["measurement"]["threads"]
    assert where["profile_date_source"] in {"git commit", "file mtime"} or \
        where["profile_date_source"].startswith("profile ")
    datetime.fromisoformat(where["profile_date"])
    assert where["this_device"] and where["measured_here"] is False
    probe = where["probe"]
    assert set(probe) == PROBE_KEYS
    assert probe["ratio"] == pytest.approx(probe["this_machine_ms"] / probe["profile_ms"])
    assert probe["this_machine_ms"] > 0 and probe["profile_ms"] > 0
    assert probe["runs"] >= simulate.PROBE_MIN_RUNS
    profile = load_profile(CPU_PROFILE)
    assert probe["context"] in profile.fits["vanilla"].axes[0].astype(int).tolist()
    assert probe["profile_ms"] == pytest.approx(1e3 * profile.vanilla_seconds(probe["context"]))
    assert (probe["clock"], probe["threads"]) == (where["profile_clock"], where["profile_threads"])
    assert torch.get_num_threads() == threads  # the probe's thread count is restored


@shipped
def test_the_table_says_whose_seconds_and_suggests_measure(capsys, short_probe):
    code, out, err = run(["--queries", "3"], capsys)
    assert code == 0, err
    assert "vanilla" in out and "fixed-8" in out
    assert "shipped profile's machine" in err and "--measure" in err
    assert "x slower" in err or "x faster" in err


def test_no_probe_omits_the_probe_without_torch():
    code = ("import sys\n"
            "from experiments.cli import main\n"
            "try:\n"
            "    main(['simulate', '--no-probe', '--queries', '3', '--json'])\n"
            "except SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit(300),
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    where = json.loads(proc.stdout)["where"]
    assert where["probe"] is None and where["probe_skipped"] == "--no-probe"
    assert where["profile_device"] and where["profile_date"]
    assert proc.stderr.strip().splitlines()[-1] == "False"  # torch was never imported


def test_a_given_profile_is_neither_described_nor_probed(capsys):
    code, out, err = run(["--profile", str(PAPER_PROFILE), "--queries", "3", "--json"], capsys)
    assert code == 0, err
    assert "where" not in json.loads(out)
    code, out, err = run(["--profile", str(PAPER_PROFILE), "--queries", "3"], capsys)
    assert code == 0 and err == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["--measure", "--profile", str(PAPER_PROFILE)], "--measure and --profile"),
    (["--measure-out", "/tmp/never-written.json"], "add --measure"),
])
def test_conflicting_options_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run([*argv, "--queries", "3"], capsys)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_paper_profile_is_not_probed():
    where = simulate.where_shipped(PAPER_PROFILE, run_probe=True)
    assert where["probe"] is None and "publications" in where["probe_skipped"]


def test_profile_date_sources(tmp_path):
    data = json.loads(PAPER_PROFILE.read_text())
    (tmp_path / "plain.json").write_text(json.dumps(data))
    date, source = simulate.profile_date(tmp_path / "plain.json", data)
    assert source == "file mtime"
    datetime.fromisoformat(date)
    dated = {**data, "measurement": {"date": "2026-01-02T03:04:05+00:00"}}
    assert simulate.profile_date(tmp_path / "plain.json", dated) == ("2026-01-02T03:04:05+00:00",
                                                                     "profile measurement.date")


@pytest.mark.skipif(not all((MODELS / kind / "config.json").is_file()
                            for kind in ("target", "draft")), reason="needs the shipped models")
def test_measure_profiles_this_machine_and_keeps_the_shipped_traces(tmp_path, capsys):
    out_file = tmp_path / "here.json"
    code, out, err = run(["--measure", "--measure-out", str(out_file), "--queries", "16", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["profile"] == str(out_file) and data["derived"] is False
    if TRACES.exists():
        assert (data["traces"], data["acceptance"]) == (str(TRACES), "replay")
    where = data["where"]
    assert where["measured_here"] is True and where["probe"] is None
    assert where["profile_device"] == where["this_device"]
    assert (where["profile_clock"], where["profile_threads"]) == ("cpu", 1)
    assert where["measure"]["out"] == str(out_file)
    measured = json.loads(out_file.read_text())
    assert measured["device"] == where["this_device"]
    assert measured["measurement"]["date"] == where["profile_date"]
    assert load_profile(out_file).drafters.keys() >= {data["drafter"]}
    names = [row["name"] for row in data["policies"]]
    assert names == ["vanilla", "fixed-1", "fixed-2", "fixed-4", "fixed-8"]
