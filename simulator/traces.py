"""Acceptance traces: what the live engine drafted and accepted at every decoding iteration (parquet).

One row per decoding iteration; the node columns hold one entry per drafted node of that iteration's
draft tree (a chain is a tree whose node i has parent i - 1), in the order the drafter made them:

    | column         | type          | meaning                                                        |
    |----------------|---------------|----------------------------------------------------------------|
    | query_id       | int64         | which query (prompt) the iteration belongs to                   |
    | domain         | string        | the query's domain, e.g. "code"                                 |
    | drafter        | string        | drafter kind: specblock, eagle, medusa, draft-model, ngram      |
    | iteration      | int64 >= 0    | index of the iteration within its query                         |
    | context_length | int64 >= 0    | tokens in the KV cache when the iteration started               |
    | depths         | list<int64>   | per node: depth in the tree, 1 = child of the root              |
    | parents        | list<int64>   | per node: index of its parent in this list, -1 for the root     |
    |                |               | (a parent always comes before its children)                     |
    | confidences    | list<double>  | per node: drafter's probability that the node is accepted given |
    |                |               | that its parent was (its draft probability q), in [0, 1]        |
    | rank_buckets   | list<int64>   | per node: predicted rank bucket 0..3 (rank head), -1 if none    |
    | on_path        | list<bool>    | per node: on the accepted path (a chain from the root)          |
    | accepted       | int64 >= 0    | accepted draft tokens (= on-path nodes; the bonus not counted)  |
    | draft_seconds  | double >= 0   | wall seconds spent drafting                                     |
    | verify_seconds | double >= 0   | wall seconds of the verify forward                              |

``save_traces`` validates and writes atomically; ``load_traces`` reads, validates every column and
returns a pandas DataFrame (node columns as numpy arrays). A bad file fails with ``InputError``
naming the column, the first bad row and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.errors import InputError
from core.files import MAX_TRACE_BYTES, atomic_write, check_size

SCHEMA = pa.schema([
    ("query_id", pa.int64()),
    ("domain", pa.string()),
    ("drafter", pa.string()),
    ("iteration", pa.int64()),
    ("context_length", pa.int64()),
    ("depths", pa.list_(pa.int64())),
    ("parents", pa.list_(pa.int64())),
    ("confidences", pa.list_(pa.float64())),
    ("rank_buckets", pa.list_(pa.int64())),
    ("on_path", pa.list_(pa.bool_())),
    ("accepted", pa.int64()),
    ("draft_seconds", pa.float64()),
    ("verify_seconds", pa.float64()),
])
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
NODE_COLUMNS = ("depths", "parents", "confidences", "rank_buckets", "on_path")
RANK_BUCKETS = (-1, 0, 1, 2, 3)


@dataclass(frozen=True)
class Nodes:
    """The node columns of a trace flattened to one entry per node, with each node's row."""

    row: np.ndarray  # (nodes,) index of the node's iteration row
    local: np.ndarray  # (nodes,) index of the node within its row
    start: np.ndarray  # (rows,) index of each row's first node
    count: np.ndarray  # (rows,) nodes per row
    depths: np.ndarray
    parents: np.ndarray  # global node index of the parent, -1 for the root
    confidences: np.ndarray
    on_path: np.ndarray


def _kind_ok(actual: pa.DataType, wanted: pa.DataType) -> bool:
    if pa.types.is_list(wanted):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and \
            _kind_ok(actual.value_type, wanted.value_type)
    if pa.types.is_integer(wanted):
        return pa.types.is_integer(actual)
    if pa.types.is_floating(wanted):
        return pa.types.is_floating(actual) or pa.types.is_integer(actual)
    if pa.types.is_string(wanted):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    return actual == wanted


def _conform(table: pa.Table) -> pa.Table:
    """Check the column names and kinds, then cast to ``SCHEMA`` (int32 -> int64 and the like)."""
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(f"trace is missing column(s) {', '.join(missing)}: record every column of "
                         "simulator.traces.SCHEMA")
    extra = [c for c in table.column_names if c not in COLUMNS]
    if extra:
        raise InputError(f"trace has unknown column(s) {', '.join(extra)}: keep only the columns of "
                         "simulator.traces.SCHEMA")
    for f in SCHEMA:
        column = table.column(f.name)
        if not _kind_ok(column.type, f.type):
            raise InputError(f"trace column {f.name} has type {column.type}, expected {f.type}: "
                             "write it with simulator.traces.save_traces")
        flat = pc.list_flatten(column) if pa.types.is_list(f.type) else column
        if column.null_count or flat.null_count:
            raise InputError(f"trace column {f.name} has missing values: record a value for every "
                             "row (and every node)")
    return table.select(list(COLUMNS)).cast(SCHEMA)


def _bad(column: str, rows: np.ndarray, problem: str, fix: str) -> None:
    if rows.size:
        raise InputError(f"trace column {column}: row {int(rows[0])} {problem}: {fix}")


def _numpy(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    if pa.types.is_list(column.type):
        column = pc.list_flatten(column)
    return column.to_numpy(zero_copy_only=False)


def _nodes(table: pa.Table) -> Nodes:
    """Flatten the node columns (the table already conforms to ``SCHEMA``)."""
    count = pc.list_value_length(table.column("depths")).to_numpy(zero_copy_only=False).astype(np.int64)
    for name in NODE_COLUMNS[1:]:
        other = pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False)
        _bad(name, np.flatnonzero(other != count), "has a different number of entries than depths",
             "record one entry per drafted node in every node column")
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    row = np.repeat(np.arange(count.size), count)
    local = np.arange(row.size) - start[row]
    parents = _numpy(table, "parents").astype(np.int64)
    _bad("parents", np.unique(row[(parents < -1) | (parents >= local)]),
         "has a parent index that is not an earlier node (or -1 for the root)",
         "list every parent before its children")
    return Nodes(row, local, start, count, _numpy(table, "depths").astype(np.int64),
                 np.where(parents >= 0, start[row] + parents, -1), _numpy(table, "confidences"),
                 _numpy(table, "on_path").astype(bool))


def _validate(table: pa.Table) -> pa.Table:
    """Conform ``table`` to ``SCHEMA`` and check every value; returns the conformed table."""
    if table.num_rows == 0:
        raise InputError("trace has no rows: record at least one decoding iteration")
    table = _conform(table)
    for name in ("domain", "drafter"):
        empty = pc.equal(pc.utf8_length(table.column(name)), 0).to_numpy(zero_copy_only=False)
        _bad(name, np.flatnonzero(empty), "is empty", "name the domain and the drafter kind")
    for name in ("iteration", "context_length", "accepted"):
        _bad(name, np.flatnonzero(_numpy(table, name) < 0), "is negative", "record a count >= 0")
    for name in ("draft_seconds", "verify_seconds"):
        values = _numpy(table, name)
        _bad(name, np.flatnonzero(~np.isfinite(values) | (values < 0)), "is not a finite time >= 0",
             "record wall seconds")
    nodes = _nodes(table)
    depth_of_parent = np.where(nodes.parents >= 0, nodes.depths[np.maximum(nodes.parents, 0)], 0)
    _bad("depths", np.unique(nodes.row[nodes.depths != depth_of_parent + 1]),
         "has a depth that is not its parent's depth + 1", "record depths of the same tree as parents")
    conf = nodes.confidences
    _bad("confidences", np.unique(nodes.row[~np.isfinite(conf) | (conf < 0) | (conf > 1)]),
         "has a value outside [0, 1]", "record probabilities")
    buckets = _numpy(table, "rank_buckets")
    _bad("rank_buckets", np.unique(nodes.row[~np.isin(buckets, RANK_BUCKETS)]),
         "has a value outside -1..3", "record the rank-head bucket 0..3, or -1 without a rank head")
    on = nodes.on_path
    off_parent = on & (nodes.parents >= 0) & ~on[np.maximum(nodes.parents, 0)]
    per_depth = nodes.row[on] * (int(nodes.depths.max(initial=0)) + 1) + nodes.depths[on]
    _, first, repeats = np.unique(per_depth, return_index=True, return_counts=True)
    _bad("on_path", np.unique(np.concatenate((nodes.row[off_parent], nodes.row[on][first[repeats > 1]]))),
         "does not mark a chain from the root", "mark exactly the nodes of the accepted path")
    on_count = np.bincount(nodes.row[on], minlength=table.num_rows)
    _bad("accepted", np.flatnonzero(on_count != _numpy(table, "accepted")),
         "differs from the number of on_path nodes", "record accepted = the accepted path's length")
    return table


def node_arrays(traces: pd.DataFrame) -> Nodes:
    """The validated node columns of ``traces`` flattened to one entry per node."""
    return _nodes(_validate(_from_pandas(traces)))


def _from_pandas(traces: pd.DataFrame) -> pa.Table:
    if not isinstance(traces, pd.DataFrame):
        raise InputError(f"traces must be a pandas DataFrame, got {type(traces).__name__}")
    missing = [c for c in COLUMNS if c not in traces.columns]
    extra = [str(c) for c in traces.columns if c not in COLUMNS]
    if missing or extra:
        raise InputError(f"trace columns differ from simulator.traces.SCHEMA (missing: "
                         f"{', '.join(missing) or '-'}; unknown: {', '.join(extra) or '-'}): "
                         "record exactly its columns")
    try:
        return pa.Table.from_pandas(traces[list(COLUMNS)], schema=SCHEMA, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as err:
        raise InputError(f"trace columns do not fit the schema ({str(err).splitlines()[0]}): "
                         "give each column the type in simulator.traces.SCHEMA") from None


def save_traces(traces: pd.DataFrame, path: str | Path) -> Path:
    """Validate ``traces`` and write them as parquet atomically."""
    table = _validate(_from_pandas(traces))
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def load_traces(path: str | Path) -> pd.DataFrame:
    """Read a parquet trace file and validate every column (InputError naming the file and the fix)."""
    path, fix = Path(path), "pass a file written by `specblock trace`"
    check_size(path, MAX_TRACE_BYTES, "trace file", fix)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise InputError(f"{path}: not a parquet trace file ({str(err).splitlines()[0]}): {fix}") from None
    try:
        return _validate(table).to_pandas()
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
