"""`specblock serve-bench`: serving policies live in the batched engine beside the serving simulator's
prediction of the same arrivals; its JSON keys, its figures' arithmetic and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.cost_profile import resolve_profile
from core.errors import InputError
from core.names import VANILLA
from core.paths import CPU_PROFILE
from experiments.serving.bench import (
    ServedDraft,
    chain_drafter,
    default_settings,
    draw_arrivals,
    measure_profile,
    serve_live,
    steering_fit,
    steering_samples,
    summarize,
)
from experiments.serving.lengths import MIN_OUTPUT, default_lengths, servable
from policies import make_policy, save_policy
from real_engine import profile as prof
from real_engine.model import Transformer
from real_engine.prompts import Prompt
from simulator.spec_serve import Arrivals

KEYS = {"tokens_per_second", "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "simulated_tokens_per_second",
        "simulated_tpot_ms_p50"}


def test_a_small_run_reports_every_policy_live_and_simulated(tmp_path: Path, cli) -> None:
    table = save_policy(make_policy("batch-table", {"l1": 2, "l2": 1}), tmp_path / "table.json")
    per_request = save_policy(make_policy("threshold-batch"), tmp_path / "per-request.json")
    code, out, err = cli(["serve-bench", "--rates", "40", "--requests", "3", "--tokens", "4", "--rounds",
                             "2", "--prompts", "1", "--calibration-prompts", "2", "--max-batch", "2",
                             "--profile-repeats", "1", "--policy", str(table), "--policy", str(per_request),
                             "--out", str(tmp_path), "--json",
                             "--profile-out", str(tmp_path / "profile.json")])
    assert code == 0, err
    report = json.loads(out)
    assert set(report["policies"]) == {VANILLA, "table", "per-request"}
    for figures in report["policies"].values():
        assert set(figures) >= KEYS and all(np.isfinite(figures[k]) and figures[k] > 0 for k in KEYS)
        assert figures["tpot_ms_p50"] <= figures["tpot_ms_p99"]
    assert 0 <= report["fidelity_error"] < 10
    assert set(report["policies"]["table"]["over_none"]) == {"40"}
    saved = json.loads((tmp_path / "serve_bench.json").read_text())
    assert saved["config"]["requests"] == 3 and saved["seed"] == 0 and "git_commit" in saved
    assert saved["config"]["traces"] == "recorded: draft-model chains on 8 calibration prompts"  # 4 domains
    config, drawn = saved["config"], saved["config"]["drawn_lengths"]
    assert config["lengths"] == "fixed"  # the toy family's prompts carry no reference answers
    assert drawn["output"] == {"mean": 4, "min": 4, "max": 4}
    assert 1 <= drawn["prompt"]["min"] <= drawn["prompt"]["mean"] <= drawn["prompt"]["max"] <= 96
    assert (tmp_path / "serve_bench.md").read_text().startswith("# serve_bench")
    assert "4 new tokens each (fixed lengths)" in (tmp_path / "serve_bench.md").read_text()
    assert json.loads((tmp_path / "profile.json").read_text())["samples"]["batch_verify"]


def test_arrivals_start_at_zero_and_repeat_with_the_seed() -> None:
    prompts = [Prompt(f"p{i}", domain, tuple(range(5 + i))) for i, domain in enumerate(("code", "text"))]
    first, picked = draw_arrivals(prompts, ("code", "text"), 4.0, 6, 8, seed=3)
    again, _ = draw_arrivals(prompts, ("code", "text"), 4.0, 6, 8, seed=3)
    assert first.seconds[0] == 0 and np.all(np.diff(first.seconds) >= 0)
    assert np.array_equal(first.seconds, again.seconds) and np.all(first.output == 8)
    assert [len(p.tokens) for p in picked] == first.prompt.tolist()
    assert [("code", "text")[d] for d in first.domain] == [p.domain for p in picked]


def test_dataset_lengths_are_the_reference_answers_capped_and_seeded() -> None:
    """Each request asks for its prompt's reference answer's length, capped at the output cap; prompts
    without an answer, or with one under MIN_OUTPUT tokens, are never drawn."""
    references = {"long": 50, "short": 10, "none": None, "tiny": MIN_OUTPUT - 1, "floor": MIN_OUTPUT}
    prompts = [Prompt(name, ("code", "text")[i % 2], tuple(range(3 + i)), ref)
               for i, (name, ref) in enumerate(references.items())]
    assert default_lengths(prompts) == "dataset" and default_lengths(prompts[2:3]) == "fixed"
    first, picked = draw_arrivals(prompts, ("code", "text"), 4.0, 40, 32, seed=5, lengths="dataset")
    again, picked_again = draw_arrivals(prompts, ("code", "text"), 4.0, 40, 32, seed=5, lengths="dataset")
    assert picked == picked_again and np.array_equal(first.output, again.output)
    assert {p.name for p in picked} == {"long", "short", "floor"}
    assert first.output.tolist() == [min(references[p.name], 32) for p in picked]
    assert [len(p.tokens) for p in picked] == first.prompt.tolist()
    fixed, _ = draw_arrivals(prompts, ("code", "text"), 4.0, 40, 32, seed=5)
    assert np.all(fixed.output == 32)  # every prompt drawable, each asking for the cap
    with pytest.raises(InputError, match="--lengths fixed"):
        servable(prompts[2:4], "dataset")


def test_the_live_engine_asks_each_request_its_own_length(target: Transformer, draft: Transformer) -> None:
    prompts = [Prompt(f"p{i}", "chat", tuple(range(1, 5 + i))) for i in range(3)]
    arrivals = Arrivals(np.zeros(3), np.array([4, 5, 6]), np.array([3, 6, 2]), np.zeros(3, dtype=np.int64))
    for policy in (None, make_policy("threshold-batch")):
        out = serve_live(target, ServedDraft(draft), policy, resolve_profile(CPU_PROFILE), arrivals, prompts,
                         2)
        assert out["tokens"] == 11 and len(out["tpot"]) == 3


def test_the_served_chain_drafts_the_draft_models_deployed_vocabulary(
        target: Transformer, draft: Transformer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft model deployed over its most frequent tokens serves, is timed and is traced drafting them;
    one without a saved shape drafts every token."""
    assert ServedDraft(draft, tmp_path).vocab is None and ServedDraft(draft, tmp_path).ids() is None
    (tmp_path / "drafting.json").write_text(json.dumps({"shape": {"depth": 4, "vocab": 8}}))
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"ids": list(range(95, -1, -1))}))
    served = ServedDraft(draft, tmp_path)
    assert served.vocab == 8 and served.ids().tolist() == list(range(95, 87, -1))
    drafter = chain_drafter(target, served)
    assert drafter.vocab.tolist() == list(range(95, 87, -1))
    assert drafter.depth == 8  # the serving depth, not the saved shape's: the policies set each chain

    class Timed(Exception):
        pass

    def measure(*_: object, draft_vocab: object = None, **__: object) -> None:
        raise Timed(draft_vocab)

    monkeypatch.setattr(prof, "measure", measure)
    with pytest.raises(Timed) as timed:  # the serving profile times the chain that serves
        measure_profile(target, served, 2, 4, 1, 0)
    assert timed.value.args[0].tolist() == list(range(95, 87, -1))


def test_figures_pool_rounds_and_compare_with_the_simulator() -> None:
    live = [{"tokens": 100.0, "iterations": 50.0, "seconds": 1.0, "ttft": [0.01, 0.03],
             "tpot": [0.002, 0.004]},
            {"tokens": 100.0, "iterations": 30.0, "seconds": 3.0, "ttft": [0.02], "tpot": [0.006]}]
    sim = [{"tokens": 100.0, "iterations": 40.0, "seconds": 2.0, "ttft": [0.02], "tpot": [0.004]}] * 2
    out = summarize(live, sim, seed=0)
    assert out["tokens_per_second"] == pytest.approx(50.0)  # all tokens over all seconds
    assert out["simulated_tokens_per_second"] == pytest.approx(50.0)
    assert out["tokens_per_second_error"] == pytest.approx(0.0)
    assert out["tpot_ms_p50"] == pytest.approx(4.0) and out["tpot_p50_error"] == pytest.approx(0.0)
    assert out["tau"] == pytest.approx(2.5) and out["simulated_tau"] == pytest.approx(2.5)
    low, high = out["tokens_per_second_ci"]
    assert 25.0 <= low <= 50.0 <= high <= 100.0


def test_vanilla_runs_first_and_each_serving_kind_by_default() -> None:
    names = [s.name for s in default_settings([])]
    assert names[0] == VANILLA and set(names[1:]) == {"batch-table", "goodput", "libraspec-batch",
                                                      "threshold-batch"}


@pytest.mark.parametrize("argv, message", [
    (["--rates", "0"], "--rates"),
    (["--rounds", "1"], "--rounds"),
    (["--calibration-prompts", "0"], "--calibration-prompts"),
    (["--profile-out", "/nonexistent/p.json"], "--profile-out"),
    (["--lengths", "dataset"], "--lengths fixed"),  # the toy family's prompts carry no answers
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path, cli) -> None:
    code, out, err = cli(["serve-bench", *argv, "--out", str(tmp_path)])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err
    assert list(tmp_path.iterdir()) == []


def test_a_length_policy_is_refused_with_where_it_goes(tmp_path: Path, cli) -> None:
    path = save_policy(make_policy("libraspec"), tmp_path / "length.json")
    code, _, err = cli(["serve-bench", "--policy", str(path), "--out", str(tmp_path)])
    assert code == 2 and "not a serving policy" in err


def test_steering_is_timed_per_iteration_of_the_engine(target: Transformer, draft: Transformer) -> None:
    """Two waves of three requests of staggered lengths: one row per iteration, each asking the policy
    at least once (its lengths) and timed; the batches drain to one request in each wave."""
    prompts = [Prompt(f"p{i}", "chat", tokens) for i, tokens in
               enumerate([(5, 9, 2, 5, 9, 2, 7), (7, 7, 3, 1), (3, 1, 4, 1)])]
    rows = steering_samples(make_policy("threshold-batch"), resolve_profile(CPU_PROFILE), 3, target,
                            ServedDraft(draft), prompts * 2, 9)
    asked, seconds = np.array(rows).T
    assert len(rows) >= 6 and asked.min() >= 1 and seconds.min() > 0


def test_steering_fit_reads_a_line_through_the_iterations() -> None:
    rows = [(q, 0.002 + 0.0005 * q) for q in (1, 3, 4, 7, 9)]
    assert steering_fit(rows) == pytest.approx((0.002, 0.0005))
    assert steering_fit([(4, 0.002), (4, 0.004)]) == pytest.approx((0.0, 0.00075))  # all per question
    assert steering_fit([(1, 0.001), (5, 0.009)])[0] == 0.0  # an intercept below zero is kept at zero


def test_the_results_page_names_the_model_and_its_steering_profile() -> None:
    from experiments.serving.report import bench_command  # the renderer docs/results.md runs

    toy = {"rates": [4.0, 12.0], "requests": 16, "tokens": 32, "rounds": 4, "max_batch": 4, "prompts": 8,
           "lengths": "fixed", "steering_profile": "data/profiles/cpu_serve.json"}
    assert bench_command("serve_bench", toy) == "specblock serve-bench --rates 4,12 --lengths fixed"
    real = {**toy, "model": "smollm2-135m", "lengths": "dataset",
            "steering_profile": "data/profiles/smollm2-135m/cpu.json"}
    assert bench_command("serve_bench_smollm2-135m", real) == (
        "specblock serve-bench --model smollm2-135m --steering-profile data/profiles/smollm2-135m/cpu.json "
        "--rates 4,12 --lengths dataset")
