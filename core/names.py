"""The names the command line offers, each list defined once: verifiers, dtypes and the drafter registry.

Standard library only, so every ``specblock ... --help`` lists them without importing torch. Drafters
are registered the way Gymnasium registers environments: ``register_drafter`` records a frozen
``DrafterSpec`` of strings, and every part of the project that handles drafters loops over the registry:
``real_engine.decode.make_drafter`` builds one from ``entry_point``; ``core.cost_profile`` validates its
cost series by ``cost_keys``/``tree_keys`` and costs its chains by ``chain``; the profiler times it
through ``profile``; ``specblock train`` runs ``recipe``; ``specblock shapes`` tries ``shapes``;
``specblock fidelity`` runs ``fidelity``; the commands offer its ``options`` (``DraftOption``: flag,
kind, help). The shipped drafters are registered at the bottom of this module; a new one is its module
and one ``register_drafter`` call. ``none`` is no drafter: the command line's choice of vanilla decoding
(``VANILLA``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from core.errors import InputError
from core.verifiers import verifier_names

DOMAINS = ("code", "tests", "prose", "text")
"""The shipped family's text domains: its corpus splits and prompt sets (``data/prompts/<domain>.jsonl``)."""
VERIFIERS = verifier_names()  # the verifiers of core.verifiers, in registration order
DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a checkpoint stores its weights in."""
RUN_DTYPES = (*DTYPES, "int4")
"""The dtypes a model runs in: a stored one, or ``int4``: bfloat16 activations, the decoder layers on 4-bit
weights and the LM head on 8-bit ones (``real_engine.packed.quantize``)."""
ROLES = ("length", "adaptation", "serving")
"""What a policy decides (``policies``): a query's speculation lengths, drafter updates across a stream of
queries, or the lengths of every request of a batch; also the tasks of `specblock tune`."""
ROLE_ALIASES = {"adapt": "adaptation", "serve": "serving"}
"""Older names of the roles, still accepted as `specblock tune` tasks."""
BENCHMARKS = ("engine", "forward_cost", "cpu_linear", "lp_solve_time", "rollout_speed", "verifier_latency",
              "checkout_ab", "pipeline_runs", "mutation", "adapt_breakeven", "multidraft", "batch_throughput",
              "drafter_pair", "model_speed", "peers", "gguf_parity")
"""`specblock benchmark NAME`: each a module of ``benchmarks`` with a click command called `command`, named
as its module, which is also the default name of its results file."""
CLOCKS = ("wall", "cpu", "thread")
"""How the engine is timed: wall seconds, this process's CPU seconds, or the calling thread's (with one torch
thread, the decoding thread's own work while another thread trains)."""
VANILLA = "none"  # the --drafter choice of vanilla decoding: no drafter, so never registered
CHAIN_RULES = ("token", "depth", "block", "once")
"""How a drafter's chain of ``depth`` positions costs (``core.cost_profile``): one forward per token (its
series keyed by ``tokens``), one per depth (keyed by ``depth``), one block forward per block of K positions
(keyed by ``starts`` and ``blocks``: one start, ceil(depth / K) blocks), or one call whatever the depth."""


@dataclass(frozen=True)
class DraftOption:
    """One option a drafter's builder takes (``make_drafter(name, ..., **options)``) and its flag."""

    name: str  # the builder's keyword
    flag: str  # the command-line flag, e.g. --draft-length
    help: str  # for --help; the drafters taking it are appended
    probability: bool = False  # a probability in [0, 1]; else a count >= 1
    default: str = ""  # what --help shows as its default


draft_options: dict[str, DraftOption] = {}  # name -> option, in registration order (the order --help lists)


def register_option(option: DraftOption) -> DraftOption:
    """Record ``option``; the same definition twice is one option, a different one under a taken name or
    flag is an InputError."""
    taken = draft_options.get(option.name) or next(
        (o for o in draft_options.values() if o.flag == option.flag), None)
    if taken is not None and taken != option:
        raise InputError(f"drafter option {option.name!r} ({option.flag}) is already registered differently: "
                         "reuse it or choose another name and flag")
    draft_options[option.name] = option
    return option


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter: how ``make_drafter`` builds it, what the command line says about it, how it is costed,
    and the entry points (``"module.path:attribute"``) of the jobs that handle it."""

    name: str
    entry_point: str  # called as f(target, draft, folder, deployed, **options)
    options: tuple[str, ...] = ()  # the keyword options the builder takes (keys of ``draft_options``)
    shape_options: tuple[str, ...] = ()  # those a deployed shape (``drafting.json`` in its folder) may set
    trained: bool = False  # built from weights trained for the target (`specblock train <name>`), a folder
    needs_draft_model: bool = False  # drafts with the draft model (make_drafter's ``draft``)
    summary: str = ""  # one line for --help
    cost_keys: tuple[str, ...] = ()  # the parameters its ``samples.draft`` series is measured over
    tree_keys: tuple[str, ...] = ()  # those of its optional ``samples.draft_trees`` series
    chain: str = "once"  # how a chain costs: one of CHAIN_RULES
    profile: str = ""  # a ``real_engine.drafter_profiles.Profiler``: its model and its timed series
    recipe: str = ""  # f(target_dir, out, run_dir, request: TrainRequest) -> its training record
    shapes: str = ""  # the shapes `specblock shapes` tries: a tuple of option dicts
    fidelity: str = ""  # f(tree) -> its ``experiments.pipeline.fidelity.Config``s (trees of ``tree`` nodes)
    folder: str = ""  # its folder under a model's drafters folder (default: its name)

    def load(self, field: str = "entry_point") -> Any:
        """What entry point ``field`` names (importing its module, torch included)."""
        module, _, attribute = getattr(self, field).partition(":")
        return getattr(importlib.import_module(module), attribute)


registry: dict[str, DrafterSpec] = {}  # name -> spec, in registration order (the order --help lists)


def register_drafter(name: str, entry_point: str, *, options: tuple[str | DraftOption, ...] = (),
                     shape_options: tuple[str, ...] = (), trained: bool = False,
                     needs_draft_model: bool = False, summary: str = "", cost_keys: tuple[str, ...] = (),
                     tree_keys: tuple[str, ...] = (),
                     chain: str = "once", profile: str = "", recipe: str = "", shapes: str = "",
                     fidelity: str = "", folder: str = "") -> DrafterSpec:
    """Record drafter ``name`` (see ``DrafterSpec``); an option given as a ``DraftOption`` is registered with
    it. InputError for a taken name or a malformed spec."""
    given = (("profile", profile), ("recipe", recipe), ("shapes", shapes), ("fidelity", fidelity))
    points = {"entry point": entry_point, **{k: v for k, v in given if v}}
    for what, point in points.items():
        module, colon, attribute = point.partition(":")
        if not (module and colon and attribute):
            raise InputError(f"drafter {name!r}: {what} {point!r} is not 'module.path:attribute'")
    if name == VANILLA or name in registry:
        raise InputError(f"a drafter called {name!r} is already registered (or means vanilla decoding): "
                         "choose another name")
    names = tuple(o if isinstance(o, str) else register_option(o).name for o in options)
    unknown = [o for o in names if o not in draft_options]
    if unknown:
        raise InputError(f"drafter {name!r}: option {unknown[0]!r} is not registered: give it as a "
                         "DraftOption")
    stray = [o for o in shape_options if o not in names]
    if stray:
        raise InputError(f"drafter {name!r}: shape option {stray[0]!r} is not one of its options: add it to "
                         "options")
    if chain not in CHAIN_RULES:
        raise InputError(f"drafter {name!r}: chain {chain!r} is not one of {', '.join(CHAIN_RULES)}")
    spec = DrafterSpec(name, entry_point, names, tuple(shape_options), trained, needs_draft_model, summary,
                       tuple(cost_keys), tuple(tree_keys), chain, profile, recipe, shapes, fidelity,
                       folder or name)
    registry[name] = spec
    return spec


def drafter_spec(name: str) -> DrafterSpec:
    """The spec of registered drafter ``name``; InputError naming the registered ones otherwise."""
    if name not in registry:
        raise InputError(f"unknown drafter {name!r}: use one of {', '.join(drafter_names())}")
    return registry[name]


def drafter_names() -> tuple[str, ...]:
    """Every registered drafter, in registration order."""
    return tuple(registry)


def drafter_choices() -> tuple[str, ...]:
    """What --drafter offers: vanilla decoding, then every registered drafter."""
    return (VANILLA, *registry)


def trained_drafters() -> tuple[str, ...]:
    """The registered drafters built from trained weights (``specblock train <name>`` trains them)."""
    return tuple(name for name, spec in registry.items() if spec.trained)


def trainable_drafters() -> tuple[str, ...]:
    """The registered drafters with a training recipe (``specblock train <name>``)."""
    return tuple(name for name, spec in registry.items() if spec.recipe)


for _option in (
    DraftOption("depth", "--draft-length", "Draft depth: tokens per chain or path, levels of a tree.",
                default="4; trained: as trained"),
    DraftOption("width", "--tree-width",
                "Draft model: >1 drafts a top-k tree this wide per level; EAGLE: its top-k; SpecBlock: "
                "children per node at most (1: a chain).", default="1; EAGLE: as trained"),
    DraftOption("budget", "--tree-budget", "Most draft nodes kept (the likeliest).",
                default="16; trained: as trained"),
    DraftOption("paths", "--paths",
                "Draft model: >1 samples this many independent paths (for rrs, gbv, seqbv).", default="1"),
    DraftOption("min_confidence", "--min-confidence",
                "Draft model's chain: draft a further token only while the draft's top probability is at "
                "least this (assisted generation's assistant_confidence_threshold).", probability=True,
                default="0"),
    DraftOption("vocab", "--draft-vocab",
                "Draft only this many of the most frequent tokens (draft_vocab.json in the drafter's "
                "folder; the vocabulary's size: all).", default="the drafter's own"),
    DraftOption("staged", "--staged",
                "Draft model's chain: guess ahead by n-gram lookup, running the guesses in the same "
                "forward, and end the chain at the first wrong guess once this many forwards ran.",
                default="off"),
    DraftOption("lookup", "--lookup",
                "Draft model's chain: where the context's last this many tokens (1 to 3) occurred before, "
                "propose the n-gram lookup's chain alone, without running the draft model.", default="off"),
    DraftOption("blocks", "--blocks",
                "SpecBlock: block forwards per draft (M); the tree reaches depth M x block size.",
                default="2"),
    DraftOption("max_ngram", "--ngram-max", "n-gram drafter: longest n tried.", default="3"),
):
    register_option(_option)

register_drafter("ngram", "real_engine.drafters.ngram:build_ngram", options=("depth", "max_ngram"),
                 shape_options=("depth", "max_ngram"), summary="n-gram prompt lookup, no model",
                 shapes="experiments.specbench.shapes:NGRAM_SHAPES",
                 profile="real_engine.drafter_profiles:NGRAM",
                 fidelity="experiments.pipeline.fidelity:ngram_configs")
register_drafter("draft-model", "real_engine.drafters.draft_model:build_draft_model",
                 options=("depth", "width", "budget", "paths", "min_confidence", "vocab", "staged", "lookup"),
                 shape_options=("depth", "width", "budget", "min_confidence", "vocab", "staged", "lookup"),
                 needs_draft_model=True, summary="a small causal LM: chain, top-k tree or sampled paths",
                 cost_keys=("tokens",), tree_keys=("depth", "width"), chain="token", folder="draft",
                 profile="real_engine.drafter_profiles:DRAFT_MODEL",
                 recipe="real_engine.training.recipes:draft_model_recipe",
                 shapes="experiments.specbench.shapes:DRAFT_MODEL_SHAPES",
                 fidelity="experiments.pipeline.fidelity:draft_model_configs")
register_drafter("specblock", "real_engine.drafters.specblock:build_specblock",
                 options=("blocks", "budget", "width", "vocab"),
                 shape_options=("blocks", "budget", "width", "vocab"),
                 trained=True, summary="block drafting with a rank head, on the target's features",
                 cost_keys=("starts", "blocks"), chain="block",
                 profile="real_engine.drafter_profiles:SPECBLOCK",
                 recipe="real_engine.training.recipes:specblock_recipe",
                 shapes="experiments.specbench.shapes:SPECBLOCK_SHAPES",
                 fidelity="experiments.pipeline.fidelity:specblock_configs")
register_drafter("eagle", "real_engine.drafters.eagle:build_eagle",
                 options=("depth", "width", "budget", "vocab"),
                 shape_options=("depth", "width", "budget", "vocab"), trained=True,
                 summary="EAGLE-style feature drafter, dynamic top-k tree",
                 cost_keys=("depth",), chain="depth", profile="real_engine.drafter_profiles:EAGLE",
                 recipe="real_engine.training.recipes:eagle_recipe",
                 shapes="experiments.specbench.shapes:EAGLE_SHAPES",
                 fidelity="experiments.pipeline.fidelity:eagle_configs")
register_drafter("medusa", "real_engine.drafters.medusa:build_medusa", options=("depth", "budget"),
                 shape_options=("depth", "budget"), trained=True,
                 summary="Medusa-style heads, static tree", profile="real_engine.drafter_profiles:MEDUSA",
                 recipe="real_engine.training.recipes:medusa_recipe",
                 shapes="experiments.specbench.shapes:MEDUSA_SHAPES",
                 fidelity="experiments.pipeline.fidelity:medusa_configs")
