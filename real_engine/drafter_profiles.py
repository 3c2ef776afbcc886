"""How the profiler times each shipped drafter: its model and its ``samples.draft`` series.

A drafter's registration (``core.names``) names its ``Profiler`` here; ``real_engine.profile`` loops over the
registry, so a new drafter is timed by naming one of its own. ``load(target, folder)`` reads trained
weights (a model folder) and ``fresh(target, seed)`` builds seeded random ones of the shipped shape
(timing does not depend on the values); a drafter with neither needs no model, and one that drafts with
the draft model gets it with the token ids it drafts (None: every token). ``series(target, net, timer)``
adds its timed configurations to ``timer`` (a ``DraftTimer``: ``run(drafter, depth)`` queues one
iteration's propose + accept and returns the list its seconds land in) and returns its rows, its tree rows
and the settings its series holds fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from real_engine.decode import MAX_TREE_NODES
from real_engine.drafters.base import Drafter
from real_engine.drafters.draft_model import DraftModelDrafter
from real_engine.drafters.eagle import EagleDrafter, TreeShape, load_eagle, new_eagle
from real_engine.drafters.medusa import MedusaDrafter, choose_tree, load_medusa, new_medusa
from real_engine.drafters.ngram import NgramDrafter
from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter, load_specblock
from real_engine.feedback import FeedbackDrafter
from real_engine.model import Transformer


class DraftTimer(Protocol):
    """What a drafter's ``series`` times with: the grid, whether to record feedback, and ``run``."""

    grid: Any  # real_engine.profile.ProfileGrid
    recording: bool  # draft as a stream that adapts online runs it (feedback recorded)

    def run(self, drafter: Drafter, depth: int) -> list[float]:
        """Queue one iteration (propose ``depth`` + accept) of ``drafter``; its seconds land in the list."""
        ...


@dataclass(frozen=True)
class DraftSeries:
    """A drafter's timed rows (``samples.draft``), tree rows (``samples.draft_trees``), the settings they hold
    fixed (``draft_shapes``) and, for a block drafter, its K (the profile's ``block_size``)."""

    rows: list[dict]
    trees: list[dict] = field(default_factory=list)
    shape: dict[str, int] = field(default_factory=dict)
    block_size: int | None = None


@dataclass(frozen=True)
class Profiler:
    """How one drafter is profiled (see the module doc)."""

    series: Callable[[Transformer, Any, DraftTimer], DraftSeries]
    load: Callable[[Transformer, Path], Any] | None = None
    fresh: Callable[[Transformer, int], Any] | None = None


def _ngram(target: Transformer, net: Any, timer: DraftTimer) -> DraftSeries:
    return DraftSeries([{"seconds": timer.run(NgramDrafter(depth=8), 8)}])


def _draft_model(target: Transformer, net: tuple[Transformer, torch.Tensor | None], timer: DraftTimer
                 ) -> DraftSeries:
    draft, vocab = net  # the draft model and the token ids it drafts (None: every token)
    grid = timer.grid
    rows = [{"tokens": n, "seconds": timer.run(DraftModelDrafter(draft, "chain", n, vocab=vocab), n)}
            for n in grid.draft_tokens]
    trees = [{"depth": d, "width": w,
              "seconds": timer.run(DraftModelDrafter(draft, "tree", d, w, grid.tree_budget, vocab=vocab), d)}
             for d in grid.tree_depths for w in grid.tree_widths]
    return DraftSeries(rows, trees, {"tree_budget": grid.tree_budget})


def _specblock(target: Transformer, net: SpecBlock, timer: DraftTimer) -> DraftSeries:
    k = net.config.block_size
    children = (k,) * (len(net.config.edges) + 1)  # every bucket drafts: later blocks start from `starts`

    def drafter(m: int, s: int) -> Drafter:
        made = SpecBlockDrafter(net, m, s, budget=MAX_TREE_NODES - 1, children=children)
        return FeedbackDrafter(made) if timer.recording else made

    rows = [{"starts": s, "blocks": m, "seconds": timer.run(drafter(m, s), m * k)}
            for s in timer.grid.specblock_starts for m in timer.grid.specblock_blocks]
    return DraftSeries(rows, shape={"children": k, "budget": MAX_TREE_NODES - 1}, block_size=k)


def _eagle(target: Transformer, net: tuple[Any, TreeShape], timer: DraftTimer) -> DraftSeries:
    layer, shape = net
    shapes = {d: TreeShape(d, shape.top_k, shape.total_tokens) for d in timer.grid.eagle_depths}
    rows = [{"depth": d, "seconds": timer.run(EagleDrafter(layer, target, s), d)} for d, s in shapes.items()]
    return DraftSeries(rows, shape={"top_k": shape.top_k, "total_tokens": shape.total_tokens})


def _medusa(target: Transformer, net: tuple[Any, Any], timer: DraftTimer) -> DraftSeries:
    heads, tree = net
    depth = max(len(node) for node in tree)
    return DraftSeries([{"seconds": timer.run(MedusaDrafter(heads, target, tree), depth)}])


def _fresh_specblock(target: Transformer, seed: int) -> SpecBlock:
    return SpecBlock.for_target(target, seed=seed).eval()


def _load_specblock(target: Transformer, folder: Path) -> SpecBlock:
    return load_specblock(folder, target).eval()


NGRAM = Profiler(_ngram)
DRAFT_MODEL = Profiler(_draft_model)
SPECBLOCK = Profiler(_specblock, _load_specblock, _fresh_specblock)
EAGLE = Profiler(_eagle, lambda target, folder: load_eagle(folder, target),
                 lambda target, seed: (new_eagle(target, seed=seed), TreeShape()))
MEDUSA = Profiler(_medusa, lambda target, folder: load_medusa(folder, target),
                  lambda target, seed: (new_medusa(target, seed=seed),
                                        choose_tree([[0.6, 0.2, 0.1, 0.05]] * 4, 24)))
