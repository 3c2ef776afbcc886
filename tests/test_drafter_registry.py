"""The drafter registry (``core.names``): the toy drafter of ``toy_drafter.py``, registered with one
``register_drafter`` call, is offered by `specblock generate` with its own option, decodes through
``generate`` and the bench harness exactly as vanilla does at temperature 0, is timed by the profiler and
costed by the profile, tried by `specblock shapes`, run by the fidelity study and trained by `specblock
train`; unknown names and options are refused; the shipped specs agree with their builders, and the name
lists import without torch."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import toy_drafter

from core import names
from core.cost_profile import profile_from_json, token_by_token
from core.errors import InputError
from core.names import DrafterSpec, register_drafter, trained_drafters
from core.paths import REPO
from experiments.cli import main
from real_engine import profile as prof
from real_engine.decode import generate, make_drafter
from real_engine.model import Transformer
from real_engine.verify import VERIFIERS

PROMPT = [5, 9, 2, 7, 7, 3]


@pytest.fixture
def repeat() -> Iterator[DrafterSpec]:
    """The toy drafter of ``tests/toy_drafter.py``, registered (one call) for one test."""
    spec = toy_drafter.register()
    yield spec
    del names.registry[spec.name], names.draft_options[toy_drafter.TOKEN.name]


def test_a_registered_drafter_is_offered_and_decodes_as_vanilla(repeat: DrafterSpec, target: Transformer,
                                                                llama_dir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.commands.generate import command

    drafter = next(p for p in command.params if p.name == "drafter")
    assert "repeat" in drafter.type.choices
    vanilla = generate(target, PROMPT, max_new_tokens=12)
    token = max(set(vanilla.tokens), key=vanilla.tokens.count)  # a token the target does emit
    out = generate(target, PROMPT, drafter=make_drafter("repeat", target, depth=2, token=token),
                   max_new_tokens=12)
    assert out.tokens == vanilla.tokens
    assert set(out.stats.tree_sizes) <= {1, 2, 3} and 3 in out.stats.tree_sizes  # its drafts were verified
    runs = {}
    for name, *options in (("none",), ("repeat", "--draft-length", "2", "--repeat-token", str(token))):
        main(["generate", "--model", str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "8",
              "--drafter", name, *options, "--json"])  # returns on success (exits on an error)
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["repeat"]["token_ids"] == runs["none"]["token_ids"]
    assert max(runs["repeat"]["tree_sizes"]) == 3  # --draft-length 2 reached the toy (its default: 3)
    assert runs["repeat"]["drafter"] == "repeat" and runs["repeat"]["verifier"] == "greedy"


def test_the_bench_harness_runs_a_registered_drafter(repeat: DrafterSpec, target: Transformer,
                                                     tmp_path: Path) -> None:
    from experiments.specbench.run import Config, Engine, Settings, plan, run_bench

    settings = Settings(categories={}, drafters=("none", "repeat"), temperatures=(0.0,), max_new_tokens=8,
                        depth=2)
    configs, notes = plan(settings, ["repeat"], hf=False)
    assert configs == [Config("none", None, None, 0.0), Config("repeat", "chain", "greedy", 0.0)]
    assert notes == []
    engine = Engine(target, None, tmp_path, settings, None)
    rows = run_bench(settings, engine, {"code": [PROMPT, PROMPT[:3]]}, configs)["rows"]
    mine = [r for r in rows if r["drafter"] == "repeat"]
    assert [r["category"] for r in mine] == ["code", "all"]
    assert all(r["greedy_identical"] for r in mine)
    assert engine.recorders[configs[1]].inner.depth == 2  # the bench's draft depth reached it


def test_unknown_drafters_and_options_are_refused(repeat: DrafterSpec, target: Transformer) -> None:
    with pytest.raises(InputError, match=r"^unknown drafter 'nope': use one of ngram, draft-model, "
                                         r"specblock, eagle, medusa, repeat$"):
        make_drafter("nope", target)
    with pytest.raises(InputError, match=r"^the repeat drafter takes no option width: drop it \(it takes "
                                         r"depth, token\)$"):
        make_drafter("repeat", target, width=2)
    with pytest.raises(InputError, match=r"^drafter option token=0 is below 1"):
        make_drafter("repeat", target, token=0)
    assert make_drafter("repeat", target, width=None).depth == 3  # an option left None is dropped
    with pytest.raises(InputError, match="already registered"):
        register_drafter("repeat", f"{__name__}:build_repeat")
    with pytest.raises(InputError, match="already registered"):
        register_drafter("none", f"{__name__}:build_repeat")
    with pytest.raises(InputError, match=r"module\.path:attribute"):
        register_drafter("other", "build_repeat")
    with pytest.raises(InputError, match="shape option 'width'"):
        register_drafter("other", f"{__name__}:build_repeat", options=("depth",), shape_options=("width",))
    with pytest.raises(InputError, match="option 'colour' is not registered"):
        register_drafter("other", f"{__name__}:build_repeat", options=("colour",))
    with pytest.raises(InputError, match="chain 'twice' is not one of"):
        register_drafter("other", f"{__name__}:build_repeat", chain="twice")
    with pytest.raises(InputError, match="already registered differently"):
        names.register_option(names.DraftOption("token", "--other-token", "another"))
    assert "other" not in names.registry


@pytest.mark.parametrize("name", names.drafter_names())
def test_each_shipped_spec_names_a_builder_taking_its_options(name: str) -> None:
    spec = names.drafter_spec(name)
    params = inspect.signature(spec.load()).parameters.values()
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == ["target", "draft", "folder",
                                                                            "deployed"]
    assert {p.name for p in params if p.kind is p.KEYWORD_ONLY} == set(spec.options)


def test_the_engine_verifiers_are_the_command_line_names() -> None:
    assert tuple(VERIFIERS) == names.VERIFIERS
    assert names.trained_drafters() == ("specblock", "eagle", "medusa")
    assert names.drafter_choices() == ("none", *names.drafter_names())


def test_the_name_lists_and_command_modules_import_without_torch() -> None:
    modules = ("core.names", *(f"experiments.commands.{c}" for c in
                               ("generate", "bench", "trace", "train", "profile", "shapes")))
    code = (f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=REPO)
    assert result.stdout.strip() == "False"


def test_every_trained_drafter_has_a_training_recipe() -> None:
    assert set(trained_drafters()) <= set(names.trainable_drafters())


def test_the_registration_brings_its_profile_series_and_costs(repeat: DrafterSpec,
                                                              target: Transformer) -> None:
    grid = dataclasses.replace(prof.QUICK, nodes=(1, 4), contexts=(16,), draft_tokens=(1, 2),
                               tree_depths=(2,), tree_widths=(2,), specblock_starts=(1,),
                               specblock_blocks=(1,), eagle_depths=(1,), prefill_tokens=(8,),
                               batch_requests=(1,), batch_nodes=(1,), repeats=1, warmup=0,
                               update_batch=(1, 8))
    data = prof.measure(target, target_name="tiny", grid=grid, feature=False, clock_kind="cpu")
    profile = profile_from_json({k: v for k, v in data.items() if k != "measurement"})
    assert [row["tokens"] for row in data["samples"]["draft"]["repeat"]] == [1, 2]
    assert profile.drafters["repeat"] == "the same token again"  # a drafter without a model: its summary
    assert token_by_token("repeat") and profile.chain_draft_seconds("repeat", 2) > 0
    assert profile.draft_row("repeat", 2)[2] == profile.chain_draft_seconds("repeat", 2)


def test_the_registration_brings_its_shapes_fidelity_and_training(repeat: DrafterSpec, target: Transformer,
                                                                  llama_dir: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.commands.train import kinds
    from experiments.pipeline import fidelity
    from experiments.specbench.shapes import shape_grids, sweep

    assert shape_grids()["repeat"] == toy_drafter.SHAPES
    result = sweep(target, [PROMPT], {"repeat": tmp_path}, max_new_tokens=6, progress=False)
    assert [row["shape"] for row in result["drafters"]["repeat"]].count({"depth": 2}) == 1
    config = next(c for c in fidelity.configs() if c.drafter == "repeat")
    assert fidelity.traces()[config.trace] == {"drafter": "repeat", "depth": 2}
    assert fidelity.draft_shape(config) is None  # a chain, costed token by token
    engine = fidelity.Engine(target, None, None, 6, 0)
    assert engine.drafter_factory(config)().depth == 2
    assert "repeat" in kinds()
    out = tmp_path / "trained"
    main(["train", "repeat", "--model", str(llama_dir), "--out", str(out), "--threads", "1", "--json"])
    trained = json.loads(capsys.readouterr().out)
    assert trained["out"] == str(out) and make_drafter("repeat", target, folder=out).token == trained["token"]
