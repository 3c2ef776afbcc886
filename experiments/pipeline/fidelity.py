"""Measured fidelity: the simulator's predicted tokens/s against the live engine's, per configuration.

Fixed configurations (vanilla decoding; draft-model chains of 2, 4 and 6 tokens; the n-gram drafter;
a draft-model top-k tree; SpecBlock with M = 1, 2 and 3 block forwards; EAGLE-style trees 2, 4 and 6
deep; Medusa-style heads) are run twice:

- in the engine on *evaluation* prompts (the second half of each domain's prompt file), all
  configurations round-robin prompt by prompt, measuring steady-state decode throughput: the new
  tokens of each query's steps after the first over their seconds (the first step also prefills the
  drafter's cache; prefill is outside the simulator's scope);
- in the simulator (``SpecLengthVectorEnv`` with a ``FixedLength`` policy) built from the cost
  profile and from traces recorded here on *calibration* prompts (the first half), with the
  evaluation set's prompt lengths, domain mix and tokens per query.

Each configuration replays a calibration trace recorded with its own draft shape. A deeper trace cut
at n (a greedy chain of n accepts the first n of what a deeper chain accepts) is biased: the deeper
drafter crosses easy stretches of text in fewer iterations, so its iterations over-represent hard ones
(``TraceReplay`` samples iterations uniformly), and a chain's tau replayed from a deeper trace comes out
too low. Chains are costed per drafted token (``T_draft(n)``). Trees are drafted whole however many
nodes are verified, so they are costed by their shape's series in the profile (``draft_shape``): the
draft model's tree by depth and width, EAGLE by depth, and SpecBlock by the block forwards and start
nodes it really ran on each calibration iteration (its rank head decides them;
``SpecBlockDrafter.shapes``), at their mean cost. Trees are kept within the simulator's 16 positions
(``LENGTH_CAP``) and verified whole.

Timing: the comparison uses the profile's clock. On a shared CPU machine the profile is measured on
the CPU clock (process CPU seconds, one torch thread), which other jobs' load barely moves; the
engine's throughput is then taken on the same clock, and the wall-clock error is reported beside
it. Such a machine's speed still drifts by several percent within an hour, so ``--measure-profile``
measures the profile in the same process right before the engine runs. Each row also decomposes its
calibration iterations: their own tau, and their draft and verify milliseconds against the profile's
for the same sizes and contexts, which tells a cost error from a difference between the prompt halves.
A configuration whose drafter the engine cannot build (no trained weights) is skipped with the
reason. Writes ``benchmarks/results/fidelity.json`` (with provenance) and ``fidelity.md``.

Run: ``specblock fidelity`` (``--help`` for the sizes).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import InputError
from core.models import ModelSpec
from core.names import VANILLA, drafter_spec, registry
from experiments.cli import drafter_folder
from policies.base import make_policy
from real_engine.decode import generate, make_drafter
from real_engine.trace import record
from simulator.predict import predict
from simulator.replay import TraceReplay
from simulator.traces import load_traces


@dataclass(frozen=True)
class Config:
    """One configuration: how the engine drafts, which calibration trace replays it, and the length
    the simulator's fixed policy verifies (0: vanilla decoding)."""

    name: str
    drafter: str  # "none" for vanilla
    trace: str  # key of the calibration trace (``traces()``); "" for vanilla
    length: int
    settings: tuple[tuple[str, float], ...] = ()  # the drafter's ``make_drafter`` options

    @property
    def options(self) -> dict[str, float]:
        """The drafter options ``make_drafter`` takes."""
        return dict(self.settings)


TREE = 16  # drafted nodes of every tree configuration: the simulator's LENGTH_CAP


def make_config(name: str, drafter: str, trace: str, length: int, **options: float) -> Config:
    """``Config`` with the drafter's options as keywords."""
    return Config(name, drafter, trace, length, tuple(options.items()))


def ngram_configs(tree: int) -> tuple[Config, ...]:
    """n-gram lookup's chain of 4."""
    return (make_config("n-gram 4", "ngram", "ngram-4", 4, depth=4),)


def draft_model_configs(tree: int) -> tuple[Config, ...]:
    """The draft model's chains of 2, 4 and 6 and its 4x3 top-k tree."""
    chains = (make_config(f"draft-model chain {d}", "draft-model", f"chain-{d}", d, depth=d)
              for d in (2, 4, 6))
    return (*chains, make_config(f"draft-model tree 4x3 ({tree} nodes)", "draft-model", "tree-4x3", tree,
                                 depth=4, width=3, budget=tree))


def specblock_configs(tree: int) -> tuple[Config, ...]:
    """SpecBlock with 1, 2 and 3 block forwards."""
    return tuple(make_config(f"specblock M={m} ({tree} nodes)", "specblock", f"specblock-{m}", tree, blocks=m,
                             budget=tree) for m in (1, 2, 3))


def eagle_configs(tree: int) -> tuple[Config, ...]:
    """EAGLE's trees 2, 4 and 6 deep."""
    return tuple(make_config(f"eagle depth {d} ({tree} nodes)", "eagle", f"eagle-{d}", tree, depth=d,
                             budget=tree) for d in (2, 4, 6))


def medusa_configs(tree: int) -> tuple[Config, ...]:
    """Medusa's static tree."""
    return (make_config(f"medusa ({tree} nodes)", "medusa", "medusa", tree, budget=tree),)


def configs() -> tuple[Config, ...]:
    """Vanilla, then every registered drafter's configurations (its ``fidelity`` entry point)."""
    return (Config("vanilla", "none", "", 0),
            *(c for spec in registry.values() if spec.fidelity for c in spec.load("fidelity")(TREE)))


def traces() -> dict[str, dict[str, Any]]:
    """The calibration traces the configurations replay: key -> the drafter and its options."""
    return {c.trace: {"drafter": c.drafter, **c.options} for c in configs() if c.trace}


def draft_shape(config: Config, shapes: Sequence[Mapping[str, float]] = ()) -> Any:
    """How the simulator costs ``config``'s drafting (``SpecLengthBatch``'s ``draft_shape``), by the drafter's
    registered cost keys: a tree (width > 1) of a drafter with a tree series costs that series; a tree of a
    depth-costed drafter its depth; a block drafter's data-dependent tree its recorded ``shapes``; anything
    else (a chain, a one-call drafter) None."""
    if config.drafter == VANILLA:
        return None
    options, spec = config.options, drafter_spec(config.drafter)
    if spec.tree_keys and (options.get("width") or 1) > 1:
        return {key: options[key] for key in spec.tree_keys}
    if spec.chain == "depth" and options.get("budget"):
        return {"depth": options["depth"]}
    if spec.chain == "block":
        if not shapes:
            raise InputError(f"{config.name}: no recorded {config.drafter} drafting shapes: record its "
                             "calibration trace here instead of passing it with --traces")
        return list(shapes)
    return None


def simulate(profile: Any, traces: Any, config: Config, prompts: Sequence[Any], tokens: int, queries: int,
             seed: int, shape: Any = None, policy: Any = None, observed: Any = None,
             decision_seconds: float = 0.0) -> dict[str, float]:
    """The simulator's tokens/s, tau and mean iteration seconds for ``config`` on prompts like ``prompts``
    (drafting costed by ``shape``, see ``draft_shape``; ``policy`` chooses the lengths instead of the
    config's fixed length, when given, and is shown the step times of ``observed``, the profile it was
    deployed with, when that is not ``profile``; each of its decisions costs ``decision_seconds``)."""
    replay = TraceReplay.from_traces(traces)
    domains = [p.domain for p in prompts]
    weights = {d: domains.count(d) for d in replay.domains if d in domains}
    lengths = [len(p.tokens) for p in prompts]
    kind = "ngram" if config.drafter == "none" else config.drafter  # T(0) is vanilla for every kind
    options = {"tokens_per_query": tokens, "prompt_tokens": (min(lengths), max(lengths)),
               "domain_weights": weights, "draft_shape": shape, "steered": policy is not None,
               "observed": observed}
    out = predict(policy or make_policy("fixed", {"length": config.length}), profile, replay, kind,
                  queries=queries, seed=seed, env_options=options,
                  rollout_options={"decision_seconds": decision_seconds}).outcome
    return {"tokens_per_second": out.tokens_per_second, "tau": out.tau,
            "iteration_seconds": out.seconds / out.iterations,
            "draft_seconds": out.draft_seconds / out.iterations}


def calibration_costs(profile: Any, traces: Any, config: Config, shape: Any = None) -> dict[str, float]:
    """Where the time of ``config``'s calibration iterations goes, measured (the trace's wall seconds)
    against the profile's prediction for the same iterations (drafted sizes and contexts), and the
    trace's own tau: it separates a cost error from a difference between the prompt halves."""
    rows = traces[traces["iteration"] > 0]
    drafted = rows["depths"].map(len).to_numpy()
    context = rows["context_length"].to_numpy(dtype=np.float64)
    kind = "ngram" if config.drafter == "none" else config.drafter
    whole = None if shape is None else float(profile.draft_row(kind, 1, shape)[1])
    draft = np.array([whole if whole is not None else profile.chain_draft_seconds(kind, int(n))
                      for n in drafted])
    verify = np.where(drafted > 0, profile.verify_seconds(drafted + 1, context),
                      profile.vanilla_seconds(context))
    return {"tau": float(rows["accepted"].mean()) + 1.0,
            "draft_ms": 1e3 * float(rows["draft_seconds"].mean()),
            "predicted_draft_ms": 1e3 * float(draft.mean()),
            "verify_ms": 1e3 * float(rows["verify_seconds"].mean()),
            "predicted_verify_ms": 1e3 * float(verify.mean())}


class StepClock:
    """An ``on_tokens`` callback noting wall time, process CPU time and the tokens of every step."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float, int]] = []

    def __call__(self, new: list[int]) -> None:
        self.steps.append((time.perf_counter(), time.process_time(), len(new)))


def steady_state(clocks: Sequence[StepClock]) -> dict[str, Any]:
    """Decode throughput after each query's first step (which also prefills the drafter's own cache),
    on the wall clock and the CPU clock, with tau over the same steps."""
    tokens = sum(n for c in clocks for _, _, n in c.steps[1:])
    iterations = sum(len(c.steps) - 1 for c in clocks)
    out: dict[str, Any] = {"tokens": tokens, "iterations": iterations, "tau": tokens / iterations}
    for index, name in enumerate(("wall", "cpu")):
        seconds = sum(c.steps[-1][index] - c.steps[0][index] for c in clocks if c.steps)
        out[name] = {"tokens_per_second": tokens / seconds, "iteration_seconds": seconds / iterations}
    return out


@dataclass
class Engine:
    """The loaded models and decoding settings the configurations run with."""

    target: Any
    draft: Any
    eos_id: int | None
    max_new_tokens: int
    seed: int
    model: ModelSpec | None = None  # whose trained drafters the configurations run (None: none)

    def drafter_factory(self, config: Config | Mapping[str, Any]) -> Callable[[], Any] | None:
        """A builder of fresh drafters for a config (or a ``traces()`` entry); None for vanilla; InputError
        when the engine cannot build the drafter (no weights trained for the model)."""
        name = config.drafter if isinstance(config, Config) else config["drafter"]
        options = config.options if isinstance(config, Config) else {
            k: v for k, v in config.items() if k != "drafter"}
        if name == "none":
            return None
        folder = None
        if drafter_spec(name).trained:
            if self.model is None:
                raise InputError(f"no model to take the trained {name} drafter from: give the engine one")
            folder = drafter_folder(self.model, name)
        make_drafter(name, self.target, self.draft, folder=folder, **options)
        return lambda: make_drafter(name, self.target, self.draft, folder=folder, **options)

    def trace(self, prompts: Sequence[Any], spec: Mapping[str, Any]) -> tuple[Any, list[dict[str, float]]]:
        """Traces of decoding ``prompts`` with the drafter of a ``traces()`` entry (a DataFrame of
        ``simulator.traces``), and the drafting shapes it recorded (SpecBlock's; empty for others)."""
        factory, shapes = self.drafter_factory(spec), []

        def build() -> Any:
            drafter = factory()
            if hasattr(drafter, "shapes"):
                drafter.shapes = shapes  # record SpecBlock's drafting shapes
            return drafter

        traces = record(self.target, prompts, build, spec["drafter"], max_new_tokens=self.max_new_tokens,
                        eos_id=self.eos_id, seed=self.seed).traces
        return traces, shapes

    def measure(self, prompts: Sequence[Any], configs: Sequence[Config],
                log: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
        """Decode ``prompts`` with every config, round-robin (each prompt by every config in turn, so a
        change of load on a shared machine touches all configs alike); config name -> ``steady_state``."""
        factories = {c.name: self.drafter_factory(c) for c in configs}
        clocks: dict[str, list[StepClock]] = {c.name: [] for c in configs}
        for i, prompt in enumerate(prompts):
            log(f"engine: prompt {i + 1}/{len(prompts)} with {len(configs)} configurations")
            for name, factory in factories.items():
                clocks[name].append(StepClock())
                generate(self.target, list(prompt.tokens), drafter=None if factory is None else factory(),
                         max_new_tokens=self.max_new_tokens, eos_id=self.eos_id, seed=self.seed + i,
                         on_tokens=clocks[name][-1])
        return {name: steady_state(c) for name, c in clocks.items()}


@dataclass
class Calibration:
    """Calibration traces by ``traces()`` key, the block drafters' shapes recorded with them, and what was
    skipped."""

    traces: dict[str, Any]
    shapes: dict[str, list[dict[str, float]]]
    skipped: list[dict[str, str]]


def calibrate(engine: Engine, calibration: Sequence[Any], configs: Sequence[Config],
              recorded: Mapping[str, Any] | None = None,
              log: Callable[[str], None] = lambda _: None) -> Calibration:
    """Record the calibration traces ``configs`` replay, except those ``recorded`` already holds."""
    out = Calibration(dict(recorded or {}), {}, [])
    for key in sorted({c.trace for c in configs if c.trace} - set(out.traces)):
        try:
            log(f"calibration trace {key} ({len(calibration)} prompts)")
            out.traces[key], out.shapes[key] = engine.trace(calibration, traces()[key])
        except InputError as err:
            out.skipped.append({"trace": key, "reason": str(err)})
    return out


def run_fidelity(engine: Engine, profile: Any, clock: str, calibration: Calibration,
                 evaluation: Sequence[Any], configs: Sequence[Config], queries: int = 512,
                 log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run every configuration in the engine on ``evaluation`` and in the simulator from its
    ``calibration`` trace; compare the prediction with the throughput measured on ``clock`` (the
    profile's clock)."""
    traces, shapes, skipped, rows = calibration.traces, calibration.shapes, list(calibration.skipped), []
    any_trace = next(iter(traces.values()), None)
    other = "wall" if clock == "cpu" else "cpu"
    sources = {c.name: traces.get(c.trace) if c.trace else any_trace for c in configs}
    skipped += [{"config": name, "reason": "its calibration trace could not be recorded"}
                for name, source in sources.items() if source is None]
    runnable = [c for c in configs if sources[c.name] is not None]
    measured = engine.measure(evaluation, runnable, log)
    for config in runnable:
        real = measured[config.name]
        shape = draft_shape(config, shapes.get(config.trace, ()))
        sim = simulate(profile, sources[config.name], config, evaluation, engine.max_new_tokens, queries,
                       engine.seed, shape)
        own = traces.get(config.trace)
        rows.append({
            "name": config.name, "drafter": config.drafter, "trace": config.trace, "length": config.length,
            **config.options, "measured": real, "predicted": sim,
            "calibration": None if own is None else calibration_costs(profile, own, config, shape),
            "draft_shape": shape if not isinstance(shape, list) else _mean_shape(shape),
            "error": sim["tokens_per_second"] / real[clock]["tokens_per_second"] - 1.0,
            f"error_{other}_clock": sim["tokens_per_second"] / real[other]["tokens_per_second"] - 1.0,
            "tau_error": sim["tau"] / real["tau"] - 1.0,
            "iteration_seconds_error": sim["iteration_seconds"] / real[clock]["iteration_seconds"] - 1.0})
    base = next((r for r in rows if r["drafter"] == "none"), None)
    for r in rows if base is not None else []:
        measured_base = base["measured"][clock]["tokens_per_second"]
        r["measured_speedup"] = r["measured"][clock]["tokens_per_second"] / measured_base
        r["predicted_speedup"] = r["predicted"]["tokens_per_second"] / base["predicted"]["tokens_per_second"]
        r["speedup_error"] = r["predicted_speedup"] / r["measured_speedup"] - 1.0
    errors = [abs(r["error"]) for r in rows]
    speedup = [abs(r["speedup_error"]) for r in rows if "speedup_error" in r and r is not base]
    return {"clock": clock, "configs": rows, "skipped": skipped,
            "median_abs_error": statistics.median(errors) if errors else None,
            "worst_abs_error": max(errors) if errors else None,
            "median_abs_speedup_error": statistics.median(speedup) if speedup else None,
            "worst_abs_speedup_error": max(speedup) if speedup else None}


def markdown(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The fidelity table as markdown."""
    clock = result["clock"]
    other = "wall" if clock == "cpu" else "cpu"
    lines = ["# Simulator fidelity: predicted vs measured decode throughput", "",
             f"Profile `{meta['profile']}` ({clock} clock); {meta['calibration']} calibration and "
             f"{meta['evaluation']} evaluation prompts; {meta['max_new_tokens']} new tokens per prompt; "
             f"greedy; {meta['threads']} torch thread(s). Measured: steady-state decode (each query's steps "
             f"after the first) on the {clock} clock; the {other}-clock error is shown for reference. "
             "Speedup: tokens/s over vanilla decoding's in the same run (engine) or simulator.", "",
             f"| configuration | measured tok/s | predicted tok/s | error | {other}-clock error "
             "| measured speedup | predicted speedup | speedup error | measured tau | predicted tau "
             "| measured ms/iter | predicted ms/iter |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["configs"]:
        m, p = r["measured"], r["predicted"]
        speed = "- | - | -"
        if "speedup_error" in r:
            speed = (f"{r['measured_speedup']:.3f} | {r['predicted_speedup']:.3f} | "
                     f"{100 * r['speedup_error']:+.1f}%")
        lines.append(f"| {r['name']} | {m[clock]['tokens_per_second']:.1f} | {p['tokens_per_second']:.1f} | "
                     f"{100 * r['error']:+.1f}% | {100 * r[f'error_{other}_clock']:+.1f}% | {speed} | "
                     f"{m['tau']:.2f} | {p['tau']:.2f} | {1e3 * m[clock]['iteration_seconds']:.2f} | "
                     f"{1e3 * p['iteration_seconds']:.2f} |")
    if result["median_abs_error"] is not None:
        lines += ["", f"Tokens/s: median absolute error {100 * result['median_abs_error']:.1f}%, worst "
                      f"{100 * result['worst_abs_error']:.1f}%."]
    if result.get("median_abs_speedup_error") is not None:
        lines.append(f"Speedup over vanilla: median absolute error "
                     f"{100 * result['median_abs_speedup_error']:.1f}%, worst "
                     f"{100 * result['worst_abs_speedup_error']:.1f}%.")
    costed = [r for r in result["configs"] if r.get("calibration")]
    if costed:
        lines += ["", "Calibration iterations (the traces the simulator replays; wall clock): their own tau "
                      "beside the evaluation prompts' tau, and their mean draft and verify milliseconds "
                      "against the profile's for the same sizes and contexts.", "",
                  "| configuration | calibration tau | evaluation tau | draft ms | profile draft ms "
                  "| verify ms | profile verify ms |", "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['name']} | {c['tau']:.2f} | {r['measured']['tau']:.2f} | {c['draft_ms']:.2f} | "
                  f"{c['predicted_draft_ms']:.2f} | {c['verify_ms']:.2f} | {c['predicted_verify_ms']:.2f} |"
                  for r in costed for c in [r["calibration"]]]
    lines.append("")
    lines += [f"- skipped {s.get('config') or s.get('trace')}: {s['reason']}" for s in result["skipped"]]
    return "\n".join(lines) + "\n"


def given_traces(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=FILE`` arguments as calibration traces, checked against the drafter each key expects."""
    out = {}
    for item in items:
        key, _, path = item.partition("=")
        keys = traces()
        if key not in keys or not path:
            raise InputError(f"--traces {item!r}: write KEY=FILE with KEY one of {', '.join(keys)}")
        recorded = load_traces(path)
        if set(recorded["drafter"]) != {keys[key]["drafter"]}:
            raise InputError(f"--traces {item}: recorded with {sorted(set(recorded['drafter']))}, but {key} "
                             f"needs the {keys[key]['drafter']} drafter: pass a matching trace")
        out[key] = recorded
    return out


def _mean_shape(shapes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each parameter over recorded shapes (for the report)."""
    return {k: statistics.fmean(s[k] for s in shapes) for k in shapes[0]}
