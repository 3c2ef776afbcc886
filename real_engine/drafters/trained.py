"""Where a trained drafter's weights and any drafter's deployed shape live, read as the builders need.

A trained drafter (registered with ``trained=True`` in ``core.names``: SpecBlock, EAGLE, Medusa) is
built from a folder that ``specblock train <name>`` writes (``config.json`` and ``model.safetensors``);
the caller names it (a model's own is ``core.models.ModelSpec.drafter_folder``: the shipped toy family's
are ``data/models/<name>``), never a default taken from another model. Options left as None keep the
folder's deployed shape: its ``drafting.json`` (``{"shape": {...}}``, of the drafter's registered
``shape_options``, as ``specblock shapes --apply`` writes the fastest one measured on this machine), else
the trained settings. A run in another dtype than the model's own reads ``drafting-<dtype>.json`` where
``specblock shapes --dtype DTYPE --apply`` saved one: a step's cost by rows differs by dtype (int4's
kernels cost more per extra row than bfloat16's), so the fastest shape does too. Each
builder (``build_specblock``, ``build_eagle``, ``build_medusa``) reads its folder and shape through
``trained_shape``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, read_json, write_json
from core.names import draft_options, drafter_spec

FILES = ("config.json", "model.safetensors")
SHAPE_FILE = "drafting.json"  # a draft model's lies in the draft model's folder


def shape_name(dtype: str | None = None) -> str:
    """The name of a deployed-shape file: ``drafting.json``, or ``drafting-<dtype>.json`` for ``dtype``'s."""
    return SHAPE_FILE if dtype is None else SHAPE_FILE.replace(".json", f"-{dtype}.json")


def shape_file(folder: str | Path, dtype: str | None = None) -> Path:
    """Where ``folder``'s deployed shape for runs in ``dtype`` lies: ``drafting-<dtype>.json`` where one
    was saved for that dtype, else ``drafting.json`` (the model's own dtype's, and any dtype's fallback)."""
    own = Path(folder) / shape_name(dtype)
    return own if own.is_file() else Path(folder) / SHAPE_FILE


def deployed_shape(name: str, folder: str | Path, dtype: str | None = None) -> dict[str, float]:
    """The shape saved for runs in ``dtype`` (``shape_file``; empty when there is none), of the options
    drafter ``name`` registers as ``shape_options``."""
    path = shape_file(folder, dtype)
    if not path.is_file():
        return {}
    options = drafter_spec(name).shape_options
    try:
        shape = read_json(path, MAX_CONFIG_BYTES, "drafting shape", "re-save it with --deploy")["shape"]
        ok = isinstance(shape, dict) and all(k in options and _valid(k, v) for k, v in shape.items())
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{path} is not a {name} drafting shape ({{\"shape\": {{option: value}}}} with "
                         f"options {', '.join(options)}: positive ints, a probability for "
                         "min_confidence): fix it, delete it, or rewrite it with `specblock shapes --apply`")
    return dict(shape)


def _valid(option: str, value: Any) -> bool:
    """Whether ``value`` suits ``option``: a probability for a probability option, else a positive int."""
    if option in draft_options and draft_options[option].probability:
        return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def write_shape(name: str, folder: str | Path, shape: dict[str, float], record: dict[str, Any],
                dtype: str | None = None) -> Path:
    """Save ``shape`` as ``folder``'s deployed shape, with ``record`` (how it was chosen): for runs in
    ``dtype`` alone (``drafting-<dtype>.json``) when given, else ``drafting.json``."""
    options = drafter_spec(name).shape_options
    bad = sorted(set(shape) - set(options))
    if bad:
        raise InputError(f"{name} takes no shape option {bad[0]!r}: use {', '.join(options)}")
    return write_json(Path(folder) / shape_name(dtype), {"shape": shape, **record})


def trained_folder(name: str, folder: str | Path | None) -> Path:
    """``folder``, where the trained ``name`` drafter lies; InputError when none is given (the caller
    names the folder: a model's own is ``ModelSpec.drafter_folder(name)``)."""
    if folder is None:
        raise InputError(f"no folder given for the trained {name} drafter: give the folder of one (a model's "
                         f"own: `specblock train {name} --model NAME` trains it)")
    return Path(folder)


def trained_available(folder: str | Path) -> bool:
    """Whether ``folder`` holds a trained drafter (config and weights)."""
    return all((Path(folder) / f).is_file() for f in FILES)


def trained_shape(name: str, folder: str | Path | None, deployed: bool, dtype: str | None = None,
                  **given: int | None) -> tuple[Path, dict[str, int]]:
    """The folder of the trained ``name`` drafter (``folder``, given by the caller) and the
    shape to build it with: the options ``given``, the others from the folder's deployed shape for runs
    in ``dtype`` (none with ``deployed=False``: the trained settings). InputError naming ``specblock
    train <name>`` when the folder holds no trained drafter."""
    folder = trained_folder(name, folder)
    saved = deployed_shape(name, folder, dtype) if deployed else {}
    shape = {**saved, **{k: v for k, v in given.items() if v is not None}}
    missing = next((f for f in FILES if not (folder / f).is_file()), None)
    if missing is not None:
        raise InputError(f"no trained {name} drafter in {folder} (no {missing}): train one with "
                         f"`specblock train {name}` or give the folder of one")
    return folder, shape


@contextmanager
def train_hint(name: str) -> Iterator[None]:
    """While loading a trained ``name`` drafter: an InputError that does not say how to train one gets
    ``(`specblock train <name>` trains one)`` added."""
    try:
        yield
    except InputError as exc:
        message = str(exc)
        raise InputError(message if "specblock train" in message
                         else f"{message} (`specblock train {name}` trains one)") from exc
