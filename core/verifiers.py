"""The verifier registry: one spec per lossless verifier, keyed by name, and the rules of which draft it fits.

Standard library only, so every ``specblock ... --help`` lists the verifiers without importing torch.
``register_verifier`` records a frozen ``VerifierSpec`` whose code is named by entry points
(``"module.path:function"``, imported on first use): ``real_engine.verify`` builds its ``LAWS``,
``VERIFIERS`` and ``verify()`` from them (and ``real_engine.exact`` proves them lossless through those),
``core.names.VERIFIERS`` lists the registered names, the commands offer them (``--verifier``), choose the
default one (``default_verifier``) and refuse a verifier that does not fit the draft (``check_fit``),
``specblock bench`` measures each on the draft shapes it fits (``fits``), and the LP table
(``experiments.lp_table``) scores each under its ``lp_column``. The shipped verifiers are registered at
the bottom of this module; a new one is its module and one ``register_verifier`` call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from core.errors import InputError

DRAFT_SHAPES = ("chain", "tree", "paths")
"""Every draft shape: a chain, a top-k tree, sampled paths (the draft model drafts each)."""


@dataclass(frozen=True)
class VerifierSpec:
    """One verifier: where its code is, what it reads, which drafts it fits, and how tables name it."""

    name: str
    law: str  # f(tree, p, sampler) -> real_engine.verify.Decision: accepted nodes, emitted token's law
    runner: str = ""  # f(tree, p, sampler) -> VerifyResult, when it is not the law and one draw from it
    needs_q: bool = True  # reads the draft's probabilities q of sampled children (DraftTree.q)
    shapes: tuple[str, ...] = ()  # the draft shapes (DRAFT_SHAPES) it is chosen for
    default_for: tuple[str, ...] = ()  # the shapes it is the default verifier for (at T > 0, or T = 0)
    greedy: bool = False  # for temperature 0 only: reads the raw logits, takes their argmax
    iid_paths: bool = False  # verifies only paths sampled i.i.d. from q (a drafter taking --paths)
    unmerged: bool = False  # verifies unmerged paths of equal length, never a top-k tree
    draws: str = "iid"  # the child rule (real_engine.tree.CHILD_RULES) of the drafts it verifies
    lp_column: str | None = None  # its column in the LP table (specblock lp), or None: not scored there
    label: str = ""  # how tables name it (default: its name)
    summary: str = ""  # one line for --help

    def load(self, field: str = "law") -> Any:
        """What entry point ``field`` (``law`` or ``runner``) names, importing its module (torch included)."""
        module, _, attribute = getattr(self, field).partition(":")
        return getattr(importlib.import_module(module), attribute)


registry: dict[str, VerifierSpec] = {}  # name -> spec, in registration order (the order --help lists)


def register_verifier(name: str, law: str, *, runner: str = "", needs_q: bool = True,
                      shapes: tuple[str, ...] = (), default_for: tuple[str, ...] = (), greedy: bool = False,
                      iid_paths: bool = False, unmerged: bool = False, draws: str = "iid",
                      lp_column: str | None = None, label: str = "", summary: str = "") -> VerifierSpec:
    """Record verifier ``name`` (see ``VerifierSpec``); InputError for a taken name or a malformed spec."""
    for what, point in (("law", law), *((("runner", runner),) if runner else ())):
        module, colon, attribute = point.partition(":")
        if not (module and colon and attribute):
            raise InputError(f"verifier {name!r}: {what} {point!r} is not 'module.path:function'")
    if name in registry:
        raise InputError(f"a verifier called {name!r} is already registered: choose another name")
    unknown = [shape for shape in shapes if shape not in DRAFT_SHAPES]
    if unknown:
        raise InputError(f"verifier {name!r}: shape {unknown[0]!r} is not one of {', '.join(DRAFT_SHAPES)}")
    stray = [shape for shape in default_for if shape not in shapes]
    if stray:
        raise InputError(f"verifier {name!r} is the default for a {stray[0]} it does not fit: add it to "
                         "shapes")
    taken = [other.name for other in registry.values() if other.greedy == greedy
             and set(other.default_for) & set(default_for)]
    if taken:
        raise InputError(f"verifier {name!r}: {taken[0]} is already the default for one of "
                         f"{', '.join(default_for)}: drop default_for")
    if lp_column is not None and any(other.lp_column == lp_column for other in registry.values()):
        raise InputError(f"verifier {name!r}: LP column {lp_column!r} is taken: choose another")
    spec = VerifierSpec(name, law, runner, needs_q, tuple(shapes), tuple(default_for), greedy, iid_paths,
                        unmerged, draws, lp_column, label or name, summary)
    registry[name] = spec
    return spec


class Loaded(Mapping[str, Any]):
    """The registered verifiers by name, in registration order, each as what ``load`` makes of its spec
    (``real_engine.verify`` loads their entry points so); read at each access, so a verifier registered
    later is found too, and each spec loaded once."""

    def __init__(self, load: Callable[[VerifierSpec], Any]) -> None:
        self.load = cache(load)

    def __getitem__(self, name: str) -> Any:
        return self.load(registry[name])

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(registry))

    def __len__(self) -> int:
        return len(registry)


def unregister_verifier(name: str) -> None:
    """Forget verifier ``name`` (tests register toy verifiers and remove them again)."""
    registry.pop(name, None)


def verifier_spec(name: str) -> VerifierSpec:
    """The spec of registered verifier ``name``; InputError naming the registered ones otherwise."""
    if name not in registry:
        raise InputError(f"unknown verifier {name!r}: use one of {', '.join(registry)}")
    return registry[name]


def verifier_names() -> tuple[str, ...]:
    """Every registered verifier, in registration order (what --verifier offers)."""
    return tuple(registry)


def _either(names: tuple[str, ...]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else "none"


def fits(shape: str, greedy: bool = False) -> tuple[str, ...]:
    """The sampling verifiers (or with ``greedy`` the temperature-0 ones) chosen for a draft of ``shape``."""
    if shape not in DRAFT_SHAPES:
        raise InputError(f"unknown draft shape {shape!r}: use one of {', '.join(DRAFT_SHAPES)}")
    return tuple(name for name, spec in registry.items() if spec.greedy == greedy and shape in spec.shapes)


def sampling_verifiers() -> tuple[str, ...]:
    """The verifiers for temperature > 0 that fit some draft the engine's drafters make."""
    return tuple(name for name, spec in registry.items() if not spec.greedy and spec.shapes)


def default_verifier(temperature: float, shape: str) -> str:
    """The verifier used when none is given: the greedy one at temperature 0, else the one whose
    ``default_for`` holds ``shape``; InputError when none is."""
    greedy = temperature == 0
    for name, spec in registry.items():
        if spec.greedy == greedy and shape in spec.default_for:
            return name
    raise InputError(f"no registered verifier is the default for a {shape} at temperature {temperature:g}: "
                     "pass --verifier")


def defaults_help(shapes: tuple[str, ...]) -> str:
    """--verifier's help: each verifier's summary, then the default for each of ``shapes``."""
    kinds = "; ".join(f"{name}: {spec.summary}" for name, spec in registry.items() if spec.summary)
    greedy = next((name for name, spec in registry.items() if spec.greedy and spec.default_for), "none")
    chosen = tuple(f"{default_verifier(1.0, shape)} ({shape})" for shape in shapes)
    return f"{kinds}. Default: {greedy} at temperature 0, else {_either(chosen)}."


class Drafter(Protocol):
    """What ``check_fit`` reads of a drafter's spec (a ``core.names.DrafterSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def trained(self) -> bool: ...

    @property
    def options(self) -> tuple[str, ...]: ...


def check_fit(verifier: str, drafter: Drafter | None, tree_width: int | None,
              samplers: Sequence[str]) -> None:
    """Refuse a verifier that does not fit the draft of ``drafter`` (None: vanilla decoding fits any) drafting
    ``tree_width`` children per node (set only for a drafter that takes a width). A trained drafter drafts a
    deterministic top-k tree, or a sampled chain at tree width 1, and takes only the verifiers chosen for
    that shape; ``iid_paths`` verifiers need one of ``samplers`` (the drafters that sample paths, named in
    the refusal) and no top-k tree; ``unmerged`` ones no top-k tree."""
    spec = verifier_spec(verifier)
    if drafter is None:
        return
    wide = (tree_width or 1) > 1
    if drafter.trained and ("chain" if tree_width == 1 else "tree") not in spec.shapes:
        chains = tuple(name for name in fits("chain") if name not in fits("tree"))
        hint = f", or --tree-width 1 (a sampled chain) for {', '.join(chains)}" * ("width" in drafter.options)
        raise InputError(f"the {drafter.name} drafter drafts a deterministic top-k tree: use --verifier "
                         f"{_either(fits('tree'))} (or {_either(fits('tree', greedy=True))} at temperature 0)"
                         f"{hint}")
    if spec.iid_paths and (drafter.name not in samplers or wide):
        named = _either(tuple(samplers))
        raise InputError(f"{verifier} verifies i.i.d. sampled paths: use --drafter {named} with "
                         "--tree-width 1 (and --paths K), or another verifier")
    if spec.unmerged and wide:
        raise InputError(f"{verifier} verifies unmerged paths, not a top-k tree: use --paths K instead of "
                         f"--tree-width, or --verifier {_either(fits('tree'))}")


register_verifier("greedy", "real_engine.verify:greedy_law", runner="real_engine.verify:greedy",
                  needs_q=False, shapes=DRAFT_SHAPES, default_for=DRAFT_SHAPES, greedy=True,
                  summary="argmax matching on any tree (temperature 0)")
register_verifier("token", "real_engine.verify:token_law", shapes=("chain",), lp_column="token",
                  summary="token-level speculative sampling on the first path")
register_verifier("block", "real_engine.verify:block_law", shapes=("chain",), default_for=("chain",),
                  lp_column="block", label="BV", summary="block verification on the first path")
register_verifier("rrs", "real_engine.verify:rrs_law", shapes=DRAFT_SHAPES, default_for=("tree",),
                  lp_column="rrs", label="RRS", summary="recursive rejection sampling over the tree")
register_verifier("gbv", "real_engine.verify:gbv_law", shapes=("paths",), iid_paths=True, unmerged=True,
                  lp_column="gbv", label="GBV", summary="greedy multi-path block verification, i.i.d. paths")
register_verifier("seqbv", "real_engine.verify:seqbv_law", shapes=("paths",), default_for=("paths",),
                  unmerged=True, lp_column="seqbv", label="SeqBV",
                  summary="sequential block verification over the paths")
register_verifier("gds", "real_engine.verify:gds_law", unmerged=True, draws="greedy_draft", lp_column="gds",
                  label="GDS", summary="greedy draft selection (a greedy draft: top K-1 tokens, one sampled)")
