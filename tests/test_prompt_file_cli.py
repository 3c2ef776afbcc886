"""`--prompt-file FILE` on bench, trace and pipeline (the project's JSON lines or MT-bench questions, rows
reported by category) and `generate --chat` (the model's chat template, or one line and exit 2 without
one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.traces import load_traces

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["def greet(name):", "And again?"]},
    {"question_id": 82, "category": "coding", "turns": ["for i in range(3):", "More?"]},
    {"question_id": 83, "category": "writing", "turns": ["class Point:", "More?"]},
]






@pytest.fixture
def questions(tmp_path: Path) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def test_bench_reports_an_mt_bench_file_by_category(llama_dir: Path, questions: Path, tmp_path: Path,
                                                    cli) -> None:
    code, _, err = cli(["bench", "--model", str(llama_dir), "--prompt-file", str(questions), "--drafters",
                          "none,ngram", "--temperatures", "0", "--prompts", "2", "--max-new-tokens", "4",
                          "--no-hf", "--out", str(tmp_path / "out"), "--json"])
    assert code == 0, err
    saved = json.loads((tmp_path / "out" / f"bench_{llama_dir.name}.json").read_text())
    assert saved["config"]["categories"] == {"writing": 2, "coding": 1}
    assert {"writing", "coding"} <= {row["category"] for row in saved["results"]["rows"]}


def test_trace_takes_a_prompt_file_and_keeps_its_categories(llama_dir: Path, draft_dir: Path, questions: Path,
                                                            tmp_path: Path,
                                                            cli) -> None:
    out = tmp_path / "t.parquet"
    code, stdout, err = cli(["trace", "--model", str(llama_dir), "--draft-model", str(draft_dir),
                             "--prompt-file", str(questions), "--prompts", "1", "--max-new-tokens", "6",
                             "--draft-length", "3", "--out", str(out), "--json"])
    assert code == 0, err
    assert json.loads(stdout)["queries"] == 2 and set(load_traces(out)["domain"]) == {"writing", "coding"}


def test_prompt_file_bad_input(llama_dir: Path, draft_dir: Path, questions: Path, tmp_path: Path,
                               refused) -> None:
    assert "drop --categories" in refused(["bench", "--model", str(llama_dir), "--prompt-file",
                                           str(questions), "--categories", "code", "--no-hf"])
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n")
    err = refused(["trace", "--model", str(llama_dir), "--draft-model", str(draft_dir), "--prompt-file",
                   str(broken), "--out", str(tmp_path / "t.parquet")])
    assert "line 2" in err and not (tmp_path / "t.parquet").exists()
    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps(q) + "\n" for q in (QUESTIONS[1], QUESTIONS[0], QUESTIONS[2])))
    err = refused(["pipeline", "--quick", "--model", str(llama_dir), "--draft-model", str(draft_dir),
                   "--prompt-file", str(one), "--out", str(tmp_path / "run")])
    assert "'coding' has one prompt" in err


def test_generate_chat_needs_a_template(llama_dir: Path, refused) -> None:
    err = refused(["generate", "--model", str(llama_dir), "--chat", "--prompt", "hi", "--drafter", "none"])
    assert "no chat template" in err and "drop --chat" in err
