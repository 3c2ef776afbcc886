"""`specblock models list | fetch | import-gguf`: the registry listed, a registry wheel's GGUF installed,
converted and verified once (a second fetch does nothing), any GGUF imported under a name that every
`--model` then takes; bad input is one line and exit 2 with nothing left in the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from test_gguf import checkpoint

from core import models
from core.models import MANIFEST, ModelSpec, Wheel
from real_engine.gguf import export_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with a BPE tokenizer and a chat template, as a Q8_0 GGUF."""
    folder = checkpoint(tmp_path_factory.mktemp("tiny") / "src")
    return export_gguf(folder, folder.parent / "tiny.Q8_0.gguf", quant="Q8_0")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache for this test (``SPECBLOCK_HOME``)."""
    folder = tmp_path / "home"
    monkeypatch.setenv("SPECBLOCK_HOME", str(folder))
    return folder


def test_list_shows_every_model_with_its_drafters(home: Path, cli) -> None:
    code, out, err = cli(["models", "list", "--json"])
    assert code == 0, err
    listed = {row["name"]: row for row in json.loads(out)["models"]}
    assert {"toy-16m", "smollm2-135m"} <= set(listed)
    for row in listed.values():
        assert {"name", "path", "installed", "source", "drafters"} <= set(row)
    assert listed["toy-16m"]["installed"] and "eagle" in listed["toy-16m"]["drafters"]
    assert not listed["smollm2-135m"]["installed"] and listed["smollm2-135m"]["drafters"] == []


def test_an_imported_gguf_is_a_model_every_command_takes(tiny_gguf: Path, home: Path,
                                                         cli, refused) -> None:
    code, out, err = cli(["models", "import-gguf", str(tiny_gguf), "--name", "tiny", "--json"])
    assert code == 0, err
    summary = json.loads(out)
    assert summary["tensor_types"]["Q8_0"] > 0 and summary["chat"]
    assert Path(summary["path"]) == home / "models" / "tiny"
    code, out, err = cli(["models", "list", "--json"])
    row = next(r for r in json.loads(out)["models"] if r["name"] == "tiny")
    assert row["installed"] and row["drafters"] == ["ngram"]  # nothing trained for it yet
    code, out, err = cli(["generate", "--model", "tiny", "--chat", "--prompt", "hello", "--max-new-tokens",
                          "5", "--drafter", "none", "--json"])
    assert code == 0, err
    assert json.loads(out)["prompt_tokens"] > len("hello")  # the template wrapped the prompt
    err = refused(["models", "import-gguf", str(tiny_gguf), "--name", "tiny"])
    assert "already taken" in err
    err = refused(["models", "import-gguf", str(tiny_gguf), "--name", "toy-16m"])
    assert "already taken" in err


def test_bad_files_and_names_leave_the_cache_empty(tiny_gguf: Path, home: Path, tmp_path: Path,
                                                   refused) -> None:
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:4096])
    cases = ((not_gguf, "GGUF"), (truncated, "truncated"), (tmp_path / "missing.gguf", "no such"))
    for path, problem in cases:
        err = refused(["models", "import-gguf", str(path), "--name", "bad"])
        assert problem.lower() in err.lower(), err
    assert "letters, digits" in refused(["models", "import-gguf", str(tiny_gguf), "--name", "../x"])
    assert not (home / "models").exists() or list((home / "models").iterdir()) == []


def fake_wheel(tmp_path: Path, gguf_path: Path, monkeypatch: pytest.MonkeyPatch, digest: str | None = None
               ) -> ModelSpec:
    """A registered model whose 'wheel' is a package on sys.path holding ``gguf_path`` (so no pip runs), with
    prompt sets of its own (so fetch extracts none)."""
    package = tmp_path / "site" / "fake_model_wheel"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.gguf").write_bytes(gguf_path.read_bytes())
    monkeypatch.syspath_prepend(str(package.parent))
    sha = digest or hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    spec = dataclasses.replace(models.TOY, name="fake-wheel", source="wheel fake", location=None,
                               drafters=tmp_path / "drafters", prompt_sets=tmp_path / "prompts",
                               wheel=Wheel("fake-model-wheel==1", "fake_model_wheel", "model.gguf", sha))
    monkeypatch.setitem(models.registry, spec.name, spec)
    monkeypatch.setattr("experiments.commands.models.pip_install",  # no test installs anything
                        lambda requirement, **_: INSTALLS.append(requirement))
    return spec


INSTALLS: list[str] = []  # what fetch asked pip for (never run in the tests)


def test_fetch_converts_verifies_once_then_does_nothing(tiny_gguf: Path, home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        cli) -> None:
    spec = fake_wheel(tmp_path, tiny_gguf, monkeypatch)
    INSTALLS.clear()
    code, out, err = cli(["models", "fetch", spec.name, "--json"])
    assert code == 0, err
    first = json.loads(out)
    assert first["fetched"] and first["verified"]["chat_template"] and spec.installed
    assert first["prompts"] is None  # its prompt sets ship with it: nothing extracted or installed
    manifest = json.loads((spec.target / MANIFEST).read_text())
    assert manifest["sha256"] == spec.wheel.sha256 and manifest["source"] == "wheel fake"
    stamp = (spec.target / "config.json").stat().st_mtime_ns
    code, out, err = cli(["models", "fetch", spec.name, "--json"])
    assert code == 0 and not json.loads(out)["fetched"], err
    assert (spec.target / "config.json").stat().st_mtime_ns == stamp
    assert INSTALLS == []  # the wheel's file was in place, and the model's prompt sets are its own


def test_fetch_refuses_a_file_that_is_not_the_registrys(tiny_gguf: Path, home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        refused) -> None:
    spec = fake_wheel(tmp_path, tiny_gguf, monkeypatch, digest="0" * 64)
    err = refused(["models", "fetch", spec.name])
    assert "SHA-256" in err and "--force-reinstall" in err
    assert (not spec.installed and not (home / "models").exists()) or list((home / "models").iterdir()) == []


def test_fetch_names_what_cannot_be_fetched(refused) -> None:
    assert "not a registry wheel" in refused(["models", "fetch", "toy-16m"])
    assert "neither a model name" in refused(["models", "fetch", "no-such-model"])
