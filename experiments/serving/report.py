"""How `specblock serve-bench` and the serving study read: their tables, for the command's own ``.md``
and for docs/results.md (``RENDERERS``)."""

from __future__ import annotations

from core.models import TOY, registry
from core.paths import repo_relative
from experiments.cli import model_result
from experiments.report_format import Lines, Record, Renderer, flag, interval, listed, table

BENCH_DEFAULTS = {"requests": 16, "tokens": 32, "rounds": 4, "max_batch": 4, "prompts": 8}


def bench_command(name: str, config: Record) -> str:
    """The serve-bench command line that writes results file ``name`` with ``config``."""
    model = config.get("model", TOY.name)  # files written before configs named their model: the toy's
    spec = registry.get(model)
    steering = None if spec is None or spec.serve_profile is None else repo_relative(spec.serve_profile)
    lengths = f" --lengths {config['lengths']}"  # its default depends on the prompt sets: always named
    model_flags = (flag("--model", model, TOY.name)
                   + flag("--steering-profile", config.get("steering_profile", steering), steering))
    default_name = model_result("serve_bench", model)
    if config.get("quick"):
        return f"specblock serve-bench{model_flags} --quick{lengths}{flag('--name', name, default_name)}"
    line = f"specblock serve-bench{model_flags} --rates {listed(config['rates'])}"
    for key, default in BENCH_DEFAULTS.items():
        line += flag(f"--{key.replace('_', '-')}", config[key], default)
    line += lengths
    line += "".join(f" --policy {path}" for path in config.get("policy_files", []))
    return line + flag("--name", name, default_name)


def _ratio(cell: Record | None) -> str:
    return "-" if cell is None else interval(cell["ratio"], cell["ratio_ci"], ".2f")


def _requests(config: Record) -> str:
    """What the requests were: their prompts and output lengths, as set and as drawn."""
    drawn = config["drawn_lengths"]

    def spread(part: str) -> str:
        return f"{drawn[part]['mean']:.1f} tokens on average, {drawn[part]['min']} to {drawn[part]['max']}"

    if config["lengths"] == "fixed":
        output = f"{config['tokens']} new tokens each (fixed lengths)"
    else:
        output = (f"each asking for as many new tokens as the dataset's answer to its prompt holds, capped "
                  f"at {config['tokens']} (dataset lengths, as vLLM's serving benchmark: {spread('output')})")
    return (f"{config['requests']} requests per round ({config['prompts']} held-out prompts per domain, "
            f"each cut to its last {config['context_tokens']} tokens: {spread('prompt')}), {output}")


def _vocab(config: Record) -> str:
    """Which tokens the draft model drafts, when not every one (results before it was recorded: every one)."""
    vocab = config.get("draft_vocab")
    return "" if vocab is None else f" (drafting its {vocab:,} most frequent tokens)"


def bench_body(record: Record) -> Lines:
    """Per arrival rate: every setting's live figures beside the simulator's, and the fidelity."""
    results, config = record["results"], record["config"]
    policies = results["policies"]
    rates = list(next(iter(policies.values()))["rates"])
    lines = [
        f"{_requests(config)}, greedy, batch cap {config['max_batch']}, {config['rounds']} rounds of Poisson "
        "arrivals per rate, settings interleaved; draft-model chains"
        f"{_vocab(config)} steered by each serving policy; wall clock, one torch thread. "
        "[95% CI]: bootstrap over rounds (tokens/s) or rounds' requests (TPOT). Ratios: tokens/s over the "
        "named setting's on the same arrivals. Simulated: `SpecServe-v0` on the same arrivals with the cost "
        "profile measured in the same process. Fidelity (median absolute relative error over settings and "
        f"rates): tokens/s {results['fidelity_error']:.3f}, median TPOT "
        f"{results['tpot_fidelity_error']:.3f}.",
        ""]
    for rate in rates:
        rows = []
        for name, p in policies.items():
            c = p["rates"][rate]
            rows.append([name, interval(c["tokens_per_second"], c["tokens_per_second_ci"], ".1f"),
                         f"{c['simulated_tokens_per_second']:.1f} ({c['tokens_per_second_error']:+.1%})",
                         _ratio(p.get("over_none", {}).get(rate)),
                         _ratio(p.get("over_batch-table", {}).get(rate)),
                         interval(c["tpot_ms_p50"], c["tpot_ms_p50_ci"], ".2f"),
                         f"{c['simulated_tpot_ms_p50']:.2f} ({c['tpot_p50_error']:+.1%})",
                         interval(c["tpot_ms_p99"], c["tpot_ms_p99_ci"], ".2f"), f"{c['ttft_ms_p50']:.1f}",
                         f"{c['tau']:.2f} ({c['simulated_tau']:.2f})"])
        lines += [f"Arrival rate {rate} requests/s:", "", *table(
            ["setting", "tokens/s [95% CI]", "simulated (error)", "over none", "over batch-table",
             "TPOT p50 ms", "simulated (error)", "TPOT p99 ms", "TTFT p50 ms", "tau (simulated)"], rows), ""]
    return lines[:-1]


def study_body(record: Record) -> Lines:
    """Per case and load: vanilla's throughput, the best policy's ratio over it, and the p99 TPOT of both;
    the tuned table's lengths by batch size."""
    lines = ["Simulated (SpecServe): every policy tuned with Ray Tune at half the case's capacity, then "
             "served on the same held-out arrivals at each load (arrival rate over the capacity).", ""]
    for row in record["results"]["rows"]:
        rows = []
        for load, vanilla in row["policies"]["vanilla"].items():
            name, best = max(((n, p[load]) for n, p in row["policies"].items() if n != "vanilla"),
                             key=lambda item: item[1]["tokens_per_second"])
            rows.append([load, f"{row['rates'][load]:.2f}", f"{vanilla['tokens_per_second']:.1f}",
                         f"{vanilla['tpot_ms_p99']:.2f}", name, f"{best['over_vanilla']:.3f}",
                         f"{best['tpot_ms_p99']:.2f}"])
        table_line = ", ".join(f"{i}: {row['tuned']['batch-table'][f'l{i}']}"
                               for i in range(1, row["traffic"]["max_batch"] + 1))
        lines += [f"{row['case']}; tuned table, length by batch size: {table_line}.", "", *table(
            ["load", "requests/s", "vanilla tokens/s", "vanilla p99 TPOT ms", "best policy",
             "its tokens/s over vanilla", "its p99 TPOT ms"], rows), ""]
    return lines[:-1]


RENDERERS: dict[str, Renderer] = {
    "serve_bench": Renderer("Serving under load: policies live against the serving simulator", bench_command,
                            bench_body),
    "study_serving": Renderer("Study: speculation under load in simulation",
                            lambda name, config: f"specblock study {config['study']}", study_body),
}
