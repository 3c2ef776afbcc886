"""The real model on a bare GPU machine: its GGUF carried over in parts, joined, checked, converted there.

A device run takes the working tree and at most 64 MiB in all, and SmolLM2-135M's smallest file (the
Q4_1 GGUF) is 98 MB. ``split_file`` cuts a file into parts of at most ``PART_BYTES`` with a manifest
(``<file>.parts.json``: the whole file's size and SHA-256, each part's); consecutive calls carry them
while the machine stays warm, and ``real_checkpoint`` there joins them (every size and digest checked
before a byte is written), converts the GGUF with the engine's own importer (``real_engine.gguf``: the
``gguf`` and ``tokenizers`` packages travel as wheels, docs/design.md says how) and returns the checkpoint
folder. ``experiments.gpu_check --real-model`` then decodes with the drafters trained for the model and
profiles it.

    specblock gpu-check --pack DIR       # here: DIR/<gguf>.partNN and DIR/<gguf>.parts.json
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, file_sha256, read_json, write_json

PART_BYTES = 48 << 20
"""A part's most bytes: two parts, the code and the drafters fit the device's 64 MiB a call."""
MANIFEST_SUFFIX = ".parts.json"
FORMAT = "specblock-parts-v1"
_BLOCK = 1 << 20


def split_file(path: Path, folder: Path, part_bytes: int = PART_BYTES) -> Path:
    """Cut ``path`` into ``folder/<name>.part00, .part01 ...`` of at most ``part_bytes`` each; the
    manifest's path."""
    if part_bytes < 1:
        raise InputError(f"a part of {part_bytes} bytes: give a positive size")
    if not path.is_file():
        raise InputError(f"{path} is not a file: give the model file to carry")
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    with path.open("rb") as source:
        while chunk := source.read(part_bytes):
            part = folder / f"{path.name}.part{len(parts):02d}"
            part.write_bytes(chunk)
            digest = hashlib.sha256(chunk).hexdigest()
            parts.append({"name": part.name, "bytes": len(chunk), "sha256": digest})
    manifest = folder / f"{path.name}{MANIFEST_SUFFIX}"
    write_json(manifest, {"format": FORMAT, "file": path.name, "bytes": path.stat().st_size,
                          "sha256": file_sha256(path), "parts": parts})
    return manifest


def _manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path``, its fields checked."""
    data = read_json(path, MAX_RECORD_BYTES, "parts manifest", "give the .parts.json that split_file wrote")
    parts = data.get("parts") if isinstance(data, dict) else None
    def good(part: Any) -> bool:
        return (isinstance(part, dict) and isinstance(part.get("name"), str) and "/" not in part["name"]
                and isinstance(part.get("bytes"), int) and isinstance(part.get("sha256"), str))

    if (not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(parts, list) or not parts
            or not all(good(p) for p in parts) or not isinstance(data.get("file"), str) or "/" in data["file"]
            or sum(p["bytes"] for p in parts) != data.get("bytes")):
        raise InputError(f"{path} is not a parts manifest (or its sizes do not add up): split the file again")
    return data


def join_parts(manifest: Path, folder: Path) -> Path:
    """The file ``manifest`` describes, joined into ``folder`` from the parts beside it; InputError, with
    nothing written, for a part missing, of another size or digest, or a whole of another digest."""
    data = _manifest(manifest)
    for part in data["parts"]:
        path = manifest.parent / part["name"]
        if not path.is_file() or path.stat().st_size != part["bytes"]:
            raise InputError(f"{path} is missing or not {part['bytes']} bytes: carry every part of "
                             f"{data['file']}")
        if file_sha256(path) != part["sha256"]:
            raise InputError(f"{path} is corrupt (its SHA-256 differs from the manifest's): carry it again")
    folder.mkdir(parents=True, exist_ok=True)
    out, tmp = folder / data["file"], folder / f".{data['file']}.tmp"
    digest = hashlib.sha256()
    with tmp.open("wb") as sink:
        for part in data["parts"]:
            with (manifest.parent / part["name"]).open("rb") as source:
                while block := source.read(_BLOCK):
                    digest.update(block)
                    sink.write(block)
    if digest.hexdigest() != data["sha256"]:
        tmp.unlink()
        raise InputError(f"the parts of {data['file']} join into a file of another SHA-256: split it again")
    tmp.replace(out)
    return out


def real_checkpoint(path: Path, dest: Path) -> Path:
    """A checkpoint folder from ``path``: that folder itself (``config.json``), a GGUF converted into
    ``dest`` (kept: a second run reuses it), or a parts manifest joined beside ``dest`` and converted."""
    if (path / "config.json").is_file():
        return path
    if path.name.endswith(MANIFEST_SUFFIX):
        path = join_parts(path, dest.parent)
    if path.suffix != ".gguf" or not path.is_file():
        raise InputError(f"{path}: give a checkpoint folder, a .gguf file or a {MANIFEST_SUFFIX} manifest")
    from real_engine.gguf import import_gguf  # gguf and tokenizers: carried wheels on a bare machine

    if not (dest / "config.json").is_file():
        import_gguf(path, dest, name=path.stem, source=f"gguf {path.name}")
    return dest
