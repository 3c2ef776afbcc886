"""`specblock simulate`: the JSON contract, policy files, traces, and exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from time_limits import limit

from core.paths import PAPER_PROFILE, REPO
from experiments.cli import main
from policies.base import make_policy, save_policy
from simulator.parametric import default_acceptance, synthetic_traces
from simulator.traces import save_traces

ROW_KEYS = {"name", "kind", "env", "tokens_per_second", "tau", "latency_seconds", "speedup"}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", *argv])
        sys.exit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_json_schema_through_the_command_line():
    command = [sys.executable, "-m", "experiments.cli", "simulate", "--profile", str(PAPER_PROFILE),
               "--queries", "6", "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=limit(300), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # exactly one JSON object and nothing else on stdout
    assert set(data) == {"profile", "derived", "traces", "acceptance", "drafter", "queries", "seed",
                         "policies"}
    assert data["queries"] == 6 and data["derived"] is True
    names = [row["name"] for row in data["policies"]]
    assert names == ["vanilla", "fixed-1", "fixed-2", "fixed-4", "fixed-8"]
    vanilla, *speculative = data["policies"]
    assert all(set(row) == ROW_KEYS for row in data["policies"])
    assert vanilla["tau"] == 1.0 and vanilla["speedup"] == 1.0
    assert all(row["tau"] > 1.0 and row["speedup"] > 1.0 for row in speculative)
    for row in data["policies"]:
        assert row["latency_seconds"] == pytest.approx(512 / row["tokens_per_second"])


def test_policy_files_and_traces(tmp_path, capsys):
    save_policy(make_policy("libraspec-exhaustive"), tmp_path / "libra.json")
    save_policy(make_policy("cost-aware-bandit"), tmp_path / "bandit.json")
    recorded = synthetic_traces(default_acceptance(), queries=8, iterations=30, seed=0, drafter="eagle")
    traces = save_traces(recorded, tmp_path / "t.parquet")
    code, out, err = run(["--profile", str(PAPER_PROFILE), "--traces", str(traces),
                          "--policy", str(tmp_path / "libra.json"),
                          "--policy", str(tmp_path / "bandit.json"), "--queries", "12", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["acceptance"], data["drafter"]) == ("replay", "eagle")
    rows = {row["name"]: row for row in data["policies"]}
    assert set(rows) == {"vanilla", "libra", "bandit"}
    assert (rows["libra"]["env"], rows["bandit"]["env"]) == ("SpecLength", "AdaptStream")
    assert rows["libra"]["speedup"] > 1.0


def test_table_output(capsys):
    code, out, _ = run(["--profile", str(PAPER_PROFILE), "--queries", "3"], capsys)
    assert code == 0 and "vanilla" in out and "fixed-8" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--profile", "/no/such/profile.json"], "no such cost profile"),
    (["--traces", "/no/such/traces.parquet"], "no such trace file"),
    (["--queries", "0"], "--queries 0"),
    (["--policy", "/no/such/policy.json"], "no such policy file"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    argv = argv if "--profile" in argv else [*argv, "--profile", str(PAPER_PROFILE)]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_malformed_profile_exits_2(tmp_path, capsys):
    bad = json.loads(PAPER_PROFILE.read_text())
    bad["samples"]["update"]["head"] = [-1.0]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, _, err = run(["--profile", str(tmp_path / "bad.json")], capsys)
    assert code == 2 and "samples.update.head[0]" in err
