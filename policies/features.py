"""Observation vectors shared by the engine and the simulator: a policy sees the same features in both.

Both worlds build observations ONLY through ``length_features`` and ``adapt_features``; policies and
environments read fields by name through ``LENGTH_SLICES`` and ``ADAPT_INDEX``. The functions are pure
and validate their inputs (``InputError``).

Length observation (``length_features``), ``LENGTH_DIM = 1 + LENGTH_CAP + (LENGTH_CAP + 1) = 34``:

    | index          | meaning                                                         | min | max |
    |----------------|-----------------------------------------------------------------|-----|-----|
    | 0              | context length (tokens already in the KV cache)                 | 0   | inf |
    | 1 .. 16        | c_1..c_16: drafter confidence that position (or node) i is       | 0   | 1   |
    |                | accepted given all before it were; 0.0 past the drafted ones     |     |     |
    | 17 .. 33       | T(0)..T(16): predicted wall seconds of the whole iteration       | >0  | inf |
    |                | T(n) = T_draft + T_verify(n) when n positions/nodes are verified |     |     |

For a tree, the nodes are ordered by decreasing path-confidence product ``P`` and ``c_i`` is the ratio
of consecutive products, so that ``prod(c_1..c_j)`` is the j-th largest path product
(``tree_confidences`` does this conversion).

Adaptation observation (``adapt_features``), ``len(ADAPT_FEATURES) + n_domains`` entries:

    | index  | name                 | meaning                                                  | min | max |
    |--------|----------------------|----------------------------------------------------------|-----|-----|
    | 0      | head_fill            | head-buffer fill, fraction of its capacity (1 = full)    | 0   | 1   |
    | 1      | full_fill            | full-buffer fill, fraction of its capacity (1 = full)    | 0   | 1   |
    | 2      | trigger              | s_trig: rejected draft positions (each with its target   | 0   | inf |
    |        |                      | distribution) buffered since the last training event     |     |     |
    | 3      | recent_tau           | EWMA of accepted tokens per iteration over recent queries| 0   | inf |
    | 4      | tau_trend            | short-horizon EWMA of tau minus long-horizon EWMA        | -inf| inf |
    | 5      | queries_since_update | queries served since the last training event             | 0   | inf |
    | 6 ..   | share_<d>            | share of domain d among recent queries (sum 1, or all 0) | 0   | 1   |

Serving observation (``serve_features``), ``6 + batch_cap * SERVE_SLOT_DIM`` entries: the batch's
``running`` requests, the ``waiting`` ones (arrived, not admitted), the ``batch_cap``, and what the next
iteration costs: ``base_seconds`` (the batched verify with no draft), ``node_seconds`` (what one more
verified node of one request adds to it, at this batch) and ``draft_seconds`` (drafting per position per
request); then per batch slot ``SERVE_SLOT_DIM = 3 + LENGTH_CAP`` entries (all 0 for an empty slot):

    | index in a slot | meaning                                                       | min | max |
    |-----------------|---------------------------------------------------------------|-----|-----|
    | 0               | active (1: a request runs in the slot)                        | 0   | 1   |
    | 1               | context length of its request                                 | 0   | inf |
    | 2               | tokens its request has still to generate                      | 0   | inf |
    | 3 .. 18         | c_1..c_16 of its pending draft, as in the length observation  | 0   | 1   |
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import numpy as np

from core.errors import InputError

LENGTH_CAP: int = 16
"""Positions (or tree nodes) a length policy can choose among: an action is in 0..LENGTH_CAP."""

LENGTH_DIM: int = 1 + LENGTH_CAP + (LENGTH_CAP + 1)
LENGTH_SLICES = MappingProxyType({
    "context_length": slice(0, 1),
    "confidences": slice(1, 1 + LENGTH_CAP),
    "step_seconds": slice(1 + LENGTH_CAP, LENGTH_DIM),
})
"""Named fields of the length observation."""

ADAPT_FEATURES: tuple[str, ...] = (
    "head_fill", "full_fill", "trigger", "recent_tau", "tau_trend", "queries_since_update",
)
"""Scalar fields of the adaptation observation; one ``share_<d>`` per domain follows them."""
ADAPT_INDEX = MappingProxyType({name: i for i, name in enumerate(ADAPT_FEATURES)})
ADAPT_DOMAINS = slice(len(ADAPT_FEATURES), None)
"""Slice of the adaptation observation holding the domain shares."""


def _vector(name: str, values: np.ndarray, low: float, high: float) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array, got shape {arr.shape}: pass one value per entry")
    if not np.all(np.isfinite(arr)) or np.any(arr < low) or np.any(arr > high):
        raise InputError(f"{name} has values outside [{low}, {high}]: pass finite values in that range")
    return arr


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _scalar(name: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number, got {value!r}")
    if not (np.isfinite(value) and low <= value <= high):
        raise InputError(f"{name} = {value!r} is out of range: pass a finite number in [{low}, {high}]")
    return float(value)


def length_features(confidences: np.ndarray, context_length: int, step_seconds: np.ndarray) -> np.ndarray:
    """The length policy's observation: ``[context_length, c_1..c_cap, T(0)..T(cap)]`` (float64).

    ``confidences`` holds at most ``LENGTH_CAP`` values in [0, 1] and is padded with 0.0;
    ``step_seconds`` holds ``LENGTH_CAP + 1`` positive iteration times, for n = 0..LENGTH_CAP.
    """
    conf = _vector("confidences", confidences, 0.0, 1.0)
    if conf.size > LENGTH_CAP:
        raise InputError(f"confidences has {conf.size} entries, more than LENGTH_CAP={LENGTH_CAP}: "
                         f"pass the first {LENGTH_CAP}")
    steps = _vector("step_seconds", step_seconds, 0.0, np.inf)
    if steps.shape != (LENGTH_CAP + 1,) or np.any(steps <= 0):
        raise InputError(f"step_seconds must hold {LENGTH_CAP + 1} positive times (n = 0..{LENGTH_CAP}), "
                         f"got shape {steps.shape}: predict T(n) for every n")
    obs = np.zeros(LENGTH_DIM, dtype=np.float64)
    obs[0] = _count("context_length", context_length)
    obs[LENGTH_SLICES["confidences"]][: conf.size] = conf
    obs[LENGTH_SLICES["step_seconds"]] = steps
    return obs


def check_length_obs(obs: np.ndarray) -> np.ndarray:
    """Return ``obs`` as float64 after checking it has the length observation's shape."""
    arr = np.asarray(obs, dtype=np.float64)
    if arr.shape != (LENGTH_DIM,):
        raise InputError(f"length observation must have shape ({LENGTH_DIM},), got {arr.shape}: "
                         "build it with policies.features.length_features")
    return arr


def tree_confidences(path_products: np.ndarray) -> np.ndarray:
    """Per-node ``c_i`` for a tree: sort path-confidence products descending, return consecutive ratios.

    The cumulative product of the result is the sorted path products, so the length features and the
    LibraSpec criterion treat the i-th most likely node as position i.
    """
    products = np.sort(_vector("path_products", path_products, 0.0, 1.0))[::-1]
    previous = np.concatenate(([1.0], products[:-1]))
    return np.divide(products, previous, out=np.zeros_like(products), where=previous > 0)


def length_bounds() -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the length observation, for a Gymnasium ``Box``."""
    low = np.zeros(LENGTH_DIM)
    high = np.full(LENGTH_DIM, np.inf)
    high[LENGTH_SLICES["confidences"]] = 1.0
    return low, high


def adapt_features(head_fill: float, full_fill: float, trigger: float, recent_tau: float, tau_trend: float,
                   queries_since_update: int, domain_shares: np.ndarray) -> np.ndarray:
    """The adaptation policy's observation: the ``ADAPT_FEATURES`` scalars then the domain shares."""
    shares = _vector("domain_shares", domain_shares, 0.0, 1.0)
    total = shares.sum()
    if not (abs(total - 1.0) <= 1e-6 or total == 0.0):
        raise InputError(f"domain_shares sum to {total:.6g}: pass shares summing to 1 "
                         "(all 0 before any query)")
    scalars = [
        _scalar("head_fill", head_fill, 0.0, 1.0),
        _scalar("full_fill", full_fill, 0.0, 1.0),
        _scalar("trigger", trigger, 0.0, np.inf),
        _scalar("recent_tau", recent_tau, 0.0, np.inf),
        _scalar("tau_trend", tau_trend, -np.inf, np.inf),
        _count("queries_since_update", queries_since_update),
    ]
    return np.concatenate((np.asarray(scalars, dtype=np.float64), shares))


def adapt_feature_names(n_domains: int) -> tuple[str, ...]:
    """Names of every entry of an adaptation observation with ``n_domains`` domain shares."""
    return ADAPT_FEATURES + tuple(f"share_{d}" for d in range(_count("n_domains", n_domains)))


def adapt_bounds(n_domains: int) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the adaptation observation, for a Gymnasium ``Box``."""
    size = len(adapt_feature_names(n_domains))
    low = np.zeros(size)
    high = np.ones(size)
    for name in ("trigger", "recent_tau", "tau_trend", "queries_since_update"):
        high[ADAPT_INDEX[name]] = np.inf
    low[ADAPT_INDEX["tau_trend"]] = -np.inf
    return low, high


def check_adapt_obs(obs: np.ndarray) -> np.ndarray:
    """Return ``obs`` as float64 after checking it is a 1-D adaptation observation."""
    arr = np.asarray(obs, dtype=np.float64)
    if arr.ndim != 1 or arr.size < len(ADAPT_FEATURES):
        raise InputError(f"adaptation observation must be 1-D with at least {len(ADAPT_FEATURES)} entries, "
                         f"got shape {arr.shape}: build it with policies.features.adapt_features")
    return arr


SERVE_GLOBAL: tuple[str, ...] = ("running", "waiting", "batch_cap", "base_seconds", "node_seconds",
                                  "draft_seconds", "draft_start_seconds")
"""The batch-wide fields that open a serving observation."""
SERVE_INDEX = MappingProxyType({name: i for i, name in enumerate(SERVE_GLOBAL)})
SERVE_SLOT_DIM: int = 3 + LENGTH_CAP
SERVE_SLOT_SLICES = MappingProxyType({
    "active": slice(0, 1), "context_length": slice(1, 2), "remaining": slice(2, 3),
    "confidences": slice(3, SERVE_SLOT_DIM),
})
"""Named fields of one slot's row in a serving observation (``serve_slots``)."""


def serve_features(running: int, waiting: int, costs: Sequence[float], slots: np.ndarray) -> np.ndarray:
    """The serving observation: ``running``, ``waiting``, the batch cap (``slots``' rows), ``costs``
    (base, node, draft and draft start seconds: ``core.serve_costs.ServeCosts``), then ``slots``
    ([batch_cap, SERVE_SLOT_DIM]: per slot active, context length, remaining tokens, c_1..c_cap)."""
    rows = np.asarray(slots, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != SERVE_SLOT_DIM or rows.shape[0] < 1:
        raise InputError(f"slots must be [batch_cap, {SERVE_SLOT_DIM}], got shape {rows.shape}: one row per "
                         "batch slot")
    confidences = rows[:, SERVE_SLOT_SLICES["confidences"]]
    if not np.all(np.isfinite(rows)) or np.any(rows < 0) or np.any(confidences > 1):
        raise InputError("slots hold negative, infinite or confidence values above 1: pass finite values")
    if len(costs) != len(SERVE_GLOBAL) - 3:
        raise InputError(f"costs must be {len(SERVE_GLOBAL) - 3} numbers ({', '.join(SERVE_GLOBAL[3:])}), "
                         f"got {len(costs)}")
    head = [_count("running", running), _count("waiting", waiting), rows.shape[0],
            *(_scalar(name, value, 0.0, np.inf) for name, value in zip(SERVE_GLOBAL[3:], costs, strict=True))]
    return np.concatenate((np.asarray(head, dtype=np.float64), rows.reshape(-1)))


def serve_slots(obs: np.ndarray) -> np.ndarray:
    """The ``[batch_cap, SERVE_SLOT_DIM]`` slot rows of a serving observation."""
    arr = np.asarray(obs, dtype=np.float64)
    head = len(SERVE_GLOBAL)
    cap = int(arr[SERVE_INDEX["batch_cap"]]) if arr.ndim == 1 and arr.size > head else -1
    if cap < 1 or arr.size != head + cap * SERVE_SLOT_DIM:
        raise InputError(f"a serving observation of shape {arr.shape} is not {head} + batch_cap x "
                         f"{SERVE_SLOT_DIM} entries: build it with policies.features.serve_features")
    return arr[len(SERVE_GLOBAL):].reshape(cap, SERVE_SLOT_DIM)


def serve_probe(obs: np.ndarray, slot: int, confidences: np.ndarray) -> np.ndarray:
    """``obs`` as a chain drafting under a serving policy shows it before drafting one more position of
    request ``slot``: that request's ``confidences`` so far and a certain next one, every other request's
    draft empty (so the rule reads no draft but its own, whichever order the requests draft in)."""
    probe = np.array(obs, dtype=np.float64)
    rows = serve_slots(probe)
    rows[:, SERVE_SLOT_SLICES["confidences"]] = 0.0
    k = len(confidences)
    rows[slot, SERVE_SLOT_SLICES["confidences"].start:SERVE_SLOT_SLICES["confidences"].start + k + 1] = [
        *confidences, 1.0]
    return probe


def serve_bounds(batch_cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the serving observation for ``batch_cap`` slots, for a Gymnasium ``Box``."""
    cap = _count("batch_cap", batch_cap)
    high = np.full((cap, SERVE_SLOT_DIM), np.inf)
    high[:, SERVE_SLOT_SLICES["active"]] = 1.0
    high[:, SERVE_SLOT_SLICES["confidences"]] = 1.0
    head = np.full(len(SERVE_GLOBAL), np.inf)
    return np.zeros(len(SERVE_GLOBAL) + cap * SERVE_SLOT_DIM), np.concatenate((head, high.reshape(-1)))
