"""``--out`` means one thing in every command: a folder, created when the command writes (a missing one is
no error), refused before any work only when it cannot be one (a file, a path under a file)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from experiments.cli import COMMANDS, OutFolder, app

FILE_OUTS = {"profile", "trace", "results"}  # their --out names the one file they write


def _commands() -> dict[str, click.Command]:
    """Every command of `specblock` and of `specblock benchmark`, by its command line."""
    ctx = click.Context(app)
    found: dict[str, click.Command] = {}
    for name in COMMANDS:
        command = app.get_command(ctx, name)
        if isinstance(command, click.Group):
            sub = click.Context(command, parent=ctx)
            found.update({f"{name} {n}": command.get_command(sub, n) for n in command.list_commands(sub)})
        else:
            found[name] = command
    return found


def test_every_folder_out_is_the_shared_type() -> None:
    outs = {line: p for line, command in _commands().items() for p in command.params if p.name == "out"}
    assert {"serve-bench", "bench", "benchmark forward_cost"} <= set(outs)
    wrong = [line for line, p in outs.items() if line not in FILE_OUTS and not isinstance(p.type, OutFolder)]
    assert not wrong, f"--out of {wrong} is not experiments.cli.OUT_FOLDER"


def test_a_missing_out_is_created_when_the_command_writes(tmp_path: Path, cli) -> None:
    out = tmp_path / "new" / "deeper"
    code, _, err = cli(["benchmark", "forward_cost", "--repeats", "10", "--out", str(out)])
    assert code == 0, err
    assert json.loads((out / "forward_cost.json").read_text())["config"]["repeats"] == 10


def test_serve_bench_takes_a_missing_out_and_bad_input_leaves_nothing(tmp_path: Path, cli) -> None:
    out = tmp_path / "new"
    code, stdout, err = cli(["serve-bench", "--quick", "--profile", str(tmp_path / "none.json"),
                             "--out", str(out)])
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1
    assert "--out" not in err and "none.json" in err  # past --out: the next input is the one refused
    assert not out.exists()


@pytest.mark.parametrize("command", [["serve-bench", "--quick"], ["benchmark", "forward_cost"], ["bench"]])
def test_a_file_or_a_path_under_one_is_refused(command: list[str], tmp_path: Path, cli) -> None:
    file = tmp_path / "file"
    file.write_text("")
    for out in (file, file / "below"):
        code, stdout, err = cli([*command, "--out", str(out)])
        assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1 and "--out" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
