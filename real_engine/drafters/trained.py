"""The trained feature drafters (SpecBlock, EAGLE, Medusa), built from the folder their weights live in.

``specblock train <name>`` writes such a folder (``config.json`` and ``model.safetensors``); the
shipped ones are ``data/models/<name>``. Options left as None keep the trained settings: SpecBlock's
2 block forwards (M) and 32 drafted nodes, EAGLE's saved tree shape, Medusa's saved static tree.
"""

from __future__ import annotations

from pathlib import Path

from policies.errors import InputError
from real_engine.drafters.base import Drafter
from real_engine.drafters.eagle import eagle_drafter
from real_engine.drafters.medusa import MedusaDrafter, load_medusa
from real_engine.drafters.specblock import SpecBlockDrafter, load_specblock
from real_engine.model import Transformer

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"
TRAINED = ("specblock", "eagle", "medusa")
FILES = ("config.json", "model.safetensors")


def trained_folder(name: str, folder: str | Path | None = None) -> Path:
    """``folder``, or the shipped ``data/models/<name>`` when it is None."""
    return MODELS_DIR / name if folder is None else Path(folder)


def trained_available(folder: str | Path) -> bool:
    """Whether ``folder`` holds a trained drafter (config and weights)."""
    return all((Path(folder) / f).is_file() for f in FILES)


def load_trained(name: str, target: Transformer, folder: str | Path | None = None, *,
                 depth: int | None = None, width: int | None = None, budget: int | None = None,
                 blocks: int | None = None) -> Drafter:
    """The ``name`` drafter trained for ``target`` from ``folder`` (default ``data/models/<name>``).

    SpecBlock takes ``blocks`` (M) and ``budget`` (drafted nodes); EAGLE ``depth``, ``width`` (top-k:
    children per node and frontier width) and ``budget`` (total tokens); Medusa ``budget`` (a static
    tree of that many nodes, re-chosen from the saved calibration accuracies) and ``depth`` (cuts the
    tree). A missing or mismatched folder is an InputError naming ``specblock train <name>``.
    """
    if name not in TRAINED:
        raise InputError(f"{name!r} is not a trained drafter: use one of {', '.join(TRAINED)}")
    folder = trained_folder(name, folder)
    hint = f"`specblock train {name}`"
    missing = next((f for f in FILES if not (folder / f).is_file()), None)
    if missing is not None:
        raise InputError(f"no trained {name} drafter in {folder} (no {missing}): train one with {hint} "
                         "or give the folder of one")
    try:
        if name == "specblock":
            options = {k: v for k, v in (("blocks", blocks), ("budget", budget)) if v is not None}
            return SpecBlockDrafter(load_specblock(folder, target), **options)
        if name == "eagle":
            return eagle_drafter(folder, target, depth, width, budget)
        net, tree = load_medusa(folder, target, budget)
        return MedusaDrafter(net, target, [n for n in tree if depth is None or len(n) <= depth])
    except InputError as exc:
        message = str(exc)
        raise InputError(message if "specblock train" in message else f"{message} ({hint} trains one)"
                         ) from exc
