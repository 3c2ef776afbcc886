"""The names the command line offers, each list defined once: verifiers, dtypes and the drafter registry.

Standard library only, so every ``specblock ... --help`` lists them without importing torch. Drafters
are registered the way Gymnasium registers environments: ``register_drafter`` records a frozen
``DrafterSpec`` of strings (``entry_point`` is ``"module.path:function"``), and
``real_engine.decode.make_drafter`` looks the spec up, checks the options against it, imports the entry
point and calls it as ``builder(target, draft, folder, deployed, **options)``. The shipped drafters are
registered at the bottom of this module; a new one needs its module and one ``register_drafter`` call.
``none`` is no drafter: it is the command line's choice of vanilla decoding (``VANILLA``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import InputError

DOMAINS = ("code", "tests", "prose", "text")
"""The shipped family's text domains: its corpus splits and prompt sets (``data/prompts/<domain>.jsonl``)."""
VERIFIERS = ("greedy", "token", "block", "rrs", "gbv", "seqbv", "gds")
DTYPES = ("float32", "bfloat16", "float16")
BENCHMARKS = ("engine", "forward_cost", "cpu_linear", "lp_solve_time", "rollout_speed", "verifier_latency",
              "checkout_ab", "pipeline_runs", "mutation", "adapt_breakeven", "multidraft", "batch_throughput",
              "drafter_pair", "model_speed", "peers", "gguf_parity")
"""`specblock benchmark NAME`: each a module of ``benchmarks`` with a click command called `command`, named
as its module, which is also the default name of its results file."""
CLOCKS = ("wall", "cpu", "thread")
"""How the engine is timed: wall seconds, this process's CPU seconds, or the calling thread's (with one torch
thread, the decoding thread's own work while another thread trains)."""
DRAFT_SHAPES = ("chain", "tree", "paths")  # what the draft model drafts: a chain, a top-k tree, sampled paths
VANILLA = "none"  # the --drafter choice of vanilla decoding: no drafter, so never registered
# the drafter options that are probabilities, and what each is; every other option is a count (>= 1)
PROBABILITY_OPTIONS = {"min_confidence": "minimum draft confidence"}


@dataclass(frozen=True)
class DrafterSpec:
    """How ``make_drafter`` builds one drafter, and what the command line says about it."""

    name: str
    entry_point: str  # "module.path:function", called as f(target, draft, folder, deployed, **options)
    options: tuple[str, ...] = ()  # the keyword options the builder takes (counts >= 1 or probabilities)
    shape_options: tuple[str, ...] = ()  # those a deployed shape (``drafting.json`` in its folder) may set
    trained: bool = False  # built from weights trained for the target (`specblock train <name>`), a folder
    needs_draft_model: bool = False  # drafts with the draft model (make_drafter's ``draft``)
    summary: str = ""  # one line for --help

    def load(self) -> Callable[..., Any]:
        """The builder ``entry_point`` names (importing its module, torch included)."""
        module, _, function = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), function)


registry: dict[str, DrafterSpec] = {}  # name -> spec, in registration order (the order --help lists)


def register_drafter(name: str, entry_point: str, *, options: tuple[str, ...] = (),
                     shape_options: tuple[str, ...] = (), trained: bool = False,
                     needs_draft_model: bool = False, summary: str = "") -> DrafterSpec:
    """Record drafter ``name`` (see ``DrafterSpec``); InputError for a taken name or a malformed spec."""
    module, colon, function = entry_point.partition(":")
    if not (module and colon and function):
        raise InputError(f"drafter {name!r}: entry point {entry_point!r} is not 'module.path:function'")
    if name == VANILLA or name in registry:
        raise InputError(f"a drafter called {name!r} is already registered (or means vanilla decoding): "
                         "choose another name")
    stray = [o for o in shape_options if o not in options]
    if stray:
        raise InputError(f"drafter {name!r}: shape option {stray[0]!r} is not one of its options: add it to "
                         "options")
    spec = DrafterSpec(name, entry_point, tuple(options), tuple(shape_options), trained, needs_draft_model,
                       summary)
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


register_drafter("ngram", "real_engine.drafters.ngram:build_ngram", options=("depth", "max_ngram"),
                 summary="n-gram prompt lookup, no model")
register_drafter("draft-model", "real_engine.drafters.draft_model:build_draft_model",
                 options=("depth", "width", "budget", "paths", "min_confidence", "vocab", "staged", "lookup"),
                 shape_options=("depth", "width", "budget", "min_confidence", "vocab", "staged", "lookup"),
                 needs_draft_model=True, summary="a small causal LM: chain, top-k tree or sampled paths")
register_drafter("specblock", "real_engine.drafters.specblock:build_specblock",
                 options=("blocks", "budget", "width", "vocab"),
                 shape_options=("blocks", "budget", "width", "vocab"),
                 trained=True, summary="block drafting with a rank head, on the target's features")
register_drafter("eagle", "real_engine.drafters.eagle:build_eagle",
                 options=("depth", "width", "budget", "vocab"),
                 shape_options=("depth", "width", "budget", "vocab"), trained=True,
                 summary="EAGLE-style feature drafter, dynamic top-k tree")
register_drafter("medusa", "real_engine.drafters.medusa:build_medusa", options=("depth", "budget"),
                 shape_options=("depth", "budget"), trained=True,
                 summary="Medusa-style heads, static tree")
