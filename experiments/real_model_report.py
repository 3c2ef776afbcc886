"""How the real model's results files read on docs/results.md (``REAL_MODEL_RENDERERS``): the engine's
speed and bandwidth on it, the peers beside it, and its parity with transformers' GGUF loader."""

from __future__ import annotations

from experiments.report_format import Lines, Record, Renderer, flag, interval, listed, table


def _model_speed_command(name: str, config: Record) -> str:
    return (f"specblock benchmark model_speed --model {config['model']} --dtypes {listed(config['dtypes'])} "
            f"--contexts {listed(config['contexts'])}{flag('--new-tokens', config['new_tokens'], 32)}"
            f"{flag('--rounds', config['rounds'], 5)}{flag('--threads', config['threads'], 2)}")


def _ci(summary: Record, fmt: str) -> str:
    return interval(summary["mean"], summary["ci"], fmt)


def _model_speed_body(record: Record) -> Lines:
    results = record["results"]
    bw = results["bandwidth"]
    copy, read = (interval(bw[k]["mean"] / 1e9, [c / 1e9 for c in bw[k]["ci"]], ".1f")
                  for k in ("copy", "read"))
    lines = [f"Vanilla greedy decoding; bandwidth measured in the same rounds: a 1 GiB copy {copy} GB/s "
             f"(bytes copied over time), a 1 GiB read-only sum {read} GB/s. The fraction "
             "is the bytes a step must read (weights as its kernels read them, and the KV cache) over its "
             "time, over each.", ""]
    rows = []
    for r in results["rows"]:
        hf = r.get("hf_tokens_per_second")
        rows.append([r["dtype"], r["context"], _ci(r["ours_tokens_per_second"], ".1f"),
                     _ci(hf, ".1f") if hf else "-", _ci(r["speedup_over_hf"], ".2f") if hf else "-",
                     f"{r['bytes_per_token']['total'] / 1e6:.0f}", _ci(r["bandwidth_fraction_copy"], ".2f"),
                     _ci(r["bandwidth_fraction_read"], ".2f"), _ci(r["verify_over_step"]["16"], ".2f")])
    return [*lines, *table(["dtype", "context", "ours tok/s", "transformers tok/s", "ours / transformers",
                            "MB per token", "of copy bandwidth", "of read bandwidth",
                            "16-node verify / step"],
                           rows)]


def _peers_command(name: str, config: Record) -> str:
    return (f"specblock benchmark peers --model {config['model']}{flag('--prompts', config['prompts'], 16)}"
            f"{flag('--new-tokens', config['new_tokens'], 128)}{flag('--threads', config['threads'], 2)}")


def _peers_body(record: Record) -> Lines:
    results = record["results"]
    rows = [[r["engine"], r["prompts"], interval(r["tokens_per_second"], r["tokens_per_second_ci"], ".1f"),
             interval(r["over_vanilla"], r["over_vanilla_ci"], ".2f"), f"{r['new_tokens']:.0f}",
             f"{r['same_tokens_as_vanilla']:.0%}"] for r in results["rows"] if r["category"] == "pooled"]
    notes = [f"Note: {note}" for note in results["notes"]]
    config = record["config"]
    return [f"Greedy, at most {config['new_tokens']} new tokens, {config['threads']} threads, engines "
            "interleaved prompt by prompt; tokens/s over each whole call (prefill included). Pooled over "
            "the categories (per category in the details). \"Same tokens\" is the share of prompts on which "
            "an engine emitted exactly our vanilla decoding's tokens: different kernels round differently, "
            "and a 16-bit model's rounding differs between a one-token step and a many-token verify, so "
            "greedy outputs part at near-ties.", *notes, "",
            *table(["engine", "prompts", "tokens/s", "over our vanilla", "mean new tokens",
                    "same tokens as our vanilla"], rows)]


def _parity_command(name: str, config: Record) -> str:
    return f"specblock benchmark gguf_parity --model {config['model']}"


def _parity_body(record: Record) -> Lines:
    results = record["results"]
    rows = [[r["prompt"], r["prompt_tokens"], "yes" if r["ids_equal"] else "no", f"{r['max_logit_diff']:.2e}",
             f"{r['greedy_agree']}/{results['new_tokens']}"] for r in results["prompts"]]
    return [f"transformers {record['versions'].get('transformers')} loading the GGUF itself against this "
            "engine on the converted folder, float32.", "",
            *table(["prompt", "tokens", "ids equal", "max |logit difference|", "greedy tokens equal"], rows)]


REAL_MODEL_RENDERERS: dict[str, Renderer] = {
    "model_speed": Renderer("The real model: engine speed and memory bandwidth", _model_speed_command,
                            _model_speed_body),
    "peers": Renderer("The real model: the peers a CPU user would pick", _peers_command, _peers_body),
    "gguf_parity": Renderer("The real model: parity with transformers' GGUF loader", _parity_command,
                            _parity_body),
}
