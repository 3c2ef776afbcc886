"""Cost profiles: what one decoding iteration costs on a device, stored as data and interpolated.

A profile is measured by ``real_engine.profile`` (or derived from a paper, and then labeled so) and
written as JSON in exactly this schema (``schema_version`` 1). Times are seconds; every ``seconds`` list
holds one or more repeated measurements of one configuration, and the profile uses their ``estimator``
(``median`` unless the profile says ``mean``, the expected cost that a measured loop pays)::

    {
      "schema_version": 1,
      "device": "NVIDIA A100-SXM4-80GB",            non-empty text
      "dtype": "bfloat16",                           non-empty text
      "models": {"target": "Llama-3.1-8B-Instruct",  the target's name
                 "drafters": {"specblock": "...",    drafter kind -> model name, one per samples.draft kind
                              "eagle": "..."}},
      "block_size": 4,                               SpecBlock's K; required iff samples.draft has specblock
      "estimator": "mean",                           optional: "median" (default) or "mean" of the repeats
      "draft_shapes": {"eagle": {"top_k": 4,         optional: per drafter kind, the settings its series
                                 "total_tokens": 24}}, holds fixed (positive integers, not grid keys)
      "derived_from": null,                          or {"source": "...", "derivation": "..."} when the
                                                     numbers come from publications, not measurements
      "samples": {
        "verify":  [{"nodes": 9, "context": 1024, "seconds": [0.0370, 0.0369]}, ...],
        "vanilla": [{"context": 1024, "seconds": [...]}, ...],
        "draft": {"specblock":   [{"starts": 1, "blocks": 2, "seconds": [...]}, ...],
                  "eagle":       [{"depth": 7, "seconds": [...]}, ...],
                  "draft-model": [{"tokens": 4, "seconds": [...]}, ...],
                  "medusa":      [{"seconds": [...]}],
                  "ngram":       [{"seconds": [...]}]},
        "update": {"head": [...], "full": [...]},
        "update_single": {"head": [...], "full": [...]},                                   optional
        "prefill": [{"tokens": 128, "seconds": [...]}, ...],                               optional
        "steering": [{"drafted": 3, "seconds": [...]}, ...],                               optional
        "batch_verify": [{"requests": 4, "nodes": 9, "context": 128, "seconds": [...]}, ...] optional
        "batch_draft": [{"requests": 4, "tokens": 3, "seconds": [...]}, ...]               optional
        "draft_backlog": [{"tokens": 96, "seconds": [...]}, ...]                           optional
        "draft_trees": {"draft-model": [{"depth": 4, "width": 3, "seconds": [...]}, ...]}   optional
      },
      "update_windows": {"head": 4, "full": 16},     optional: query windows the update samples trained on
      "fits": {...}                                  optional; written by save_profile (see below)
    }

- ``verify``: one target forward that verifies a draft. ``nodes`` counts the tokens of that forward,
  the root (last committed token) included, so n drafted positions take ``n + 1`` nodes (1..128 is
  the usual grid); ``context`` is the number of tokens already in the KV cache.
- ``vanilla``: one plain decoding step (one token, no tree) at ``context``.
- ``draft``: all drafting of one iteration, per drafter kind, keyed by the kind's own parameters
  (its registered ``cost_keys``): specblock runs ``blocks`` block forwards (M) with ``starts``
  start positions in each later block; eagle runs ``depth`` sequential forwards of its dynamic tree;
  draft-model drafts ``tokens`` tokens autoregressively (a chain); medusa and ngram make one call.
  Only the kinds that were measured appear.
- ``draft_trees`` (optional): the tree shapes of a drafter whose ``draft`` series is a chain, keyed
  by its ``tree_keys``: the draft model's top-k tree of ``depth`` levels, each expanding the ``width`` best
  frontier nodes into ``width`` children. A tree is drafted whole however many of its nodes are
  verified: ``CostProfile.step_table(kind, n, shape=...)`` costs that, for these and the tree drafters.
- ``draft_shapes`` (optional): what each kind's series hold fixed (e.g. EAGLE's top-k and kept nodes).
- ``update``: one backward pass plus optimizer step of a head-only or a whole-drafter update; the
  engine's SpecBlock update (``real_engine.adapt.update_drafter``) on a full buffer.
- ``update_windows`` (optional): how many query windows the buffers of the ``update`` samples held.
  SpecBlock's update trains one window per buffered query (its rows from some context before the
  first rejection), so its time grows with the windows, not the positions: ``update_cost`` then
  charges per window; without this field it scales the full-buffer time by the buffer's fill.
- ``update_single`` (optional, with ``update_windows``): the same updates on a buffer of one query
  window. ``update_cost`` then interpolates linearly in the windows between one window and the full
  buffer's, since an update's fixed part (copying the drafter, the reference pass) is not per window.
- ``prefill`` (optional): the start of one query with a ``tokens``-token prompt: the target's prefill
  and the drafter's ``begin`` (the SpecBlock drafter the engine adapts, with its feedback recording,
  when one was profiled). ``prefill_cost`` charges it; a profile without it charges nothing.
- ``steering`` (optional): a length policy's own work in one engine iteration
  (``real_engine.speculate.LengthControlled``: the features, the policy's choices while a chain is
  drafted, ranking, trimming, the policy's feedback) by the positions ``drafted`` (0: none), on a
  drafter that costs nothing. ``steering_seconds`` charges it to iterations a policy steers.
- ``batch_verify`` (optional): one iteration of the batched engine (``real_engine.batch``, run as it
  is) with drafts that cost nothing: ``requests`` requests of ``nodes`` tokens each packed into one
  target forward at ``context`` cached tokens each, each verified greedily and compacted, the engine's
  bookkeeping included. ``batch_verify_seconds`` charges it.
- ``batch_draft`` (optional, with a draft-model series): one iteration's drafting of ``requests`` draft-model
  chains of ``tokens`` positions in lockstep, one packed forward per position over all of them
  (``DraftModelDrafter.propose_together``). ``batch_draft_seconds`` charges it.
- ``draft_backlog`` (optional, with a draft-model series): a one-position proposal of a draft-model chain
  whose model has not run the last ``tokens`` committed tokens (a request's prompt at its first proposal,
  or what it committed while it did not draft). ``draft_backlog_seconds`` charges what it adds.
- Grid rule: rows with two or more parameters must cover the full grid (every value of each
  parameter with every value of the others); repeated rows of one configuration are pooled.
- ``fits``: per series the grid axes and the median at every grid point, e.g.
  ``{"verify": {"nodes": [...], "context": [...], "seconds": [[...], ...]}, "vanilla": {"context":
  [...], "seconds": [...]}, "draft": {"medusa": {"seconds": 0.001}, ...}, "update": {"head": 0.1,
  "full": 1.0}}``. They are recomputed from ``samples`` on load; a file whose fits disagree fails.

Interpolation is piecewise linear along every parameter (bilinear on two-parameter grids): exact on
the grid, monotone between neighbouring grid points, clamped to the first grid value below the grid
and extended along the last segment's slope (never downward) above it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from core.errors import InputError
from core.files import MAX_PROFILE_BYTES, read_json, write_json
from core.interpolation import ESTIMATORS, Grid, Series, blend, bracket
from core.names import drafter_spec, registry
from core.paths import PAPER_PROFILE

SCHEMA_VERSION = 1

VERIFY_KEYS = ("nodes", "context")
VANILLA_KEYS = ("context",)
OPTIONAL_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "prefill": ("tokens",),
    "steering": ("drafted",),
    "batch_verify": ("requests", "nodes", "context"),
    "batch_draft": ("requests", "tokens"),
    "draft_backlog": ("tokens",),
})
"""The optional series (``samples.<name>``) -> the parameters each is measured over."""
UPDATE_KINDS = ("head", "full")


def draft_keys(kind: str, trees: bool = False) -> tuple[str, ...]:
    """The parameters registered drafter ``kind``'s ``samples.draft`` series (``trees``: its
    ``samples.draft_trees`` series) is measured over: its spec's ``cost_keys`` (``tree_keys``)."""
    spec = drafter_spec(kind)
    return spec.tree_keys if trees else spec.cost_keys


def token_by_token(kind: str) -> bool:
    """Whether drafter ``kind``'s series is a chain drafted one token per forward (its ``chain`` rule)."""
    return kind in registry and registry[kind].chain == "token"


DraftShape = Mapping[str, float] | Sequence[Mapping[str, float]]
"""A drafter's tree shape (``draft_seconds`` parameters), or the shapes of recorded iterations."""
_MIN_VALUE = {"requests": 1, "nodes": 1, "context": 0, "starts": 1, "blocks": 1, "depth": 1, "tokens": 1,
              "width": 1, "drafted": 0}


@dataclass(frozen=True)
class Derivation:
    """Where a profile's numbers come from when they were not measured."""

    source: str
    derivation: str


@dataclass(frozen=True)
class StepTable:
    """T(n) = T_draft(n) + T_verify(n + 1 nodes) for n = 0..n_max (T(0) = vanilla) on a context grid.

    Exactly ``CostProfile.step_seconds`` (up to rounding), precomputed so that the simulator evaluates
    it for thousands of contexts in a few array operations.
    """

    context: np.ndarray  # (C,) union of the verify and vanilla context grids
    table: np.ndarray  # (C, n_max + 1)

    def __call__(self, context: np.ndarray) -> np.ndarray:
        """(N, n_max + 1) iteration seconds at each of the N contexts."""
        ctx = np.asarray(context, dtype=np.float64)
        if self.context.size == 1:
            return np.broadcast_to(self.table[0], (*ctx.shape, self.table.shape[1])).copy()
        i, w = bracket(self.context, ctx)
        return blend(self.table[i], self.table[i + 1], w[..., None])


@dataclass(frozen=True)
class CostProfile:
    """A validated cost profile (see the module docstring for the schema); build it with ``load_profile``."""

    device: str
    dtype: str
    target: str
    drafters: Mapping[str, str]
    block_size: int | None
    derived_from: Derivation | None
    verify: Series
    vanilla: Series
    draft: Mapping[str, Series]
    update: Mapping[str, tuple[float, ...]]
    schema_version: int = SCHEMA_VERSION
    draft_trees: Mapping[str, Series] = field(default_factory=lambda: MappingProxyType({}))
    draft_shapes: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    update_windows: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    update_single: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: MappingProxyType({}))
    optional: Mapping[str, Series] = field(default_factory=lambda: MappingProxyType({}))  # OPTIONAL_KEYS
    estimator: str = "median"
    fits: Mapping[str, Any] = field(init=False, repr=False, compare=False)
    _tables: dict[tuple[Any, ...], StepTable] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise InputError(f"schema_version {self.schema_version!r} is not supported: this code reads "
                             f"version {SCHEMA_VERSION}; re-run `specblock profile`")
        if set(self.drafters) != set(self.draft):
            raise InputError(f"models.drafters names {sorted(self.drafters)} but samples.draft holds "
                             f"{sorted(self.draft)}: name exactly the drafter kinds that were measured")
        blocked = [kind for kind in self.draft if registry[kind].chain == "block"]
        if blocked and not (isinstance(self.block_size, int) and self.block_size >= 1):
            raise InputError("block_size is missing or not a positive integer: set it to the drafter's K "
                             f"(positions per block forward) when samples.draft has {blocked[0]}")
        if self.estimator not in ESTIMATORS:
            raise InputError(f"estimator {self.estimator!r} is unknown: use one of {', '.join(ESTIMATORS)}")
        if set(self.update) != set(UPDATE_KINDS):
            raise InputError(f"samples.update must hold exactly {', '.join(UPDATE_KINDS)}: measure both")
        counts = self.update_windows.values()
        if self.update_windows and (set(self.update_windows) != set(UPDATE_KINDS) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in counts)):
            raise InputError(f"update_windows = {dict(self.update_windows)!r} is invalid: give the query "
                             f"windows of both {' and '.join(UPDATE_KINDS)} updates as positive integers, or "
                             "drop the field")
        if self.update_single and (set(self.update_single) != set(UPDATE_KINDS) or not self.update_windows):
            raise InputError("samples.update_single needs both head and full timings and update_windows "
                             "beside it: measure both on one-window buffers, or drop the field")
        for kind in self.draft_trees:
            if not draft_keys(kind, trees=True) or kind not in self.draft:
                raise InputError(f"samples.draft_trees has drafter {kind!r}: tree series are for drafters "
                                 "with tree_keys, next to their samples.draft series")
        for kind, settings in self.draft_shapes.items():
            if kind not in self.draft:
                raise InputError(f"draft_shapes names drafter {kind!r}, which samples.draft lacks: describe "
                                 "only measured drafters")
            keys = draft_keys(kind) + draft_keys(kind, trees=True)
            for name, value in settings.items():
                if name in keys or isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InputError(f"draft_shapes.{kind}.{name} = {value!r} is invalid: give the fixed "
                                     f"settings as positive integers, not the grid keys {keys}")
        est, combine = self.estimator, ESTIMATORS[self.estimator]
        fits = {
            "verify": self.verify.grid("samples.verify", est),
            "vanilla": self.vanilla.grid("samples.vanilla", est),
            "draft": {kind: s.grid(f"samples.draft.{kind}", est) for kind, s in self.draft.items()},
            "update": {kind: float(combine(s)) for kind, s in self.update.items()},
        }
        if self.update_single:
            fits["update_single"] = {kind: float(combine(s)) for kind, s in self.update_single.items()}
        for name in ("batch_draft", "draft_backlog"):
            if name in self.optional and "draft-model" not in self.draft:
                raise InputError(f"samples.{name} needs the draft-model series beside it: measure both, or "
                                 "drop it")
        fits.update({name: series.grid(f"samples.{name}", est) for name, series in self.optional.items()})
        if self.draft_trees:
            fits["draft_trees"] = {kind: series.grid(f"samples.draft_trees.{kind}", est)
                                   for kind, series in self.draft_trees.items()}
        object.__setattr__(self, "fits", MappingProxyType(fits))
        object.__setattr__(self, "_tables", {})

    def verify_seconds(self, nodes: float | np.ndarray, context: float | np.ndarray) -> float | np.ndarray:
        """One verify forward of ``nodes`` tokens (root included) at ``context`` cached tokens."""
        return self.fits["verify"](nodes, context)

    def batch_verify_seconds(self, requests: float | np.ndarray, nodes: float | np.ndarray,
                             context: float | np.ndarray) -> float | np.ndarray:
        """One batched verify iteration of ``requests`` requests of ``nodes`` tokens each (root included) at
        ``context`` cached tokens each (``real_engine.batch``)."""
        if "batch_verify" not in self.fits:
            raise InputError("this profile has no batched verify samples (samples.batch_verify): re-run "
                             "`specblock profile`")
        return self.fits["batch_verify"](requests, nodes, context)

    def batch_draft_seconds(self, requests: float | np.ndarray, tokens: float | np.ndarray
                            ) -> float | np.ndarray:
        """``requests`` draft-model chains of ``tokens`` positions in lockstep (``samples.batch_draft``)."""
        if "batch_draft" not in self.fits:
            raise InputError("this profile has no lockstep drafting samples (samples.batch_draft): "
                             "re-run `specblock profile` with a draft model")
        return self.fits["batch_draft"](requests, tokens)

    def draft_backlog_seconds(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """What a draft-model chain's proposal adds by running ``tokens`` committed tokens its model has not
        run, over a backlog of one (``samples.draft_backlog``; 0 without it)."""
        more = self._charged("draft_backlog", np.maximum(tokens, 1))
        return np.maximum(more - self._charged("draft_backlog", 1), 0.0)

    def vanilla_seconds(self, context: float | np.ndarray) -> float | np.ndarray:
        """One plain decoding step at ``context`` cached tokens."""
        return self.fits["vanilla"](context)

    def draft_seconds(self, kind: str, **params: float | np.ndarray) -> float | np.ndarray:
        """All drafting of one iteration of drafter ``kind`` with its parameters: its ``cost_keys``, or
        ``tree_keys`` for its tree series (interpolated between the measured shapes)."""
        grid = self._draft_grid(kind)
        tree = self.fits.get("draft_trees", {}).get(kind)
        if tree is not None and set(params) == set(tree.keys):
            grid = tree
        if set(params) != set(grid.keys):
            timed = " or ".join(f"({', '.join(g.keys)})" for g in (grid, tree) if g is not None)
            raise InputError(f"drafter {kind!r} is timed by {timed}, got ({', '.join(sorted(params))}): pass "
                             "exactly those parameters")
        return grid(*(params[k] for k in grid.keys))

    def update_seconds(self, kind: str) -> float:
        """One backward + optimizer step of a ``head`` or ``full`` drafter update."""
        if kind not in UPDATE_KINDS:
            raise InputError(f"unknown update kind {kind!r}: use one of {', '.join(UPDATE_KINDS)}")
        return self.fits["update"][kind]

    def update_cost(self, kind: str, fill: float | np.ndarray,
                    windows: float | np.ndarray) -> float | np.ndarray:
        """Seconds of a ``kind`` update on a buffer at ``fill`` (of its capacity) holding ``windows`` query
        windows. With ``update_single``: linear in the windows through the one-window and the full-buffer
        times (proportional below one window); with ``update_windows`` alone: the full buffer's time per
        window times ``windows``; else the full-buffer time times ``fill``."""
        full = self.update_seconds(kind)
        w = np.asarray(windows, dtype=float)
        if self.update_single:
            one, counted = self.fits["update_single"][kind], self.update_windows[kind]
            slope = (full - one) / (counted - 1) if counted > 1 else 0.0
            return np.where(w < 1.0, one * w, np.maximum(one + slope * (w - 1.0), 0.0))
        if self.update_windows:
            return full / self.update_windows[kind] * w
        return full * np.asarray(fill, dtype=float)

    def prefill_cost(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """Seconds to start a query with a ``tokens``-token prompt (``samples.prefill``; 0 without it)."""
        return self._charged("prefill", tokens)

    def steering_seconds(self, drafted: float | np.ndarray) -> float | np.ndarray:
        """A length policy's own seconds in an iteration that drafted ``drafted`` positions
        (``samples.steering``; 0 without it)."""
        return self._charged("steering", drafted)

    def chain_draft_seconds(self, kind: str, depth: int) -> float:
        """Drafting one chain of ``depth`` positions with drafter ``kind`` (0 for depth 0)."""
        if depth == 0:
            return 0.0
        grid = self._draft_grid(kind)
        if registry[kind].chain == "block":  # one start position per block: ceil(depth / K) blocks
            params = {"starts": 1, "blocks": math.ceil(depth / (self.block_size or 1))}
        else:  # one forward per depth or token (the series' one key), or one call (no key)
            params = {key: depth for key in grid.keys}
        return float(grid(*(params[k] for k in grid.keys)))

    def draft_row(self, kind: str, n_max: int, shape: DraftShape | None = None) -> np.ndarray:
        """T_draft for 0..n_max drafted positions (0 for none): a chain's ``chain_draft_seconds``; with
        ``shape`` (the parameters of ``draft_seconds``, e.g. ``{"depth": 4, "width": 3}``) a tree drafted
        whole, ``draft_seconds(kind, **shape)`` for every n >= 1. A list of shapes (those a
        data-dependent drafter such as SpecBlock ran on recorded iterations) costs their mean."""
        if n_max < 0:
            raise InputError(f"n_max = {n_max} is negative: pass the largest draft length to cost")
        if shape is None:
            return np.array([self.chain_draft_seconds(kind, k) for k in range(n_max + 1)])
        shapes = [shape] if isinstance(shape, Mapping) else list(shape)
        if not shapes:
            raise InputError("the list of draft shapes is empty: give at least one, or None for a chain")
        whole = float(np.mean([self.draft_seconds(kind, **s) for s in shapes]))
        return np.concatenate(([0.0], np.full(n_max, whole)))

    def step_table(self, kind: str, n_max: int, shape: DraftShape | None = None) -> StepTable:
        """The T(0..n_max) of drafter ``kind`` over the context grid (see ``StepTable``), built once:
        T(n) = ``draft_row(kind, n_max, shape)[n]`` + T_verify(n + 1 nodes), T(0) the vanilla step."""
        shapes = None if shape is None else [shape] if isinstance(shape, Mapping) else list(shape)
        key = (kind, n_max, None if shapes is None else tuple(tuple(sorted(s.items())) for s in shapes))
        if key in self._tables:
            return self._tables[key]
        draft = self.draft_row(kind, n_max, shape)[1:]
        context = np.union1d(self.fits["verify"].axes[1], self.fits["vanilla"].axes[0])
        n = np.arange(1, n_max + 1)
        verify = self.verify_seconds(n[None, :] + 1, context[:, None]) + draft[None, :]
        vanilla = np.asarray(self.vanilla_seconds(context)).reshape(-1, 1)
        table = StepTable(context, np.hstack([vanilla, np.asarray(verify).reshape(context.size, n_max)]))
        table.table.setflags(write=False)  # shared by every caller through the cache
        self._tables[key] = table
        return table

    def step_seconds(self, kind: str, n_range: Sequence[int] | np.ndarray, context: float | np.ndarray,
                     shape: DraftShape | None = None) -> np.ndarray:
        """T(n) = T_draft(n) + T_verify(n + 1 nodes) for each n in ``n_range`` (T(0) = vanilla decode), shaped
        ``np.shape(context) + (len(n_range),)``: the length features' step seconds (``shape``: see
        ``step_table``)."""
        n = np.asarray(n_range, dtype=np.int64)
        if n.ndim != 1 or np.any(n < 0):
            raise InputError("n_range must be a 1-D sequence of draft lengths >= 0: e.g. range(17)")
        table = self.step_table(kind, int(n.max(initial=0)), shape)
        return table(np.asarray(context, dtype=np.float64))[..., n]

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the schema, fits included."""
        fits = self.fits
        shapes = {k: dict(v) for k, v in self.draft_shapes.items()}
        trees = {kind: s.to_json() for kind, s in self.draft_trees.items()}
        tree_fits = {kind: g.to_json() for kind, g in fits.get("draft_trees", {}).items()}
        return {
            "schema_version": self.schema_version,
            "device": self.device,
            "dtype": self.dtype,
            "models": {"target": self.target, "drafters": dict(self.drafters)},
            "block_size": self.block_size,
            "estimator": self.estimator,
            **({"draft_shapes": shapes} if shapes else {}),
            "derived_from": None if self.derived_from is None else {
                "source": self.derived_from.source, "derivation": self.derived_from.derivation},
            **({"update_windows": dict(self.update_windows)} if self.update_windows else {}),
            "samples": {
                "verify": self.verify.to_json(),
                "vanilla": self.vanilla.to_json(),
                "draft": {kind: s.to_json() for kind, s in self.draft.items()},
                "update": {kind: list(s) for kind, s in self.update.items()},
                **({"update_single": {k: list(s) for k, s in self.update_single.items()}}
                   if self.update_single else {}),
                **{name: series.to_json() for name, series in self.optional.items()},
                **({"draft_trees": trees} if trees else {}),
            },
            "fits": {
                "verify": fits["verify"].to_json(),
                "vanilla": fits["vanilla"].to_json(),
                "draft": {kind: g.to_json() for kind, g in fits["draft"].items()},
                "update": dict(fits["update"]),
                **({"update_single": dict(fits["update_single"])} if "update_single" in fits else {}),
                **{name: fits[name].to_json() for name in self.optional},
                **({"draft_trees": tree_fits} if tree_fits else {}),
            },
        }

    def _charged(self, name: str, value: float | np.ndarray) -> float | np.ndarray:
        """Optional series ``name`` at ``value``; 0 without it."""
        return self.fits[name](value) if name in self.fits else np.zeros_like(np.asarray(value, dtype=float))

    def _draft_grid(self, kind: str) -> Grid:
        if kind not in self.fits["draft"]:
            raise InputError(f"this profile has no drafter {kind!r}: use one of "
                             f"{', '.join(sorted(self.fits['draft']))} or profile that drafter")
        return self.fits["draft"][kind]


def _need(obj: Any, key: str, path: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``obj[key]`` checked to be ``kind``; InputError naming the field and what to put there."""
    if key not in obj:
        raise InputError(f"missing field {path}: add {what}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InputError(f"field {path} must be {what}, got {json.dumps(value)[:40]}")
    return value


def _seconds(values: Any, path: str) -> tuple[float, ...]:
    if not isinstance(values, list) or not values:
        raise InputError(f"field {path} must be a non-empty list of seconds: record at least one timing")
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise InputError(f"field {path}[{i}] = {json.dumps(value)} is not a positive finite time: "
                             "re-measure that configuration (times are seconds > 0)")
    return tuple(float(v) for v in values)


def _series(rows: Any, keys: tuple[str, ...], path: str) -> Series:
    if not isinstance(rows, list) or not rows:
        raise InputError(f"field {path} must be a non-empty list of rows: record at least one timing")
    parsed = []
    for r, row in enumerate(rows):
        where = f"{path}[{r}]"
        if not isinstance(row, dict):
            raise InputError(f"field {where} must be an object with {', '.join((*keys, 'seconds'))}")
        extra = sorted(set(row) - {*keys, "seconds"})
        if extra:
            raise InputError(f"field {where} has unknown key(s) {', '.join(extra)}: "
                             f"rows of {path} hold only {', '.join((*keys, 'seconds'))}")
        point = []
        for key in keys:
            value = _need(row, key, f"{where}.{key}", int, f"an integer >= {_MIN_VALUE[key]}")
            if value < _MIN_VALUE[key]:
                raise InputError(f"field {where}.{key} = {value} is below {_MIN_VALUE[key]}: fix the row")
            point.append(value)
        parsed.append((tuple(point), _seconds(row.get("seconds"), f"{where}.seconds")))
    return Series(keys, tuple(parsed))


def _text(obj: Any, key: str, path: str) -> str:
    value = _need(obj, key, path, str, "non-empty text")
    if not value.strip():
        raise InputError(f"field {path} is empty: write non-empty text")
    return value


def profile_from_json(data: Any) -> CostProfile:
    """Validate a decoded profile (every field, type and time) and build the ``CostProfile``."""
    if not isinstance(data, dict):
        raise InputError("a cost profile must be a JSON object: write it with save_profile")
    version = _need(data, "schema_version", "schema_version", int, f"the integer {SCHEMA_VERSION}")
    models = _need(data, "models", "models", dict, 'an object {"target": ..., "drafters": {...}}')
    drafters = _need(models, "drafters", "models.drafters", dict, "an object: drafter kind -> model name")
    for kind in drafters:
        _text(drafters, kind, f"models.drafters.{kind}")
    derived = data.get("derived_from")
    if derived is not None:
        if not isinstance(derived, dict):
            raise InputError('field derived_from must be null or {"source": ..., "derivation": ...}')
        derived = Derivation(_text(derived, "source", "derived_from.source"),
                             _text(derived, "derivation", "derived_from.derivation"))
    block_size = data.get("block_size")
    if block_size is not None:
        block_size = _need(data, "block_size", "block_size", int, "a positive integer (SpecBlock's K)")
    samples = _need(data, "samples", "samples", dict, "an object with verify, vanilla, draft, update")
    draft = _need(samples, "draft", "samples.draft", dict, "an object: drafter kind -> rows")
    unknown = sorted(set(draft) - set(registry))
    if unknown:
        raise InputError(f"samples.draft has unknown drafter kind(s) {', '.join(unknown)}: "
                         f"use {', '.join(registry)}")
    update = _need(samples, "update", "samples.update", dict, 'an object {"head": [...], "full": [...]}')
    trees = samples.get("draft_trees") or {}
    tree_kinds = [kind for kind, spec in registry.items() if spec.tree_keys]
    if not isinstance(trees, dict) or set(trees) - set(tree_kinds):
        raise InputError(f"field samples.draft_trees must be an object {{kind: [rows]}} with kind in "
                         f"{', '.join(tree_kinds)}: fix or drop it")
    shapes = data.get("draft_shapes") or {}
    if not isinstance(shapes, dict) or not all(isinstance(v, dict) for v in shapes.values()):
        raise InputError('field draft_shapes must be an object {"kind": {"setting": integer}}: fix or '
                         'drop it')
    single = samples.get("update_single") or {}
    if not isinstance(single, dict):
        raise InputError('field samples.update_single must be an object {"head": [...], "full": [...]}: fix '
                         'or drop it')
    estimator = data.get("estimator", "median")
    if not isinstance(estimator, str):
        raise InputError(f"field estimator must be one of {', '.join(ESTIMATORS)}: fix or drop it")
    windows = data.get("update_windows") or {}
    if not isinstance(windows, dict):
        raise InputError('field update_windows must be an object {"head": n, "full": n}: fix or drop it')
    profile = CostProfile(
        schema_version=version,
        device=_text(data, "device", "device"),
        dtype=_text(data, "dtype", "dtype"),
        target=_text(models, "target", "models.target"),
        drafters=MappingProxyType(dict(drafters)),
        block_size=block_size,
        derived_from=derived,
        verify=_series(_need(samples, "verify", "samples.verify", list, "a list of rows"),
                       VERIFY_KEYS, "samples.verify"),
        vanilla=_series(_need(samples, "vanilla", "samples.vanilla", list, "a list of rows"),
                        VANILLA_KEYS, "samples.vanilla"),
        draft=MappingProxyType({kind: _series(rows, draft_keys(kind), f"samples.draft.{kind}")
                                for kind, rows in draft.items()}),
        update=MappingProxyType({kind: _seconds(update.get(kind), f"samples.update.{kind}")
                                 for kind in UPDATE_KINDS}),
        draft_trees=MappingProxyType({kind: _series(rows, draft_keys(kind, trees=True),
                                                     f"samples.draft_trees.{kind}")
                                      for kind, rows in trees.items()}),
        draft_shapes=MappingProxyType({kind: MappingProxyType(dict(v)) for kind, v in shapes.items()}),
        update_windows=MappingProxyType(dict(windows)),
        update_single=MappingProxyType({kind: _seconds(values, f"samples.update_single.{kind}")
                                        for kind, values in single.items()}),
        optional=MappingProxyType({name: _series(samples[name], keys, f"samples.{name}")
                                   for name, keys in OPTIONAL_KEYS.items() if samples.get(name) is not None}),
        estimator=estimator,
    )
    if data.get("fits") is not None:
        _check_fits(data["fits"], profile.to_json()["fits"])
    return profile


def _check_fits(stored: Any, fitted: dict[str, Any], path: str = "fits") -> None:
    """The file's fits must equal the ones recomputed from its samples."""
    stale = InputError(f"{path} does not match the samples: delete the fits block to refit from samples")
    if isinstance(fitted, dict):
        if not isinstance(stored, dict) or set(stored) != set(fitted):
            raise stale
        for key, value in fitted.items():
            _check_fits(stored[key], value, f"{path}.{key}")
        return
    try:
        stored_arr = np.asarray(stored, dtype=np.float64)
        same = stored_arr.shape == np.shape(fitted) and np.allclose(stored_arr, fitted, rtol=1e-9, atol=0.0)
    except (TypeError, ValueError):
        same = False
    if not same:
        raise stale


def load_profile(path: str | Path) -> CostProfile:
    """Read and validate a cost profile JSON file (InputError naming the file, the field and the fix)."""
    data = read_json(path, MAX_PROFILE_BYTES, "cost profile", "pass a file written by `specblock profile`")
    try:
        return profile_from_json(data)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None


def profile_measurement(path: str | Path) -> dict[str, Any]:
    """The ``measurement`` block of the profile file at ``path`` (how, where and when; empty if none)."""
    data = read_json(path, MAX_PROFILE_BYTES, "cost profile", "pass a file written by `specblock profile`")
    block = data.get("measurement") if isinstance(data, dict) else None
    return block if isinstance(block, dict) else {}


def save_profile(profile: CostProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON atomically (samples and their fits)."""
    return write_json(path, profile.to_json())


def resolve_profile(profile: str | Path | CostProfile | None) -> CostProfile:
    """A profile given as a ``CostProfile``, a path, or None for the shipped paper-derived A100 profile."""
    if isinstance(profile, CostProfile):
        return profile
    return load_profile(PAPER_PROFILE if profile is None else profile)
