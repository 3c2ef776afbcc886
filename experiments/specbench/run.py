"""The benchmark harness behind `specblock bench`, measured the way Spec-Bench measures.

Every configuration (drafter, draft shape, verifier, temperature) decodes the same prompts of each
category. Per prompt, vanilla decoding runs first and every configuration right after it, so machine
noise hits all alike; one warm-up generation per configuration precedes the measurements. A row's
``speedup`` is the mean over prompts of (tokens/s / vanilla tokens/s on that prompt); ``tau``,
``accepted`` and ``alpha`` pool the iterations of all its prompts. At temperature 0 every output is
checked token for token against vanilla's (``greedy_identical``); at temperature > 0 EOS does not stop a
run, so every configuration decodes the same number of tokens. Length policy files (``--policy``) add
each fitting configuration once more with the policy trimming its drafts (``real_engine.speculate``).
The ``transformers`` peer
(``hf-vanilla``, ``hf-assisted``) is measured in the same interleaved loop (see ``hf_peer``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np
import torch

from core.cost_profile import resolve_profile
from core.errors import InputError
from core.names import VANILLA, drafter_spec
from core.verifiers import default_verifier, fits
from experiments.intervals import REPLICATES, interval, resamples
from policies import policy_from_dict
from real_engine.decode import generate, make_drafter
from real_engine.drafters.base import Drafter
from real_engine.model import Output, Transformer
from real_engine.prompts import PromptRow, read_prompt_set, select_part
from real_engine.speculate import LengthControlled
from real_engine.training.specblock import specblock_loss
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

WARMUP_TOKENS = 8
TEXT_EVERY, TEXT_DEPTH = 16, 8  # real-text acceptance: a draft after every 16th prompt token, 8 deep at most


@dataclass(frozen=True)
class Config:
    """One measured configuration; ``drafter`` ``none`` is vanilla decoding."""

    drafter: str
    shape: str | None
    verifier: str | None
    temperature: float
    policy: str | None = None  # name of a length policy of ``Settings.policies`` trimming each draft

    @property
    def label(self) -> str:
        """A short name such as ``draft-model/tree/rrs`` (``+policy`` when a length policy steers it)."""
        name = "/".join(x for x in (self.drafter, self.shape, self.verifier) if x)
        return f"{name}+{self.policy}" if self.policy else name


@dataclass(frozen=True)
class Settings:
    """Everything a bench run needs besides the loaded models."""

    # category (a prompt set's name, or a prompt file's category) -> its prompts, untokenized
    categories: dict[str, list[PromptRow]]
    drafters: tuple[str, ...] = (VANILLA, "ngram", "draft-model")
    verifiers: tuple[str, ...] = ("greedy", "block", "rrs")
    temperatures: tuple[float, ...] = (0.0, 1.0)
    shapes: tuple[str, ...] = ("chain", "tree")
    max_new_tokens: int = 64
    seed: int = 0
    depth: int = 4
    width: int = 4
    budget: int = 16
    # the draft model's chain options (depth, vocab, min_confidence, staged, lookup), e.g. its deployed shape;
    # None: ``depth``
    chain: dict[str, float] | None = None
    policies: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, policy file content) of length policies
    profile: str | None = None  # the cost profile the policies' features come from
    # also run the trained drafters at the shape they were trained with (shape "trained": SpecBlock's 2
    # blocks, EAGLE's saved tree, Medusa's static tree), the deep trees of the papers, beside the deployed one
    trained_shapes: bool = False
    # at T = 0 run every listed verifier that fits a shape, not only the greedy one: each must reproduce
    # vanilla's output (``greedy_identical``), the losslessness check on a real model
    every_verifier: bool = False


@dataclass
class Measurement:
    """One generation: its tokens and the figures rows are built from."""

    tokens: tuple[int, ...]
    seconds: float
    draft_seconds: float
    iterations: int  # target forwards that emitted tokens
    accepted: tuple[int, ...] | None = None  # per iteration (engine only)
    depths: tuple[int, ...] | None = None  # draft depth per iteration (engine only)
    draft_calls: int | None = None  # drafter model forwards in the whole generation

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of wall time."""
        return len(self.tokens) / self.seconds


@dataclass
class Recorder:
    """Wraps a drafter to record each proposal's depth and count its model's forwards, so rows can
    report acceptance by chain position and drafter calls per iteration."""

    inner: Drafter
    counter: list[int] = field(default_factory=lambda: [0])  # shared forward count of the drafter's model
    depths: list[int] = field(default_factory=list)
    calls: int = 0

    @property
    def model_seconds(self) -> float:
        """The wrapped drafter's model time (read by the decode loop)."""
        return self.inner.model_seconds

    def reset(self) -> None:
        """Forget the previous generation's records."""
        self.depths, self.calls = [], 0

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Delegate; forwards run here are prefill, not drafting, and are not counted."""
        self.inner.begin(prompt, target, sampling, generator, max_length)

    def propose(self, max_depth: int) -> DraftTree:
        """Delegate, recording the tree's depth and the model forwards it took."""
        before = self.counter[0]
        tree = self.inner.propose(max_depth)
        self.calls += self.counter[0] - before
        self.depths.append(int(tree.depths.max()))
        return tree

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Delegate, counting any model forwards the drafter runs while committing."""
        before = self.counter[0]
        self.inner.accept(path, token, target)
        self.calls += self.counter[0] - before


def load_prompts(folder: Path, categories: Sequence[str] | None, count: int) -> dict[str, list[PromptRow]]:
    """The first ``count`` prompts of each category's ``<folder>/<category>.jsonl`` (all categories there
    when ``categories`` is None): of its evaluation split where its rows carry splits (the real prompt
    sets), else of the whole file."""
    if count < 1:
        raise InputError(f"--prompts is {count}: give at least 1 prompt per category")
    present = sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []
    if not present:
        raise InputError(f"no <category>.jsonl prompt sets in {folder}: pass --prompts-dir DIR or run "
                         "`specblock train tokenizer`")
    chosen = list(categories) if categories else present
    unknown = [c for c in chosen if c not in present]
    if unknown:
        raise InputError(f"unknown category {unknown[0]!r}: use some of {', '.join(present)}")
    prompts: dict[str, list[PromptRow]] = {}
    for category in chosen:
        path = folder / f"{category}.jsonl"
        rows = read_prompt_set(path, category)
        if any(row.split is not None for row in rows):
            rows = select_part(rows, "evaluation", path)
        if not rows:
            raise InputError(f"{path} holds no prompts: add JSON lines with a \"text\" field")
        prompts[category] = rows[:count]
    return prompts


def plan(settings: Settings, available: Sequence[str], hf: bool, chains: Collection[str] = (),
         model: str | None = None) -> tuple[list[Config], list[str]]:
    """The configurations to measure at each temperature (vanilla first) and notes on what was left out.

    ``available`` names the drafters that can run (trained weights present); at T = 0 every drafter
    uses the greedy verifier (each listed one that fits, with ``settings.every_verifier``), at T > 0 each
    sampling verifier of ``settings.verifiers`` that fits its
    draft shape (the draft model drafts ``settings.shapes``; the trained drafters (SpecBlock, EAGLE,
    Medusa) top-k trees, but those named in ``chains`` deploy a chain, which they sample at T > 0; with
    ``settings.trained_shapes`` they also run at their training shape, a top-k tree; the others, n-gram
    among them, chains). A note on a drafter left out names the command training it for ``model`` (how
    ``--model`` names it), when given.
    """
    configs, notes = [], []
    for drafter in settings.drafters:
        if drafter != VANILLA and drafter not in available:
            fix = f" (`specblock train {drafter} --model {model}` trains it)" if model else ""
            notes.append(f"{drafter}: no trained weights, skipped{fix}")
    for t in settings.temperatures:
        configs.append(Config(VANILLA, None, None, t))
        for drafter in (d for d in settings.drafters if d != VANILLA and d in available):
            spec = drafter_spec(drafter)
            shapes = settings.shapes if spec.needs_draft_model else (
                ("tree",) if spec.trained and drafter not in chains else ("chain",))
            if spec.trained and settings.trained_shapes:
                shapes = (*shapes, "trained")
            for shape in shapes:
                drafted = "tree" if shape == "trained" else shape  # a trained drafter trains on a top-k tree
                if t == 0 and settings.every_verifier:
                    fit = tuple(v for v in settings.verifiers if v in fits(drafted, True) + fits(drafted))
                else:
                    fit = ((default_verifier(t, drafted),) if t == 0
                           else tuple(v for v in settings.verifiers if v in fits(drafted)))
                configs.extend(Config(drafter, shape, v, t) for v in fit)
                if shape != "paths":  # trimming K sampled paths by confidence would bias them
                    configs.extend(Config(drafter, shape, v, t, name)
                                   for v in fit for name, _ in settings.policies)
                if not fit:
                    notes.append(f"{drafter}/{shape} at T={t:g}: none of the verifiers "
                                 f"{','.join(settings.verifiers)} fits a {shape}, skipped")
        if hf:
            configs.append(Config("hf-vanilla", None, None, t))
            configs.append(Config("hf-assisted", "chain", "greedy" if t == 0 else "token", t))
    return configs, notes


def stop_token(config: Config, eos_id: int | None) -> int | None:
    """EOS stops greedy runs only: sampled runs decode every requested token, so configurations that
    draw different samples still compare over the same number of tokens."""
    return eos_id if config.temperature == 0 else None


def alpha(accepted: Sequence[int], depths: Sequence[int]) -> list[float | None]:
    """Acceptance by chain position: for i = 1..max depth, the fraction of iterations with accepted
    length >= i among those with accepted length >= i - 1 whose draft reached depth i."""
    out: list[float | None] = []
    for i in range(1, max(depths, default=0) + 1):
        reached = sum(1 for a, d in zip(accepted, depths, strict=True) if a >= i - 1 and d >= i)
        passed = sum(1 for a in accepted if a >= i)
        out.append(passed / reached if reached else None)
    return out


class Engine:
    """Our engine's side of the bench: the target, the draft model and one recorded drafter per config."""

    def __init__(self, target: Transformer, draft: Transformer | None, drafters_dir: Path,
                 settings: Settings, eos_id: int | None, draft_dir: Path | None = None) -> None:
        self.target, self.draft, self.dir, self.s, self.eos_id = target, draft, drafters_dir, settings, eos_id
        self.draft_dir = draft_dir  # the draft model's folder: its token order, for a reduced vocabulary
        self.recorders: dict[Config, Recorder] = {}
        self.counters: dict[int, list[int]] = {}

    def _counter(self, drafter: Drafter) -> list[int]:
        """A forward counter on the drafter's model (one hook per module, shared by its configs)."""
        module = getattr(drafter, "model", None)
        module = getattr(drafter, "net", None) if module is None else module
        if not isinstance(module, torch.nn.Module):
            return [0]
        if id(module) not in self.counters:
            count = self.counters[id(module)] = [0]
            module.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        return self.counters[id(module)]

    def _build(self, config: Config) -> Drafter:
        s, spec = self.s, drafter_spec(config.drafter)
        if spec.trained:
            drafter = make_drafter(config.drafter, self.target, folder=self.dir / config.drafter,
                                   deployed=config.shape != "trained")
        elif spec.needs_draft_model:
            chain = config.shape == "chain" and s.chain is not None
            options = dict(s.chain) if chain else {"depth": s.depth}
            drafter = make_drafter(config.drafter, self.target, self.draft, folder=self.draft_dir,
                                   deployed=False, width=s.width if config.shape == "tree" else 1,
                                   budget=s.budget, paths=s.width if config.shape == "paths" else 1,
                                   **options)
        else:  # a drafter without weights or draft model: the bench's draft depth, where it takes one
            depth = s.depth if "depth" in spec.options else None
            drafter = make_drafter(config.drafter, self.target, depth=depth)
        if config.policy is None:
            return drafter

        policy = policy_from_dict(dict(s.policies)[config.policy], seed=s.seed, source=config.policy)
        return LengthControlled(drafter, policy, resolve_profile(s.profile), config.drafter)

    def run(self, config: Config, prompt: list[int], seed: int, max_new_tokens: int) -> Measurement:
        """Decode ``prompt`` with ``config``."""
        recorder = None
        if config.drafter != VANILLA:
            if config not in self.recorders:
                inner = self._build(config)
                self.recorders[config] = Recorder(inner, self._counter(getattr(inner, "drafter", inner)))
            recorder = self.recorders[config]
            recorder.reset()
        result = generate(self.target, prompt, drafter=recorder, verifier=config.verifier or "greedy",
                          sampling=Sampling(config.temperature), max_new_tokens=max_new_tokens,
                          eos_id=stop_token(config, self.eos_id), seed=seed)
        st = result.stats
        return Measurement(result.tokens, st.seconds, st.draft_seconds if recorder else 0.0, st.iterations,
                           st.accepted,
                           tuple(recorder.depths) if recorder else (0,) * st.iterations,
                           recorder.calls if recorder else 0)


@torch.inference_mode()
def agreement(target: Transformer, draft: Transformer, prompts: Sequence[list[int]]
              ) -> dict[str, float | int]:
    """Teacher-forced top-1 agreement of the draft model with the target over the prompts' tokens."""
    agree = total = 0
    device = target.lm_head.weight.device
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        agree += int((target(x).logits.argmax(-1) == draft(x).logits.argmax(-1)).sum())
        total += len(ids)
    return {"top1": agree / total, "tokens": total}


def text_acceptance(engine: Engine, configs: Sequence[Config], prompts: dict[str, list[list[int]]],
                    seed: int = 0, every: int = TEXT_EVERY) -> dict[str, dict[str, dict[str, Any]]]:
    """Each T = 0 greedy drafter's acceptance on real held-out text: a draft after every ``every``-th
    token of each prompt, the text before it as the context, verified against the target's top tokens
    (at most ``TEXT_DEPTH`` deep). Per config label and category (and ``all``): ``alpha`` by position,
    ``tau`` (one plus the mean accepted length) and ``drafts``. The decoding rows draft after the target's
    own output, which is easier to predict; this is the teacher-forced view of the same drafter. Trained
    drafters draft here at the shape they were trained with (``shape="trained"``: SpecBlock's 2 blocks,
    EAGLE's saved tree), not their deployed one, so every position they learnt is seen."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for config in configs:
        if (config.drafter == VANILLA or config.drafter.startswith("hf-") or config.temperature != 0
                or config.verifier != "greedy" or config.policy or config.label in out
                or config.shape == "trained"):  # the deployed shape's row already drafts at this one
            continue
        deep = replace(config, shape="trained") if drafter_spec(config.drafter).trained else config
        firsts = {category: [engine.run(deep, ids[:t], seed, TEXT_DEPTH + 1)
                             for ids in items for t in range(every, len(ids), every)]
                  for category, items in prompts.items()}
        firsts["all"] = [m for runs in firsts.values() for m in runs]
        out[config.label] = {}
        for category, runs in firsts.items():
            accepted, depths = [m.accepted[0] for m in runs], [m.depths[0] for m in runs]
            out[config.label][category] = {"alpha": alpha(accepted, depths), "drafts": len(runs),
                                           "tau": 1 + fmean(accepted) if runs else None}
    return out


@torch.inference_mode()
def rank_confusion(target: Transformer, net: Any, prompts: Sequence[list[int]], seed: int = 0,
                   top_k: int = 32) -> dict[str, Any]:
    """SpecBlock's rank head, teacher-forced on the prompts' real text: the confusion counts of the
    target token's rank bucket in the draft law (rows) against the predicted bucket (columns), over
    the valid-prefix positions of M = 2 blocks started at every position (the training loss's view)."""
    device = target.lm_head.weight.device
    generator = torch.Generator().manual_seed(seed)
    total = None
    for ids in prompts:
        if len(ids) < 3:
            continue
        tokens = torch.tensor([ids], device=device)
        out = target(tokens)
        top = out.logits.float().log_softmax(-1).topk(min(top_k, out.logits.shape[-1]), dim=-1)
        batch = {"tokens": tokens, "features": out.features.float(), "topk_logp": top.values,
                 "topk_ids": top.indices}
        starts = torch.arange(len(ids) - 1, device=device)
        slots = torch.randint(0, net.config.block_size, (1, starts.numel()), generator=generator).to(device)
        counts = torch.tensor(specblock_loss(net, batch, starts, slots)[1]["confusion"])
        total = counts if total is None else total + counts
    if total is None:
        raise InputError("no prompt has 3 tokens or more: give longer prompts for the rank-head confusion")
    positions = int(total.sum())
    return {"confusion": total.tolist(), "positions": positions,
            "accuracy": float(total.diagonal().sum()) / max(positions, 1)}


def summarize(config: Config, category: str, runs: Sequence[Measurement], base: Sequence[Measurement],
              hf_base: Sequence[Measurement] | None = None, categories: Sequence[str] | None = None
              ) -> dict[str, Any]:
    """One row from a config's measurements and vanilla's on the same prompts; for ``hf-assisted``,
    ``hf_base`` (HF's plain generate) is also the reference its greedy output must match. ``speedup_ci``
    is the 95% bootstrap interval of the speedup over the prompts, resampled within each of ``categories``
    (each run's category; default all ``category``)."""
    new = sum(len(m.tokens) for m in runs)
    iters = sum(m.iterations for m in runs)
    engine = runs[0].accepted is not None
    accepted = [a for m in runs for a in m.accepted] if engine else []
    depths = [d for m in runs for d in m.depths] if engine else []
    calls = [m.draft_calls for m in runs]
    ratios = np.array([m.tokens_per_second / b.tokens_per_second for m, b in zip(runs, base, strict=True)])
    reference = hf_base if config.drafter == "hf-assisted" and hf_base is not None else base
    strata = categories or [category] * len(runs)
    row: dict[str, Any] = {
        "drafter": config.drafter, "shape": config.shape, "verifier": config.verifier,
        "policy": config.policy,
        "temperature": config.temperature, "category": category, "prompts": len(runs), "new_tokens": new,
        "tau": new / iters,
        "tokens_per_second": new / sum(m.seconds for m in runs),
        "speedup": float(ratios.mean()),
        "speedup_ci": interval(ratios[resamples(strata, REPLICATES, 0)].mean(1)),
        "draft_share": sum(m.draft_seconds for m in runs) / sum(m.seconds for m in runs),
        "draft_ms": 1e3 * sum(m.draft_seconds for m in runs) / iters,  # drafting time per iteration
        "accepted": fmean(accepted) if engine else new / iters - 1,
        "draft_calls": sum(calls) / iters if None not in calls else None,
        "alpha": alpha(accepted, depths) if engine else None,
        "greedy_identical": (all(m.tokens == b.tokens for m, b in zip(runs, reference, strict=True))
                             if config.temperature == 0 else None),
    }
    if hf_base is not None:
        row["hf_speedup"] = fmean(m.tokens_per_second / b.tokens_per_second
                                  for m, b in zip(runs, hf_base, strict=True))
    return row


def run_bench(settings: Settings, engine: Engine, prompts: dict[str, list[list[int]]],
              configs: Sequence[Config], hf: Any = None, advance: Callable[[str], None] = lambda _: None
              ) -> dict[str, Any]:
    """Warm up, then measure every config interleaved with vanilla, prompt by prompt; return rows
    (per category and over ``all`` categories) and the per-prompt figures."""

    def measure(config: Config, ids: list[int], seed: int, max_new: int) -> Measurement:
        if config.drafter.startswith("hf-"):
            return hf.run(config, ids, seed, max_new, stop_token(config, engine.eos_id))
        return engine.run(config, ids, seed, max_new)

    first = next(iter(prompts.values()))[0]
    for config in configs:
        measure(config, first, settings.seed, min(WARMUP_TOKENS, settings.max_new_tokens))
        advance(f"warm-up {config.label} T={config.temperature:g}")
    results: dict[tuple[Config, str], list[Measurement]] = {}
    per_prompt = []
    for t in settings.temperatures:
        group = [c for c in configs if c.temperature == t]
        for category, items in prompts.items():
            for j, ids in enumerate(items):
                for config in group:
                    m = measure(config, ids, settings.seed + j, settings.max_new_tokens)
                    results.setdefault((config, category), []).append(m)
                    per_prompt.append({"config": config.label, "temperature": t, "category": category,
                                       "prompt": j, "new_tokens": len(m.tokens), "seconds": m.seconds,
                                       "iterations": m.iterations})
                    advance(f"{category} #{j} {config.label} T={t:g}")
    rows = []
    for t in settings.temperatures:
        group = [c for c in configs if c.temperature == t]
        vanilla, hf_plain = group[0], next((c for c in group if c.drafter == "hf-vanilla"), None)
        for category in [*prompts, "all"]:
            def get(c: Config, k: str = category) -> list[Measurement]:
                return [m for each in (prompts if k == "all" else [k]) for m in results[(c, each)]]

            labels = [k for k in (prompts if category == "all" else [category]) for _ in prompts[k]]
            for config in group:
                hf_base = get(hf_plain) if config.drafter.startswith("hf-") and hf_plain else None
                rows.append(summarize(config, category, get(config), get(vanilla), hf_base, labels))
    return {"rows": rows, "per_prompt": per_prompt}
