"""The fidelity harness: exact predictions on synthetic inputs, and the shipped data's measured error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.cost_profile import profile_from_json
from core.errors import InputError
from core.paths import DATA, TRACES
from experiments.cli import main
from experiments.pipeline import fidelity
from real_engine.prompts import Prompt

TRACE_TOKENS = 128  # new tokens per prompt of the shipped traces (acceptance grows along a generation)
SHIPPED = (DATA / "models" / "target" / "config.json", DATA / "models" / "draft" / "config.json",
           TRACES)


def flat_profile() -> object:
    """Costs independent of the context: verify 1 ms a node, vanilla 2 ms, drafting 0.5 ms a token."""
    rows = [1, 2, 4, 8, 16, 32]
    return profile_from_json({
        "schema_version": 1, "device": "test", "dtype": "float32",
        "models": {"target": "t", "drafters": {"draft-model": "d", "ngram": "n"}}, "derived_from": None,
        "samples": {
            "verify": [{"nodes": n, "context": c, "seconds": [1e-3 * n]} for n in rows for c in (0, 4096)],
            "vanilla": [{"context": c, "seconds": [2e-3]} for c in (0, 4096)],
            "draft": {"draft-model": [{"tokens": t, "seconds": [5e-4 * t]} for t in rows],
                      "ngram": [{"seconds": [1e-4]}]},
            "update": {"head": [1.0], "full": [2.0]}}})


def chain_traces(accepted: int, drafted: int = 8, rows: int = 20) -> pd.DataFrame:
    """Chain iterations that always accept ``accepted`` of ``drafted`` tokens, in two domains."""
    return pd.DataFrame({
        "query_id": np.arange(rows) // 5, "domain": np.where(np.arange(rows) < 10, "a", "b"),
        "drafter": "draft-model", "iteration": np.arange(rows) % 5, "context_length": 100,
        "depths": [np.arange(1, drafted + 1)] * rows, "parents": [np.arange(-1, drafted - 1)] * rows,
        "confidences": [np.full(drafted, 0.5)] * rows, "rank_buckets": [np.full(drafted, -1)] * rows,
        "on_path": [np.arange(drafted) < accepted] * rows, "accepted": accepted,
        "draft_seconds": 0.0, "verify_seconds": 0.0})


PROMPTS = [Prompt("x", "a", (1,) * 50), Prompt("y", "b", (1,) * 70)]


@pytest.mark.parametrize(("length", "tau", "seconds"), [(2, 3.0, 1e-3 + 3e-3), (6, 5.0, 3e-3 + 7e-3),
                                                        (0, 1.0, 2e-3)])
def test_simulate_chain_is_exact(length: int, tau: float, seconds: float) -> None:
    drafter = "none" if length == 0 else "draft-model"
    config = fidelity.make_config("c", drafter, "chain", length, depth=length)
    out = fidelity.simulate(flat_profile(), chain_traces(accepted=4), config, PROMPTS, tokens=60, queries=8,
                            seed=0)
    assert out["tau"] == pytest.approx(tau)
    assert out["iteration_seconds"] == pytest.approx(seconds)
    assert out["tokens_per_second"] == pytest.approx(tau / seconds)


def test_a_tree_config_is_charged_its_whole_tree_at_every_length() -> None:
    """A tree's drafting costs its shape's series whatever the verified length; a chain's grows per token."""
    tree = fidelity.make_config("t", "draft-model", "tree", 8, depth=4, width=2, budget=8)
    shape = fidelity.draft_shape(tree)
    assert shape == {"depth": 4, "width": 2}
    chain = fidelity.make_config("c", "draft-model", "chain", 8, depth=8)
    assert fidelity.draft_shape(chain) is None
    eagle = fidelity.make_config("e", "eagle", "eagle-4", 16, depth=4, budget=16)
    assert fidelity.draft_shape(eagle) == {"depth": 4}


def test_specblock_is_charged_the_mean_of_its_recorded_shapes() -> None:
    config = fidelity.make_config("s", "specblock", "specblock-2", 16, blocks=2, budget=16)
    shapes = [{"starts": 1.0, "blocks": 1}, {"starts": 4.0, "blocks": 2}]
    assert fidelity.draft_shape(config, shapes) == shapes
    with pytest.raises(InputError, match="record its calibration trace here"):
        fidelity.draft_shape(config)


def test_steady_state_skips_each_first_step() -> None:
    a, b = fidelity.StepClock(), fidelity.StepClock()
    a.steps = [(10.0, 1.0, 3), (10.5, 1.2, 2), (11.0, 1.4, 4)]
    b.steps = [(20.0, 5.0, 1), (22.0, 5.4, 3)]
    out = fidelity.steady_state([a, b])
    assert (out["tokens"], out["iterations"], out["tau"]) == (9, 3, 3.0)
    assert out["wall"]["tokens_per_second"] == pytest.approx(9 / 3.0)
    assert out["cpu"]["tokens_per_second"] == pytest.approx(9 / 0.8)


def test_markdown_lists_every_config() -> None:
    row = {"name": "chain 4",
           "measured": {"tau": 3.0, "cpu": {"tokens_per_second": 100.0, "iteration_seconds": 0.03},
                        "wall": {"tokens_per_second": 50.0, "iteration_seconds": 0.06}},
           "predicted": {"tokens_per_second": 104.0, "tau": 3.1, "iteration_seconds": 0.0298},
           "error": 0.04, "error_wall_clock": 1.08}
    skipped = [{"config": "eagle", "reason": "none"}]
    text = fidelity.markdown({"clock": "cpu", "configs": [row], "skipped": skipped,
                              "median_abs_error": 0.04, "worst_abs_error": 0.04},
                             {"profile": "p.json", "calibration": 4, "evaluation": 4, "max_new_tokens": 64,
                              "threads": 1})
    assert "| chain 4 | 100.0 | 104.0 | +4.0% | +108.0% |" in text and "skipped eagle" in text


@pytest.mark.slow
def test_fidelity_of_a_profile_measured_here() -> None:
    """A cost profile measured in this process predicts a run measured right after it: the speedup over
    vanilla within 30% and tokens/s within 50% (loose on purpose: they catch unit and modelling
    breakage, a factor of 2, while this machine drifts 15 to 30% between the profile's rows and the run;
    a profile measured elsewhere is never compared with here)."""
    import dataclasses

    import torch

    from core.cost_profile import profile_from_json
    from real_engine import profile as prof
    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer
    from real_engine.trace import load_prompts, prompt_domains
    from simulator.traces import load_traces

    target_config, traces_path = SHIPPED[0], SHIPPED[2]
    traces = load_traces(traces_path)
    assert set(traces["drafter"]) == {"draft-model"}, "the shipped traces are draft-model chains"
    depth = int(max(d.max(initial=0) for d in traces["depths"]))  # replayed at the depth they were drafted
    config = fidelity.make_config(f"chain {depth}", "draft-model", "chain", depth, depth=depth)
    target, draft = load_model(target_config.parent), load_model(DATA / "models" / "draft")
    tokenizer = Tokenizer.load(target_config.parent, target.args.vocab_size, target.args.eos_token_id)
    prompts = load_prompts(prompt_domains(), 2, tokenizer.encode, "evaluation", max_tokens=256)
    grid = dataclasses.replace(prof.QUICK, nodes=(1, 2, depth // 2 + 1, depth + 1), contexts=(64, 512),
                               draft_tokens=tuple(range(1, depth + 1)), draft_context=256, repeats=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread on the process CPU clock, as the pipeline measures
    try:
        data = prof.measure(target, target_name="target", draft=draft, draft_name="draft", grid=grid,
                            feature=False, threads=1, clock_kind="cpu")
        engine = fidelity.Engine(target, draft, tokenizer.eos_id, TRACE_TOKENS, 0)
        vanilla = fidelity.make_config("vanilla", "none", "", 0)
        measured = engine.measure(prompts, [vanilla, config])
    finally:
        torch.set_num_threads(threads)
    profile = profile_from_json({k: v for k, v in data.items() if k != "measurement"})
    predicted = {c.name: fidelity.simulate(profile, traces, c, prompts, TRACE_TOKENS, 256, 0)
                 ["tokens_per_second"] for c in (vanilla, config)}
    real = {name: m["cpu"]["tokens_per_second"] for name, m in measured.items()}
    predicted_speedup = predicted[config.name] / predicted["vanilla"]
    measured_speedup = real[config.name] / real["vanilla"]
    assert abs(predicted_speedup / measured_speedup - 1) <= 0.3, (predicted, real)
    for name in predicted:
        assert abs(predicted[name] / real[name] - 1) <= 0.5, (predicted, real)


class FakeEngine:
    """Engine stand-in: fixed traces and measured throughputs (vanilla 400 tok/s, chain 2 600 tok/s)."""

    max_new_tokens, seed = 60, 0

    def trace(self, prompts: list, spec: dict) -> tuple[pd.DataFrame, list]:
        return chain_traces(accepted=4), []

    def measure(self, prompts: list, configs: list, log: object) -> dict:
        speed = {"vanilla": 400.0, "chain 2": 600.0}
        return {c.name: {"tau": 1.0, "cpu": {"tokens_per_second": speed[c.name], "iteration_seconds": 0.01},
                         "wall": {"tokens_per_second": speed[c.name] / 2, "iteration_seconds": 0.02}}
                for c in configs}


def test_run_fidelity_compares_tokens_per_second_and_speedup() -> None:
    configs = [fidelity.make_config("vanilla", "none", "", 0),
               fidelity.make_config("chain 2", "draft-model", "chain-2", 2)]
    engine = FakeEngine()
    calibration = fidelity.calibrate(engine, PROMPTS, configs)
    result = fidelity.run_fidelity(engine, flat_profile(), "cpu", calibration, PROMPTS, configs, queries=8)
    vanilla, chain = result["configs"]
    assert vanilla["predicted"]["tokens_per_second"] == pytest.approx(500.0)  # 1 token per 2 ms
    assert chain["predicted"]["tokens_per_second"] == pytest.approx(750.0)  # 3 tokens per 1 + 3 ms
    assert chain["error"] == pytest.approx(0.25) and chain["error_wall_clock"] == pytest.approx(1.5)
    assert chain["predicted_speedup"] == pytest.approx(1.5) and chain["speedup_error"] == pytest.approx(0.0)
    assert result["median_abs_error"] == pytest.approx(0.25)
    assert result["worst_abs_speedup_error"] == pytest.approx(0.0, abs=1e-12)
    assert chain["calibration"]["tau"] == pytest.approx(5.0) and vanilla["calibration"] is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--measure-profile", "p.json", "--profile-repeats", "0"], "--profile-repeats 0"),
    (["--measure-profile", "{tmp}/missing/p.json"], "does not exist"),
])
def test_profile_options_are_checked_before_anything_runs(tmp_path: Path, capsys, argv, message) -> None:
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(["fidelity", *argv, "--out", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_calibration_costs_split_a_trace_into_tau_draft_and_verify() -> None:
    traces = chain_traces(accepted=4).assign(draft_seconds=np.where(np.arange(20) % 5 == 0, 1.0, 3e-3),
                                             verify_seconds=8e-3)
    chain = fidelity.make_config("c", "draft-model", "chain", 8, depth=8)
    out = fidelity.calibration_costs(flat_profile(), traces, chain)
    assert out["tau"] == pytest.approx(5.0)
    assert out["draft_ms"] == pytest.approx(3.0)  # each query's first iteration (1 s) left out
    assert out["predicted_draft_ms"] == pytest.approx(4.0)
    assert out["predicted_verify_ms"] == pytest.approx(9.0)
    tree = fidelity.calibration_costs(flat_profile(), traces, chain, shape={"tokens": 2})
    assert tree["predicted_draft_ms"] == pytest.approx(1.0)  # the whole tree's cost, not the chain's
    row = {"name": "c", "measured": {"tau": 4.0, "cpu": {"tokens_per_second": 1.0, "iteration_seconds": 1.0},
                                     "wall": {"tokens_per_second": 1.0, "iteration_seconds": 1.0}},
           "predicted": {"tokens_per_second": 1.0, "tau": 5.0, "iteration_seconds": 1.0}, "error": 0.0,
           "error_wall_clock": 0.0, "calibration": out}
    text = fidelity.markdown({"clock": "cpu", "configs": [row], "skipped": [], "median_abs_error": 0.0,
                              "worst_abs_error": 0.0}, {"profile": "p", "calibration": 1, "evaluation": 1,
                                                        "max_new_tokens": 1, "threads": 1})
    assert "| c | 5.00 | 4.00 | 3.00 | 4.00 | 8.00 | 9.00 |" in text
