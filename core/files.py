"""File input and output for every package.

Writes are atomic: a result is either complete on disk or absent, never half-written. Reads of user
files are capped: ``read_text`` and ``read_json`` check a file's size before reading it (and read at
most the cap, for files whose size the file system does not know), so a wrong or hostile file costs no
more memory than the cap. The caps are generous: each is far above the largest such file specblock
ships or its pipeline writes (the comments give those sizes).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import InputError

_UMASK = os.umask(0)
os.umask(_UMASK)

MIB = 2**20
MAX_POLICY_BYTES = 4 * MIB  # a policy file, calibration included, is a few KiB
MAX_CALIBRATION_BYTES = 4 * MIB  # a pipeline's calibration.json is a few KiB
MAX_PROFILE_BYTES = 16 * MIB  # the shipped CPU profile is 58 KiB
MAX_TRACE_BYTES = 256 * MIB  # the shipped traces are 98 KiB of parquet
MAX_PROMPT_BYTES = 1 * MIB  # the models' context is a few thousand tokens: about 16 KiB of text
MAX_PROMPT_SET_BYTES = 64 * MIB  # a <domain>.jsonl prompt set: the shipped ones are under 46 KiB
MAX_RECORD_BYTES = 16 * MIB  # a training log, checkpoint meta, trial record or study.json: KiBs
MAX_CONFIG_BYTES = 16 * MIB  # a config.json or safetensors index: KiBs, an 8B model's index 24 KiB
MAX_TOKENIZER_BYTES = 128 * MIB  # a tokenizer.json: the shipped one 217 KiB, large-vocabulary ones ~30 MiB
MAX_INT_DIGITS = 30  # longer integers in a JSON input are refused: no field of ours needs more than 20


def check_size(path: str | Path, limit: int, what: str, fix: str) -> None:
    """InputError ("<path>: problem: ``fix``") when the ``what`` at ``path`` is missing, a folder, or larger
    than ``limit`` bytes: a check made before reading it."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}: {fix}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({err.strerror or err}): {fix}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{path}: is a folder, not a {what}: {fix}")
    if info.st_size > limit:
        raise InputError(f"{path}: the {what} is {_size(info.st_size)}, over the {_size(limit)} limit: {fix}")


def _read_bytes(path: Path, limit: int, what: str, fix: str) -> bytes:
    """The bytes of ``path`` after ``check_size``; at most ``limit`` of them, else InputError."""
    check_size(path, limit, what, fix)
    try:
        with path.open("rb") as file:
            data = file.read(limit + 1)  # a device or a pipe says size 0: read no more than the cap
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({err.strerror or err}): {fix}") from None
    if len(data) > limit:
        raise InputError(f"{path}: the {what} is over the {_size(limit)} limit: {fix}")
    return data


def read_text(path: str | Path, limit: int, what: str, fix: str) -> str:
    """The UTF-8 text of the ``what`` at ``path``, newlines translated as ``Path.read_text`` does;
    InputError ("<path>: problem: ``fix``") when it is missing, unreadable, larger than ``limit`` bytes
    (checked before reading) or not UTF-8."""
    data = _read_bytes(Path(path), limit, what, fix)
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: the {what} is not UTF-8 text ({err.reason} at byte {err.start}): "
                         f"{fix}") from None


def read_json(path: str | Path, limit: int, what: str, fix: str) -> Any:
    """The decoded JSON ``what`` at ``path`` (``read_text``'s cap); InputError when it is missing,
    unreadable, too large, not UTF-8 JSON, nested deeper than Python's parser recurses, or holds an
    integer of more than ``MAX_INT_DIGITS`` digits."""
    data = _read_bytes(Path(path), limit, what, fix)
    try:
        return json.loads(data.decode("utf-8"), parse_int=_parse_int)
    except RecursionError:
        problem = "nested too deeply for Python's parser"
    except ValueError as err:  # UnicodeDecodeError, JSONDecodeError, and _parse_int's refusal
        problem = str(err).splitlines()[0]
    raise InputError(f"{path}: not a JSON {what} ({problem}): {fix}")


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits.lstrip('-'))} digits, over {MAX_INT_DIGITS}")
    return int(digits)


def _size(count: int) -> str:
    return f"{count / MIB:.1f} MiB ({count:,} bytes)"


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give results the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def file_sha256(path: str | Path) -> str:
    """The SHA-256 hex digest of a file, read in chunks (a downloaded model or data file is checked by it)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
