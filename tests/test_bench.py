"""`specblock bench` on tiny random models: the JSON schema, vanilla as the exact baseline, greedy
losslessness of every drafter, the report files, the transformers peer, and one-line input errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from core.models import TOY
from experiments.cli import main
from experiments.specbench.run import alpha

KEYS = {"drafter", "shape", "verifier", "temperature", "category", "prompts", "new_tokens", "tau",
        "tokens_per_second", "speedup", "speedup_ci", "draft_share", "draft_ms", "accepted", "draft_calls",
        "alpha", "greedy_identical"}
PROMPTS = {"code": ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a,",
                    "for i in range(3):\n    print(i)\nfor i in range(3):\n"],
           "prose": ["The cat sat on the mat. The dog sat on the log. The cat sat on"]}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["bench", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def prompts_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "prompts"
    folder.mkdir()
    for category, texts in PROMPTS.items():
        (folder / f"{category}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return folder


@pytest.fixture
def medusa_dir(tmp_path: Path, llama_dir: Path) -> Path:
    """A drafters folder holding untrained Medusa heads (a trained drafter the bench must pick up)."""
    from real_engine.drafters.medusa import new_medusa, save_medusa
    from real_engine.model import load_model

    folder = tmp_path / "drafters"
    save_medusa(new_medusa(load_model(llama_dir), heads=2), [(0,), (1,), (0, 0)], folder / "medusa",
                dtype=torch.float32)
    return folder


def test_alpha_conditions_on_the_previous_position_and_the_draft_depth() -> None:
    assert alpha([0, 1, 2, 4], [4, 4, 4, 4]) == [3 / 4, 2 / 3, 1 / 2, 1.0]
    assert alpha([0, 2], [1, 2]) == [1 / 2, 1.0]  # the first draft never reached depth 2
    assert alpha([0, 0], [0, 0]) == []


def test_text_acceptance_of_the_target_as_its_own_draft_model_is_total(llama_dir: Path) -> None:
    from experiments.specbench.run import TEXT_EVERY, Config, Engine, Settings, text_acceptance
    from real_engine.model import load_model

    target = load_model(llama_dir)
    settings = Settings(categories={}, depth=3)
    engine = Engine(target, target, llama_dir, settings, None)
    ids = torch.randint(1, target.args.vocab_size, (3 * TEXT_EVERY + 5,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    configs = [Config("none", None, None, 0.0), Config("draft-model", "chain", "greedy", 0.0),
               Config("draft-model", "chain", "block", 1.0), Config("ngram", "chain", "greedy", 0.0)]
    out = text_acceptance(engine, configs, {"code": [ids], "prose": [ids[:TEXT_EVERY + 1]]})
    assert set(out) == {"draft-model/chain/greedy", "ngram/chain/greedy"}  # T = 0 greedy drafters only
    mine = out["draft-model/chain/greedy"]
    assert {d: mine[d]["drafts"] for d in mine} == {"code": 3, "prose": 1, "all": 4}
    # drafting with the target itself, every drafted token is the target's top token
    assert mine["all"]["alpha"] == [1.0, 1.0, 1.0] and mine["all"]["tau"] == 4.0


def test_the_deployed_chain_drafts_its_stop_and_vocabulary(llama_dir: Path, tmp_path: Path) -> None:
    """``Settings.chain`` (the deployed shape) reaches the draft model's chain: its depth, its early stop
    and its reduced vocabulary, read from the draft model's folder."""
    from experiments.specbench.run import Config, Engine, Settings
    from real_engine.model import load_model

    (tmp_path / "draft_vocab.json").write_text(json.dumps({"ids": list(range(95, -1, -1))}))
    target = load_model(llama_dir)
    settings = Settings(categories={}, chain={"depth": 3, "min_confidence": 0.2, "vocab": 8})
    engine = Engine(target, target, llama_dir, settings, None, tmp_path)
    chain, tree = Config("draft-model", "chain", "greedy", 0.0), Config("draft-model", "tree", "greedy", 0.0)
    for config in (chain, tree):
        engine.run(config, [5, 6, 7], 0, 6)
    drafter = engine.recorders[chain].inner
    assert (drafter.depth, drafter.min_confidence) == (3, 0.2)
    assert drafter.vocab.tolist() == list(range(95, 87, -1))
    assert engine.recorders[tree].inner.vocab is None  # the chain's options are the chain's only


def test_bench_rows_report_and_files(llama_dir: Path, draft_dir: Path, prompts_dir: Path, medusa_dir: Path,
                                     tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(draft_dir), "--prompts-dir",
                             str(prompts_dir), "--drafters-dir", str(medusa_dir), "--prompts", "2",
                             "--max-new-tokens", "8", "--drafters", "none,ngram,draft-model,medusa,eagle",
                             "--out", str(out), "--tag", "tiny", "--trained-shapes", "--json"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    rows = result["rows"]
    assert all(row.keys() >= KEYS for row in rows)
    assert {r["category"] for r in rows} == {"code", "prose", "all"}
    assert {r["prompts"] for r in rows if r["category"] == "code"} == {2}
    vanilla = [r for r in rows if r["drafter"] == "none"]
    assert len(vanilla) == 6 and all(r["speedup"] == 1.0 and r["tau"] == 1.0 for r in vanilla)
    greedy = [r for r in rows if r["temperature"] == 0]
    assert {r["drafter"] for r in greedy} >= {"none", "ngram", "draft-model", "medusa"}
    assert all(r["greedy_identical"] is True for r in greedy)
    assert all(r["greedy_identical"] is None for r in rows if r["temperature"] == 1)
    sampled = {(r["drafter"], r["shape"], r["verifier"]) for r in rows if r["temperature"] == 1}
    assert {("draft-model", "chain", "block"), ("draft-model", "chain", "rrs"),
            ("draft-model", "tree", "rrs"), ("ngram", "chain", "block"), ("medusa", "tree", "rrs"),
            ("medusa", "trained", "rrs")} <= sampled
    assert ("medusa", "trained", "greedy") in {(r["drafter"], r["shape"], r["verifier"]) for r in greedy}
    assert not any(v == "greedy" for _, _, v in sampled)
    for r in rows:
        if r["drafter"] in ("none", "ngram"):
            assert r["draft_calls"] == 0
        if r["drafter"] == "draft-model" and r["shape"] == "chain":
            assert 1 <= r["draft_calls"] <= 4  # one forward per depth at most
        if r["alpha"]:
            assert all(a is None or 0 <= a <= 1 for a in r["alpha"]) and len(r["alpha"]) <= 4
        assert r["tau"] >= 1 and 0 <= r["draft_share"] < 1 and r["new_tokens"] > 0
        assert (r["draft_ms"] == 0) == (r["drafter"] in ("none", "hf-vanilla"))
        low, high = r["speedup_ci"]  # a bootstrap interval over the prompts around the mean
        assert low <= r["speedup"] + 1e-9 and r["speedup"] <= high + 1e-9
    assert any("eagle" in note for note in result["notes"])  # no weights: skipped with a note
    assert set(result["agreement"]) == {"code", "prose"}
    assert all(0 <= a["top1"] <= 1 and a["tokens"] > 0 for a in result["agreement"].values())
    on_text = result["text_acceptance"]
    assert {"ngram/chain/greedy", "draft-model/chain/greedy", "medusa/tree/greedy"} <= set(on_text)
    assert "medusa/trained/greedy" not in on_text  # the deployed row already drafts at the trained shape
    assert all(set(per) == {"code", "prose", "all"} and per["all"]["drafts"] > 0 for per in on_text.values())
    if importlib.util.find_spec("transformers") is not None:
        hf = [r for r in rows if r["drafter"] == "hf-assisted"]
        assert hf and all(r["hf_speedup"] > 0 for r in hf)
        assert all(r["greedy_identical"] for r in hf if r["temperature"] == 0)
    saved = json.loads((out / "bench_tiny.json").read_text())
    assert saved["results"]["rows"] == rows and saved["config"]["max_new_tokens"] == 8
    assert saved["config"]["categories"] == {"code": 2, "prose": 1}
    assert {p["category"] for p in saved["results"]["per_prompt"]} == {"code", "prose"}
    assert {"versions", "machine", "seed"} <= saved.keys()
    report = (out / "bench_tiny.md").read_text()
    assert "| all | none |" in report and "## Acceptance on real held-out text" in report
    assert (out / "bench_tiny.png").read_bytes().startswith(b"\x89PNG")


def test_a_length_policy_adds_steered_rows(llama_dir: Path, draft_dir: Path, prompts_dir: Path,
                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from policies import make_policy, save_policy

    policy = save_policy(make_policy("fixed", {"length": 1}), tmp_path / "one.json")
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(draft_dir), "--prompts-dir",
                             str(prompts_dir), "--categories", "code", "--prompts", "1", "--max-new-tokens",
                             "8", "--drafters", "none,draft-model", "--shapes", "chain", "--verifiers",
                             "block", "--no-hf", "--policy", str(policy),
                             "--profile", str(TOY.profile),  # a checkpoint folder has none of its own
                             "--out", str(tmp_path), "--json"], capsys)
    assert code == 0, err
    rows = [r for r in json.loads(stdout)["rows"] if r["category"] == "code"]
    steered = {r["temperature"]: r for r in rows if r["policy"] == "one"}
    assert set(steered) == {0.0, 1.0}
    assert all(len(r["alpha"]) == 1 for r in steered.values())  # drafts of depth 1 only
    assert steered[0.0]["greedy_identical"] is True and steered[1.0]["verifier"] == "block"
    assert all(r["policy"] is None for r in rows if r["drafter"] == "none")


def test_the_draft_models_chain_drafts_its_deployed_depth(llama_dir: Path, draft_dir: Path, prompts_dir: Path,
                                                          tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from real_engine.drafters.trained import write_shape

    draft = shutil.copytree(draft_dir, tmp_path / "draft")
    deployed = {"depth": 2, "width": 1, "min_confidence": 0.01, "vocab": 32}
    write_shape("draft-model", draft, deployed, {})
    (draft / "draft_vocab.json").write_text(json.dumps({"ids": list(range(95, -1, -1))}))
    base = ["--model", str(llama_dir), "--draft-model", str(draft), "--prompts-dir", str(prompts_dir),
            "--categories", "code", "--prompts", "1", "--max-new-tokens", "8", "--drafters",
            "none,ngram,draft-model", "--temperatures", "0", "--no-hf", "--out", str(tmp_path), "--json"]
    for extra, chain_depth in (([], 2), (["--draft-length", "3"], 3)):
        code, stdout, err = run([*base, *extra], capsys)
        assert code == 0, err
        rows = {(r["drafter"], r["shape"]): r for r in json.loads(stdout)["rows"] if r["category"] == "code"}
        assert len(rows["draft-model", "chain"]["alpha"]) == chain_depth  # 1/32 >= 0.01: no early stop
        assert rows["draft-model", "chain"]["greedy_identical"] is True
        assert len(rows["ngram", "chain"]["alpha"] or []) <= (3 if extra else 4)
        saved = tmp_path / f"bench_{llama_dir.name}.json"  # a model other than the toy family's: its own name
        assert json.loads(saved.read_text())["config"]["chain"] == (
            None if extra else {"depth": 2, "min_confidence": 0.01, "vocab": 32})


@pytest.mark.parametrize(("args", "needle"), [
    (["--drafters", "none,lookahead"], "lookahead"),
    (["--policy", "ADAPT"], "drafter updates"),
    (["--verifiers", "greedy,magic"], "magic"),
    (["--categories", "poetry"], "poetry"),
    (["--prompts", "0"], "--prompts"),
    (["--temperatures", "hot"], "--temperatures"),
    (["--model", "MISSING"], "no config.json"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], needle: str, llama_dir: Path, draft_dir: Path,
                                         prompts_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from policies import make_policy, save_policy

    adapt = save_policy(make_policy("epsilon-greedy"), tmp_path / "adapt.json")
    args = [a.replace("MISSING", str(tmp_path / "nowhere")).replace("ADAPT", str(adapt)) for a in args]
    base = ["--model", str(llama_dir), "--draft-model", str(draft_dir), "--prompts-dir", str(prompts_dir),
            "--out", str(tmp_path / "out")]
    code, stdout, err = run([*base, *args], capsys)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not (tmp_path / "out").exists()


def test_missing_peer_or_draft_model_is_skipped_with_a_note(
        llama_dir: Path, draft_dir: Path, prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import experiments.specbench.hf_peer

    base = ["--model", str(llama_dir), "--prompts-dir", str(prompts_dir), "--categories", "prose",
            "--prompts", "1", "--max-new-tokens", "4", "--temperatures", "0", "--out", str(tmp_path),
            "--json"]
    monkeypatch.setattr(experiments.specbench.hf_peer, "transformers_available", lambda: False)
    code, stdout, err = run([*base, "--draft-model", str(draft_dir), "--drafters", "none"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    assert [r["drafter"] for r in result["rows"]] == ["none", "none"]  # prose, all
    assert any("transformers is not installed" in note for note in result["notes"])
    code, stdout, err = run([*base, "--draft-model", str(tmp_path / "nowhere"), "--drafters", "none,ngram"],
                            capsys)
    assert code == 0, err
    result = json.loads(stdout)
    assert {r["drafter"] for r in result["rows"]} == {"none", "ngram"} and result["agreement"] == {}
    assert any("no draft model" in note for note in result["notes"])


def test_the_report_sets_specblock_against_eagle() -> None:
    from experiments.specbench.report import markdown

    def row(drafter: str, speedup: float, draft_ms: float, category: str = "all",
            shape: str = "tree") -> dict:
        return {"drafter": drafter, "shape": shape, "verifier": "greedy", "policy": None, "temperature": 0.0,
                "category": category, "tau": 2.0, "tokens_per_second": 100.0, "speedup": speedup,
                "draft_share": 0.2, "draft_ms": draft_ms, "draft_calls": 1.0, "alpha": [],
                "greedy_identical": True}

    rows = [row("specblock", 9.0, 9.0, "code"), row("specblock", 1.1, 1.0), row("eagle", 1.0, 2.0)]
    text = markdown({"rows": rows}, "t")
    assert "| deployed | 0 | greedy | 1.10 (1.10x / 1.00x) | 0.50 (1.00 / 2.00) |" in text
    assert "against" not in markdown({"rows": rows[:2]}, "t")  # no EAGLE row: no comparison
    # training shapes pair with training shapes, after the deployed ones
    rows += [row("eagle", 0.5, 8.0, shape="trained"), row("specblock", 0.6, 4.0, shape="trained")]
    text = markdown({"rows": rows}, "t")
    deployed = text.index("| deployed | 0 | greedy | 1.10 (1.10x / 1.00x) | 0.50 (1.00 / 2.00) |")
    assert text.index("| trained | 0 | greedy | 1.20 (0.60x / 0.50x) | 0.50 (4.00 / 8.00) |") > deployed


def test_the_results_page_names_the_fastest_configuration_per_temperature_and_category() -> None:
    from experiments.specbench.report import RENDERERS  # the page's renderer, as the page imports it

    def row(drafter: str, category: str, speedup: float, temperature: float = 0.0) -> dict:
        return {"drafter": drafter, "shape": None if drafter == "none" else "tree", "verifier": "greedy",
                "policy": None, "temperature": temperature, "category": category, "tau": 1.5,
                "tokens_per_second": 50.0, "speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1],
                "draft_ms": 1.0}

    rows = [row("none", "all", 1.0), row("none", "chat", 1.0), row("eagle", "all", 1.4),
            row("eagle", "chat", 1.2), row("specblock", "all", 1.3), row("specblock", "chat", 1.6),
            row("none", "all", 1.0, 1.0),
            row("hf-vanilla", "all", 1.2, 1.0), row("medusa", "all", 0.9, 1.0)]
    record = {"results": {"rows": rows}, "config": {"categories": {"chat": 1}}}
    text = "\n".join(RENDERERS["bench"].body(record))
    assert "| 0 | all | eagle/tree/greedy | 1.40 [1.30, 1.50] | 1.50 |" in text
    assert "| 0 | chat | specblock/tree/greedy | 1.60 [1.50, 1.70] | 1.50 |" in text
    assert "| 1 | all | medusa/tree/greedy | 0.90 [0.80, 1.00] | 1.50 |" in text  # vanilla is no candidate


def test_a_trained_drafter_deploying_a_chain_is_verified_as_a_chain_at_temperature_one() -> None:
    from experiments.specbench.run import Settings, plan

    settings = Settings(categories={"code": ["x"]}, drafters=("none", "specblock", "eagle", "medusa"))
    configs, _ = plan(settings, ["specblock", "eagle", "medusa"], hf=False, chains=["specblock"])
    sampled = {(c.drafter, c.shape, c.verifier) for c in configs if c.temperature == 1}
    assert {("specblock", "chain", "block"), ("specblock", "chain", "rrs"), ("eagle", "tree", "rrs"),
            ("medusa", "tree", "rrs")} == sampled - {("none", None, None)}
    greedy = {(c.drafter, c.shape, c.verifier) for c in configs if c.temperature == 0}
    assert ("specblock", "chain", "greedy") in greedy and ("eagle", "tree", "greedy") in greedy
    assert not any(c.shape == "trained" for c in configs)


def test_trained_shapes_add_the_training_shape_beside_the_deployed_one() -> None:
    from experiments.specbench.run import Settings, plan

    settings = Settings(categories={"code": ["x"]}, drafters=("none", "ngram", "specblock", "eagle"),
                        trained_shapes=True)
    configs, _ = plan(settings, ["ngram", "specblock", "eagle"], hf=False, chains=["specblock"])
    trained = {(c.drafter, c.verifier, c.temperature) for c in configs if c.shape == "trained"}
    assert trained == {(d, v, t) for d in ("specblock", "eagle") for v, t in (("greedy", 0.0), ("rrs", 1.0))}
    assert ("specblock", "chain", "greedy") in {(c.drafter, c.shape, c.verifier) for c in configs}


def test_every_verifier_at_temperature_zero_reproduces_vanilla(llama_dir: Path, draft_dir: Path,
                                                               prompts_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`--every-verifier`: at T=0 each listed verifier that fits a shape runs, and each emits exactly
    vanilla's tokens (the losslessness check a real model's bench makes)."""
    verifiers = "greedy,token,block,rrs"
    code, stdout, err = run(["--model", str(llama_dir), "--draft-model", str(draft_dir), "--prompts-dir",
                             str(prompts_dir), "--prompts", "1", "--max-new-tokens", "8", "--drafters",
                             "none,ngram,draft-model", "--shapes", "chain,tree,paths", "--verifiers",
                             verifiers, "--temperatures", "0", "--every-verifier", "--no-hf",
                             "--out", str(tmp_path), "--json"], capsys)
    assert code == 0, err
    rows = [r for r in json.loads(stdout)["rows"] if r["drafter"] == "draft-model" and r["category"] == "all"]
    ran = {(r["shape"], r["verifier"]) for r in rows}
    assert {("chain", "greedy"), ("chain", "token"), ("chain", "block"), ("paths", "rrs")} <= ran
    assert all(r["greedy_identical"] is True for r in rows)
