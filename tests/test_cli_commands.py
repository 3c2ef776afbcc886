"""One command line: every experiment, study and benchmark is a `specblock` subcommand with the same
conventions (``--help``; ``--json``: one JSON object on stdout; bad input: one line on stderr, exit 2), and
`specblock --help` stays light (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from time_limits import limit

from core.names import BENCHMARKS
from core.paths import REPO
from experiments.cli import COMMANDS

EXPERIMENTS = ("adapt-live", "fidelity", "study", "gpu-check", "benchmark", "serve-bench")
NOT_BENCHMARKS = {"__init__", "output", "mutation_notes", "checkout_worker"}  # helpers of the benchmarks


def listed(help_text: str) -> set[str]:
    """The subcommand names a group's ``--help`` lists."""
    return {line.split()[0] for line in help_text.split("Commands:")[1].splitlines() if line.strip()}


def test_specblock_help_lists_every_command_without_importing_torch() -> None:
    code = ("import sys\n"
            "from experiments.cli import main\n"
            "try:\n"
            "    main(['--help'])\n"
            "except SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit(120),
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert set(EXPERIMENTS) <= listed(proc.stdout) == set(COMMANDS)
    assert proc.stderr.strip().splitlines()[-1] == "False"  # torch was never imported


HELPED = [*([name] for name in EXPERIMENTS), *(["benchmark", name] for name in BENCHMARKS)]


@pytest.mark.parametrize("argv", HELPED, ids=" ".join)
def test_every_experiment_and_benchmark_has_help(argv: list[str], cli) -> None:
    code, out, err = cli([*argv, "--help"])
    assert code == 0 and err == ""
    assert out.startswith(f"Usage: specblock {' '.join(argv)} ")


def test_every_benchmark_module_is_a_subcommand(cli) -> None:
    modules = {p.stem for p in (REPO / "benchmarks").glob("*.py")} - NOT_BENCHMARKS
    assert set(BENCHMARKS) == modules
    code, out, _ = cli(["benchmark", "--help"])
    assert code == 0
    assert listed(out) == set(BENCHMARKS)


@pytest.mark.parametrize(("argv", "message"), [
    (["benchmark", "nope"], "No such command 'nope'"),
    (["study", "nope"], "unknown study 'nope'"),
    (["gpu-check", "--tiny"], "--tiny writes a test profile: give --out DIR"),
    (["benchmark", "forward_cost", "--alpha", "x"], "--alpha 'x'"),
    (["benchmark", "batch_throughput", "--batches", "0,2"], "give positive integers"),
    (["benchmark", "batch_throughput", "--drafters", "specblock"], "lacks none"),
    (["benchmark", "checkout_ab", str(REPO / "data")], "is not a checkout of this project"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, cli, monkeypatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    code, out, err = cli(argv)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("errors", [{}, {"profile": "RuntimeError: out of memory"}])
def test_gpu_check_runs_the_scripts_check_and_fails_with_its_sections(errors, cli, monkeypatch,
                                                                      tmp_path: Path) -> None:
    from experiments import gpu_check

    calls = []
    results = {"plan": "tiny_check", "errors": errors, "seconds": {},
               "overlap": {"skipped": "CUDA streams need a GPU"}}

    def check(*args: object) -> dict:
        calls.append(args)
        return results

    monkeypatch.setattr(gpu_check, "check", check)
    argv = ["gpu-check", "--device", "cpu", "--tiny", "--out", str(tmp_path), "--json"]
    code, out, err = cli(argv)
    assert calls == [("cpu", True, tmp_path, gpu_check.MODELS, 0, None)]  # no --real-model
    assert json.loads(out) == results and out.count("\n") == 1
    assert code == (1 if errors else 0)
    assert ("profile: RuntimeError: out of memory" in err) == bool(errors)


def test_a_benchmark_prints_one_json_object_and_writes_its_result(tmp_path: Path) -> None:
    argv = ["benchmark", "verifier_latency", "--repeats", "1", "--warmup", "0", "--json",
            "--out", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", *argv], capture_output=True, text=True,
                          timeout=limit(300), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = proc.stdout.splitlines()
    shown = json.loads(line)
    saved = json.loads(Path(shown["results"]).read_text())
    assert Path(shown["results"]) == tmp_path / "verifier_latency.json"
    assert saved["results"] == shown["rows"] and {r["verifier"] for r in shown["rows"]} >= {"greedy", "rrs"}
    assert "median ms" in proc.stderr  # the table went to stderr, as progress


def test_study_runs_the_named_study_and_prints_its_tables_or_one_object(cli, monkeypatch,
                                                                       tmp_path: Path) -> None:
    from experiments.tuning import studies

    def run_study(name: str, directory: Path) -> dict:
        (directory / f"study_{name}.md").write_text(f"# {name} table\n")
        return {"rows": [], "seconds": 1.0}

    monkeypatch.setattr(studies, "run_study", run_study)
    code, out, err = cli(["study", "length", "--out", str(tmp_path)])
    assert code == 0 and out.startswith("# length table") and "study_length.json" in err
    code, out, _ = cli(["study", "adapt", "--out", str(tmp_path), "--json"])  # the role's older name
    shown = json.loads(out)
    assert code == 0 and shown["results"] == str(tmp_path / "study_adaptation.json") and shown["rows"] == []
