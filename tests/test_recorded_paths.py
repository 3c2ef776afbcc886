"""Results files name paths through ``core.paths.repo_relative``: relative to the repository inside it,
``~/...`` under the home folder, absolute elsewhere; no committed file names a checkout's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.paths import REPO, RESULTS, repo_relative

# what a path inside some checkout looks like, wherever that checkout lay
CHECKOUT_PARTS = ("/data/models/", "/data/profiles/", "/data/prompts", "/benchmarks/results/")


def test_a_path_inside_the_repository_is_relative_to_it() -> None:
    assert repo_relative(REPO / "data" / "profiles" / "cpu_shipped.json") == "data/profiles/cpu_shipped.json"
    assert repo_relative(REPO / "data" / ".." / "data" / "models") == "data/models"


def test_a_path_under_the_home_folder_names_no_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home" / "someone"
    monkeypatch.setenv("HOME", str(home))
    assert repo_relative(home / ".cache" / "models" / "m") == "~/.cache/models/m"
    assert repo_relative("~/checkpoint") == "~/checkpoint"


def test_a_path_elsewhere_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert repo_relative("run/draft") == str(tmp_path.resolve() / "run" / "draft")


def test_a_results_writer_records_repo_relative_paths(tmp_path: Path) -> None:
    from benchmarks.forward_cost import command

    target = REPO / "data" / "models" / "target"
    out = CliRunner().invoke(command, ["--repeats", "10", "--target", str(target), "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    config = json.loads((tmp_path / "forward_cost.json").read_text())["config"]
    assert config["target"] == "data/models/target" and config["draft"] == "data/models/draft"


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_no_committed_results_file_names_a_checkout_or_home_folder() -> None:
    home = str(Path.home())
    for path in sorted(RESULTS.glob("*.json")):
        found = [s for s in _strings(json.loads(path.read_text())) if s.startswith(("/", "~"))
                 and (s.startswith((str(REPO), home + "/")) or any(part in s for part in CHECKOUT_PARTS))]
        assert not found, f"{path.name} names {found[0]!r}: record it through core.paths.repo_relative"
