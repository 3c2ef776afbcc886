"""How each family of results files reads on docs/results.md: the command that wrote it and its key figures.

A :class:`Renderer` per family (the registry ``RENDERERS``, keyed by the file name or its prefix before
an underscore) names the command that writes a file of it, from the file's name and config, and turns its
key figures into a compact markdown table. ``experiments.results_doc`` lays the page out.
"""

from __future__ import annotations

from pathlib import Path

from experiments.adapt_plan import QUICK_SIZES
from experiments.real_model_report import REAL_MODEL_RENDERERS
from experiments.report_format import Lines, Record, Renderer, flag, interval, listed, pairs, table
from experiments.serve_report import SERVE_RENDERERS

# --- the families -----------------------------------------------------------------------------------


def benchmark(module: str) -> str:
    """``specblock benchmark NAME`` for the script ``benchmarks/<module>.py``."""
    return f"specblock benchmark {module}"


def _pipeline_command(name: str, config: Record) -> str:
    full = config["command"] == "specblock pipeline"
    default = "pipeline_full" if full else "pipeline_quick"
    return (f"{benchmark('pipeline_runs')} --runs {config['runs']}{' --full' if full else ''}"
            f"{flag('--tag', name, default)}")


def _pipeline_body(record: Record) -> Lines:
    runs = record["results"]
    count = f"{len(runs)} {'run' if len(runs) == 1 else 'runs'}"
    lines = [f"{count} of `{record['config']['command']}` in a row. Fidelity error: the median over "
             "policies of |predicted / measured - 1| tokens/s; Kendall's tau between the predicted and "
             "measured ranking of the policies.", ""]
    rows = []
    for i, run in enumerate(runs, 1):
        agree = run["rank_agreement"]
        rows.append([i, interval(run["fidelity_error"], run["fidelity_error_ci"], ".1%"),
                     f"{run['worst_policy']} {run['worst_error']:+.1%}", f"{agree['kendall_tau']:.2f}",
                     f"{agree['predicted_best']} / {agree['measured_best']}",
                     "yes" if agree["predicted_best_within_interval"] else "no", f"{run['seconds']:.0f}"])
    lines += table(["run", "fidelity error [95% CI]", "worst policy", "Kendall's tau",
                    "predicted / measured best", "predicted best within interval", "seconds"], rows)
    policies = sorted({p for run in runs for p in run["against_best_fixed"]["policies"]})
    lines += ["", "Measured tokens/s of each adaptive policy over the run's best fixed length [95% CI]:", ""]
    header = ["policy", *(f"run {i} (vs {run['against_best_fixed']['best_fixed']})"
                          for i, run in enumerate(runs, 1))]
    rows = []
    for policy in policies:
        cells = [run["against_best_fixed"]["policies"].get(policy) for run in runs]
        rows.append([policy, *(interval(c["ratio"], c["ratio_ci"]) if c else "-" for c in cells)])
    return lines + table(header, rows)


def _fidelity_command(name: str, config: Record) -> str:
    return f"specblock fidelity{flag('--name', name, 'fidelity')}"


def _fidelity_body(record: Record) -> Lines:
    config, result = record["config"], record["results"]
    lines = [f"{config['calibration']} calibration and {config['evaluation']} evaluation prompts, "
             f"{config['max_new_tokens']} new tokens, greedy, profile `{Path(config['profile']).name}` "
             f"({result['clock']} clock). Tokens/s error: median {result['median_abs_error']:.1%}, worst "
             f"{result['worst_abs_error']:.1%}; speedup error: median "
             f"{result['median_abs_speedup_error']:.1%}, worst {result['worst_abs_speedup_error']:.1%}.", ""]
    rows = [[c["name"], f"{c['measured'][result['clock']]['tokens_per_second']:.1f}",
             f"{c['predicted']['tokens_per_second']:.1f}", f"{c['error']:+.1%}",
             f"{c['measured_speedup']:.3f}", f"{c['predicted_speedup']:.3f}",
             f"{c['measured']['tau']:.2f}", f"{c['predicted']['tau']:.2f}"] for c in result["configs"]]
    return lines + table(["configuration", "measured tok/s", "predicted tok/s", "error", "measured speedup",
                          "predicted speedup", "measured tau", "predicted tau"], rows)


def _bench_command(name: str, config: Record) -> str:
    counts = sorted(set(config["domains"].values()))
    prompts = f" --prompts {counts[0]}" if len(counts) == 1 else ""
    return (f"specblock bench --drafters {listed(config['drafters'])}"
            f" --verifiers {listed(config['verifiers'])} --temperatures {listed(config['temperatures'])}"
            f" --shapes {listed(config['shapes'])} --domains {listed(list(config['domains']))}{prompts}"
            f" --max-new-tokens {config['max_new_tokens']}{flag('--threads', config.get('threads'))}"
            f"{' --trained-shapes' if config['trained_shapes'] else ''}"
            f"{' --no-hf' if config.get('hf_assisted') is None else ''}"
            f"{flag('--tag', name.removeprefix('bench_'), 'bench')}")


def _config_label(row: Record) -> str:
    return "/".join(str(row[key]) for key in ("drafter", "shape", "verifier") if row[key]) + (
        f" + {row['policy']}" if row.get("policy") else "")


def _bench_body(record: Record) -> Lines:
    rows = record["results"]["rows"]
    domains = list(record["config"]["domains"])
    speedups = {(_config_label(r), r["temperature"], r["domain"]): r["speedup"] for r in rows}
    lines = ["Speedup: tokens/s over vanilla decoding's in the same run, all domains pooled, then per "
             "domain; tau: new tokens per target forward; draft ms: the drafter's time per iteration.", ""]
    out = []
    for r in (r for r in rows if r["domain"] == "all"):
        label = _config_label(r)
        per_domain = [speedups.get((label, r["temperature"], d)) for d in domains]
        out.append([f"{r['temperature']:g}", label, f"{r['tau']:.2f}", f"{r['tokens_per_second']:.1f}",
                    f"{r['speedup']:.2f}x", *("-" if s is None else f"{s:.2f}x" for s in per_domain),
                    f"{r['draft_ms']:.2f}", "yes" if r.get("greedy_identical") else "-"])
    return lines + table(["T", "configuration", "tau", "tok/s", "speedup", *domains, "draft ms",
                          "greedy identical"], out)


def _adapt_live_command(name: str, config: Record) -> str:
    plan = config["plan"]  # files written before the paper's stream plan no query count
    quick = plan["queries"] in QUICK_SIZES if "queries" in plan else name.endswith("_quick")
    overlap = str(config.get("clock", "")).startswith("wall clock")  # trained beside decoding
    default = f"adapt_live{'_quick' if quick else ''}{'_overlap' if overlap else ''}"
    return f"specblock adapt-live{' --quick' if quick else ''}{' --overlap' if overlap else ''}" \
           f"{flag('--name', name, default)}"


def _adapt_live_body(record: Record) -> Lines:
    plan, figures = record["config"]["plan"], record["results"].get("figures")
    if figures is not None:
        return _adapt_stream_body(plan, record["results"], figures)
    # written before the paper's stream: code queries first, then the domains in turn
    lines = [f"Stream: {plan['first']} code queries, then {plan['mixed']} mixed, {plan['max_new_tokens']} "
             "new tokens each; measured live against the simulator's AdaptStream (sim). Shifted tau: the "
             "non-code queries of the first against the second half of the mixed phase.", ""]
    rows = []
    for policy, entry in record["results"]["policies"].items():
        m, s = entry["measured"], entry["simulated_summary"]
        rows.append([policy, f"{m['tokens_per_second']:.1f}", f"{s['tokens_per_second']:.1f}",
                     f"{m['tau']:.3f}", f"{s['tau']:.3f}",
                     f"{m['shifted_tau_early']:.3f} -> {m['shifted_tau_late']:.3f}",
                     f"{entry['updates']['head']}/{entry['updates']['full']}"])
    return lines + table(["policy", "tokens/s", "sim", "tau", "sim", "shifted tau early -> late",
                          "updates (head/full)"], rows)


def _adapt_stream_body(plan: Record, results: Record, figures: Record) -> Lines:
    mix = results["mix"]
    prompts = ", ".join(f"{d} {n}" for d, n in results["prompts"].items())
    lines = [f"Stream: {plan['queries']} queries, equal shares of the domains, the mix shifting after query "
             f"{plan['shift']} (toward {', '.join(mix['shifted'])}), {plan['min_new_tokens']} to "
             f"{plan['max_new_tokens']} new tokens each; distinct held-out prompts per domain: {prompts} "
             "(reused in order when the stream needs more). Measured live, tokens/s with update seconds "
             "charged [95% CI: bootstrap over the queries within each domain], against the simulator's "
             "AdaptStream (sim). Shifted tau: the shifted domains' queries in the first against the second "
             f"half after the shift. Fidelity error (median |sim / measured - 1|): "
             f"{figures['fidelity_error']:.1%}.", ""]
    adjusted = all("tokens_per_second_at_never_speed" in f for f in figures["policies"].values())
    if adjusted:
        lines[0] += (" At never's speed: each query's seconds divided by the machine's slowness there over "
                     "the never stream's, from the re-timings between queries (the policies serve in turn "
                     "while the machine drifts): an adjustment, not a measurement.")
    rows = []
    for policy, f in figures["policies"].items():
        rows.append([policy, interval(f["tokens_per_second"], f["tokens_per_second_ci"], ".1f"),
                     *([interval(f["tokens_per_second_at_never_speed"],
                                 f["tokens_per_second_at_never_speed_ci"], ".1f")] if adjusted else []),
                     f"{f['simulated_tokens_per_second']:.1f}", f"{f['simulated_error']:+.1%}",
                     f"{f['tau']:.3f}", f"{f['simulated_tau']:.3f}",
                     f"{f['shifted_tau_early']:.3f} -> {f['shifted_tau_late']:.3f}",
                     f"{f['updates']['head']}/{f['updates']['full']}", f"{f['update_seconds']:.1f}"])
    return lines + table(["policy", "tokens/s [95% CI]", *(["at never's speed"] if adjusted else []), "sim",
                          "sim error", "tau", "sim", "shifted tau early -> late", "updates (head/full)",
                          "update s"], rows)


def _study_command(name: str, config: Record) -> str:
    return f"specblock study {config['study']}"


STUDY_LENGTH_POLICIES = ("libraspec", "threshold (tuned)", "heuristic (tuned)")


def _study_length_body(record: Record) -> Lines:
    config = record["config"]
    lines = [f"Simulated tokens/s on {config['held_queries']} held-out queries, policies tuned with Ray Tune "
             f"({config['samples']} configurations per kind on {config['tune_queries']} other queries); the "
             "policies' cells are ratios to the best fixed length, chosen with hindsight.", ""]
    rows = [[r["case"], r["traffic"], f"{r['vanilla']:.2f}",
             f"{r['best_fixed']:.2f} ({r['best_fixed_length']})",
             *(f"{r['tokens_per_second'][p] / r['best_fixed']:.3f}" for p in STUDY_LENGTH_POLICIES)]
            for r in record["results"]["rows"]]
    return lines + table(["case", "traffic", "vanilla", "best fixed (n)", *STUDY_LENGTH_POLICIES], rows)


def _study_adapt_body(record: Record) -> Lines:
    config = record["config"]
    lines = [f"AdaptStream: {config['held_streams']} held-out streams of {config['queries']} queries; ratio: "
             "mean over streams of tokens/s over `never`'s on the same stream (+- standard error).", ""]
    rows = [[r["policy"], f"{r['tokens_per_second']:.2f}", f"{r['tau']:.3f}",
             f"{r['ratio_to_never']:.4f} +- {r['ratio_stderr']:.4f}"] for r in record["results"]["rows"]]
    return lines + table(["policy", "tokens/s", "tau", "ratio to never"], rows)


def _breakeven_command(name: str, config: Record) -> str:
    return (f"{benchmark('adapt_breakeven')}{' --quick' if config['quick'] else ''}"
            f"{flag('--profile', config['profile'])}")


def _breakeven_factor(edge: Record, seconds: Record) -> str:
    if edge["factor"] is None:
        return {"below": "never pays on the grid", "above": "pays on the whole grid"}[edge["status"]]
    return (f"{edge['factor']:.3g}x (head {edge['factor'] * seconds['head']:.3g} s, full "
            f"{edge['factor'] * seconds['full']:.3g} s)")


def _breakeven_body(record: Record) -> Lines:
    config = record["config"]
    lines = [f"AdaptStream, {config['seeds']} streams per point (common random numbers): the cost-aware "
             "bandit's tokens/s over never's against the profile's update seconds scaled by a factor; "
             "break-even: the factor where the mean gain falls through 1 (head and full seconds on a full "
             "buffer there); shown up to: every 95% interval above 1 up to that factor."]
    for m in record["results"]["maps"]:
        lines += ["", f"{m['label']}:", "", *table(
            ["stream length", "break-even factor", "shown up to"],
            [[e["length"], _breakeven_factor(e, m["update_seconds"]),
              "-" if e["shown_up_to"] is None else f"{e['shown_up_to']:.3g}x"] for e in m["break_even"]])]
        live = [f"- live `{r['name']}`: {r['stream_length']} queries at {r['factor']:.2f}x the profile's "
                f"update cost: measured gain {r['measured_gain']:.3f}, map {r['map_gain']:.3f}"
                for r in m.get("live", []) if r["placed"]]
        lines += ["", *live] if live else []
    return lines


def _shapes_command(name: str, config: Record) -> str:
    return (f"specblock shapes --drafters {listed(config['drafters'])}"
            f" --domains {listed(config['domains'])} --prompts {config['prompts']}"
            f" --rounds {config['rounds']} --max-new-tokens {config['max_new_tokens']}"
            f"{flag('--drafters-dir', config.get('drafters_dir', 'data/models'), 'data/models')}"
            f"{flag('--threads', config['threads'], 1)}{flag('--tag', name, 'shapes')}"
            f"{' --apply' if config.get('apply') else ''}")


def _shapes_body(record: Record) -> Lines:
    result = record["results"]
    lines = [f"Greedy, round-robin with vanilla decoding ({result['vanilla_tokens_per_second']:.1f} "
             "tokens/s). Speedup: median over prompts of vanilla's time over the shape's (quartiles beside "
             "it). With `--apply` the command saves each fastest shape as the drafter's `drafting.json`.", ""]
    rows = []
    for drafter, shapes in sorted(result["drafters"].items()):
        best = shapes[0]
        rows.append([drafter, len(shapes), pairs(best["shape"]), f"{best['tokens_per_second']:.1f}",
                     interval(best["speedup"], best["speedup_quartiles"], ".2f"), f"{best['tau']:.2f}"])
    return lines + table(["drafter", "shapes measured", "fastest shape", "tokens/s", "speedup [quartiles]",
                          "tau"], rows)


def _lp_solve_time_command(name: str, config: Record) -> str:
    return (f"{benchmark('lp_solve_time')}{flag('--instances', config['instances'], 2)}"
            f"{flag('--time-budget', config['time_budget_s'], 60.0)}")


def _lp_solve_time_body(record: Record) -> Lines:
    solvers = sorted({r["solver"] for r in record["results"]})
    cells: dict[tuple[int, int, int], Record] = {}
    for r in record["results"]:
        entry = cells.setdefault((r["vocab"], r["length"], r["drafts"]), {"variables": r["variables"]})
        entry[r["solver"]] = "skipped" if r.get("skipped") else f"{r['seconds_mean']:.3f}"
    lines = ["Mean seconds per solve of the verification LP by vocabulary V, draft length L, drafts K.", ""]
    rows = [[*key, f"{entry['variables']:,}", *(entry.get(s, "-") for s in solvers)]
            for key, entry in sorted(cells.items())]
    return lines + table(["V", "L", "K", "variables", *solvers], rows)


def _multidraft_command(name: str, config: Record) -> str:
    return f"{benchmark('multidraft')}{' --quick' if config['quick'] else ''}"


def _multidraft_body(record: Record) -> Lines:
    result = record["results"]

    def mean(row: Record, column: str) -> str:
        return f"{row['value'][column]['mean']:.3f}"

    lines = ["Expected accepted draft tokens, mean over instances. LP: the bound for K i.i.d. paths, which "
             "token, BV, RRS, SeqBV and GBV draw; RRS without replacement and GDS (greedy draft) draw other "
             "drafts, so each is shown with the LP bound of its own draft law. GBV < BV: instances where GBV "
             "accepts less than single-path BV.", ""]
    rows = [[r["source"], r["vocab"], r["length"], r["drafts"], r["instances"], mean(r, "lp"),
             *(mean(r, c) for c in ("token", "block", "rrs", "seqbv", "gbv")),
             f"{mean(r, 'rrs_wor')} ({mean(r, 'lp_wor')})", f"{mean(r, 'gds')} ({mean(r, 'lp_gds')})",
             r["gbv_below_bv"]["count"]] for r in result["cells"]]
    lines += table(["source", "V", "L", "K", "n", "LP", "token", "BV", "RRS", "SeqBV", "GBV",
                    "RRS w/o repl. (its LP)", "GDS (its LP)", "GBV < BV"], rows)
    lines += ["", *(f"- {source}, K >= 2: GBV below BV on {s['gbv_below_bv']} of {s['instances']} "
                    f"instance-cells; GDS above the i.i.d. LP on {s['gds_over_lp']}, at its own bound on "
                    f"{s['gds_at_own_bound']}." for source, s in result["overall"].items())]
    return lines


def _verifier_latency_command(name: str, config: Record) -> str:
    return (f"{benchmark('verifier_latency')} --repeats {config['repeats']} --warmup {config['warmup']}"
            f" --device {config['device']} --threads {config['threads']}")


def _verifier_latency_body(record: Record) -> Lines:
    rows = [[r["verifier"], r["shape"], r["nodes"], f"{r['vocab']:,}", f"{r['median_ms']:.3f}",
             f"{r['p10_ms']:.3f} to {r['p90_ms']:.3f}"] for r in record["results"]]
    return table(["verifier", "shape", "nodes", "vocabulary", "median ms", "p10 to p90 ms"], rows)


def _batch_throughput_command(name: str, config: Record) -> str:
    batches = ",".join(map(str, config["batches"]))
    return (f"{benchmark('batch_throughput')}{flag('--batches', batches, '1,2,4,8')}"
            f"{flag('--drafters', ','.join(config['drafters']), 'none,specblock')}"
            f"{' --alone' if config.get('alone') else ''}"
            f"{flag('--prompts', config['prompts_per_domain'], 4)}{flag('--tokens', config['tokens'], 32)}"
            f"{flag('--rounds', config['rounds'], 5)}")


def _batch_throughput_body(record: Record) -> Lines:
    rows = [[r["batch"], r["drafter"], interval(r["tokens_per_second"], r["tokens_per_second_ci"], ".1f"),
             interval(r["speedup"], r["speedup_ci"], ".2f") if "speedup" in r else "1",
             f"{r['tpot_ms']:.2f}", f"{r['ttft_ms']:.1f}", f"{r['tau']:.2f}"]
            for r in record["results"]["settings"]]
    return ["The batched engine (continuous batching), every prompt submitted at once; speedup over vanilla "
            "at the same batch cap, paired by round [95% CI over the rounds]. A drafter's chains draft in "
            "lockstep across requests; \"alone\": each request's drafter proposes by itself.", "",
            *table(["batch cap", "drafter", "tokens/s", "speedup", "TPOT ms", "TTFT ms", "tau"], rows)]


def _drafter_pair_command(name: str, config: Record) -> str:
    return (f"{benchmark('drafter_pair')}{flag('--prompts', config['prompts_per_domain'], 16)}"
            f"{flag('--tokens', config['tokens'], 64)}"
            f"{flag('--drafters-dir', config['drafters_dir'], 'data/models/fair')}")


def _drafter_pair_body(record: Record) -> Lines:
    results = record["results"]
    rows = [[f"{p['temperature']:g}", p["vocab"], p["shape"],
             interval(p["speedup_ratio"], p["speedup_ratio_ci"]),
             interval(p["draft_time_ratio"], p["draft_time_ratio_ci"]),
             interval(p["a100_speedup_ratio"], p["a100_speedup_ratio_ci"])] for p in results["relative"]]
    speed = {(r["drafter"], r["temperature"], r["vocab"], r["shape"]): r for r in results["settings"]}
    own = [[f"{t:g}", v, s, *(interval(speed[(d, t, v, s)]["speedup"], speed[(d, t, v, s)]["speedup_ci"])
                              for d in ("specblock", "eagle"))]
           for (d0, t, v, s) in speed if d0 == "specblock"]
    paper = results["paper"]
    low, high = paper["ratios"]["speedup_ratio"]
    d_low, d_high = paper["ratios"]["draft_time_ratio"]
    return ["SpecBlock and EAGLE-style trained alike, at equal vocabulary, depth and node budget; [95% CI] "
            "over the prompts. A100: simulated, this run's acceptance on the paper-derived profile; the "
            f"paper reports a speedup ratio of {low:g} to {high:g} at {d_low:g} to {d_high:g} of EAGLE-3's "
            "drafting time, while its own taus and shares on that profile give SpecBlock "
            f"{paper['on_profile']['specblock']:.2f}x against EAGLE-3 {paper['on_profile']['eagle']:.2f}x.",
            "",
            *table(["T", "vocabulary", "shape", "speedup ratio", "drafting time ratio",
                    "A100 speedup ratio (simulated)"], rows), "",
            *table(["T", "vocabulary", "shape", "SpecBlock speedup", "EAGLE-style speedup"], own)]


def _rollout_speed_command(name: str, config: Record) -> str:
    return f"{benchmark('rollout_speed')}{flag('--seconds', config['seconds_per_measurement'], 3.0)}"


def _rollout_speed_body(record: Record) -> Lines:
    rows = [[r["env"], r["acceptance"], r["policy"], r["path"], f"{r['num_envs']:,}",
             f"{r['per_second']:,.0f} {r['unit']}",
             f"{r['vs_single_env']:.0f}x" if "vs_single_env" in r else "-"] for r in record["results"]]
    return ["Simulator steps per second; vs one env: over a single Gymnasium environment's rate.", "",
            *table(["environment", "acceptance", "policy", "path", "envs", "per second", "vs one env"], rows)]


def _forward_cost_command(name: str, config: Record) -> str:
    return (f"{benchmark('forward_cost')} --repeats {config['repeats']} --target {config['target']}"
            f" --draft {config['draft']} --alpha {listed(config['alpha'])}"
            f"{flag('--tag', name, 'forward_cost')}")


def _forward_cost_body(record: Record) -> Lines:
    result = record["results"]
    ms, share = result["median_ms"], result["products_share"]
    lines = [f"Median milliseconds per forward (context {record['config']['context']}): "
             + ", ".join(f"{key} {value:.3f}" for key, value in ms.items())
             + f". Matrix products' share of a step: target {share['target']:.2f}, "
             f"draft {share['draft']:.2f}.",
             "", "Speedup bound of a draft chain (c: a draft forward over a target step; v: a verify over a "
             "step):", ""]
    rows = [[drafter, b["depth"], f"{b['expected_tokens']:.3f}", f"{b['c']:.3f}", f"{b['v']:.3f}",
             f"{b['speedup_bound']:.3f}"] for drafter, bounds in result["bounds"].items() for b in bounds]
    return lines + table(["draft forward", "depth", "expected tokens", "c", "v", "speedup bound"], rows)


def _cpu_linear_command(name: str, config: Record) -> str:
    return f"{benchmark('cpu_linear')} --repeats {config['repeats']} --threads {config['threads']}"


def _cpu_linear_body(record: Record) -> Lines:
    rows = [[r["weight"], "x".join(map(str, r["shape"])), r["rows"], f"{r['linear_us']:.0f}",
             f"{r['fbgemm_fp16_us']:.0f}", f"{r['fbgemm_ratio']:.2f}x"] for r in record["results"]]
    return table(["weight", "shape", "rows", "fp32 linear us", "packed fp16 us", "faster by"], rows)


def _engine_command(name: str, config: Record) -> str:
    quick = " --quick" if config["quick"] else ""
    return f"{benchmark('engine')}{quick}{flag('--threads', config['threads'], 1)}"


def _engine_body(record: Record) -> Lines:
    config, rows = record["config"], record["results"]
    of = {kind: [r for r in rows if r["benchmark"] == kind]
          for kind in ("decode_step", "tree_verify", "overhead")}
    lines = [f"A random-weight target of {config['target_parameters']:,} parameters; decode: "
             f"{config['new_tokens']} new tokens.", ""]
    lines += table(["dtype", "ours ms", "transformers loop ms", "transformers generate ms", "greedy match"],
                   [[r["dtype"], f"{r['ours_ms']:.1f}", f"{r['transformers_loop_ms']:.1f}",
                     f"{r['transformers_generate_ms']:.1f}", "yes" if r["greedy_tokens_match"] else "no"]
                    for r in of["decode_step"]])
    lines += ["", *table(["tree nodes", "verify forward ms", "over one node"],
                         [[r["nodes"], f"{r['forward_ms']:.1f}", f"{r['relative_to_one_node']:.2f}"]
                          for r in of["tree_verify"]])]
    return [*lines, "", *table(
        ["drafter", "shape", "verifier", "T", "loop overhead share", "draft share"],
        [[r["drafter"], pairs(r["shape"]) or "-", r["verifier"], f"{r['temperature']:g}",
          f"{r['overhead_share']:.3f}", f"{r['draft_share']:.3f}"] for r in of["overhead"]])]


def _checkout_ab_command(name: str, config: Record) -> str:
    return (f"{benchmark('checkout_ab')} BASE --drafters {listed(config['drafters'])} --domains "
            f"{listed(config['domains'])} --prompts {config['prompts']} --max-new-tokens "
            f"{config['max_new_tokens']}{flag('--name', name, 'checkout_ab')}")


def _checkout_ab_body(record: Record) -> Lines:
    config = record["config"]
    lines = ["Two checkouts alternated prompt by prompt in two worker processes: base "
             f"`{config['base_commit'][:12]}`, candidate `{config['candidate_commit'][:12]}`.", ""]
    rows = [[r["drafter"], f"{r['base']['tokens_per_s']:.1f}", f"{r['candidate']['tokens_per_s']:.1f}",
             f"{r['candidate_over_base']:.2f}x", f"{r['candidate']['tau']:.2f}"] for r in record["results"]]
    return lines + table(["drafter", "base tok/s", "candidate tok/s", "candidate / base", "tau"], rows)


def _mutation_command(name: str, config: Record) -> str:
    return f"{benchmark('mutation')}{flag('--budget-minutes', config['budget_minutes'], 40.0)}"


def _mutation_body(record: Record) -> Lines:
    keys = ("mutants", "killed", "survived", "timeout", "no tests", "not run")
    rows = [[f"`{module}`", *(m[k] for k in keys)] for module, m in record["results"]["modules"].items()]
    return [f"mutmut {record['config']['mutmut']}; each module against its own tests.", "",
            *table(["module", *keys], rows)]


RENDERERS: dict[str, Renderer] = {
    **REAL_MODEL_RENDERERS,
    "pipeline": Renderer("The main job's fidelity, run after run", _pipeline_command, _pipeline_body),
    "fidelity": Renderer("Simulator fidelity: predicted against measured throughput", _fidelity_command,
                         _fidelity_body),
    "bench": Renderer("Benchmark of the drafters and verifiers", _bench_command, _bench_body),
    "shapes": Renderer("Drafter shapes (what `generate` and `bench` deploy)", _shapes_command, _shapes_body),
    "adapt_live": Renderer("Live online adaptation against the simulator", _adapt_live_command,
                           _adapt_live_body),
    "study_length": Renderer("Study: length policies in simulation", _study_command, _study_length_body),
    "study_adapt": Renderer("Study: adaptation policies in simulation", _study_command, _study_adapt_body),
    "adapt_breakeven": Renderer("When does adaptation pay? Break-even in simulation", _breakeven_command,
                                _breakeven_body),
    "lp_solve_time": Renderer("LP solve time", _lp_solve_time_command, _lp_solve_time_body),
    "multidraft": Renderer("Multi-draft verification against the LP bound", _multidraft_command,
                           _multidraft_body),
    "verifier_latency": Renderer("Verifier latency", _verifier_latency_command, _verifier_latency_body),
    "batch_throughput": Renderer("Continuous batching: throughput by batch size", _batch_throughput_command,
                                 _batch_throughput_body),
    "drafter_pair": Renderer("SpecBlock against EAGLE-style on equal terms", _drafter_pair_command,
                             _drafter_pair_body),
    "rollout_speed": Renderer("Simulator rollout speed", _rollout_speed_command, _rollout_speed_body),
    "forward_cost": Renderer("Forward cost and the draft chain's speedup bound", _forward_cost_command,
                             _forward_cost_body),
    "cpu_linear": Renderer("Packed half-precision linears on CPU", _cpu_linear_command, _cpu_linear_body),
    "engine": Renderer("Engine against transformers", _engine_command, _engine_body),
    "checkout_ab": Renderer("Checkout A/B", _checkout_ab_command, _checkout_ab_body),
    "mutation": Renderer("Mutation testing", _mutation_command, _mutation_body),
    **SERVE_RENDERERS,
}
