"""The drafter registry (``core.names``): a toy drafter registered with one ``register_drafter`` call is
offered by `specblock generate`, decodes through ``generate`` and the bench harness exactly as vanilla
does at temperature 0, and unknown names and options are refused; the shipped specs agree with their
builders, and the name lists import without torch."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core import names
from core.errors import InputError
from core.names import DrafterSpec, register_drafter, trained_drafters
from core.paths import REPO
from experiments.cli import main
from real_engine.decode import generate, make_drafter
from real_engine.model import Output, Transformer
from real_engine.training.recipes import RECIPES
from real_engine.tree import DraftTree
from real_engine.verify import VERIFIERS
from real_engine.warp import Sampling

PROMPT = [5, 9, 2, 7, 7, 3]


class Repeat:
    """A toy drafter: always the chain ``token`` x ``depth`` after the root, with point-mass laws."""

    def __init__(self, depth: int, token: int) -> None:
        self.depth, self.token, self.model_seconds = depth, token, 0.0
        self.root, self.vocab = 0, 0

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        self.root, self.vocab = int(prompt[-1]), target.logits.shape[-1]

    def propose(self, max_depth: int) -> DraftTree:
        draft = [self.token] * min(self.depth, max_depth)
        q = torch.cat((F.one_hot(torch.tensor(draft, dtype=torch.long), self.vocab).float(),
                       torch.zeros(1, self.vocab)))
        return DraftTree.chain(self.root, draft, q, "topk")

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        self.root = token


def build_repeat(target: Transformer, draft: Transformer | None, folder: str | Path | None, deployed: bool, *,
                 depth: int = 3, token: int = 1) -> Repeat:
    return Repeat(depth, token)


@pytest.fixture
def repeat() -> Iterator[DrafterSpec]:
    """The toy drafter, registered for one test."""
    spec = register_drafter("repeat", f"{__name__}:build_repeat", options=("depth", "token"),
                            summary="the same token again")
    yield spec
    del names.registry[spec.name]


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
    for name, *options in (("none",), ("repeat", "--draft-length", "2")):
        main(["generate", "--model", str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "8",
              "--drafter", name, *options, "--json"])  # returns on success (exits on an error)
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["repeat"]["token_ids"] == runs["none"]["token_ids"]
    assert max(runs["repeat"]["tree_sizes"]) == 3  # --draft-length 2 reached the toy (its default: 3)
    assert runs["repeat"]["drafter"] == "repeat" and runs["repeat"]["verifier"] == "greedy"


def test_the_bench_harness_runs_a_registered_drafter(repeat: DrafterSpec, target: Transformer,
                                                     tmp_path: Path) -> None:
    from experiments.bench import Config, Engine, Settings, plan, run_bench

    settings = Settings(domains={}, drafters=("none", "repeat"), temperatures=(0.0,), max_new_tokens=8,
                        depth=2)
    configs, notes = plan(settings, ["repeat"], hf=False)
    assert configs == [Config("none", None, None, 0.0), Config("repeat", "chain", "greedy", 0.0)]
    assert notes == []
    engine = Engine(target, None, tmp_path, settings, None)
    rows = run_bench(settings, engine, {"code": [PROMPT, PROMPT[:3]]}, configs)["rows"]
    mine = [r for r in rows if r["drafter"] == "repeat"]
    assert [r["domain"] for r in mine] == ["code", "all"]
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
    with pytest.raises(InputError, match=r"module\.path:function"):
        register_drafter("other", "build_repeat")
    with pytest.raises(InputError, match="shape option 'width'"):
        register_drafter("other", f"{__name__}:build_repeat", options=("depth",), shape_options=("width",))
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
    assert set(RECIPES) == set(trained_drafters())
