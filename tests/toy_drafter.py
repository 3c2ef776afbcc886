"""A toy drafter in one module: everything the project needs to handle it, named by one registration.

``register()`` makes one ``register_drafter`` call; the drafter then takes part everywhere a shipped one
does (``tests/test_drafter_registry.py`` checks each): `specblock generate` offers it and its own option
(``--repeat-token``), the bench harness runs it, the profiler times its series and the cost profile
validates and costs them, `specblock shapes` tries its shapes, the fidelity study runs its configuration,
and `specblock train repeat` runs its recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from core.files import read_json, write_json
from core.names import DrafterSpec, DraftOption, register_drafter
from experiments.pipeline.fidelity import Config, make_config
from real_engine.drafter_profiles import DraftSeries, DraftTimer, Profiler
from real_engine.model import Output, Transformer
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

NAME = "repeat"
TOKEN = DraftOption("token", "--repeat-token", "Repeat drafter: the token it drafts.",
                    default="its trained one")


class Repeat:
    """Always the chain ``token`` x ``depth`` after the root, with point-mass laws."""

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


def build_repeat(target: Transformer, draft: Transformer | None, folder: str | Path | None,
                 deployed: bool, *, depth: int = 3, token: int | None = None) -> Repeat:
    """The builder: ``token`` given, else the one its recipe wrote in ``folder``, else 1."""
    if token is None and folder is not None and (Path(folder) / "repeat.json").is_file():
        token = read_json(Path(folder) / "repeat.json", 1 << 10, "repeat drafter", "retrain it")["token"]
    return Repeat(depth, token or 1)


def _series(target: Transformer, net: Any, timer: DraftTimer) -> DraftSeries:
    return DraftSeries([{"tokens": n, "seconds": timer.run(Repeat(n, 1), n)}
                        for n in timer.grid.draft_tokens])


PROFILER = Profiler(_series)
SHAPES = ({"depth": 1}, {"depth": 2})


def fidelity(tree: int) -> tuple[Config, ...]:
    """Its chain of 2."""
    return (make_config("repeat 2", NAME, "repeat-2", 2, depth=2),)


def recipe(target_dir: Path, out: Path, run_dir: Path, request: Any) -> dict[str, Any]:
    """Its training: the token to repeat is the target's greedy continuation of a fixed prompt."""
    from real_engine.decode import generate
    from real_engine.model import load_model

    token = generate(load_model(target_dir), [5, 9, 2, 7], max_new_tokens=1).tokens[0]
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "repeat.json", {"token": token})
    return {"token": token, "steps_done": 1}


def register() -> DrafterSpec:
    """The one registration."""
    return register_drafter(NAME, f"{__name__}:build_repeat", options=("depth", TOKEN),
                            summary="the same token again", cost_keys=("tokens",), chain="token",
                            profile=f"{__name__}:PROFILER", recipe=f"{__name__}:recipe",
                            shapes=f"{__name__}:SHAPES", fidelity=f"{__name__}:fidelity")
