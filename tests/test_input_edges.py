"""Input at the edges: extreme temperatures, mismatched configs, devices, seeds, non-UTF-8
prompts, hostile JSON, oversized files and runs from another working directory all end in one line
on stderr and exit code 2, or in valid output; never a traceback."""

from __future__ import annotations

import builtins
import io
import json
import math
import os
import pathlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from core import files
from core.cost_profile import load_profile
from core.errors import InputError
from core.paths import PAPER_PROFILE, PROMPTS, REPO, TOKENIZER
from experiments.cli import MAX_SEED, main, resolve_device
from experiments.specbench import run as bench
from experiments.tuning.tune import load_calibration
from policies.base import load_policy
from real_engine import trace
from real_engine.decode import generate, make_drafter
from real_engine.drafters.eagle import load_eagle
from real_engine.drafters.medusa import load_medusa
from real_engine.drafters.specblock import load_specblock
from real_engine.drafters.trained import deployed_shape
from real_engine.drafters.vocab import load_vocab
from real_engine.model import ModelArgs, Transformer, load_model, save_model
from real_engine.tokenizer import Tokenizer
from real_engine.training.drafter_data import open_drafter_data
from real_engine.warp import MIN_TEMPERATURE, Sampling, warp
from simulator.traces import load_traces

VOCAB = 40


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the command line in-process: (exit code, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], needle: str) -> str:
    """Assert ``argv`` exits 2 with one stderr line holding ``needle``; return the line."""
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, ""), err
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    return err


def tiny_model(seed: int, scale: float = 1.0) -> Transformer:
    """A random 2-layer model of ``VOCAB`` tokens; ``scale`` multiplies its logits."""
    torch.manual_seed(seed)
    model = Transformer(ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                  max_position_embeddings=256, eos_token_id=0))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
        model.lm_head.weight.mul_(scale)
    return model.eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tiny_model(0), tmp_path_factory.mktemp("tiny"), dtype=torch.float32)


@pytest.mark.parametrize(("temperature", "needle"), [
    (math.nan, "not a finite number"), (math.inf, "not a finite number"), (-math.inf, "not a finite number"),
    (1e-40, "use 0 (greedy)"), (MIN_TEMPERATURE / 2, "use 0 (greedy)"), (-1.0, "negative")])
def test_non_finite_and_tiny_temperatures_are_refused(temperature: float, needle: str) -> None:
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Sampling(temperature)


def test_the_generate_command_refuses_them_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["generate", "--drafter", "none", "--max-new-tokens", "1", "--prompt", "x", "--json"]
    for value, needle in (("nan", "not a finite number"), ("inf", "not a finite number"), ("1e-40", "use 0")):
        refused([*base, "--temperature", value], capsys, needle)


def test_warp_at_the_extremes_is_a_distribution() -> None:
    logits = torch.tensor([[3e4, -3e4, 0.0, 3e4 - 1], [1e30, 1e30, -1e30, 0.0]])
    for temperature in (MIN_TEMPERATURE, 1e30, 1e300):
        for sampling in (Sampling(temperature), Sampling(temperature, top_k=2),
                         Sampling(temperature, top_p=0.5)):
            probs = warp(logits, sampling)
            assert torch.isfinite(probs).all() and (probs >= 0).all(), (temperature, sampling)
            torch.testing.assert_close(probs.sum(-1), torch.ones(2))


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e6])
@pytest.mark.parametrize(("drafter", "verifier"), [("none", "greedy"), ("ngram", "block"), ("ngram", "token"),
                                                   ("chain", "block"), ("tree", "rrs"), ("paths", "seqbv")])
def test_extreme_allowed_temperatures_emit_only_vocabulary_ids(temperature: float, drafter: str,
                                                               verifier: str) -> None:
    target, draft = tiny_model(0, scale=300.0), tiny_model(1, scale=300.0)  # logits in the hundreds
    shape = {"chain": {}, "tree": {"width": 3}, "paths": {"paths": 2}}
    spec = (make_drafter("draft-model", target, draft, depth=3, **shape[drafter]) if drafter in shape
            else make_drafter(drafter, target))
    for seed in range(3):
        out = generate(target, [1, 2, 3, 1, 2], drafter=spec, verifier=verifier,
                       sampling=Sampling(temperature, top_p=0.9 if seed == 2 else 1.0), max_new_tokens=12,
                       seed=seed)
        assert out.tokens and all(0 <= int(t) < VOCAB for t in out.tokens), out.tokens


@pytest.mark.parametrize(("change", "needle"), [
    ({"vocab_size": VOCAB + 8}, "vocab_size"), ({"hidden_size": 64}, "does not fit the weights"),
    ({"num_hidden_layers": 3}, "lacks weights"), ({"vocab_size": "forty"}, "positive integer"),
    ({"num_attention_heads": 0, "head_dim": None}, "positive integer")])
def test_a_config_that_does_not_fit_its_weights_is_one_line(change: dict, needle: str, model_dir: Path,
                                                            tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("model.safetensors", "config.json"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(InputError, match=needle) as err:
        load_model(folder)
    assert "\n" not in str(err.value)
    refused(["generate", "--model", str(folder), "--drafter", "none", "--prompt", "x",
             "--max-new-tokens", "1"], capsys, needle)


def test_a_config_that_is_not_an_object_is_refused(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        load_model(tmp_path)


@pytest.mark.parametrize("device", ["bogus", "", "cuda:99", "meta", "cuda:-1"])
def test_bad_devices_are_input_errors(device: str) -> None:
    with pytest.raises(InputError, match="--device"):
        resolve_device(device)


def test_resolve_device_keeps_what_exists() -> None:
    assert resolve_device("cpu") == "cpu" and resolve_device("cpu:0") == "cpu:0"
    assert resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("argv", [
    ["generate", "--drafter", "none", "--prompt", "x", "--max-new-tokens", "1"],
    ["bench", "--drafters", "none", "--no-hf", "--prompts", "1"],
    ["profile", "--quick", "--out", "{tmp}/p.json"],
    ["trace", "--drafter", "ngram", "--out", "{tmp}/t.parquet"],
])
def test_every_device_option_refuses_a_missing_device(argv: list[str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    for device in ("bogus", "cuda:99"):
        refused([*argv, "--device", device], capsys, "--device")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["generate", "--drafter", "none", "--prompt", "x", "--max-new-tokens", "1"],
    ["bench", "--drafters", "none", "--no-hf"], ["lp", "--vocab", "2", "--length", "1", "--instances", "1"],
    ["profile", "--quick", "--out", "{tmp}/p.json"], ["shapes", "--out", "{tmp}"],
    ["simulate", "--no-probe", "--queries", "2"], ["trace", "--out", "{tmp}/t.parquet"]])
def test_seeds_outside_what_the_generators_take_are_refused(argv: list[str], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    for seed in (2**70, MAX_SEED + 1, -1):
        refused([*argv, "--seed", str(seed)], capsys, "--seed")
    assert not list(tmp_path.iterdir())


def test_the_largest_seed_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["lp", "--vocab", "2", "--length", "1", "--instances", "1", "--seed", str(MAX_SEED),
                        "--json"], capsys)
    assert code == 0, err
    code, _, err = run(["simulate", "--no-probe", "--profile", str(PAPER_PROFILE), "--queries", "2",
                        "--seed", str(MAX_SEED), "--json"], capsys)
    assert code == 0, err


def test_prompts_that_are_not_utf8_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["generate", "--drafter", "none", "--max-new-tokens", "1"]
    refused([*base, "--prompt", os.fsdecode(b"ab\xffcd")], capsys, "--prompt is not UTF-8")
    raw = tmp_path / "prompt.txt"
    raw.write_bytes(b"ab\xffcd")
    refused([*base, "--prompt-file", str(raw)], capsys, "not UTF-8")
    big = tmp_path / "big.txt"
    big.write_text("x" * (files.MAX_PROMPT_BYTES + 1))
    refused([*base, "--prompt-file", str(big)], capsys, "limit")


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("flag", "text", "needle"), [
    ("--policy", DEEP, "nested too deeply"), ("--profile", DEEP, "nested too deeply"),
    ("--policy", '{"kind": "fixed", "version": 1, "params": {"length": 1' + "0" * 400 + "}}", "digits"),
    ("--policy", '{"kind": "fixed", "version": 1, "params": {"length": 1' + "0" * 5000 + "}}", "digits"),
    ("--profile", '{"samples": ' + "9" * 5000 + "}", "digits"),
    ("--policy", '{"kind": "fixed", "version": 1, "params": {"length": 1e400}}', "length"),
])
def test_hostile_json_is_one_line(flag: str, text: str, needle: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "input.json"
    path.write_text(text)
    profile = [] if flag == "--profile" else ["--profile", str(PAPER_PROFILE)]
    refused(["simulate", "--no-probe", "--queries", "2", *profile, flag, str(path)], capsys, needle)


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "--no-probe", "--queries", str(10**10)], "at most 100,000"),
    (["simulate", "--no-probe", "--queries", str(2**80)], "at most"),
    (["lp", "--vocab", "2", "--length", "1", "--instances", str(10**10)], "at most 10,000"),
])
def test_huge_counts_are_refused_before_allocating(argv: list[str], needle: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    refused(argv, capsys, needle)


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk space."""
    with path.open("wb") as file:
        file.truncate(size)
    return path


def with_weights(folder: Path) -> Path:
    """``folder`` with an empty weights file beside its config (a drafter folder's second file)."""
    (folder / "model.safetensors").touch()
    return folder


def forbid_reads(patch: pytest.MonkeyPatch) -> None:
    """Make every file read fail the test: a cap must be checked before reading."""
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"read before the size check: {args[:1]}")

    for owner, name in ((builtins, "open"), (io, "open"), (pathlib.Path, "open"), (pathlib.Path, "read_text"),
                        (pathlib.Path, "read_bytes")):
        patch.setattr(owner, name, forbidden)
    patch.setattr("pyarrow.parquet.read_table", forbidden)


@pytest.mark.parametrize(("load", "limit", "name"), [
    (load_profile, files.MAX_PROFILE_BYTES, "profile.json"),
    (load_policy, files.MAX_POLICY_BYTES, "policy.json"),
    (load_traces, files.MAX_TRACE_BYTES, "traces.parquet"),
    (lambda path: Tokenizer.load(path.parent), files.MAX_TOKENIZER_BYTES, "tokenizer.json"),
    (lambda path: load_model(path.parent), files.MAX_CONFIG_BYTES, "config.json"),
    (lambda path: load_eagle(path.parent, None), files.MAX_CONFIG_BYTES, "config.json"),
    (lambda path: load_medusa(path.parent, None), files.MAX_CONFIG_BYTES, "config.json"),
    (lambda path: load_specblock(with_weights(path.parent), None), files.MAX_CONFIG_BYTES, "config.json"),
    (lambda path: deployed_shape("eagle", path.parent), files.MAX_CONFIG_BYTES, "drafting.json"),
    (lambda path: load_vocab(path.parent, 4), files.MAX_CONFIG_BYTES, "draft_vocab.json"),
    (lambda path: open_drafter_data(path.parent), files.MAX_RECORD_BYTES, "meta.json"),
    (lambda path: bench.load_prompts(path.parent, ["code"], 1), files.MAX_PROMPT_SET_BYTES, "code.jsonl"),
    (lambda path: trace.load_prompts(["code"], 1, list, folder=path.parent), files.MAX_PROMPT_SET_BYTES,
     "code.jsonl"),
    (load_calibration, files.MAX_CALIBRATION_BYTES, "calibration.json"),
])
def test_oversized_files_are_refused_before_reading(load: Callable[[Path], object], limit: int, name: str,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sparse(tmp_path / name, limit + 1)
    needle = f"over the {limit / 2**20:.1f} MiB"
    with monkeypatch.context() as patch, pytest.raises(InputError, match=needle) as err:
        forbid_reads(patch)
        load(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_gigabyte_profile_is_refused_on_the_command_line(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = sparse(tmp_path / "huge.json", 2**30)
    refused(["simulate", "--no-probe", "--profile", str(path)], capsys, "1,073,741,824 bytes")


def test_reads_stop_at_the_cap_where_the_size_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="over the"):
        files.read_text("/dev/zero", 1000, "prompt file", "give a text file")
    with pytest.raises(InputError, match="is a folder"):
        files.read_text(tmp_path, 1000, "prompt file", "give a text file")
    with pytest.raises(InputError, match="not a JSON policy file"):
        files.read_json(sparse(tmp_path / "empty.json", 0), 10, "policy file", "pass a policy file")
    (tmp_path / "latin1.json").write_bytes(b'{"kind": "caf\xe9"}')
    with pytest.raises(InputError, match="not a JSON policy file"):
        files.read_json(tmp_path / "latin1.json", 100, "policy file", "pass a policy file")
    (tmp_path / "crlf.txt").write_bytes(b"a\r\nb\rc")  # newlines as Path.read_text translates them
    assert files.read_text(tmp_path / "crlf.txt", 100, "prompt file", "") == "a\nb\nc"


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from an empty folder that is not the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_train_finds_the_shipped_data_from_another_folder(elsewhere: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from real_engine.training import draft_model, recipes, windows

    calls: dict[str, tuple] = {}
    monkeypatch.setattr(draft_model, "train_draft_model", lambda *a, **k: calls.setdefault("draft", a) and {})
    monkeypatch.setattr(recipes, "eagle_recipe", lambda *a, **k: calls.setdefault("eagle", (a, k)) and {})
    code, _, err = run(["train", "draft-model", "--steps", "1", "--threads", "1"], capsys)
    assert code == 0, err
    out, run_dir, target = calls["draft"][:3]
    assert (out, run_dir, target) == (REPO / "data/models/draft", REPO / "runs/draft-model",
                                      REPO / "data/models/target")
    code, _, err = run(["train", "eagle", "--steps", "1", "--threads", "1", "--out", "mine"], capsys)
    assert code == 0, err
    (target, out, run_dir, request), _ = calls["eagle"]
    assert (target, out, run_dir) == (REPO / "data/models/target", Path("mine"), REPO / "runs/eagle")
    assert request.data_dir == REPO / "runs/drafter-data"
    assert not list(elsewhere.iterdir())  # nothing written to the working folder
    assert TOKENIZER.is_file() and (PROMPTS / "code.jsonl").is_file()
    assert windows.TOKEN_CACHE.is_relative_to(REPO)
