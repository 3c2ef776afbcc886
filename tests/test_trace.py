"""Traces from the live engine: node columns, agreement with the decode loop, round trip, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.cli import main
from real_engine.decode import Iteration, generate, make_drafter
from real_engine.model import Transformer
from real_engine.prompts import Prompt
from real_engine.trace import load_prompts, node_columns, record
from real_engine.tree import DraftTree
from simulator.traces import load_traces, save_traces


@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    gen = torch.Generator().manual_seed(0)
    return [Prompt(f"p{i}", ("a", "b")[i % 2], tuple(torch.randint(1, 96, (6 + i,), generator=gen).tolist()))
            for i in range(6)]


def test_node_columns_of_a_tree() -> None:
    q = torch.zeros(5, 8)
    q[0, [3, 4]] = torch.tensor([0.6, 0.3])
    q[1, 5] = 0.9
    q[2, 6] = 0.5
    tree = DraftTree(torch.tensor([1, 3, 5, 4, 6]), torch.tensor([-1, 0, 1, 0, 2]), q, "topk")
    cols = node_columns(Iteration(tree, (1, 2), 7, 10, 0.0, 0.0))
    assert cols["depths"].tolist() == [1, 2, 1, 3]
    assert cols["parents"].tolist() == [-1, 0, -1, 1]
    assert cols["confidences"].tolist() == pytest.approx([0.6, 0.9, 0.3, 0.5])
    assert cols["on_path"].tolist() == [True, True, False, False]
    assert cols["rank_buckets"].tolist() == [-1] * 4


@pytest.mark.parametrize("shape", [{"depth": 3}, {"depth": 3, "width": 2, "budget": 6}])
def test_trace_matches_the_decode_loop(shape: dict, target: Transformer, draft: Transformer,
                                       prompts: list[Prompt], tmp_path: Path) -> None:
    rec = record(target, prompts, lambda: make_drafter("draft-model", target, draft, **shape), "draft-model",
                 max_new_tokens=12)
    traces = rec.traces
    for query, stats in enumerate(rec.stats):
        rows = traces[traces["query_id"] == query]
        assert rows["accepted"].tolist() == list(stats.accepted)
        assert rows["iteration"].tolist() == list(range(stats.iterations))
        assert [len(d) + 1 for d in rows["depths"]] == list(stats.tree_sizes)
        assert rows["context_length"].iloc[0] == len(prompts[query].tokens) - 1  # the root is not cached
        assert np.diff(rows["context_length"]).tolist() == [a + 1 for a in stats.accepted[:-1]]
        assert rows["draft_seconds"].sum() == pytest.approx(stats.draft_seconds, rel=1e-6)
        assert rows["verify_seconds"].sum() == pytest.approx(stats.verify_seconds, rel=1e-6)
    assert sum(traces["accepted"]) > 0
    assert set(traces["domain"]) == {"a", "b"}
    save_traces(traces, tmp_path / "t.parquet")
    back = load_traces(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(back.drop(columns=["depths", "parents", "confidences", "rank_buckets",
                                                     "on_path"]),
                                  traces.drop(columns=["depths", "parents", "confidences", "rank_buckets",
                                                       "on_path"]), check_dtype=False)
    for column in ("depths", "parents", "confidences", "on_path"):
        assert all(np.array_equal(a, b) for a, b in zip(back[column], traces[column], strict=True))


def test_tracing_does_not_change_the_output(target: Transformer, draft: Transformer,
                                            prompts: list[Prompt]) -> None:
    seen = []
    plain = generate(target, list(prompts[0].tokens), drafter=make_drafter("draft-model", target, draft),
                     max_new_tokens=12)
    traced = generate(target, list(prompts[0].tokens), drafter=make_drafter("draft-model", target, draft),
                      max_new_tokens=12, on_iteration=seen.append)
    assert traced.tokens == plain.tokens and len(seen) == traced.stats.iterations
    assert [len(it.path) for it in seen] == list(traced.stats.accepted)


def test_prompt_split_and_truncation(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"x-{i}", "text": "ab" * (i + 1)}) for i in range(6)]
    (tmp_path / "x.jsonl").write_text("\n".join(lines))
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    cal = load_prompts(["x"], 5, encode, "calibration", folder=tmp_path)
    ev = load_prompts(["x"], 2, encode, "evaluation", max_tokens=3, folder=tmp_path)
    assert [p.name for p in cal] == ["x-0", "x-1", "x-2"]
    assert [p.name for p in ev] == ["x-3", "x-4"] and all(len(p.tokens) == 3 for p in ev)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["trace", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_writes_a_trace(llama_dir: Path, draft_dir: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.parquet"
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(draft_dir),
                             "--domains", "code,text", "--prompts", "1", "--max-new-tokens", "8",
                             "--draft-length", "3", "--out", str(out), "--json"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    traces = load_traces(out)
    assert result["iterations"] == len(traces) and result["queries"] == 2
    assert set(traces["domain"]) == {"code", "text"} and set(traces["drafter"]) == {"draft-model"}
    assert result["tau"] >= 1.0


def test_cli_probes_every_position(llama_dir: Path, draft_dir: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.parquet"
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(draft_dir), "--domains", "code",
                             "--prompts", "1", "--max-new-tokens", "8", "--draft-length", "3", "--probe",
                             "--out", str(out), "--json"], capsys)
    assert code == 0, err
    traces = load_traces(out)
    assert json.loads(stdout)["probe"] and len(traces) == 8  # a plain step per token, a draft at each
    assert np.diff(traces["context_length"]).tolist() == [1] * 7


@pytest.mark.parametrize("args", [["--drafter", "bogus"], ["--domains", " , "], ["--domains", "nosuchdomain"],
                                  ["--model", "{missing}"], ["--prompts", "0"],
                                  ["--probe", "--temperature", "1"], ["--probe", "--verifier", "token"]])
def test_cli_bad_input_exits_2(args: list[str], llama_dir: Path, draft_dir: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(missing=tmp_path / "nowhere") for a in args]
    base = [] if "--model" in args else ["--model", str(llama_dir)]
    code, stdout, err = run([*base, "--draft-model", str(draft_dir), *args,
                             "--out", str(tmp_path / "t.parquet"), "--json"], capsys)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("specblock: error:")
    assert not (tmp_path / "t.parquet").exists()
