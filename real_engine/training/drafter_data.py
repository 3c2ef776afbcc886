"""Training data for feature drafters, made by running the target over token sequences, cached on disk.

For every sequence (``[T]`` token ids) the target's causal forward gives, per position ``t`` (after
token ``t``): the low/mid/high features (``Output.features``, bfloat16), the final hidden state
(``Output.hidden``, bfloat16) and the ``top_k`` largest log-probabilities of its temperature-1 law
with their token ids (float32 / int32), enough for a KL on the top-k support without storing
vocabulary-wide rows. Sequences are written in chunks, ``chunk_00000.safetensors`` ..., each written
atomically, beside a ``meta.json`` naming the target and the settings; a rerun skips the chunks
already there, so an interrupted preparation resumes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from core.errors import InputError
from core.files import MAX_RECORD_BYTES, atomic_write, read_json, write_json
from real_engine.model import Transformer
from real_engine.training.progress import progress_bar
from real_engine.training.windows import check_on_policy, corpus_windows, rollout

FIELDS = ("tokens", "features", "hidden", "topk_logp", "topk_ids")


@dataclass(frozen=True)
class DataMeta:
    """What a data folder holds: sequence count and length, top-k size, chunking, and its sources."""

    sequences: int
    seq_len: int
    top_k: int
    chunk_size: int
    target: str  # fingerprint of the target (config and weights)
    tokens_sha256: str  # of the token sequences
    on_policy: float = 0.0  # the share of them that the target continued itself (``training_windows``)

    @property
    def chunks(self) -> int:
        """Number of chunk files."""
        return -(-self.sequences // self.chunk_size)


def target_fingerprint(target: Transformer) -> str:
    """SHA-256 over the target's config and the bytes of its output-layer and embedding weights."""
    h = hashlib.sha256(json.dumps(target.args.to_hf(), sort_keys=True).encode())
    for w in (target.lm_head.weight, target.model.embed_tokens.weight, target.model.norm.weight):
        h.update(w.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def training_windows(target: Transformer, domains: Sequence[str], seq_len: int, count: int, seed: int,
                     on_policy: float, data_dir: str | Path, prefix: int = 64) -> tuple[torch.Tensor, Path]:
    """The drafters' training windows and the folder that caches the target's rows for them.

    ``windows.corpus_windows``, of which a share ``on_policy`` (rows spread evenly over the domains) is
    replaced by the target's own continuation of the window's first ``prefix`` tokens, alternately greedy
    and sampled (``windows.rollout``): on-policy data, as the draft model's ``--on-policy``. The
    continuations are kept in the folder (``windows.safetensors``, keyed by the corpus windows, the
    seed and the prompt length), so that a resumed run or another drafter does not generate them again.
    """
    check_on_policy(on_policy, prefix, seq_len)
    windows = corpus_windows(domains, seq_len, count, seed)
    folder = Path(data_dir) / target_fingerprint(target)[:12]
    if not on_policy:
        return windows, folder
    folder = folder.with_name(f"{folder.name}-onpolicy{on_policy:g}")
    key = {"corpus_windows_sha256": hashlib.sha256(windows.numpy().tobytes()).hexdigest(), "seed": str(seed),
           "prefix": str(prefix)}
    kept = folder / "windows.safetensors"
    try:
        with safe_open(str(kept), "pt") as f:
            if f.metadata() == key:
                return f.get_tensor("windows"), folder
    except (SafetensorError, OSError):  # absent or unreadable: generate (and rewrite) them
        pass
    index = torch.arange(count)
    rows = index[((index + 1) * on_policy).floor() > (index * on_policy).floor()]
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, len(rows), 16):
        part = rows[i:i + 16]
        sampled = torch.arange(i, i + len(part)) % 2 == 1
        windows[part] = rollout(target, windows[part, :prefix], seq_len, sampled, gen)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(kept, lambda tmp: save_file({"windows": windows}, tmp, metadata=key))
    return windows, folder


@torch.inference_mode()
def target_rows(target: Transformer, tokens: torch.Tensor, top_k: int) -> dict[str, torch.Tensor]:
    """The stored fields for a batch of sequences ([B, T]), on the CPU."""
    device = target.lm_head.weight.device
    out = target(tokens.to(device))
    logp = out.logits.float().log_softmax(-1).topk(top_k, dim=-1)
    return {"tokens": tokens.to(torch.int32).cpu(),
            "features": out.features.to(torch.bfloat16).cpu(),
            "hidden": out.hidden.to(torch.bfloat16).cpu(),
            "topk_logp": logp.values.cpu(),
            "topk_ids": logp.indices.to(torch.int32).cpu()}


def prepare_drafter_data(target: Transformer, sequences: torch.Tensor, folder: str | Path, *, top_k: int = 32,
                         chunk_size: int = 32, batch_size: int = 8, progress: bool = True,
                         on_policy: float = 0.0) -> DrafterData:
    """Run ``target`` over ``sequences`` ([N, T] long) and cache its rows under ``folder`` (resumable);
    ``on_policy`` records the share of the sequences that the target continued itself.

    A folder prepared with another target, other sequences or other settings is refused rather than
    mixed: give a new folder.
    """
    if sequences.dim() != 2 or sequences.shape[1] < 2:
        raise InputError("sequences must be [count, length] token ids with length >= 2")
    if not 1 <= top_k <= target.args.vocab_size or chunk_size < 1 or batch_size < 1:
        raise InputError(f"need 1 <= top_k <= vocabulary ({target.args.vocab_size}), chunk_size >= 1 and "
                         "batch_size >= 1")
    folder = Path(folder)
    tokens_sha = hashlib.sha256(sequences.to(torch.int64).numpy().tobytes()).hexdigest()
    meta = DataMeta(sequences.shape[0], sequences.shape[1], top_k, chunk_size, target_fingerprint(target),
                    tokens_sha, on_policy)
    if (folder / "meta.json").exists():
        old = open_drafter_data(folder).meta
        if old != meta:
            raise InputError(f"{folder} holds drafter data made with another target, sequences or settings: "
                             "give a new folder (or delete this one)")
    else:
        write_json(folder / "meta.json", asdict(meta))
    with progress_bar(progress) as bar:
        task = bar.add_task("target rows", total=meta.chunks)
        for chunk in range(meta.chunks):
            path = folder / f"chunk_{chunk:05d}.safetensors"
            if not path.exists():
                part = sequences[chunk * chunk_size:(chunk + 1) * chunk_size]
                rows = [target_rows(target, part[i:i + batch_size], top_k)
                        for i in range(0, len(part), batch_size)]
                tensors = {name: torch.cat([r[name] for r in rows]).contiguous() for name in FIELDS}
                atomic_write(path, lambda tmp, t=tensors: save_file(t, tmp))
            bar.advance(task)
    return open_drafter_data(folder)


class DrafterData:
    """A prepared data folder: random access to sequences by index (chunk files opened lazily)."""

    def __init__(self, folder: Path, meta: DataMeta) -> None:
        self.folder, self.meta = folder, meta
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return self.meta.sequences

    def _chunk(self, index: int) -> Any:
        if index not in self._open:
            path = self.folder / f"chunk_{index:05d}.safetensors"
            if not path.exists():
                raise InputError(f"missing {path}: the data preparation did not finish; rerun it to resume")
            try:
                self._open[index] = safe_open(str(path), framework="pt")
            except (SafetensorError, OSError) as exc:
                raise InputError(f"cannot read {path} ({exc}): delete it and rerun the preparation") from exc
        return self._open[index]

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The fields of the sequences ``indices``, stacked ([B, T, ...]); ids as long, floats as float32."""
        rows: dict[str, list[torch.Tensor]] = {name: [] for name in FIELDS}
        for i in indices:
            handle = self._chunk(i // self.meta.chunk_size)
            for name in FIELDS:
                rows[name].append(handle.get_slice(name)[i % self.meta.chunk_size])
        out = {name: torch.stack(v) for name, v in rows.items()}
        for name in ("tokens", "topk_ids"):
            out[name] = out[name].long()
        for name in ("features", "hidden"):
            out[name] = out[name].float()
        return out

    def batches(self, batch_size: int, seed: int, first_step: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Endless batches: epoch ``e`` visits the sequences in a permutation seeded by ``(seed, e)``;
        starting at ``first_step`` gives exactly the batches a run from step 0 would have reached."""
        n = len(self)
        per_epoch = max(n // batch_size, 1)
        step = first_step
        while True:
            epoch, index = divmod(step, per_epoch)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
            yield self.batch(order[index * batch_size:(index + 1) * batch_size].tolist())
            step += 1


def frequent_targets(data: DrafterData, count: int, vocab: int) -> torch.Tensor:
    """The ``count`` of the ``vocab`` token ids that the target predicts most often (its top token) over
    ``data``, most frequent first; ties go to the more frequent input token, then the lower id: a
    drafter's reduced vocabulary."""
    if not 1 <= count <= vocab:
        raise InputError(f"a drafting vocabulary of {count} tokens: give 1 to {vocab}")
    top, seen = torch.zeros(vocab, dtype=torch.long), torch.zeros(vocab, dtype=torch.long)
    for chunk in range(data.meta.chunks):
        handle = data._chunk(chunk)
        top += torch.bincount(handle.get_slice("topk_ids")[:, :, 0].long().flatten(), minlength=vocab)
        seen += torch.bincount(handle.get_slice("tokens")[:].long().flatten(), minlength=vocab)
    return rank_tokens(top, seen)[:count]


def rank_tokens(top: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """Every token id by how often the target predicts it (``top`` counts), then by how often it occurs
    (``seen`` counts), then by id: the order a reduced drafting vocabulary takes its first tokens from."""
    key = top * (int(seen.max()) + 1) + seen  # lexicographic: target top-1 count, then input count
    return torch.sort(-key, stable=True).indices


def open_drafter_data(folder: str | Path) -> DrafterData:
    """Open a folder written by :func:`prepare_drafter_data`."""
    folder = Path(folder)
    path = folder / "meta.json"
    if not path.exists():
        raise InputError(f"no meta.json in {folder}: prepare the drafter data first")
    raw = read_json(path, MAX_RECORD_BYTES, "drafter-data description", "prepare the data again")
    try:
        meta = DataMeta(**raw)
    except TypeError as exc:
        raise InputError(f"{path} is not a drafter-data description: prepare the data again") from exc
    return DrafterData(folder, meta)
