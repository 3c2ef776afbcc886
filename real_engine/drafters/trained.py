"""The trained feature drafters (SpecBlock, EAGLE, Medusa), built from the folder their weights live in.

``specblock train <name>`` writes such a folder (``config.json`` and ``model.safetensors``); the
shipped ones are ``data/models/<name>``. Options left as None keep the folder's deployed shape: its
``drafting.json`` (``{"shape": {...}}``, the options below, as ``specblock shapes --apply`` writes the
fastest one measured on this machine), else the trained settings: SpecBlock's 2 block forwards (M),
32 drafted nodes and its buckets' children, EAGLE's saved tree shape, Medusa's saved static tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, read_json, write_json
from core.paths import MODELS
from real_engine.drafters.base import Drafter
from real_engine.drafters.eagle import eagle_drafter
from real_engine.drafters.medusa import MedusaDrafter, load_medusa
from real_engine.drafters.rank import CHILDREN
from real_engine.drafters.specblock import SpecBlockDrafter, load_specblock
from real_engine.model import Transformer

TRAINED = ("specblock", "eagle", "medusa")
FILES = ("config.json", "model.safetensors")
SHAPE_FILE = "drafting.json"
SHAPE_OPTIONS = {"specblock": ("blocks", "budget", "width"), "eagle": ("depth", "width", "budget"),
                 "medusa": ("depth", "budget"),
                 "draft-model": ("depth", "width", "budget", "min_confidence", "vocab", "staged",
                                 "lookup")}
# the options each drafter's shape takes; a draft model's drafting.json lies in the draft model's folder


def deployed_shape(name: str, folder: str | Path) -> dict[str, float]:
    """The shape saved in ``folder/drafting.json`` (empty when there is none)."""
    path = Path(folder) / SHAPE_FILE
    if not path.is_file():
        return {}
    try:
        shape = read_json(path, MAX_CONFIG_BYTES, "drafting shape", "re-save it with --deploy")["shape"]
        ok = isinstance(shape, dict) and all(k in SHAPE_OPTIONS[name] and _valid(k, v)
                                              for k, v in shape.items())
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{path} is not a {name} drafting shape ({{\"shape\": {{option: value}}}} with "
                         f"options {', '.join(SHAPE_OPTIONS[name])}: positive ints, a probability for "
                         "min_confidence): fix it, delete it, or rewrite it with `specblock shapes --apply`")
    return dict(shape)


def _valid(option: str, value: Any) -> bool:
    """Whether ``value`` suits ``option``: a probability for ``min_confidence``, else a positive int."""
    if option == "min_confidence":
        return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def write_shape(name: str, folder: str | Path, shape: dict[str, float], record: dict[str, Any]) -> Path:
    """Save ``shape`` as ``folder``'s deployed shape, with ``record`` (how it was chosen)."""

    bad = sorted(set(shape) - set(SHAPE_OPTIONS[name]))
    if bad:
        raise InputError(f"{name} takes no shape option {bad[0]!r}: use {', '.join(SHAPE_OPTIONS[name])}")
    return write_json(Path(folder) / SHAPE_FILE, {"shape": shape, **record})


def trained_folder(name: str, folder: str | Path | None = None) -> Path:
    """``folder``, or the shipped ``data/models/<name>`` when it is None."""
    return MODELS / name if folder is None else Path(folder)


def trained_available(folder: str | Path) -> bool:
    """Whether ``folder`` holds a trained drafter (config and weights)."""
    return all((Path(folder) / f).is_file() for f in FILES)


def load_trained(name: str, target: Transformer, folder: str | Path | None = None, *,
                 depth: int | None = None, width: int | None = None, budget: int | None = None,
                 blocks: int | None = None, deployed: bool = True) -> Drafter:
    """The ``name`` drafter trained for ``target`` from ``folder`` (default ``data/models/<name>``).

    SpecBlock takes ``blocks`` (M), ``budget`` (drafted nodes) and ``width`` (children per node at most:
    1 drafts a chain that still stops where the rank head gives up); EAGLE ``depth``, ``width`` (top-k:
    children per node and frontier width) and ``budget`` (total tokens); Medusa ``budget`` (a static
    tree of that many nodes, re-chosen from the saved calibration accuracies) and ``depth`` (cuts the
    tree). Options left None take the folder's deployed shape (``drafting.json``), or with
    ``deployed=False`` the trained settings. A missing or mismatched folder is an InputError naming
    ``specblock train <name>``.
    """
    if name not in TRAINED:
        raise InputError(f"{name!r} is not a trained drafter: use one of {', '.join(TRAINED)}")
    folder = trained_folder(name, folder)
    hint = f"`specblock train {name}`"
    given = {"depth": depth, "width": width, "budget": budget, "blocks": blocks}
    saved = deployed_shape(name, folder) if deployed else {}
    shape = {**saved, **{k: v for k, v in given.items() if v is not None}}
    depth, width, budget, blocks = (shape.get(k) for k in ("depth", "width", "budget", "blocks"))
    missing = next((f for f in FILES if not (folder / f).is_file()), None)
    if missing is not None:
        raise InputError(f"no trained {name} drafter in {folder} (no {missing}): train one with {hint} "
                         "or give the folder of one")
    try:
        if name == "specblock":
            given = (("blocks", blocks), ("budget", budget))
            options: dict[str, Any] = {k: v for k, v in given if v is not None}
            if width is not None:
                options["children"] = tuple(min(c, width) for c in CHILDREN)
            return SpecBlockDrafter(load_specblock(folder, target), **options)
        if name == "eagle":
            return eagle_drafter(folder, target, depth, width, budget)
        net, tree = load_medusa(folder, target, budget)
        return MedusaDrafter(net, target, [n for n in tree if depth is None or len(n) <= depth])
    except InputError as exc:
        message = str(exc)
        raise InputError(message if "specblock train" in message else f"{message} ({hint} trains one)"
                         ) from exc
