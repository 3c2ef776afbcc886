"""The simulated half of ``experiments.adapt.live``: engine streams as ``AdaptRecord``s, ``AdaptStream``'s
prediction of each policy's stream, and the figures both are compared by."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from policies.adaptation import ACTIONS, SKIP
from policies.base import make_policy
from simulator.adaptation import AdaptRecord
from simulator.predict import make_env
from simulator.rollout import serve_query

if TYPE_CHECKING:
    from experiments.adapt.plan import StreamPlan


def record_of(rows: Sequence[Mapping[str, Any]], domains: Sequence[str]) -> Any:
    """An engine stream as ``simulator.adaptation.AdaptRecord`` (domain order ``domains``)."""
    share = np.zeros((len(rows), len(domains)))
    action, fill = np.full(len(rows), SKIP), np.zeros(len(rows))
    for i, row in enumerate(rows):
        update = row["update"]
        if update is not None:
            action[i], fill[i] = ACTIONS.index(update["kind"]), update["fill"]
            for domain, value in update["shares"].items():
                share[i, domains.index(domain)] = value
    column = {key: np.array([r[key] for r in rows])
              for key in ("tau", "reverted", "checkpoint", "checkpoint_previous")}
    domain = np.array([domains.index(r["domain"]) for r in rows])
    draft = np.array([r["draft_ratio"] for r in rows]) if all("draft_ratio" in r for r in rows) else None
    return AdaptRecord(domain, column["tau"], action, fill, share, column["reverted"], column["checkpoint"],
                       draft, column["checkpoint_previous"])


def simulate(
    spec: Mapping[str, Any],
    stream_domains: Sequence[str],
    acceptance: Any,
    profile: Any,
    dynamics: Any,
    plan: StreamPlan,
    tokens: int,
    prompt_tokens: tuple[int, int],
    seed: int,
    shapes: Sequence[Mapping[str, float]],
    overlap_slowdown: float | None = None,
) -> dict[str, list[float]]:
    """``AdaptStream``'s per-query means over ``plan.sim_seeds`` streams of the policy ``spec``
    (policy-file content) whose queries generate ``tokens`` each, drafting costed at the recorded
    SpecBlock ``shapes``; with ``overlap_slowdown`` updates train beside decoding (``overlap``).
    Tokens/s is each query's harmonic mean, its mean seconds per token inverted: a stream's tokens/s
    is its tokens over its summed seconds, which the arithmetic mean of rates overstates."""
    env = make_env("adaptation", profile, acceptance, "specblock", len(stream_domains),
                   draft_length=acceptance.cap, tokens_per_query=tokens, prompt_tokens=prompt_tokens,
                   phases=[(1, {d: 1.0}) for d in stream_domains], dynamics=dynamics,
                   draft_shape=list(shapes), overlap=overlap_slowdown is not None,
                   overlap_slowdown=overlap_slowdown or 1.0)
    q = len(stream_domains)
    tau, tps, update, updated = (np.zeros((plan.sim_seeds, q)) for _ in range(4))
    for s in range(plan.sim_seeds):
        policy = make_policy(spec["kind"], spec["params"], seed=seed)
        obs, _ = env.reset(seed=seed * 1000 + s)
        for i in range(q):
            next_obs, _, info = serve_query(policy, env, obs)
            tau[s, i], tps[s, i] = info["tau"], info["tokens_per_second"]
            update[s, i], updated[s, i] = info["update_seconds"], info["updated"]
            obs = next_obs
    return {  # a query's tokens/s over the seeds is its mean seconds inverted: what its stream sums
        "tau": tau.mean(0).tolist(),
        "tokens_per_second": (1.0 / (1.0 / tps).mean(0)).tolist(),
        "update_seconds": update.mean(0).tolist(),
        "update_rate": updated.mean(0).tolist(),
    }


def at_machine_speed(simulated: Mapping[str, list[float]], speed: Mapping[str, Sequence[float]]
                     ) -> dict[str, list[float]]:
    """``simulate``'s per-query figures with each query's tokens/s divided by the machine's speed factor
    there (``adapt_serve.machine_speed``'s factors interpolated linearly between the re-timings): the
    profile prices a stream at its pooled timings, and a shared machine's speed drifts within one (each
    policy's ``machine_speed`` in the results file)."""
    tps = np.asarray(simulated["tokens_per_second"])
    return {**simulated, "tokens_per_second": (tps / speed_factors(speed, tps.size)).tolist()}


def speed_factors(speed: Mapping[str, Sequence[float]], queries: int) -> np.ndarray:
    """Each of ``queries`` queries' machine-speed factor: ``adapt_serve.machine_speed``'s, interpolated
    linearly between the re-timings around it."""
    return np.interp(np.arange(queries) + 0.5, speed["at"], speed["factor"])


def add_draft_ratios(rows: Sequence[dict[str, Any]], shapes: Sequence[Mapping[str, float]], profile: Any,
                     base_ms: float, base_nodes: float, context: float) -> None:
    """Set each row's ``draft_ratio``: what its trees cost beyond verifying ``base_nodes`` per forward, over
    ``base_ms`` (the simulator's drafting time before any update): the profile's mean drafting time at the
    shapes its query ran (its ``proposals`` entries of ``shapes``, in order) plus the verify forwards'
    extra time at its ``tree_nodes`` (at ``context`` cached tokens). Updates that widen the rank head's
    trees make both drafting and verification dearer; the simulator charges both through this ratio."""
    start = 0
    base_verify = profile.verify_seconds(base_nodes, context)
    for row in rows:
        mine = shapes[start:start + row["proposals"]]
        start += row["proposals"]
        drafting = mean_shape(profile, mine)["draft_ms"] if mine else base_ms
        verifying = 1e3 * float(profile.verify_seconds(row["tree_nodes"], context) - base_verify)
        row["draft_ratio"] = (drafting + verifying) / base_ms


def tree_nodes(rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean nodes per verify forward (root included) over a stream's iterations."""
    return sum(r["tree_nodes"] * r["iterations"] for r in rows) / max(sum(r["iterations"] for r in rows), 1)


def mean_shape(profile: Any, shapes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean block forwards and start nodes of recorded SpecBlock shapes, and the profile's mean drafting
    milliseconds at them."""
    out = {k: float(np.mean([s[k] for s in shapes])) for k in ("blocks", "starts")}
    out["draft_ms"] = 1e3 * float(np.mean([profile.draft_seconds("specblock", **s) for s in shapes]))
    return out


def summary(
    domains: Sequence[str],
    tau: Sequence[float],
    tps: Sequence[float],
    update: Sequence[float],
    tokens: Sequence[int],
    window: Sequence[int],
    shifted: Collection[str],
) -> dict[str, float]:
    """Stream figures: tokens/s with updates charged, mean tau, and tau on the ``shifted`` domains (those
    the stream shifts to) in the first and the second half of the queries ``window`` (``[start, end)``:
    the phase after the first shift, ``experiments.adapt.live.shifted_queries``)."""
    seconds = [n / r for n, r in zip(tokens, tps, strict=True)]
    start, end = window
    middle = start + (end - start) // 2
    after = [i for i in range(start, end) if domains[i] in shifted]
    early = [tau[i] for i in after if i < middle]
    late = [tau[i] for i in after if i >= middle]
    return {
        "tokens_per_second": sum(tokens) / (sum(seconds) + sum(update)),
        "tau": float(np.mean(tau)),
        "shifted_tau_early": float(np.mean(early)) if early else float("nan"),
        "shifted_tau_late": float(np.mean(late)) if late else float("nan"),
        "update_seconds": float(sum(update)),
    }


def errors(measured: Sequence[float], simulated: Sequence[float]) -> dict[str, float]:
    """Mean absolute relative error per query and the relative error of the means (sim / measured - 1)."""
    m, s = np.asarray(measured, dtype=float), np.asarray(simulated, dtype=float)
    return {
        "per_query_mape": float(np.mean(np.abs(s / m - 1.0))),
        "mean_error": float(s.mean() / m.mean() - 1.0),
    }
