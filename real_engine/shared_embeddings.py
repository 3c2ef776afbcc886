"""A checkpoint that reads its token embeddings and LM head from its target's checkpoint.

A draft model cut from its target (``training.distil_rows``) keeps the target's embedding table and LM
head unchanged: for SmolLM2 they are most of the parameters, and a copy would make every clone carry
them twice. Its ``config.json`` names them under ``EMBEDDINGS_FROM``: the target (a registered model's
name, or a folder relative to the draft's) and the SHA-256 of each tensor, so that ``load_model`` reads
them from there and refuses a target whose tensors differ (another model, or a re-converted one).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from core.errors import InputError
from core.files import MAX_CONFIG_BYTES, read_json
from core.models import INDEX, known_models, resolve_model

EMBEDDINGS_FROM = "specblock_embeddings_from"  # the config.json key


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's values as float32 (the same for a bf16 and a float32 copy of bf16 values)."""
    return hashlib.sha256(tensor.detach().float().contiguous().cpu().numpy().tobytes()).hexdigest()


def share_entry(draft_folder: Path, target_dir: Path, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The ``EMBEDDINGS_FROM`` entry of a draft in ``draft_folder`` reading ``tensors`` (name -> the
    target's tensor) from the target in ``target_dir``: named by its registered model where it is one, else
    by its path relative to the draft folder."""
    target_dir = Path(target_dir).resolve()
    name = next((m.name for m in known_models() if m.target.resolve() == target_dir), None)
    if name is None:
        name = Path(*_relative(Path(draft_folder).resolve(), target_dir)).as_posix()
    return {"model": name, "sha256": {k: tensor_sha256(v) for k, v in tensors.items()}}


def _relative(start: Path, to: Path) -> list[str]:
    common = len([a for a, b in zip(start.parts, to.parts, strict=False) if a == b])
    return [".."] * (len(start.parts) - common) + list(to.parts[common:]) or ["."]


def _target_folder(folder: Path, model: str) -> Path:
    if "/" not in model and model not in (".", ".."):
        return resolve_model(model).require().target
    return (folder / model).resolve()


def _read(target: Path, name: str) -> torch.Tensor:
    """One tensor of a (possibly sharded) checkpoint, read alone."""
    shard = "model.safetensors"
    if (target / INDEX).exists():
        index = read_json(target / INDEX, MAX_CONFIG_BYTES, "safetensors index", "re-save the checkpoint")
        shard = index.get("weight_map", {}).get(name, shard) if isinstance(index, dict) else shard
    try:
        with safe_open(str(target / shard), framework="pt") as f:
            if name not in f.keys():  # noqa: SIM118 (safe_open has keys(), not __contains__)
                raise InputError(f"{target / shard} has no {name}: give the draft's own target")
            return f.get_tensor(name)
    except (SafetensorError, OSError) as exc:
        raise InputError(f"cannot read {name} from {target} ({exc}): fetch or convert the target again"
                         ) from exc


def shared_tensors(folder: Path, entry: Any) -> dict[str, torch.Tensor]:
    """The tensors a draft in ``folder`` reads from its target (``entry``: its ``EMBEDDINGS_FROM``),
    checked against their recorded SHA-256."""
    fix = "train the draft model for this target again"
    if not (isinstance(entry, dict) and isinstance(entry.get("model"), str)
            and isinstance(entry.get("sha256"), dict)):
        raise InputError(f"{folder / 'config.json'}: {EMBEDDINGS_FROM} must name a model and its tensors' "
                         f"SHA-256: {fix}")
    target = _target_folder(folder, entry["model"])
    out = {}
    for name, digest in entry["sha256"].items():
        tensor = _read(target, name)
        if tensor_sha256(tensor) != digest:
            raise InputError(f"{target}'s {name} is not the one the draft in {folder} was cut from: {fix}")
        out[name] = tensor
    return out
