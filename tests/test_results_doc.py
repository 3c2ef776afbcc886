"""`specblock results`: docs/results.md is generated from the results files, names each file's command and
commit, gives unknown files a one-line entry, and `--check` catches a page that differs from the files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from time_limits import limit

from core.paths import REPO, RESULTS
from experiments.provenance import provenance
from experiments.results.doc import PAGE, family, render

PIPELINE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
ADAPT_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
OTHER_COMMIT = "5555555555aaaaaaaaaa5555555555aaaaaaaaaa"


def record(config: dict, results: object, commit: str) -> dict:
    """A results file as `experiments.provenance.save_result` writes it, with a fixed commit and date."""
    return {"config": config, "seed": 0, "versions": {"torch": "2.13.0+cpu"},
            "machine": {"platform": "Linux", "python": "3.11", "cpu": "Test CPU", "cpu_count": 2},
            "git_commit": commit, "created": "2026-01-02T03:04:05+0000", "results": results}


def pipeline_run(error: float, ties: list[str] | None = None) -> dict:
    """One run's summary; ``ties`` (None: a run from before ties were kept) the predicted best's ties."""
    tied = {} if ties is None else {"predicted_ties": ties, "measured_best_tied": True}
    policy = {"measured_tokens_per_second": 500.0, "measured_ci": [450.0, 550.0],
              "predicted_tokens_per_second": 520.0, "predicted_ci": [500.0, 540.0], "error": error}
    return {"fidelity_error": error, "fidelity_error_ci": [0.011, 0.205], "worst_policy": "libraspec",
            "worst_error": -0.1, "seconds": 120.0,
            "policies": {"fixed-3": policy, "vanilla": {**policy, "measured_tokens_per_second": 400.0}},
            "rank_agreement": {"kendall_tau": 0.75, "p_value": 0.01, "predicted_best": "fixed-3",
                               "measured_best": "fixed-3", "measured_best_lead_ci": [1.0, 1.0],
                               "predicted_best_within_interval": True, **tied},
            "against_best_fixed": {"best_fixed": "fixed-3", "policies": {
                "tuned-libraspec": {"ratio": 0.9512, "ratio_ci": [0.9034, 1.0021]}}}}


def adapt_policy(tps: float) -> dict:
    summary = {"tokens_per_second": tps, "tau": 2.1, "shifted_tau_early": 2.0, "shifted_tau_late": 2.25,
               "update_seconds": 0.0}
    return {"measured": summary, "simulated_summary": summary, "updates": {"head": 3, "full": 1}}


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """Three tiny results files in the real schema, one with a markdown report beside it."""
    folder = tmp_path / "results"
    folder.mkdir()
    files = {
        "pipeline_quick": record({"command": "specblock pipeline --quick", "runs": 2},
                                 [pipeline_run(0.0371), pipeline_run(0.0442, ["tuned-libraspec"])],
                                 PIPELINE_COMMIT),
        "adapt_live_quick": record({"plan": {"first": 4, "mixed": 8, "max_new_tokens": 24}},
                                   {"policies": {"never": adapt_policy(54.4),
                                                 "cost_aware_bandit": adapt_policy(59.7)}}, ADAPT_COMMIT),
        "brand_new_thing": record({"command": "specblock something-new"}, {"x": 1}, OTHER_COMMIT),
    }
    for name, data in files.items():
        (folder / f"{name}.json").write_text(json.dumps(data))
    (folder / "pipeline_quick.md").write_text("# details\n")
    return folder


def results(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "experiments.cli", "results", *argv],
                          capture_output=True, text=True, timeout=limit(120), cwd=REPO)


def test_fixture_has_the_provenance_schema():
    assert set(record({}, None, PIPELINE_COMMIT)) == {*provenance({}, 0), "results"}


def test_command_writes_sections_naming_command_and_commit(results_dir: Path, tmp_path: Path):
    out = tmp_path / "docs" / "results.md"
    proc = results("--results", str(results_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert page.startswith("# Results\n") and "do not edit this page by hand" in page
    pipeline = page[page.index("### pipeline_quick"):page.index("## Live online adaptation")]
    assert "`specblock benchmark pipeline_runs --runs 2`" in pipeline
    assert f"commit `{PIPELINE_COMMIT[:12]}`, 2026-01-02, Test CPU, 2 CPUs" in pipeline
    assert "[pipeline_quick.md](../results/pipeline_quick.md)" in pipeline  # the report beside the file
    assert "| 1 | 3.7% [1.1%, 20.5%] |" in pipeline and "| 2 | 4.4% [1.1%, 20.5%] |" in pipeline
    assert "| yes | - |" in pipeline and "| yes | yes (ties: tuned-libraspec) |" in pipeline  # ties once kept
    assert "| tuned-libraspec | 0.951 [0.903, 1.002] | 0.951 [0.903, 1.002] |" in pipeline
    assert "| vanilla (not drafting; no interval kept) | 0.800 | 0.800 |" in pipeline  # over fixed-3
    adapt = page[page.index("### adapt_live_quick"):]
    assert "`specblock adapt-live --quick`" in adapt and f"commit `{ADAPT_COMMIT[:12]}`" in adapt
    assert "| cost_aware_bandit | 59.7 | 59.7 | 2.100 | 2.100 | 2.000 -> 2.250 | 3/1 |" in adapt
    assert "Details:" not in adapt  # no report beside that file, so no link


def test_unknown_file_gets_a_one_line_generic_entry(results_dir: Path):
    page = render(results_dir, "results")
    other = page[page.index("## Other files"):]
    assert (f"- `brand_new_thing.json`: command `specblock something-new`, commit `{OTHER_COMMIT[:12]}`"
            in other.splitlines())
    assert family("brand_new_thing") is None and family("bench_shipped") == "bench"
    assert family("study_length") == "study_length"  # the longest matching key wins


def test_a_known_name_with_another_layout_falls_back_to_the_generic_entry(results_dir: Path):
    (results_dir / "bench_odd.json").write_text(json.dumps(record({"drafters": []}, [1, 2], OTHER_COMMIT)))
    (results_dir / "fidelity_profile.json").write_text(json.dumps({"schema_version": 3}))  # no provenance
    page = render(results_dir, "results")
    assert "- `bench_odd.json`: command not recorded" in page and "### bench_odd" not in page
    assert "- `fidelity_profile.json`: command not recorded, commit not recorded" in page


def test_output_is_deterministic(results_dir: Path):
    assert render(results_dir, "x") == render(results_dir, "x")
    assert "2026-01-02T" not in render(results_dir, "x")  # a date, never a clock


def test_check_passes_on_fresh_output_and_fails_after_a_hand_edit(results_dir: Path, tmp_path: Path):
    out = tmp_path / "results.md"
    assert results("--results", str(results_dir), "--out", str(out), "--check").returncode == 1  # absent
    assert results("--results", str(results_dir), "--out", str(out)).returncode == 0
    fresh = results("--results", str(results_dir), "--out", str(out), "--check")
    assert fresh.returncode == 0, fresh.stderr
    out.write_text(out.read_text().replace("3.7%", "2.9%"))
    edited = results("--results", str(results_dir), "--out", str(out), "--check")
    assert edited.returncode == 1
    assert len(edited.stderr.strip().splitlines()) == 1 and "specblock results" in edited.stderr


def test_empty_folder_is_refused_in_one_line(tmp_path: Path):
    proc = results("--results", str(tmp_path), "--out", str(tmp_path / "r.md"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.md").exists()


def test_an_out_under_a_file_is_refused_in_one_line(results_dir: Path, tmp_path: Path):
    (tmp_path / "file").write_text("keep")
    proc = results("--results", str(results_dir), "--out", str(tmp_path / "file" / "r.md"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is a file" in proc.stderr and (tmp_path / "file").read_text() == "keep"


def test_committed_page_is_the_generators_output():
    assert PAGE.read_text() == render(RESULTS, "../benchmarks/results"), \
        "docs/results.md is stale or hand-edited: run `specblock results`"


def test_pipeline_runs_of_another_model_name_it_in_their_command():
    from benchmarks.pipeline_runs import _pipeline_command  # the benchmark's own renderer

    quick = {"command": "specblock pipeline --quick --model smollm2-135m", "runs": 3, "model": "smollm2-135m"}
    full = {"command": "specblock pipeline --model smollm2-135m", "runs": 1, "model": "smollm2-135m"}
    toy = {"command": "specblock pipeline", "runs": 1}  # written before files named their model
    assert (_pipeline_command("pipeline_quick_smollm2-135m", quick)
            == "specblock benchmark pipeline_runs --runs 3 --model smollm2-135m")
    assert (_pipeline_command("pipeline_full_smollm2-135m", full)
            == "specblock benchmark pipeline_runs --runs 1 --full --model smollm2-135m")
    assert _pipeline_command("pipeline_full", toy) == "specblock benchmark pipeline_runs --runs 1 --full"
    assert family("pipeline_quick_smollm2-135m") == "pipeline"


def test_the_page_leads_with_the_real_model(results_dir: Path):
    real = record({"command": "specblock pipeline --quick --model smollm2-135m", "runs": 1,
                   "model": "smollm2-135m"}, [pipeline_run(0.08)], PIPELINE_COMMIT)
    (results_dir / "pipeline_quick_smollm2-135m.json").write_text(json.dumps(real))
    page = render(results_dir, "results")
    parts = [line for line in page.splitlines() if line.startswith("## ")]
    assert parts[0].startswith("## `smollm2-135m`: SmolLM2-135M-Instruct")
    assert parts[1].startswith("## `toy-16m`: ") and parts[-1] == "## Other files"
    assert page.index("#### pipeline_quick_smollm2-135m") < page.index("#### pipeline_quick\n")
    assert "`specblock benchmark pipeline_runs --runs 1 --model smollm2-135m`" in page
