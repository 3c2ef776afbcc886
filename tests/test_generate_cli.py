"""`specblock generate`, run in-process: JSON and streamed output, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.models import TOY
from experiments.cli import main
from experiments.commands import generate as command


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["generate", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def generate_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run([*args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_json_output_and_greedy_losslessness(llama_dir: Path, draft_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", str(llama_dir), "--draft-model", str(draft_dir), "--prompt", "def f(x): return x",
            "--max-new-tokens", "10"]
    vanilla = generate_json([*base, "--drafter", "none"], capsys)
    assert {"text", "token_ids", "new_tokens", "iterations", "tau", "seconds", "tokens_per_second",
            "draft_seconds", "verify_seconds"} <= vanilla.keys()
    assert vanilla["tau"] == 1.0 and len(vanilla["token_ids"]) == vanilla["new_tokens"] <= 10
    for extra in (["--drafter", "draft-model"], ["--drafter", "draft-model", "--tree-width", "3"],
                  ["--drafter", "ngram", "--verifier", "block"]):
        spec = generate_json([*base, *extra], capsys)
        assert (spec["token_ids"], spec["text"]) == (vanilla["token_ids"], vanilla["text"])
        assert spec["iterations"] <= vanilla["iterations"]
    sampled = [*base, "--drafter", "draft-model", "--paths", "2", "--temperature", "1", "--top-p", "0.9",
               "--seed", "3"]
    first = generate_json(sampled, capsys)
    assert first["verifier"] == "seqbv"  # the default for sampled paths
    assert first["token_ids"] == generate_json(sampled, capsys)["token_ids"]  # seeded


def test_streams_text_and_prints_stats(llama_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("abc abc abc")
    expected = generate_json(["--model", str(llama_dir), "--prompt-file", str(prompt)], capsys)["text"]
    code, out, err = run(["--model", str(llama_dir), "--prompt-file", str(prompt)], capsys)
    assert code == 0
    assert out == expected + "\n"
    assert len(err.strip().splitlines()) == 1 and "tau" in err


def test_choices_match_the_engine() -> None:
    from core.names import drafter_choices
    from real_engine.verify import VERIFIERS

    params = {param.name: param for param in command.command.params}
    assert params["drafter"].type.choices == drafter_choices()
    assert params["verifier"].type.choices == tuple(VERIFIERS)


def broken_copies(llama_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    missing, corrupt = tmp_path / "missing", tmp_path / "corrupt"
    for folder in (missing, corrupt):
        shutil.copytree(llama_dir, folder)
    (missing / "model.safetensors").unlink()
    (corrupt / "model.safetensors").write_bytes(b"{not safetensors")
    return missing, corrupt


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "a" * 300], "context"),
    (["--drafter", "draft-model", "--draft-model", "{other}"], "vocabulary"),
    (["--model", "{missing}"], "missing weights"),
    (["--model", "{corrupt}"], "corrupt"),
    (["--model", "{tmp}/nowhere"], "--model"),
    (["--drafter", "draft-model", "--draft-model", "{tmp}/nowhere"], "--draft-model"),
    (["--verifier", "best"], "--verifier"),
    (["--drafter", "eagle", "--drafter-model", "{tmp}/nowhere"], "specblock train eagle"),
    (["--drafter", "specblock"], "specblock train specblock"),  # the shipped one is for another target
    (["--drafter", "specblock", "--paths", "2"], "--paths does not apply"),
    (["--drafter", "medusa", "--verifier", "block", "--temperature", "1"], "deterministic top-k tree"),
    (["--drafter", "ngram", "--policy", "{policy}"], "kind, version, params"),
    (["--drafter", "ngram", "--policy", "{adapt}"], "drafter updates"),
    (["--drafter", "none", "--policy", "{fixed}"], "give a --drafter"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--paths", "2", "--temperature", "1",
      "--policy", "{fixed}"], "bias K sampled paths"),
    (["--policy", "{tmp}/none.json"], "--policy"),
    (["--prompt", "x", "--prompt-file", "{policy}"], "exactly one"),
    (["--temperature", "-1"], "temperature"),
    (["--drafter", "ngram", "--verifier", "gbv"], "i.i.d. sampled paths"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--tree-width", "2", "--verifier", "seqbv"],
     "not a top-k tree"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--tree-width", "2", "--min-confidence", "0.5"],
     "--min-confidence shapes a chain"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--paths", "2", "--staged", "1"],
     "--staged shapes a chain"),
    (["--drafter", "ngram", "--staged", "1"], "--staged does not apply"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--staged", "0"], "staged=0 is below 1"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--tree-width", "2", "--lookup", "2"],
     "--lookup shapes a chain"),
    (["--drafter", "ngram", "--lookup", "2"], "--lookup does not apply"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--lookup", "0"], "lookup=0 is below 1"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--lookup", "4"], "match length of 1 to 3"),
    (["--drafter", "ngram", "--min-confidence", "0.5"], "--min-confidence does not apply"),
    (["--drafter", "draft-model", "--draft-model", "{draft}", "--min-confidence", "1.5"], "--min-confidence"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, llama_dir: Path, draft_dir: Path,
                                          other_vocab_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    missing, corrupt = broken_copies(llama_dir, tmp_path)
    from policies import make_policy, save_policy

    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    names = {"other": other_vocab_dir, "draft": draft_dir, "missing": missing, "corrupt": corrupt,
             "tmp": tmp_path, "policy": policy,
             "adapt": save_policy(make_policy("cost-aware-bandit"), tmp_path / "adapt.json"),
             "fixed": save_policy(make_policy("fixed", {"length": 2}), tmp_path / "fixed.json")}
    args = [arg.format(**names) for arg in args]
    if "--prompt" not in args and "--prompt-file" not in args:
        args += ["--prompt", "x = 1"]
    code, out, err = run(["--model", str(llama_dir), *args, "--max-new-tokens", "4"], capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_a_length_policy_steers_generation_and_keeps_greedy_output(llama_dir: Path, draft_dir: Path,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]
                                                                     ) -> None:
    from policies import make_policy, save_policy

    path = save_policy(make_policy("fixed", {"length": 2}), tmp_path / "fixed.json")
    base = ["--model", str(llama_dir), "--prompt", "x = 1", "--max-new-tokens", "16", "--json"]
    code, out, _ = run([*base, "--drafter", "none"], capsys)
    vanilla = json.loads(out)["token_ids"]
    code, out, err = run([*base, "--drafter", "draft-model", "--draft-model", str(draft_dir),
                          "--draft-length", "5",
                          "--policy", str(path), "--profile", str(TOY.profile)], capsys)  # a folder has none
    assert code == 0, err
    result = json.loads(out)
    assert result["token_ids"] == vanilla and result["policy"] == "fixed"
    verified = result["verified_per_iteration"]
    assert verified[:3] == [2, 2, 2] and max(verified) == 2  # fewer only where the token budget ends


def test_tokenizer_falls_back_and_checks_the_vocabulary(llama_dir: Path, draft_dir: Path) -> None:
    from core.errors import InputError
    from real_engine.tokenizer import Tokenizer

    shipped = llama_dir / "tokenizer.json"
    tokenizer = Tokenizer.load(draft_dir, vocab_size=96, fallback=shipped)  # draft_dir has none
    assert tokenizer.eos_id == 0
    assert tokenizer.decode(tokenizer.encode("x = (1, 2)")) == "x = (1, 2)"
    with pytest.raises(InputError, match="tokens but the model only 50"):
        Tokenizer.load(draft_dir, vocab_size=50, fallback=shipped)
    with pytest.raises(InputError, match=r"no tokenizer\.json"):
        Tokenizer.load(draft_dir, fallback=draft_dir / "absent.json")
