"""The deploy comparison: bootstrap intervals, the fidelity error, rank agreement and the adaptive
policies against the best fixed length, on synthetic measurements whose answers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.intervals import interval, ratio_of_sums, resample_queries, resamples
from experiments.pipeline.deploy import Forecast, Live, compare, decision_cost
from policies import make_policy
from policies.calibration import Calibration

DOMAINS = ["a", "b"] * 8


def live(speed: float, noise: float, seed: int) -> Live:
    """16 prompts of 64 tokens decoded at about ``speed`` tokens/s."""
    rng = np.random.default_rng(seed)
    tokens = np.full(16, 64.0)
    seconds = tokens / speed * rng.uniform(1 - noise, 1 + noise, 16)
    iterations = tokens / 2
    return Live(tokens, seconds, iterations, 0.3 * seconds, 0.6 * seconds)


def forecast(speed: float) -> Forecast:
    return Forecast(speed, 2.0, 2.0 / speed, 0.6 / speed, np.full(10, speed) * np.linspace(0.95, 1.05, 10))


def test_resamples_stay_within_each_domain() -> None:
    index = resamples(DOMAINS, 50, 0)
    labels = np.asarray(DOMAINS)
    assert index.shape == (50, 16)
    assert np.all(labels[index] == labels[None, :])  # every slot draws from its own domain
    assert len(np.unique(index)) > 8  # and draws differ


def test_ratio_of_sums_and_interval() -> None:
    tokens, seconds = np.array([10.0, 20.0]), np.array([1.0, 4.0])
    index = np.array([[0, 0], [1, 1], [0, 1]])
    np.testing.assert_allclose(ratio_of_sums(tokens, seconds, index), [10.0, 5.0, 6.0])
    assert interval(np.arange(101.0)) == pytest.approx([2.5, 97.5])


def test_resample_queries_keeps_each_domains_query_count() -> None:
    traces = pd.DataFrame({"query_id": [0, 0, 1, 2, 2, 2], "domain": ["a", "a", "a", "b", "b", "b"],
                           "iteration": [0, 1, 0, 0, 1, 2]})
    out = resample_queries(traces, np.random.default_rng(3))
    per_domain = out.groupby("domain")["query_id"].nunique()
    assert per_domain.to_dict() == {"a": 2, "b": 1}
    for _, rows in out.groupby("query_id"):  # every query is one recorded query, whole
        assert list(rows["iteration"]) == list(range(len(rows)))


def test_compare_reports_errors_intervals_and_ranking() -> None:
    runs = {"vanilla": live(100, 0.02, 0), "fixed-3": live(150, 0.05, 1), "fixed-6": live(120, 0.05, 2),
            "tuned-libraspec": live(160, 0.05, 3)}
    predicted = {"vanilla": forecast(100), "fixed-3": forecast(165), "fixed-6": forecast(120),
                 "tuned-libraspec": forecast(150)}
    kinds = {"fixed-3": "fixed", "fixed-6": "fixed", "tuned-libraspec": "libraspec"}
    out = compare(runs, predicted, DOMAINS, 0, kinds)
    rows = out["policies"]
    errors = {n: predicted[n].tokens_per_second / runs[n].tokens_per_second - 1 for n in runs}
    for name, row in rows.items():
        assert row["error"] == pytest.approx(errors[name])
        low, high = row["measured_ci"]
        assert low <= row["measured_tokens_per_second"] <= high
        assert row["predicted_ci"][0] <= row["predicted_tokens_per_second"] <= row["predicted_ci"][1]
    assert out["fidelity_error"] == pytest.approx(float(np.median(np.abs(list(errors.values())))))
    assert out["fidelity_error_ci"][0] <= out["fidelity_error"] <= out["fidelity_error_ci"][1]
    agreement = out["rank_agreement"]
    assert agreement["predicted_best"] == "fixed-3" and agreement["measured_best"] == "tuned-libraspec"
    assert agreement["kendall_tau"] == pytest.approx(2 / 3)  # one swapped pair of six
    best = out["against_best_fixed"]
    assert best["best_fixed"] == "fixed-3" and set(best["policies"]) == {"tuned-libraspec"}
    ratio = best["policies"]["tuned-libraspec"]
    assert ratio["ratio"] == pytest.approx(runs["tuned-libraspec"].tokens_per_second
                                           / runs["fixed-3"].tokens_per_second)
    assert rows["fixed-3"]["measured_draft_ms"] == pytest.approx(
        0.3 * rows["fixed-3"]["measured_iteration_ms"])


def test_compare_reports_the_forecast_from_the_held_out_prompts_own_traces() -> None:
    runs = {"vanilla": live(100, 0.02, 0), "a": live(150, 0.05, 1), "b": live(120, 0.05, 2)}
    predicted = {"vanilla": forecast(100), "a": forecast(165), "b": forecast(120)}
    replayed = {"vanilla": forecast(101), "a": forecast(153), "b": forecast(114)}
    out = compare(runs, predicted, DOMAINS, 0, {}, replayed=replayed)
    errors = {n: replayed[n].tokens_per_second / runs[n].tokens_per_second - 1 for n in runs}
    for name, row in out["policies"].items():
        assert row["replay_error"] == pytest.approx(errors[name])
        assert row["replayed_tokens_per_second"] == replayed[name].tokens_per_second
    assert out["replay_error"] == pytest.approx(float(np.median(np.abs(list(errors.values())))))
    assert "replay_error" not in compare(runs, predicted, DOMAINS, 0, {})  # only when replayed


def test_a_clearly_faster_measured_best_is_called_out() -> None:
    runs = {"vanilla": live(100, 0.01, 0), "a": live(200, 0.01, 1), "b": live(120, 0.01, 2)}
    predicted = {"vanilla": forecast(100), "a": forecast(110), "b": forecast(130)}
    agreement = compare(runs, predicted, DOMAINS, 0, {})["rank_agreement"]
    assert agreement["predicted_best"] == "b" and agreement["measured_best"] == "a"
    assert not agreement["predicted_best_within_interval"] and agreement["measured_best_lead_ci"][0] > 1


def test_forecasts_the_calibration_queries_cannot_tell_apart_are_ties() -> None:
    """Ties read the paired ratio of the forecast replicates: a forecast 1% below the best whose replicates
    scatter around it by more ties; one 10% below on the same resamples does not, nor does the same 1% gap
    held steady over every resample."""
    rng = np.random.default_rng(0)
    shared = rng.uniform(0.9, 1.1, 10)  # each resample of the calibration queries moves every forecast
    best = Forecast(150.0, 2.0, 0.01, 0.003, 150.0 * shared)
    close = Forecast(148.5, 2.0, 0.01, 0.003, 148.5 * shared * rng.uniform(0.95, 1.05, 10))
    far = Forecast(135.0, 2.0, 0.01, 0.003, 135.0 * shared)
    runs = {"vanilla": live(100, 0.01, 0), "best": live(140, 0.01, 1), "close": live(150, 0.01, 2),
            "far": live(130, 0.01, 3)}
    agreement = compare(runs, {"vanilla": forecast(100), "best": best, "close": close, "far": far},
                        DOMAINS, 0, {})["rank_agreement"]
    assert agreement["predicted_best"] == "best" and agreement["measured_best"] == "close"
    assert agreement["predicted_ties"] == ["close"]
    assert agreement["measured_best_tied"]
    steady = {"vanilla": forecast(100), "best": best, "far": far,
              "close": Forecast(148.5, 2.0, 0.01, 0.003, 148.5 * shared)}
    agreement = compare(runs, steady, DOMAINS, 0, {})["rank_agreement"]
    assert agreement["predicted_ties"] == [] and not agreement["measured_best_tied"]


def test_decision_cost_is_what_a_policy_adds_to_a_fixed_length() -> None:
    from core.cost_profile import profile_from_json

    flat = [{"context": c, "seconds": [2e-3]} for c in (0, 4096)]
    profile = profile_from_json({
        "schema_version": 1, "device": "test", "dtype": "float32", "derived_from": None,
        "models": {"target": "t", "drafters": {"draft-model": "d"}},
        "samples": {"verify": [{"nodes": n, **row} for n in (1, 32) for row in flat], "vanilla": flat,
                    "draft": {"draft-model": [{"tokens": 1, "seconds": [1e-3]}]},
                    "update": {"head": [1.0], "full": [2.0]}}})
    traces = pd.DataFrame({"confidences": [np.array([0.9, 0.5, 0.3])] * 8, "context_length": 100})
    assert decision_cost(make_policy("fixed"), traces, profile, "draft-model", calls=200) == pytest.approx(
        0.0, abs=2e-5)
    slow = make_policy("libraspec", calibration=Calibration((((0.0, 1.0), (0.0, 1.0)),)))
    assert decision_cost(slow, traces, profile, "draft-model", calls=200) > 0
