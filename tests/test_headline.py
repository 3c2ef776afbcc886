"""A real model's headline on docs/results.md: the fastest bench configurations and our fastest engine
against llama.cpp, each read against its target as met, missed or unsettled by its interval."""

from __future__ import annotations

import json
from pathlib import Path

from test_results_doc import PIPELINE_COMMIT, pipeline_run, record

from experiments.results.doc import render
from experiments.results.headline import SPEEDUP_TARGETS, headline, peer_ratio, verdict

MODEL = "smollm2-135m"


def bench_row(drafter: str, temperature: float, category: str, speedup: float, ci: list[float]) -> dict:
    return {"drafter": drafter, "shape": None if drafter == "none" else "chain",
            "verifier": None if drafter == "none" else "greedy", "policy": None, "temperature": temperature,
            "category": category, "tau": 2.0, "tokens_per_second": 80.0 * speedup, "speedup": speedup,
            "speedup_ci": ci, "draft_ms": 1.0, "greedy_identical": False}


def bench_file() -> dict:
    rows = [bench_row("none", 0.0, "chat", 1.0, [1.0, 1.0]), bench_row("ngram", 0.0, "chat", 1.4, [1.3, 1.5]),
            bench_row("draft-model", 0.0, "chat", 2.2, [2.1, 2.4]),
            bench_row("draft-model", 0.0, "code", 2.4, [2.2, 2.7]),
            bench_row("ngram", 1.0, "all", 1.1, [1.0, 1.2])]
    config = {"model": MODEL, "categories": ["chat", "code"]}
    return record(config, {"rows": rows}, PIPELINE_COMMIT)


NAMES = ["specblock vanilla", "specblock draft-model", "llama.cpp Q4_1 vanilla",
         "llama.cpp Q4_1 prompt lookup"]


def peers_file(lookup: tuple[float, ...] = (25.0, 25.0, 25.0, 25.0)) -> dict:
    """Two prompts per category; ours runs twice llama.cpp's vanilla on each, and llama.cpp's prompt
    lookup runs at ``lookup`` tokens/s prompt by prompt."""
    names = NAMES
    speeds = dict(zip(names, (50.0, 100.0, 50.0, 25.0), strict=True))
    per_prompt = [{"category": c, "engines": {n: {"tokens_per_second": speeds[n]} for n in names}}
                  for c in ("chat", "chat", "code", "code")]
    for prompt, tps in zip(per_prompt, lookup, strict=True):
        prompt["engines"][names[3]]["tokens_per_second"] = tps
    pooled = [{"engine": n, "category": "pooled", "tokens_per_second": speeds[n],
               "over_rival": speeds[n] / 50.0, "over_rival_ci": [speeds[n] / 50.0] * 2} for n in names]
    results = {"engines": dict.fromkeys(names, "an engine"), "rival": "llama.cpp Q4_1 vanilla",
               "rows": pooled, "per_prompt": per_prompt, "notes": []}
    return record({"model": MODEL}, results, PIPELINE_COMMIT)


def test_a_target_is_met_only_when_its_whole_interval_clears_it():
    assert verdict(2.0, [2.0, 2.3]) == "met"
    assert verdict(2.0, [1.5, 1.9]) == "missed"
    assert verdict(2.0, [1.9, 2.1]).startswith("unsettled")


def test_each_speedup_target_reads_the_fastest_drafter_of_its_temperature_and_category():
    lines = "\n".join(headline(bench_file(), None))
    assert "T=0, chat | at least 2.0x | draft-model/chain/greedy: 2.20 [2.10, 2.40] | met" in lines
    assert "T=0, code | at least 2.5x | draft-model/chain/greedy: 2.40 [2.20, 2.70] | unsettled" in lines
    assert "T=1, all | at least 1.5x | ngram/chain/greedy: 1.10 [1.00, 1.20] | missed" in lines
    assert len(SPEEDUP_TARGETS) == 3 and "llama.cpp" not in lines


def test_our_fastest_engine_is_read_against_llama_cpps_vanilla_and_prompt_lookup():
    lines = "\n".join(headline(None, peers_file()))
    ours = "specblock draft-model"
    assert f"over llama.cpp Q4_1 vanilla | above 1.0x | {ours}: 2.00 [2.00, 2.00] | met" in lines
    assert f"over llama.cpp Q4_1 prompt lookup | above 1.0x | {ours}: 4.00 [4.00, 4.00] | met" in lines
    per_prompt = peers_file()["results"]["per_prompt"]
    assert peer_ratio(per_prompt, "llama.cpp Q4_1 prompt lookup", "specblock vanilla")[0] == 0.5


def test_the_ratio_to_prompt_lookup_is_paired_per_prompt_with_its_interval_within_categories():
    """Ours over lookup at 50 and 200 tok/s on chat, 100 and 100 on code: ratios 2, 0.5, 1, 1."""
    per_prompt = peers_file((50.0, 200.0, 100.0, 100.0))["results"]["per_prompt"]
    mean, ci = peer_ratio(per_prompt, NAMES[1], NAMES[3])
    assert mean == 1.125  # the mean of per-prompt ratios, not the ratio of mean tokens/s (0.89)
    # each resample keeps two chat and two code prompts: the mean is 0.75, 1.125 or 1.5 (chances 1/4,
    # 1/2, 1/4); resampled across categories, four chat ratios of 0.5 would reach 0.5
    assert ci == [0.75, 1.5]
    lines = "\n".join(headline(None, peers_file((50.0, 200.0, 100.0, 100.0))))
    assert "prompt lookup | above 1.0x | specblock draft-model: 1.12 [" in lines and "unsettled" in lines


def test_no_files_or_another_layout_give_no_headline():
    assert headline(None, None) == []
    assert headline(record({}, {"rows": "not rows"}, PIPELINE_COMMIT), None) == []


def test_the_real_models_part_opens_with_its_headline(tmp_path: Path):
    pipeline = record({"command": f"specblock pipeline --quick --model {MODEL}", "runs": 1, "model": MODEL},
                      [pipeline_run(0.08)], PIPELINE_COMMIT)
    for name, content in ((f"bench_{MODEL}", bench_file()), ("peers", peers_file()),
                          (f"pipeline_quick_{MODEL}", pipeline)):
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    page = render(tmp_path, "results")
    assert page.index(f"## `{MODEL}`") < page.index("### Against the targets") < page.index("#### ")
    assert page.count("### Against the targets") == 1
