"""`specblock lp`: the JSON contract, the table, and one-line refusals of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from time_limits import limit

from core.paths import REPO
from experiments.cli import main

KEYS = {"lp", "token", "block", "rrs", "seqbv", "gbv", "gds", "seconds"}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["lp", *argv])
        sys.exit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_json_schema_through_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "lp", "--vocab", "2", "--length", "2",
                           "--drafts", "2", "--instances", "2", "--seed", "3", "--json"],
                          capture_output=True, text=True, timeout=limit(300), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # exactly one JSON object and nothing else on stdout
    assert set(data) == {"vocab", "length", "drafts", "instances"}
    assert (data["vocab"], data["length"], data["drafts"]) == (2, 2, 2)
    assert len(data["instances"]) == 2
    for row in data["instances"]:
        assert set(row) == KEYS
        assert all(0 <= row[k] <= 2 for k in KEYS - {"seconds", "lp"})
        assert -1e-9 <= row["lp"] <= 2 + 1e-9  # up to the solver's tolerance
        assert row["seconds"] >= 0
        assert max(row["rrs"], row["seqbv"], row["gbv"], row["block"]) <= row["lp"] + 1e-6


def test_one_draft_multi_path_verifiers_reduce_to_single_path(capsys):
    code, out, _ = run(["--vocab", "3", "--length", "2", "--instances", "2", "--seed", "1",
                        "--drafter", "mix", "--json"], capsys)
    assert code == 0
    for row in json.loads(out)["instances"]:
        assert row["rrs"] == pytest.approx(row["token"], abs=1e-9)
        assert row["seqbv"] == pytest.approx(row["block"], abs=1e-9)
        assert row["gbv"] == pytest.approx(row["block"], abs=1e-9)
        assert row["gds"] == pytest.approx(row["block"], abs=1e-9)
        assert row["lp"] == pytest.approx(row["block"], abs=1e-6)


def test_seed_fixes_the_instances(capsys):
    argv = ["--vocab", "2", "--length", "2", "--instances", "2", "--seed", "4", "--json"]
    first = json.loads(run(argv, capsys)[1])["instances"]
    second = json.loads(run(argv, capsys)[1])["instances"]
    other = json.loads(run([*argv[:-2], "5", "--json"], capsys)[1])["instances"]
    assert [r["block"] for r in first] == [r["block"] for r in second] != [r["block"] for r in other]


def test_step_instance_reproduces_the_known_example(capsys):
    third = "0.33333333333333333"
    code, out, _ = run(["--length", "2", "--step-p", f"{third},0.66666666666666667", "--step-q",
                        f"0.66666666666666667,{third}", "--json"], capsys)
    assert code == 0
    [row] = json.loads(out)["instances"]
    assert row["token"] == pytest.approx(10 / 9, abs=1e-9)
    assert row["block"] == pytest.approx(11 / 9, abs=1e-9)
    assert row["lp"] == pytest.approx(11 / 9, abs=1e-6)


def test_table_has_a_row_per_instance_and_a_mean(capsys):
    code, out, err = run(["--vocab", "2", "--length", "1", "--drafts", "2", "--instances", "3"], capsys)
    assert code == 0 and err == ""
    lines = [line for line in out.splitlines() if "│" in line]
    assert [line.split("│")[1].strip() for line in lines] == ["0", "1", "2", "mean"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--vocab", "1", "--length", "2"], "at least 2 tokens"),
    (["--vocab", "2", "--length", "0"], "draft length"),
    (["--vocab", "2", "--length", "2", "--drafts", "0"], "at least 1 draft"),
    (["--vocab", "2", "--length", "2", "--instances", "0"], "at least 1 instance"),
    (["--length", "2"], "missing --vocab"),
    (["--vocab", "2"], "--length"),
    (["--length", "2", "--step-p", "-0.5,1.5", "--step-q", "0.5,0.5"], "negative"),
    (["--length", "2", "--step-p", "0.5,0.6", "--step-q", "0.5,0.5"], "sums to"),
    (["--length", "2", "--step-p", "0.5,0.5", "--step-q", "0.2,0.3,0.5"], "3 entries"),
    (["--length", "2", "--step-p", "0.5,x", "--step-q", "0.5,0.5"], "could not read --step-p"),
    (["--vocab", "3", "--length", "2", "--step-p", "0.5,0.5", "--step-q", "0.5,0.5"], "make them agree"),
    (["--length", "2", "--step-p", "0.5,0.5", "--step-q", "0.5,0.5", "--instances", "3"], "drop --instances"),
    (["--vocab", "2", "--length", "2", "--step-p", "0.5,0.5"], "go together"),
    (["--vocab", "4", "--length", "3", "--drafts", "3"], "1,642,240 variables"),
    (["--vocab", "1000", "--length", "50"], "more than"),
    (["--vocab", "3", "--length", "3", "--drafts", "3"], "19,683 draft tuples"),
    (["--vocab", "2", "--length", "2", "--drafter", "oracle"], "--drafter"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and message in err


def test_a_solver_failure_exits_1_with_one_line(capsys, monkeypatch):
    from experiments import lp_table
    from simulator.lp import LPSolveError

    def fail(*args, **kwargs):
        raise LPSolveError("the LP was not solved: CLARABEL returned solver_error")

    monkeypatch.setattr(lp_table, "solve_lp", fail)
    code, out, err = run(["--vocab", "2", "--length", "1", "--json"], capsys)
    assert (code, out) == (1, "")
    assert err.splitlines() == ["specblock: error: the LP was not solved: CLARABEL returned solver_error"]
