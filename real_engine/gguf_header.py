"""The checks a GGUF file passes before anything trusts it, and typed reads of its metadata.

A GGUF is user input and may be hostile. ``gguf.GGUFReader`` memory-maps the file and walks its header
as the header declares itself, and a read past the end gives it a short array, not an error: a string
that claims 2**60 bytes is silently cut at the end of the file; a tensor or key count that large fails
at the first empty read; but an array of scalars that claims 2**60 items loops for ever, appending an
empty view per item, its memory growing without bound. Even within the file's size every array item
costs the reader a numpy view object of its own, hundreds of times the item's bytes. So ``scan`` first
walks the header with ``struct``, reading only lengths, counts, types, dimensions and offsets, and
checks each against the bytes really left in the file and against the caps below (the array cap also
bounds the reader's memory, to what a large vocabulary needs anyway); only a file that passes is handed
to ``read``. The scan allocates nothing in proportion to a declared count. It also holds the tensors to
llama.cpp's layout (each at the padded end of the one before), so a type or shape that misstates a
tensor's size is caught.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import gguf

from core.errors import InputError

GIB = 2**30
MAX_GGUF_BYTES = 64 * GIB  # the largest file imported: a 16B-parameter model at 4 bytes a weight
MAX_PARAMETERS = 16 * GIB  # values over all tensors: 64 GiB as float32, far past a CPU engine's reach
MAX_TENSORS = 1 << 16  # a 30-layer Llama has 272 tensors; one of 200 layers with biases under 3,000
MAX_KEYS = 1 << 16  # metadata keys: a llama.cpp file has about 40
MAX_ARRAY_ELEMENTS = 1 << 20  # over all metadata arrays: a 262,144-token vocabulary's tokens, types, scores
MAX_STRING_BYTES = 1 << 24  # one metadata string: a chat template is a few KiB
MAX_NAME_BYTES = 1 << 10  # a key or tensor name: llama.cpp's are under 64 bytes
SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
CORRUPT = "the file is truncated or corrupt: download or convert it again"


@dataclass(frozen=True)
class Entry:
    """One tensor as the header declares it, checked against the file."""

    name: str
    shape: tuple[int, ...]  # torch order (rows first)
    kind: str  # the ggml type's name
    nbytes: int


class _Walk:
    """A cursor over the header that refuses to step past the file's end."""

    def __init__(self, view: mmap.mmap, size: int, path: Path) -> None:
        self.view, self.size, self.path, self.pos = view, size, path, 0

    def fail(self, problem: str, fix: str = CORRUPT) -> NoReturn:
        raise InputError(f"{self.path}: {problem}: {fix}")

    def take(self, count: int, what: str) -> int:
        if count > self.size - self.pos:
            self.fail(f"the {what} at byte {self.pos} needs {count:,} bytes but the file has "
                      f"{self.size - self.pos:,} left")
        start, self.pos = self.pos, self.pos + count
        return start

    def read(self, fmt: str, what: str) -> Any:
        return struct.unpack_from("<" + fmt, self.view, self.take(struct.calcsize(fmt), what))[0]

    def string(self, limit: int, what: str) -> int:
        """Step over a string (at most ``limit`` bytes); its start."""
        at = self.pos
        length = self.read("Q", f"length of the {what}")
        if length > limit:
            self.fail(f"the {what} at byte {at:,} claims {length:,} bytes, over the {limit:,} limit")
        return self.take(length, what)

    def name(self, what: str) -> str:
        """Step over a key or tensor name; its text."""
        start = self.string(MAX_NAME_BYTES, what)
        return bytes(self.view[start:self.pos]).decode("utf-8", "replace")


def scan(path: Path, size: int) -> list[Entry]:
    """Check the header's every count, length, type and offset against the file (see the module
    docstring); the tensors it declares. InputError names the first problem."""
    if size < 24:
        raise InputError(f"{path}: {size} bytes is too short for a GGUF file: give a .gguf model file")
    with path.open("rb") as file:
        magic = file.read(4)
        if magic != b"GGUF":
            raise InputError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF'): give a .gguf "
                             "model file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            walk = _Walk(view, size, path)
            walk.pos = 4
            version = walk.read("I", "version")
            if version & 0xFFFF == 0:
                walk.fail("a big-endian GGUF", "convert the model to a little-endian GGUF")
            if version not in (2, 3):
                walk.fail(f"GGUF version {version}", "only versions 2 and 3 are read; convert it again")
            tensors, keys = walk.read("Q", "tensor count"), walk.read("Q", "key count")
            for count, limit, least, what in ((tensors, MAX_TENSORS, 32, "tensors"),
                                              (keys, MAX_KEYS, 13, "keys")):  # least: bytes one takes
                if count > limit or count * least > size - walk.pos:
                    walk.fail(f"the header declares {count:,} {what}, more than the file's {size:,} bytes "
                              f"hold or the {limit:,} limit")
            alignment = _scan_keys(walk, keys)
            return _scan_tensors(walk, tensors, alignment)


def _scan_keys(walk: _Walk, keys: int) -> int:
    """Step over the metadata; the data alignment it sets (32 by default)."""
    alignment, elements = 32, 0
    for _ in range(keys):
        key = walk.name("metadata key")
        kind = walk.read("I", f"type of {key!r}")
        if kind in _SCALARS:
            start = walk.take(struct.calcsize(_SCALARS[kind]), f"value of {key!r}")
            if key == "general.alignment" and kind == 4:
                alignment = struct.unpack_from("<I", walk.view, start)[0]
        elif kind == _STRING:
            walk.string(MAX_STRING_BYTES, f"string {key!r}")
        elif kind == _ARRAY:
            item, count = walk.read("I", f"item type of {key!r}"), walk.read("Q", f"length of {key!r}")
            elements += count
            if elements > MAX_ARRAY_ELEMENTS:
                walk.fail(f"metadata array {key!r} of {count:,} items takes the arrays past the "
                          f"{MAX_ARRAY_ELEMENTS:,}-item limit")
            if item in _SCALARS:
                walk.take(count * struct.calcsize(_SCALARS[item]), f"array {key!r}")
            elif item == _STRING:
                for _ in range(count):
                    walk.string(MAX_STRING_BYTES, f"item of {key!r}")
            else:
                walk.fail(f"metadata array {key!r} has items of type {item}, which GGUF readers do not read")
        else:
            walk.fail(f"metadata key {key!r} has the unknown value type {kind}")
    if alignment == 0 or alignment & (alignment - 1):
        walk.fail(f"general.alignment {alignment} is not a power of two")
    return alignment


def _scan_tensors(walk: _Walk, count: int, alignment: int) -> list[Entry]:
    """Step over the tensor table; each tensor checked to fit its type's blocks and the file."""
    infos, total = [], 0
    for _ in range(count):
        name = walk.name("tensor name")
        dims = walk.read("I", f"dimension count of {name!r}")
        if not 1 <= dims <= 4:
            walk.fail(f"tensor {name!r} has {dims} dimensions, not 1 to 4")
        shape = tuple(walk.read("Q", f"dimensions of {name!r}") for _ in range(dims))
        kind_id, offset = walk.read("I", f"type of {name!r}"), walk.read("Q", f"offset of {name!r}")
        elements = math.prod(shape)
        total += elements
        if min(shape) < 1:
            walk.fail(f"tensor {name!r} declares the shape {list(shape)}, which holds no values")
        if total > MAX_PARAMETERS:
            walk.fail(f"tensor {name!r} ({list(shape)}) takes the model past {MAX_PARAMETERS:,} values "
                      f"({4 * MAX_PARAMETERS // GIB} GiB as float32)",
                      "import a smaller model (or download the file again if it is corrupt)")
        try:
            kind = gguf.GGMLQuantizationType(kind_id).name
        except ValueError:
            kind = f"type {kind_id}"
        if kind not in SUPPORTED:
            walk.fail(f"tensor {name!r} is stored as {kind}, which is not supported",
                      f"use a file quantized to one of {', '.join(SUPPORTED)}")
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
        if shape[0] % block:
            walk.fail(f"tensor {name!r} has rows of {shape[0]} values, not a whole number of {kind} blocks "
                      f"of {block}: its byte size disagrees with its shape and type")
        infos.append((offset, name, tuple(reversed(shape)), kind, elements // block * type_size))
    # llama.cpp's layout rule: the tensors lie in the order listed, each at the padded end of the one before
    # (gguf.cpp refuses any other offset), so a type or shape that misstates a tensor's size shows here.
    start, expected, before = -(-walk.pos // alignment) * alignment, 0, "the start of the data"
    for offset, name, shape, kind, nbytes in infos:
        if offset != expected:
            walk.fail(f"tensor {name!r} starts at byte {offset:,} of the data but {before} ends at "
                      f"{expected:,}: a tensor's byte size disagrees with its shape and type")
        if start + offset + nbytes > walk.size:
            walk.fail(f"tensor {name!r} ({kind}, {nbytes:,} bytes at byte {start + offset:,}) runs past the "
                      f"end of the file ({walk.size:,} bytes)")
        expected = offset + -(-nbytes // alignment) * alignment
        before = f"the tensor before it ({name!r}, {kind} {list(shape)})"
    return [Entry(name, shape, kind, nbytes) for _offset, name, shape, kind, nbytes in infos]


def read(path: Path, entries: list[Entry]) -> gguf.GGUFReader:
    """``GGUFReader`` on a scanned file, cross-checked against the scan."""
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, OSError) as err:
        raise InputError(f"{path}: cannot read it as a GGUF file ({err}): {CORRUPT}") from None
    found = {t.name: t for t in reader.tensors}
    for entry in entries:
        tensor = found.get(entry.name)
        if tensor is None or tensor.data.nbytes != entry.nbytes or tensor.tensor_type.name != entry.kind:
            raise InputError(f"{path}: tensor {entry.name!r} reads back unlike its header: {CORRUPT}")
    return reader


def field(reader: gguf.GGUFReader, path: Path, key: str, kind: type, default: Any = ...) -> Any:
    """Metadata value ``key`` of Python type ``kind`` (int, float, str, bool, or list for an array);
    InputError when it is missing (and no ``default``) or of another type."""
    found = reader.fields.get(key)
    if found is None:
        if default is ...:
            raise InputError(f"{path}: the metadata lacks {key!r}: it is not a complete llama.cpp model "
                             "file; convert the model again")
        return default
    try:
        value = found.contents()
    except (UnicodeDecodeError, IndexError, ValueError) as err:
        raise InputError(f"{path}: metadata {key!r} cannot be read ({err}): {CORRUPT}") from None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
          isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
    if not ok:
        raise InputError(f"{path}: metadata {key!r} is {type(value).__name__} {str(value)[:40]!r}, not "
                         f"{kind.__name__}: {CORRUPT}")
    return value
