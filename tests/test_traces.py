"""Acceptance traces: the parquet round trip and one clear refusal per kind of bad file."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.errors import InputError
from simulator.parametric import default_acceptance, synthetic_traces
from simulator.traces import COLUMNS, load_traces, save_traces


def tree_rows() -> pd.DataFrame:
    """Two iterations of two queries: a chain of 3 (2 accepted) and a tree (root children 0 and 1; 2 under 0;
    3 under 1)."""
    return pd.DataFrame({
        "query_id": [7, 8], "domain": ["code", "code"], "drafter": ["specblock", "specblock"],
        "iteration": [0, 1], "context_length": [100, 103],
        "depths": [[1, 2, 3], [1, 1, 2, 2]],
        "parents": [[-1, 0, 1], [-1, -1, 0, 1]],
        "confidences": [[0.9, 0.8, 0.5], [0.6, 0.3, 0.9, 0.5]],
        "rank_buckets": [[0, 0, 1], [1, 1, 0, 3]],
        "on_path": [[True, True, False], [False, True, False, True]],
        "accepted": [2, 2],
        "draft_seconds": [0.001, 0.002], "verify_seconds": [0.01, 0.011],
    })


def test_round_trip_keeps_every_value(tmp_path):
    df = synthetic_traces(default_acceptance(), queries=6, iterations=5, seed=1)
    path = save_traces(df, tmp_path / "t.parquet")
    back = load_traces(path)
    assert list(back.columns) == list(COLUMNS) and len(back) == 30
    for column in COLUMNS:
        for a, b in zip(df[column], back[column], strict=True):
            np.testing.assert_array_equal(a, b)
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_trees_validate_and_int32_columns_are_widened(tmp_path):
    df = tree_rows()
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.set_column(table.schema.get_field_index("accepted"), "accepted",
                             pa.array([2, 2], type=pa.int32()))
    pq.write_table(table, tmp_path / "t.parquet")
    back = load_traces(tmp_path / "t.parquet")
    assert back["accepted"].dtype == np.int64 and list(back["on_path"][1]) == [False, True, False, True]


def _mutate(column: str, value) -> pd.DataFrame:
    df = tree_rows()
    df[column] = pd.Series(value) if isinstance(value, list) else value
    return df


BAD = [
    ("missing", lambda: tree_rows().drop(columns=["on_path"]), "missing column.*on_path"),
    ("extra", lambda: tree_rows().assign(verifier="bv"), "unknown column.*verifier"),
    ("type", lambda: _mutate("confidences", [["a", "b", "c"], ["a", "b", "c", "d"]]), "confidences"),
    ("range", lambda: _mutate("confidences", [[0.9, 1.5, 0.5], [0.6, 0.3, 0.9, 0.5]]), "confidences: row 0"),
    ("length", lambda: _mutate("rank_buckets", [[0, 0], [1, 1, 0, 3]]), "rank_buckets: row 0"),
    ("bucket", lambda: _mutate("rank_buckets", [[0, 0, 1], [1, 1, 0, 7]]), "rank_buckets: row 1"),
    ("parent", lambda: _mutate("parents", [[-1, 0, 2], [-1, -1, 0, 1]]), "parents: row 0"),
    ("depth", lambda: _mutate("depths", [[1, 2, 3], [1, 1, 2, 3]]), "depths: row 1"),
    ("path", lambda: _mutate("on_path", [[True, False, True], [False, True, False, True]]), "on_path: row 0"),
    ("accepted", lambda: _mutate("accepted", [2, 1]), "accepted: row 1"),
    ("time", lambda: _mutate("verify_seconds", [0.01, -1.0]), "verify_seconds: row 1"),
    ("empty", lambda: tree_rows().iloc[:0], "no rows"),
]


@pytest.mark.parametrize(("name", "build", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_trace_file_fails_naming_the_problem(tmp_path, name, build, message):
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pandas(build(), preserve_index=False), path)
    with pytest.raises(InputError, match=message):
        load_traces(path)
    with pytest.raises(InputError):
        save_traces(build(), tmp_path / "never.parquet")
    assert not (tmp_path / "never.parquet").exists()


def test_unreadable_trace_files(tmp_path):
    with pytest.raises(InputError, match="no such trace file"):
        load_traces(tmp_path / "absent.parquet")
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="not a parquet trace file"):
        load_traces(tmp_path / "x.parquet")
