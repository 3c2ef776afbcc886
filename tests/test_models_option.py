"""`--model NAME|DIR`: one option resolves the model (``core.models``), and everything a command takes
downstream (drafters, prompt sets, profiles, where `train` writes) is that model's, never the toy family's
folders for another model."""

from __future__ import annotations

import json
import pathlib
from pathlib import Path

import pytest

from core.models import TOY, model_names
from core.paths import REPO

GENERATE = ["generate", "--prompt", "def add(a, b):", "--max-new-tokens", "6", "--json"]


def test_the_toy_name_and_its_folder_generate_alike(monkeypatch: pytest.MonkeyPatch,
                                                    cli) -> None:
    monkeypatch.chdir(REPO)
    outputs = []
    for model in ("toy-16m", "data/models/target"):
        code, out, err = cli([*GENERATE, "--model", model])
        assert code == 0, err
        outputs.append(json.loads(out))
    assert outputs[0]["token_ids"] == outputs[1]["token_ids"] and outputs[0]["text"] == outputs[1]["text"]
    assert len(outputs[0]["token_ids"]) == 6


def test_an_unknown_name_names_the_choices(refused) -> None:
    err = refused([*GENERATE, "--model", "no-such-model"])
    assert "no-such-model" in err and all(name in err for name in model_names())


def test_a_model_not_installed_names_the_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               refused) -> None:
    monkeypatch.setenv("SPECBLOCK_HOME", str(tmp_path))  # an empty cache: nothing converted
    err = refused([*GENERATE, "--model", "smollm2-135m"])
    assert "`specblock models fetch smollm2-135m`" in err


def test_a_folder_without_drafters_never_borrows_the_toy_familys(llama_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                cli, refused) -> None:
    assert not (llama_dir / "drafters").exists()
    touched: list[Path] = []
    stat, open_ = pathlib.Path.stat, pathlib.Path.open

    def recording_stat(self: Path, *args: object, **kwargs: object) -> object:
        touched.append(Path(self))
        return stat(self, *args, **kwargs)

    def recording_open(self: Path, *args: object, **kwargs: object) -> object:
        touched.append(Path(self))
        return open_(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "stat", recording_stat)
    monkeypatch.setattr(pathlib.Path, "open", recording_open)
    base = ["generate", "--model", str(llama_dir), "--prompt", "x = 1", "--max-new-tokens", "4", "--json"]
    err = refused([*base, "--drafter", "eagle"])
    assert f"`specblock train eagle --model {llama_dir}`" in err
    seen = [p.absolute() for p in touched]  # (resolve() would stat again, growing the list)
    assert seen and not [p for p in seen if p.is_relative_to(TOY.drafter_folder("eagle").absolute())]
    code, out, err = cli([*base, "--drafter", "ngram"])
    assert code == 0, err
    assert json.loads(out)["drafter"] == "ngram" and len(json.loads(out)["token_ids"]) == 4


def test_train_writes_a_folder_models_drafters_into_it(llama_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                        cli, refused) -> None:
    from real_engine.training import draft_model, recipes

    calls: dict[str, tuple] = {}
    monkeypatch.setattr(recipes, "eagle_recipe", lambda *a, **k: calls.setdefault("eagle", a) and {})
    monkeypatch.setattr(draft_model, "train_draft_model", lambda *a, **k: calls.setdefault("draft", a) and {})
    code, _, err = cli(["train", "eagle", "--model", str(llama_dir), "--steps", "1", "--threads", "1"])
    assert code == 0, err
    target, out, run_dir, _ = calls["eagle"]
    assert (target, out) == (llama_dir, llama_dir / "drafters" / "eagle")
    assert run_dir == REPO / "runs" / f"eagle-{llama_dir.name}"  # never the toy family's checkpoints
    code, _, err = cli(["train", "draft-model", "--model", str(llama_dir), "--steps", "1", "--threads", "1"])
    assert code == 0, err
    out, _, target = calls["draft"][:3]
    assert (out, target) == (llama_dir / "drafters" / "draft", llama_dir)
    for kind in ("target", "tokenizer"):  # they build the toy family itself
        err = refused(["train", kind, "--model", str(llama_dir), "--steps", "1"])
        assert TOY.name in err


def test_the_option_lists_the_models_in_help(cli) -> None:
    code, out, _ = cli(["generate", "--help"])
    assert code == 0 and "--model NAME|DIR" in out and all(name in out for name in model_names())
