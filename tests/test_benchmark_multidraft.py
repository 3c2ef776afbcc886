"""`specblock benchmark multidraft --quick --json`: one JSON object with every cell of the grid, on random and
real laws, whose figures respect their bounds; the .md table and the .png plot beside the results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.lp_table import STUDY

CELL_KEYS = {"source", "vocab", "length", "drafts", "instances", "value", "gap", "over_iid_bound",
             "gbv_below_bv", "per_instance"}
IID = ("token", "block", "rrs", "seqbv", "gbv")  # drafted i.i.d., so under the i.i.d. LP


def test_quick_run_prints_one_json_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["benchmark", "multidraft", "--quick", "--out", str(tmp_path), "--json"])
    except SystemExit as exc:  # click exits only on an error here
        assert not exc.code
    data = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert set(data) == {"results", "files", "rows"}
    names = [Path(f).name for f in data["files"]]
    assert names == [f"multidraft_quick{ext}" for ext in (".json", ".md", ".png")]
    assert all(Path(f).is_file() for f in data["files"])
    result = data["rows"]
    assert set(result) == {"columns", "bound_of", "cells", "overall"} and result["columns"] == list(STUDY)
    assert {c["source"] for c in result["cells"]} == set(result["overall"]) == {"random", "real"}
    for cell in result["cells"]:
        assert set(cell) == CELL_KEYS and len(cell["per_instance"]) == cell["instances"] >= 1
        assert set(cell["value"]) == set(STUDY) and set(cell["gap"]) == set(result["bound_of"])
        low, high = cell["value"]["gds"]["ci"]
        assert low - 1e-12 <= cell["value"]["gds"]["mean"] <= high + 1e-12
        for row in cell["per_instance"]:
            assert all(row[v] <= row["lp"] + 1e-6 for v in IID)
            assert row["rrs_wor"] <= row["lp_wor"] + 1e-6 and row["gds"] <= row["lp_gds"] + 1e-6
            if cell["drafts"] == 1:  # one draft: every multi-draft rule is token-level or BV
                assert row["gds"] == pytest.approx(row["block"], abs=1e-9)
                assert row["rrs"] == pytest.approx(row["token"], abs=1e-9)
                assert row["lp"] == pytest.approx(row["block"], abs=1e-6)
    markdown = (tmp_path / "multidraft_quick.md").read_text()
    assert "| source | V | L | K |" in markdown and "GBV below single-path BV" in markdown
