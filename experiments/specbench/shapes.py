"""Each drafter's shape, tuned for this machine: how much to speculate per step.

A drafter's best shape depends on what a drafter forward and a verify cost here, not on the drafter
alone: on a small CPU a deeper or wider tree can cost more per iteration than its extra accepted tokens
save (each shape's figures: ``benchmarks/results/shapes.json``, docs/results.md, "Drafter shapes"). So
each shape of ``shape_grids()`` decodes the calibration prompts (the first half of
``data/prompts/<domain>.jsonl``; the benchmark's held-out half is never seen), greedy, round-robin with
vanilla decoding: every prompt runs vanilla, then every shape, so the machine's drift touches all of
them alike. A shape's speedup is the median over those runs of vanilla's time over the shape's on the
same prompt, measured moments apart (a shared machine's speed drifts within minutes, which pooled
tokens/s would mix in); its quartiles show the spread, and the pooled tokens/s ratio is kept beside it.
``apply`` saves each drafter's fastest shape as its folder's ``drafting.json``, the shape
``make_drafter`` (and so ``generate``, and for the trained drafters ``bench`` and ``trace``) uses when
no option is given.
The draft model's shapes (chains and top-k trees) are tuned the same way; its ``drafting.json`` lies
in the draft model's folder. Shapes timed in a dtype other than the model's own are saved for runs in
that dtype alone (``drafters.trained.shape_file``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from core.errors import InputError
from core.files import write_text
from core.names import drafter_spec, registry
from core.paths import repo_relative
from experiments.provenance import save_result
from real_engine.decode import generate, make_drafter
from real_engine.drafters.trained import shape_name, trained_available, write_shape
from real_engine.model import load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts

SPECBLOCK_SHAPES = (*({"blocks": m, "budget": n} for m in (1, 2) for n in (8, 16, 32)),
                    *({"blocks": m, "width": 1, "budget": n} for m, n in ((1, 3), (1, 4), (2, 6), (2, 8))))
"""SpecBlock's block forwards (M) and drafted nodes, as trees or as chains (width 1)."""
EAGLE_SHAPES = tuple({"depth": d, "width": w, "budget": n}
                     for d, w, n in ((2, 1, 2), (2, 2, 4), (3, 1, 3), (4, 1, 4), (3, 2, 6), (4, 2, 8),
                                     (3, 4, 16), (5, 4, 24)))
"""EAGLE's depth, top-k and total tokens."""
MEDUSA_SHAPES = tuple({"budget": n} for n in (2, 4, 8, 16, 24))
"""Medusa's static-tree nodes."""
NGRAM_SHAPES = tuple({"depth": d, "max_ngram": n} for d in (2, 4, 6, 8, 12) for n in (2, 3, 4))
"""n-gram lookup's chain depth and longest n-gram: a deployed shape for a model lies in its drafters'
``ngram/`` folder (no weights: the lookup has none)."""
DRAFT_MODEL_SHAPES = (*({"depth": d, "width": 1} for d in (1, 2, 3, 4)),
                      *({"depth": d, "width": 1, "min_confidence": c}
                        for d, c in ((4, 0.5), (6, 0.7), (6, 0.9))),
                      *({"depth": d, "width": 1, "min_confidence": c, "vocab": v}
                        for d, c, v in ((1, 0, 2048), (1, 0, 4096), (6, 0.9, 4096))),
                      *({"depth": d, "width": 1, "staged": f} for d, f in ((4, 4), (6, 1), (8, 1), (6, 2))),
                      *({"depth": d, "width": 1, "staged": f, "lookup": m}
                        for d, f, m in ((6, 1, 3), (8, 1, 3), (8, 1, 2), (8, 2, 3))),
                      *({"depth": d, "width": 1, "vocab": 2048} for d in (2, 3, 4)),
                      *({"depth": d, "width": 1, "staged": f, "lookup": m, "vocab": 2048}
                        for d, f, m in ((6, 1, 3), (8, 1, 3), (8, 1, 2), (12, 1, 2))),
                      *({"depth": d, "width": w, "budget": n}
                        for d, w, n in ((2, 2, 4), (3, 2, 6), (4, 4, 16))))
"""The draft model's chain depth (fixed, or at most that deep while its top probability stays at
``min_confidence``), also over only its ``vocab`` most frequent tokens, or guessing ahead by n-gram lookup
within ``staged`` forwards, and then proposing the lookup's chain alone where the context's last ``lookup``
tokens occurred before (over every token or its ``vocab`` most frequent: the head over a real model's
whole vocabulary can cost more than the layers); or its top-k tree's depth, width and nodes."""


def shape_grids() -> dict[str, tuple[dict[str, float], ...]]:
    """The shapes tried per drafter (``make_drafter`` options): every registered drafter's ``shapes``."""
    return {name: tuple(spec.load("shapes")) for name, spec in registry.items() if spec.shapes}


def label(shape: Mapping[str, float]) -> str:
    """``blocks=1 budget=16`` style."""
    return " ".join(f"{k}={v}" for k, v in shape.items())


def sweep(target: Any, prompts: Sequence[Sequence[int]], drafters: Mapping[str, Path],
          grids: Mapping[str, Sequence[Mapping[str, float]]] | None = None, max_new_tokens: int = 48,
          rounds: int = 1, progress: bool = True, draft: Any = None) -> dict[str, Any]:
    """Greedy tokens/s of vanilla and of every shape of every drafter (``name -> folder``; the
    ``draft-model`` drafts with ``draft``) on ``prompts``, measured round-robin; per drafter, its
    shapes' speedup, tau and share of runs whose output equals vanilla's, best first. Options a shape
    leaves out keep the trained settings. A float32 target's output must never change (a
    lossless-decoding bug stops the sweep); a 16-bit one rounds a many-token verify and a one-token step
    differently, so greedy outputs may part at near-ties, and the share says how often."""
    exact = next(iter(target.parameters())).dtype == torch.float32
    if not prompts:
        raise InputError("no prompts to tune on: give at least one per domain")
    grids = shape_grids() if grids is None else grids
    configs = [(name, dict(shape)) for name in drafters for shape in grids[name]]
    built = [make_drafter(name, target, draft, folder=drafters[name], deployed=False, **shape)
             for name, shape in configs]  # each query's begin resets a drafter: one per shape serves all
    seconds, tokens, iterations = [0.0] * (len(configs) + 1), [0] * (len(configs) + 1), [0] * len(configs)
    ratios: list[list[float]] = [[] for _ in configs]  # per run: vanilla's seconds over the shape's
    same = [0] * len(configs)  # runs whose output equals vanilla's
    began = time.perf_counter()
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            vanilla = generate(target, prompt, max_new_tokens=max_new_tokens)
            seconds[-1] += vanilla.stats.seconds
            tokens[-1] += vanilla.stats.new_tokens
            for c, (name, shape) in enumerate(configs):
                out = generate(target, prompt, drafter=built[c], max_new_tokens=max_new_tokens)
                if out.tokens != vanilla.tokens and exact:
                    raise RuntimeError(f"{name} {label(shape)} changed the greedy output: a "
                                       "lossless-decoding bug")
                same[c] += out.tokens == vanilla.tokens
                seconds[c] += out.stats.seconds
                tokens[c] += out.stats.new_tokens
                iterations[c] += out.stats.iterations
                ratios[c].append(vanilla.stats.seconds / out.stats.seconds)
            if progress:
                print(f"[{time.perf_counter() - began:5.0f} s] round {r + 1}/{rounds} prompt "
                      f"{i + 1}/{len(prompts)}", flush=True)
    base = tokens[-1] / seconds[-1]
    out: dict[str, Any] = {"vanilla_tokens_per_second": base, "drafters": {}}
    for c, (name, shape) in enumerate(configs):
        rate, tau = tokens[c] / seconds[c], tokens[c] / iterations[c]
        quartiles = statistics.quantiles(ratios[c], n=4) if len(ratios[c]) > 1 else ratios[c] * 3
        out["drafters"].setdefault(name, []).append({
            "shape": shape, "tokens_per_second": rate, "speedup": statistics.median(ratios[c]),
            "speedup_quartiles": [quartiles[0], quartiles[2]], "pooled_speedup": rate / base, "tau": tau,
            "same_as_vanilla": same[c] / len(ratios[c])})
    for rows in out["drafters"].values():
        rows.sort(key=lambda row: -row["speedup"])
    return out


def markdown(result: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The sweep as a report: one table per drafter, fastest shape first."""
    lines = [f"# Drafter shapes on {config['prompts']} calibration prompts per domain "
             f"({', '.join(config['domains'])}), greedy, {config['max_new_tokens']} tokens", "",
             f"Vanilla: {result['vanilla_tokens_per_second']:.1f} tokens/s, measured round-robin with every "
             "shape. Speedup = median over prompts and rounds of vanilla's time over the shape's on the same "
             "prompt (quartiles beside it); pooled = tokens/s over vanilla's; same = the share of runs whose "
             f"output equals vanilla's (in {config['dtype']}).", ""]
    for name, rows in result["drafters"].items():
        lines += [f"## {name}", "", "| shape | tokens/s | speedup | quartiles | pooled | tau | same |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for i, r in enumerate(rows):
            low, high = r["speedup_quartiles"]
            best = " (best)" if i == 0 else ""
            lines.append(f"| {label(r['shape'])}{best} | {r['tokens_per_second']:.1f} | "
                         f"{r['speedup']:.2f}x | {low:.2f} to {high:.2f} | {r['pooled_speedup']:.2f}x | "
                         f"{r['tau']:.2f} | {r['same_as_vanilla']:.0%} |")
        lines.append("")
    return "\n".join(lines)


def run(model_dir: Path, drafters_dir: Path, names: Sequence[str], domains: Sequence[str], count: int,
        max_new_tokens: int, rounds: int, seed: int, out: Path, tag: str, apply: bool,
        prompts_dir: Path, model: str, progress: bool = True, train_as: str | None = None,
        dtype: str = "float32", own_dtype: bool = True) -> dict[str, Any]:
    """Load (in ``dtype``), sweep, write ``out/<tag>.json`` and ``.md``; with ``apply`` save the best
    shapes, as the drafters' shapes (``own_dtype``: ``dtype`` is the model's own) or as their shapes for
    runs in ``dtype`` alone. The calibration prompts come from ``prompts_dir`` (the model's), ``model``
    names the model in the results, and a missing drafter's fix names ``--model train_as`` when given."""
    tried = shape_grids()
    unknown = [n for n in names if n not in tried]
    if unknown:
        raise InputError(f"no shapes to tune for {unknown[0]!r}: use {', '.join(tried)}")
    uses_draft = {n: drafter_spec(n).needs_draft_model for n in names}  # tuned in the draft model's folder
    folders = {n: drafters_dir / drafter_spec(n).folder for n in names}
    present = {n: (f / "config.json").is_file() if uses_draft[n] else
               trained_available(f) if drafter_spec(n).trained else True for n, f in folders.items()}
    missing = [n for n, ok in present.items() if not ok]
    if missing:
        kind = "draft model" if uses_draft[missing[0]] else f"trained {missing[0]} drafter"
        train = f"{missing[0]} --model {train_as}" if train_as else missing[0]
        raise InputError(f"no {kind} in {folders[missing[0]]}: train it with `specblock train {train}` or "
                         "pass --drafters-dir")
    torch.manual_seed(seed)
    target = load_model(model_dir, dtype)
    draft = next((load_model(folders[n], dtype) for n in names if uses_draft[n]), None)
    tokenizer = Tokenizer.load(model_dir)
    prompts = [list(p.tokens) for p in load_prompts(domains, count, tokenizer.encode, "calibration", 192,
                                                    folder=prompts_dir, chat_encode=tokenizer.chat_encoder())]
    with torch.inference_mode():
        result = sweep(target, prompts, folders, max_new_tokens=max_new_tokens, rounds=rounds,
                       progress=progress, draft=draft)
    config = {"model": model, "model_dir": repo_relative(model_dir),
              "prompts_dir": repo_relative(prompts_dir),
              "drafters": list(names), "domains": list(domains), "prompts": count,
              "max_new_tokens": max_new_tokens, "rounds": rounds, "threads": torch.get_num_threads(),
              "drafters_dir": repo_relative(drafters_dir), "apply": apply, "dtype": dtype,
              "saved_as": shape_name(None if own_dtype else dtype)}
    path = save_result(tag, result, config, seed, out)
    write_text(out / f"{tag}.md", markdown(result, config))
    if apply:
        for name, rows in result["drafters"].items():
            best = rows[0]
            write_shape(name, folders[name], best["shape"],
                        {"speedup": round(best["speedup"], 3), "tau": round(best["tau"], 3), "dtype": dtype,
                         "chosen_by": f"specblock shapes ({path.name}): the fastest of {len(rows)} shapes"},
                        None if own_dtype else dtype)
    return {"path": str(path), **result}
