"""Live deployment against prediction: every length policy in the engine beside the simulator's
forecast, each with a 95% interval, and how well the forecast matches and ranks them.

Measured: the policies decode the same held-out prompts round-robin, prompt by prompt, the order
rotated at every prompt, so a drift of the machine's speed touches every policy alike and none always
runs right after the same one; the pipeline interleaves the prompts with the rounds of the cost
profile the forecast uses, so the profile sees the machine as the live runs do. Each prompt gives its
steady-state tokens and seconds on the profile's clock (after the first step, which also fills the
drafter's cache: prefill is outside the simulator's scope). The interval resamples prompts within
each domain (``experiments.intervals``).

Predicted: ``experiments.pipeline.fidelity.simulate`` from the cost profile and the calibration traces, on
queries shaped like the held-out prompts; its interval resamples the recorded calibration queries
within each domain, the uncertainty of a forecast built from a handful of queries.

Replayed: the same forecast from the held-out prompts' own probed traces instead of the calibration
prompts' (no interval). Its error is the simulator's on the very text the engine decoded (the cost
profile's error, and the few greedy tokens a verify's rounding turns, as bfloat16 does); the rest of
the fidelity error is how the calibration prompts differ from the held-out ones.

The fidelity error is the median over policies of |predicted / measured - 1|; its interval pairs the
two bootstraps. The ranking is compared by Kendall's tau, and the predicted best policy is called the
measured best within its interval when the measured best's lead over it (a paired ratio over the same
resampled prompts) does not exclude 1. Its ties are the policies the simulator cannot tell from it: the
ratio of their forecast to its over the same resampled calibration queries does not exclude 1. Where the
top forecasts tie, which of them is best is the calibration prompts' draw, not the simulator's finding.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from experiments.intervals import REPLICATES, interval, ratio_of_sums, resample_queries, resamples
from experiments.pipeline.fidelity import Config, StepClock, simulate
from policies import length_features, make_policy
from policies.features import LENGTH_CAP
from real_engine.decode import generate

CLOCK_INDEX = {"wall": 0, "cpu": 1}  # StepClock's fields


@dataclass(frozen=True)
class Live:
    """One policy's steady-state measurements, one entry per prompt (the prompts' order)."""

    tokens: np.ndarray
    seconds: np.ndarray  # on the profile's clock
    iterations: np.ndarray
    draft_seconds: np.ndarray  # wall seconds of the drafter's calls (and a length policy's own work)
    verify_seconds: np.ndarray  # wall seconds of the target's verify (or plain) steps

    @property
    def tokens_per_second(self) -> float:
        """Throughput over every prompt."""
        return float(self.tokens.sum() / self.seconds.sum())

    @property
    def tau(self) -> float:
        """Tokens per target forward."""
        return float(self.tokens.sum() / self.iterations.sum())


class LiveRun:
    """Every policy's drafter (``builders[name](prompt index)``, None for vanilla) on the same prompts,
    one prompt at a time (``prompt(i)``) so other measurements can interleave with them; at each prompt
    the policies take turns, the order rotated by one."""

    def __init__(self, target: Any, prompts: Sequence[Any], builders: Mapping[str, Callable[[int], Any]],
                 max_new_tokens: int, seed: int, log: Callable[[str], None] = lambda _: None) -> None:
        self.target, self.prompts, self.builders = target, prompts, builders
        self.max_new_tokens, self.seed, self.log = max_new_tokens, seed, log
        self.clocks: dict[str, list[StepClock]] = {name: [StepClock() for _ in prompts] for name in builders}
        self.parts = {name: np.zeros((len(prompts), 2)) for name in builders}  # (draft, verify) seconds

    def prompt(self, i: int) -> None:
        """Decode prompt ``i`` with every policy."""
        names = list(self.builders)
        self.log(f"deploy: prompt {i + 1}/{len(self.prompts)}, {len(names)} policies")
        turn = i % len(names)
        for name in names[turn:] + names[:turn]:
            drafter, clock = self.builders[name](i), self.clocks[name][i]
            generate(self.target, list(self.prompts[i].tokens), drafter=drafter,
                     max_new_tokens=self.max_new_tokens, seed=self.seed + i, on_tokens=clock,
                     on_iteration=self._first_skipped(name, i))
            if drafter is None:  # vanilla: every step is a plain step (its first one left out, as above)
                self.parts[name][i, 1] = clock.steps[-1][0] - clock.steps[0][0]

    def _first_skipped(self, name: str, i: int) -> Callable[[Any], None]:
        """An ``on_iteration`` callback adding each iteration's times but the first's."""
        seen = [0]

        def add(iteration: Any) -> None:
            if seen[0]:
                self.parts[name][i] += (iteration.draft_seconds, iteration.verify_seconds)
            seen[0] += 1

        return add

    def result(self, clock: str) -> dict[str, Live]:
        """Each policy's steady state per prompt on ``clock`` (every prompt must have run)."""
        index = CLOCK_INDEX[clock]
        return {name: Live(np.array([sum(n for *_, n in c.steps[1:]) for c in runs], dtype=np.float64),
                           np.array([c.steps[-1][index] - c.steps[0][index] for c in runs]),
                           np.array([len(c.steps) - 1 for c in runs], dtype=np.float64),
                           self.parts[name][:, 0].copy(), self.parts[name][:, 1].copy())
                for name, runs in self.clocks.items()}


@dataclass(frozen=True)
class Forecast:
    """The simulator's prediction for one policy and its bootstrap replicates (tokens/s)."""

    tokens_per_second: float
    tau: float
    iteration_seconds: float
    draft_seconds: float  # per iteration
    replicates: np.ndarray


def decision_cost(policy: Any, traces: pd.DataFrame, profile: Any, drafter: str, calls: int = 2000) -> float:
    """Seconds one ``act`` of ``policy`` costs beyond a fixed length's (whose cost the profile's
    ``steering`` series holds), timed on the process's CPU clock over observations built from the
    recorded confidences and ``profile``'s step times."""
    steps = profile.step_table(drafter, LENGTH_CAP)
    rows = traces.head(256)
    observations = [length_features(np.asarray(c, dtype=np.float64)[:LENGTH_CAP], int(ctx),
                                    steps(np.float64(ctx)))
                    for c, ctx in zip(rows["confidences"], rows["context_length"], strict=True)]

    def seconds(p: Any) -> float:
        start = time.process_time()
        for i in range(calls):
            p.act(observations[i % len(observations)])
        return (time.process_time() - start) / calls

    return max(seconds(policy) - seconds(make_policy("fixed")), 0.0)


def forecast(profile: Any, traces: pd.DataFrame, policy: Any, prompts: Sequence[Any], tokens: int,
             queries: int, seed: int, replicates: int, drafter: str, observed: Any = None,
             decision_seconds: float = 0.0) -> Forecast:
    """Simulate ``policy`` (None: vanilla decoding; shown the step times of ``observed`` when given, each
    decision costing ``decision_seconds``) on queries like ``prompts``, and again on ``replicates``
    resamples of the calibration queries."""
    config = Config("policy", drafter if policy is not None else "none", "", 0)
    options = {"policy": policy, "observed": observed, "decision_seconds": decision_seconds}
    point = simulate(profile, traces, config, prompts, tokens, queries, seed, **options)
    rng = np.random.default_rng(seed)
    draws = [simulate(profile, resample_queries(traces, rng), config, prompts, tokens, queries, seed + 1 + r,
                      **options)["tokens_per_second"] for r in range(replicates)]
    return Forecast(point["tokens_per_second"], point["tau"], point["iteration_seconds"],
                    point["draft_seconds"], np.array(draws))


def compare(live: Mapping[str, Live], predicted: Mapping[str, Forecast], domains: Sequence[str],
            seed: int, kinds: Mapping[str, str], baseline: str = "vanilla",
            replayed: Mapping[str, Forecast] | None = None) -> dict[str, Any]:
    """Per policy, measured and predicted tokens/s, speedup and tau with intervals and the error; over
    all, the fidelity error with its interval, the rank agreement (see the module docstring) and each
    adaptive policy against the best fixed length (``kinds``: policy name -> kind; vanilla has none);
    with ``replayed`` (the forecasts from the held-out prompts' traces), each one's error and their median
    (``replay_error``)."""
    index = resamples(domains, REPLICATES, seed)
    boot = {name: ratio_of_sums(run.tokens, run.seconds, index) for name, run in live.items()}
    pred = {name: f.replicates[np.arange(REPLICATES) % f.replicates.size] for name, f in predicted.items()}
    rows = {}
    for name, run in live.items():
        f, real = predicted[name], run.tokens_per_second
        rows[name] = {
            "measured_tokens_per_second": real, "measured_ci": interval(boot[name]),
            "predicted_tokens_per_second": f.tokens_per_second, "predicted_ci": interval(f.replicates),
            "error": f.tokens_per_second / real - 1.0, "error_ci": interval(pred[name] / boot[name] - 1.0),
            "measured_speedup": real / live[baseline].tokens_per_second,
            "measured_speedup_ci": interval(boot[name] / boot[baseline]),
            "predicted_speedup": f.tokens_per_second / predicted[baseline].tokens_per_second,
            "predicted_speedup_ci": interval(f.replicates / predicted[baseline].replicates),
            "measured_tau": run.tau, "predicted_tau": f.tau,
            **decomposition(run, f),
        }
        if replayed is not None:
            again = replayed[name]
            speed = again.tokens_per_second
            rows[name].update({"replayed_tokens_per_second": speed, "replayed_tau": again.tau,
                               "replay_error": speed / real - 1.0})
    errors = np.median(np.abs(np.stack([pred[n] / boot[n] - 1.0 for n in live])), axis=0)
    replay = {} if replayed is None else {
        "replay_error": statistics.median(abs(r["replay_error"]) for r in rows.values())}
    return {"policies": rows, **replay,
            "fidelity_error": statistics.median(abs(r["error"]) for r in rows.values()),
            "fidelity_error_ci": interval(errors),
            "worst_error": max(abs(r["error"]) for r in rows.values()),
            "rank_agreement": rank_agreement(rows, boot, pred),
            "against_best_fixed": against_best_fixed(rows, boot, kinds, baseline)}


def against_best_fixed(rows: Mapping[str, Mapping[str, Any]], boot: Mapping[str, np.ndarray],
                       kinds: Mapping[str, str], baseline: str = "vanilla") -> dict[str, Any]:
    """Each adaptive policy's measured tokens/s over the best fixed length's, with its paired interval.
    ``baseline`` (not drafting) counts as length 0: a fixed policy of length 0 decodes alike but pays for
    its decisions, so where not drafting is best the adaptive policies are held to plain decoding."""
    fixed = [n for n in rows if kinds.get(n) == "fixed" or n == baseline]
    if not fixed:
        return {}
    best = max(fixed, key=lambda n: rows[n]["measured_tokens_per_second"])
    base = rows[best]["measured_tokens_per_second"]
    return {"best_fixed": best, "policies": {
        n: {"ratio": rows[n]["measured_tokens_per_second"] / base, "ratio_ci": interval(boot[n] / boot[best])}
        for n in rows if kinds.get(n) not in (None, "fixed")}}


def decomposition(run: Live, f: Forecast) -> dict[str, float]:
    """Where an iteration's milliseconds go, measured against predicted: drafting (with the length
    policy's own work), verifying, and the rest of the loop (measured only: the simulator has none)."""
    iterations = run.iterations.sum()
    measured = 1e3 * float(run.seconds.sum() / iterations)
    draft, verify = (1e3 * float(part.sum() / iterations) for part in (run.draft_seconds, run.verify_seconds))
    predicted_draft = 1e3 * f.draft_seconds
    return {"measured_iteration_ms": measured, "predicted_iteration_ms": 1e3 * f.iteration_seconds,
            "measured_draft_ms": draft, "predicted_draft_ms": predicted_draft,
            "measured_verify_ms": verify, "predicted_verify_ms": 1e3 * f.iteration_seconds - predicted_draft,
            "measured_overhead_ms": measured - draft - verify}


def rank_agreement(rows: Mapping[str, Mapping[str, Any]], boot: Mapping[str, np.ndarray],
                   forecasts: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Kendall's tau between predicted and measured tokens/s over the policies; whether the predicted
    best is the measured best within its interval (the paired ratio best / predicted-best includes 1);
    the policies whose ``forecasts`` (replicates over the same resampled calibration queries) tie with the
    predicted best's (their paired ratio includes 1), and whether the measured best is one of them."""
    names = list(rows)
    measured = [rows[n]["measured_tokens_per_second"] for n in names]
    predicted = [rows[n]["predicted_tokens_per_second"] for n in names]
    tau = stats.kendalltau(predicted, measured)
    best_predicted, best_measured = names[int(np.argmax(predicted))], names[int(np.argmax(measured))]
    lead = interval(boot[best_measured] / boot[best_predicted])
    ties = [n for n in names
            if n != best_predicted and interval(forecasts[n] / forecasts[best_predicted])[1] >= 1.0]
    return {"kendall_tau": float(tau.statistic), "p_value": float(tau.pvalue),
            "predicted_best": best_predicted, "measured_best": best_measured,
            "measured_best_lead_ci": lead, "predicted_best_within_interval": lead[0] <= 1.0,
            "predicted_ties": ties, "measured_best_tied": best_measured in (best_predicted, *ties)}
