"""The offline corpus: the running Python's standard library, split into four domains.

Every machine with this Python has the same files, so the shipped models' training data needs no
download. Domains (all from ``sysconfig.get_paths()["stdlib"]``, site-packages and __pycache__
excluded, files sorted by relative path):

- ``code``: library modules' source (``*.py`` outside test folders);
- ``tests``: the test suites (``*.py`` under ``test``/``tests``/``idle_test`` folders, ``test_*.py``);
- ``prose``: the docstrings and comments of every Python file, extracted with ``ast`` and
  ``tokenize``, plus the documentation topics in ``pydoc_data/topics.py`` (one document per topic);
- ``text``: the non-Python text and data files (``.txt .rst .html .xml .toml .json .cfg .ini``,
  the e-mail messages under the test data, README/NEWS files), each cut to 64 KiB.

A file is held out (never trained on, in any domain) when the SHA-256 of its relative path falls in
the lowest ``HELD_OUT_FRACTION`` of the hash range, so the split is the same on every machine and a
file's docstrings (``prose``) are held out exactly when its source is.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import sys
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from core.errors import InputError
from core.files import write_json, write_text
from core.names import DOMAINS
from core.paths import CORPUS_MANIFEST, PROMPTS, TOKENIZER

HELD_OUT_FRACTION = 0.04
TEXT_SUFFIXES = frozenset({".txt", ".rst", ".html", ".xml", ".toml", ".json", ".cfg", ".ini"})
TEXT_NAMES = frozenset({"README", "NEWS", "TODO", "LICENSE", "CREDITS", "HISTORY", "ChangeLog"})
TEXT_MAX_BYTES = 64 * 1024
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
TOPICS = "pydoc_data/topics.py"
EOS = "<|endoftext|>"
VOCAB_SIZE = 8192
PROMPTS_PER_DOMAIN = 64


@dataclass(frozen=True)
class Document:
    """One training or held-out document: its domain, split, source file and text."""

    domain: str
    split: str  # "train" or "heldout"
    path: str  # relative to the stdlib root
    text: str


def stdlib_root() -> Path:
    """The running Python's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(path: str) -> str:
    """``"heldout"`` for a deterministic ~4% of relative paths (by SHA-256), else ``"train"``."""
    digest = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big")
    return "heldout" if digest < HELD_OUT_FRACTION * 2**64 else "train"


def read_text(path: Path) -> str:
    """A file's text: UTF-8, with undecodable bytes replaced, so every file reads the same way."""
    return path.read_bytes().decode("utf-8", errors="replace")


@functools.cache
def _all_files() -> tuple[str, ...]:
    root = stdlib_root()
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts) or not path.is_file() or path.is_symlink():
            continue
        found.append(rel.as_posix())
    return tuple(sorted(found))


def _is_test(rel: str) -> bool:
    parts = rel.split("/")
    return bool(TEST_DIRS.intersection(parts[:-1])) or parts[-1].startswith("test_")


def _is_text(rel: str) -> bool:
    p = Path(rel)
    if p.suffix in TEXT_SUFFIXES:
        return True
    in_email_data = rel.startswith("test/test_email/data/") and p.name.startswith("msg_")
    return in_email_data or p.name in TEXT_NAMES


def domain_files(domain: str) -> list[str]:
    """The sorted relative paths that feed ``domain``."""
    _check_domain(domain)
    files = _all_files()
    if domain == "text":
        return [f for f in files if _is_text(f)]
    py = [f for f in files if f.endswith(".py")]
    if domain == "code":
        return [f for f in py if not _is_test(f) and f != TOPICS]
    if domain == "tests":
        return [f for f in py if _is_test(f)]
    return py


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise InputError(f"unknown corpus domain {domain!r}: use one of {', '.join(DOMAINS)}")


def prose_of(source: str) -> str:
    """The docstrings and comments of a Python source, in file order, blank-line separated.

    Sources that do not parse or tokenize contribute what was extracted before the error.
    """
    pieces: list[tuple[int, str]] = []
    try:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    pieces.append((node.body[0].lineno, doc))
    except (SyntaxError, ValueError, RecursionError):
        pass
    comments: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith("#!"):
                text = tok.string.lstrip("#").strip()
                if text:
                    comments.append((tok.start[0], text))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    # Consecutive comment lines form one paragraph.
    block: list[str] = []
    last = -2
    for line, text in comments:
        if line != last + 1 and block:
            pieces.append((line - len(block), "\n".join(block)))
            block = []
        block.append(text)
        last = line
    if block:
        pieces.append((last, "\n".join(block)))
    pieces.sort(key=lambda p: p[0])
    return "\n\n".join(text for _, text in pieces)


def _topics() -> list[tuple[str, str]]:
    """The pydoc topics: (name, text) pairs, read as a literal without importing the module."""
    source = read_text(stdlib_root() / TOPICS)
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            topics = ast.literal_eval(node.value)
            return sorted(topics.items())
    return []


@functools.cache
def build_domain(domain: str) -> tuple[Document, ...]:
    """All documents of ``domain``, in a fixed order (cached per process)."""
    _check_domain(domain)
    root = stdlib_root()
    docs = []
    for rel in domain_files(domain):
        text = read_text(root / rel)
        if domain == "text":
            text = text[:TEXT_MAX_BYTES]
        elif domain == "prose":
            if rel == TOPICS:
                docs.extend(Document(domain, split_of(f"{rel}:{name}"), f"{rel}:{name}", body.strip())
                            for name, body in _topics())
                continue
            text = prose_of(text)
        if text.strip():
            docs.append(Document(domain, split_of(rel), rel, text))
    return tuple(docs)


def documents(domains: tuple[str, ...] = DOMAINS, split: str = "train") -> list[Document]:
    """The documents of one split across ``domains``, domain by domain."""
    if split not in ("train", "heldout"):
        raise InputError(f"unknown split {split!r}: use train or heldout")
    return [doc for d in domains for doc in build_domain(d) if doc.split == split]


def domain_manifest(domain: str) -> dict[str, Any]:
    """File lists per split, sizes and a SHA-256 over paths and texts for one domain."""
    h = hashlib.sha256()
    entry: dict[str, Any] = {"train": [], "heldout": [], "characters": {"train": 0, "heldout": 0}}
    for doc in build_domain(domain):
        h.update(doc.path.encode() + b"\0" + doc.text.encode("utf-8", errors="replace") + b"\0")
        entry[doc.split].append(doc.path)
        entry["characters"][doc.split] += len(doc.text)
    entry["sha256"] = h.hexdigest()
    return entry


def manifest(domains: tuple[str, ...] = DOMAINS) -> dict[str, Any]:
    """The corpus manifest: Python version, split rule, per-domain file lists and hashes."""
    per_domain = {d: domain_manifest(d) for d in domains}
    total = hashlib.sha256("".join(per_domain[d]["sha256"] for d in domains).encode()).hexdigest()
    return {
        "python_version": sys.version.split()[0],
        "stdlib_root": "sysconfig.get_paths()['stdlib']",
        "held_out_fraction": HELD_OUT_FRACTION,
        "split_rule": "heldout when sha256(relative path)[:8] < fraction * 2**64",
        "sha256": total,
        "domains": per_domain,
    }


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE tokenizer trained on the training split of every domain.

    ``<|endoftext|>`` (id 0) ends each document and is the models' BOS/EOS.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((doc.text for doc in documents()), trainer=trainer)
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a ``tokenizer.json``."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"no tokenizer at {path}: run `specblock train tokenizer` first")
    return Tokenizer.from_file(str(path))


def encode_documents(tok: Tokenizer, docs: list[Document]) -> np.ndarray:
    """The documents' tokens as one stream, each document followed by EOS: uint16 where the vocabulary
    fits (the shipped tokenizer, SmolLM2's), else uint32."""
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise InputError(f"the tokenizer has no {EOS} token to end documents with: give a tokenizer that has")
    ids: list[int] = []
    for enc in tok.encode_batch([d.text for d in docs]):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32)


def prompt_set(tok: Tokenizer, domain: str, count: int = PROMPTS_PER_DOMAIN, seed: int = 0
               ) -> list[dict[str, Any]]:
    """``count`` prompts cut from ``domain``'s held-out documents: 64 to 256 token prefixes.

    Prompts cycle over the held-out documents (in order); the i-th prompt of a document starts at a
    line boundary chosen by a seeded generator, and its length is drawn in [64, 256] tokens.
    """
    rng = np.random.default_rng([seed, DOMAINS.index(domain)])
    docs = [d for d in build_domain(domain) if d.split == "heldout"]
    encoded = [tok.encode(d.text) for d in docs]
    usable = [(d, e) for d, e in zip(docs, encoded, strict=True) if len(e.ids) >= 80]
    if not usable:
        raise InputError(f"domain {domain!r} has no held-out document long enough for prompts")
    prompts = []
    i = 0
    while len(prompts) < count:
        doc, enc = usable[i % len(usable)]
        i += 1
        length = int(rng.integers(64, 257))
        length = min(length, len(enc.ids))
        start_tok = int(rng.integers(0, max(1, len(enc.ids) - length)))
        # Snap the start to the beginning of a line, so a prompt never opens mid-token or mid-word.
        start_char = enc.offsets[start_tok][0]
        start_char = doc.text.rfind("\n", 0, start_char) + 1
        ids = tok.encode(doc.text[start_char:]).ids[:length]
        if len(ids) < 64:
            continue
        prompts.append({"id": f"{domain}-{len(prompts):03d}", "domain": domain, "source": doc.path,
                        "tokens": len(ids), "text": tok.decode(ids)})
    return prompts


def prepare_data() -> dict[str, Any]:
    """Write the corpus manifest, the tokenizer and the prompt sets into the shipped data folder."""
    man = manifest()
    write_json(CORPUS_MANIFEST, man)
    tok = train_tokenizer()
    write_text(TOKENIZER, tok.to_str())
    counts = {}
    for domain in DOMAINS:
        rows = prompt_set(tok, domain)
        write_text(PROMPTS / f"{domain}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        counts[domain] = len(rows)
    return {"corpus_sha256": man["sha256"], "vocab_size": tok.get_vocab_size(), "prompts": counts}
