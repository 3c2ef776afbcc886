"""The offline corpus, its split, the shipped tokenizer and the prompt sets."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from core.names import DOMAINS
from core.paths import DATA
from real_engine.training import corpus

MANIFEST = json.loads((DATA / "corpus_manifest.json").read_text())
SAME_PYTHON = MANIFEST["python_version"] == sys.version.split()[0]


@pytest.fixture(scope="module")
def tokenizer():
    return corpus.load_tokenizer(DATA / "tokenizer.json")


def test_domain_build_is_deterministic() -> None:
    first = corpus.domain_manifest("text")
    corpus.build_domain.cache_clear()
    corpus._all_files.cache_clear()
    second = corpus.domain_manifest("text")
    assert first == second
    assert first["train"] and first["heldout"]


@pytest.mark.skipif(not SAME_PYTHON, reason="the manifest was recorded with another Python version")
def test_recorded_manifest_matches_this_python() -> None:
    text = corpus.domain_manifest("text")
    recorded = MANIFEST["domains"]["text"]
    assert (text["train"], text["heldout"], text["sha256"]) == (
        recorded["train"], recorded["heldout"], recorded["sha256"])
    for domain in ("code", "tests"):
        listed = MANIFEST["domains"][domain]
        assert set(listed["train"]) | set(listed["heldout"]) <= set(corpus.domain_files(domain))
    hashes = "".join(MANIFEST["domains"][d]["sha256"] for d in DOMAINS)
    assert hashlib.sha256(hashes.encode()).hexdigest() == MANIFEST["sha256"]


def test_heldout_files_never_enter_training() -> None:
    for domain in DOMAINS:
        listed = MANIFEST["domains"][domain]
        assert listed["heldout"], domain
        assert not set(listed["train"]) & set(listed["heldout"])
        assert all(corpus.split_of(p) == "heldout" for p in listed["heldout"])
        assert all(corpus.split_of(p) == "train" for p in listed["train"])
    train_paths = {d.path for d in corpus.documents(("text",), "train")}
    assert not train_paths & set(MANIFEST["domains"]["text"]["heldout"])


def test_split_is_by_file_across_domains() -> None:
    # A file's docstrings (prose) are held out exactly when its source (code or tests) is.
    domains = MANIFEST["domains"]
    prose = domains["prose"]
    source_heldout = set(domains["code"]["heldout"]) | set(domains["tests"]["heldout"])
    assert source_heldout & set(prose["heldout"])
    assert not source_heldout & set(prose["train"])


def test_prose_extracts_docstrings_and_comments() -> None:
    source = ('"""Module doc."""\n# a comment\n# continued\n'
              'def f():\n    """Function doc."""\n    return 1  # tail\n')
    assert corpus.prose_of(source) == "Module doc.\n\na comment\ncontinued\n\nFunction doc.\n\ntail"


def test_tokenizer_round_trips_every_domain(tokenizer) -> None:
    assert tokenizer.get_vocab_size() == corpus.VOCAB_SIZE
    assert tokenizer.token_to_id(corpus.EOS) == 0
    samples = [json.loads(line)["text"] for d in DOMAINS
               for line in (DATA / "prompts" / f"{d}.jsonl").read_text().splitlines()[:5]]
    samples += [doc.text for doc in corpus.build_domain("text")[:20]]
    samples.append("naïve café — ünïcode ✓ \t\r\n  indented")
    for text in samples:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


@pytest.mark.parametrize("domain", DOMAINS)
def test_prompt_files(domain: str) -> None:
    rows = [json.loads(line) for line in (DATA / "prompts" / f"{domain}.jsonl").read_text().splitlines()]
    assert len(rows) >= 60
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert row["domain"] == domain and row["text"].strip()
        assert 64 <= row["tokens"] <= 256
        assert corpus.split_of(row["source"]) == "heldout"


@pytest.mark.skipif(not SAME_PYTHON, reason="the prompts were cut from another Python's library")
def test_prompts_are_reproducible(tokenizer) -> None:
    rows = [json.loads(line) for line in (DATA / "prompts" / "text.jsonl").read_text().splitlines()]
    assert corpus.prompt_set(tokenizer, "text") == rows
