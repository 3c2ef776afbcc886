"""The report of ``experiments.adapt.live``: the markdown tables (with how the simulator charged drafting,
updates and the re-timed decoding) and the per-query plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.files import atomic_write
from core.models import TOY
from experiments.adapt.plan import QUICK_SIZES, result_name
from experiments.adapt.predict import mean_shape
from experiments.adapt.serve import pooled, with_samples
from experiments.report_format import Lines, Record, Renderer, flag, interval, table
from simulator.adaptation import ADAPT_FITTED


def markdown(result: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The results table."""
    plan, mix = config["plan"], result["mix"]
    prompts = ", ".join(f"{d} {n}" for d, n in result["prompts"].items())
    figures = result["figures"]
    start, end = mix["queries"]
    lines = [
        "# Live online adaptation vs the simulator (AdaptStream)",
        "",
        f"Stream: {plan['queries']} queries in {len(mix['phases'])} phases ({phase_text(mix['phases'])}); "
        f"each query generates {plan['min_new_tokens']} to {plan['max_new_tokens']} new tokens (drawn with "
        f"the seed), greedy. Held-out prompts per domain: {prompts} (reused in order when the stream needs "
        f"more). SpecBlock drafter `{config['drafter']}` (tree: {config['draft']}); {config['clock']}. "
        f"Shifted tau: the {', '.join(mix['shifted'])} queries of the first vs the second half of queries "
        f"{start + 1}-{end} (the phase after the first shift). Tokens/s charge update seconds; [95% CI]: "
        "bootstrap over the stream's queries, resampled within each domain. Fidelity error (median |sim / "
        f"measured - 1|): {figures['fidelity_error']:.1%}.",
        "",
        "| policy | tokens/s [95% CI] | sim | sim error | tau | sim | shifted tau early -> late | sim | "
        "updates (head/full) | update s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, entry in result["policies"].items():
        m, s, f = entry["measured"], entry["simulated_summary"], figures["policies"][kind]
        low, high = f["tokens_per_second_ci"]
        lines.append(
            f"| {kind} | {f['tokens_per_second']:.1f} [{low:.1f}, {high:.1f}] | "
            f"{s['tokens_per_second']:.1f} | "
            f"{f['simulated_error']:+.1%} | {m['tau']:.3f} | "
            f"{s['tau']:.3f} | {m['shifted_tau_early']:.3f} -> {m['shifted_tau_late']:.3f} | "
            f"{s['shifted_tau_early']:.3f} -> {s['shifted_tau_late']:.3f} | {entry['updates']['head']}/"
            f"{entry['updates']['full']} | {f['update_seconds']:.1f} |"
        )
    adjusted = {kind: f for kind, f in figures["policies"].items() if "tokens_per_second_at_never_speed" in f}
    if adjusted:
        lines += ["", "At the `never` stream's machine speed (an adjustment for the drift between the "
                  "streams, not a measurement: each query's seconds divided by the machine's slowness there "
                  "over the `never` stream's, from the re-timings): " + "; ".join(
                      f"{kind} {f['tokens_per_second_at_never_speed']:.1f} "
                      f"[{f['tokens_per_second_at_never_speed_ci'][0]:.1f}, "
                      f"{f['tokens_per_second_at_never_speed_ci'][1]:.1f}]" for kind, f in adjusted.items())
                  + " tokens/s."]
    lines += ["", "Drafting per policy: the shapes each policy's drafter ran (its rank head decides them, "
              "and updates retrain it), the profile's drafting time at them, and the engine's time per "
              "iteration.",
              "", "| policy | block forwards | start nodes | profile draft ms | engine ms/iter |",
              "|---|---|---|---|---|"]
    for kind, entry in result["policies"].items():
        d, rows = entry["drafted"], entry["rows"]
        per_iteration = sum(r["query_seconds"] for r in rows) / sum(r["iterations"] for r in rows)
        lines.append(f"| {kind} | {d['blocks']:.2f} | {d['starts']:.2f} | {d['draft_ms']:.2f} | "
                     f"{1e3 * per_iteration:.2f} |")
    fit = result["fit"]
    lines += [
        "",
        "Simulator error (sim / measured - 1; per-query MAPE of the seed-averaged prediction; no factor "
        "fitted to the measured speed). Drafting is costed at the SpecBlock shapes the `never` stream "
        f"ran (mean {result['simulator_profile']['draft_shape']['blocks']:.2f} block forwards, "
        f"{result['simulator_profile']['draft_shape']['starts']:.2f} start nodes per later block); "
        + update_text(result["simulator_profile"]),
        "",
        *([text, ""] if (text := retime_text(result["simulator_profile"])) else []),
        *([text, ""] if (text := speed_text(result["policies"])) else []),
        "| policy | tau MAPE | tau mean | tokens/s MAPE | tokens/s mean |",
        "|---|---|---|---|---|",
    ]
    for kind, entry in result["policies"].items():
        e = entry["errors"]
        lines.append(
            f"| {kind} | {e['tau']['per_query_mape']:.1%} | {e['tau']['mean_error']:+.1%} | "
            f"{e['tokens_per_second']['per_query_mape']:.1%} | "
            f"{e['tokens_per_second']['mean_error']:+.1%} |"
        )
    lines += [
        "",
        "Fitted `AdaptationDynamics` (paper defaults in brackets): "
        + ", ".join(
            f"{k} {fit['dynamics'][k]:.3g} [{fit['paper'][k]:.3g}]"
            for k in (*ADAPT_FITTED, "query_noise", "head_draft", "full_draft") if k in fit["dynamics"]
        )
        + f"; tau RMSE {fit['rmse_tau']:.3f} (fitted) vs {fit['rmse_tau_paper']:.3f} (paper defaults).",
        "",
        f"Signals: the `never` stream routed {result['signals']['head']} rejected positions to the head "
        f"buffer and {result['signals']['full']} to the full one (head share "
        f"{result['signals']['head_share']:.3f}); the simulator routes them alike.",
        "",
    ]
    if result["overlap"] is not None:
        seconds, slowdown = result["overlap"]["seconds"], result["overlap"]["slowdown"]
        lines += ["Training beside decoding: a query ran "
                  + " and ".join(f"{slowdown[kind]:.3f}x slower beside a one-window {kind} update"
                                 for kind in slowdown)
                  + f" (medians of {len(seconds['alone'])} interleaved timings alone and beside, wall "
                  "clock); the simulator slows queries by that kind's factor while an update trains.",
                  ""]
    return "\n".join(lines)


def phase_text(phases: Sequence[Mapping[str, int]]) -> str:
    """Each phase's queries and the shares of the domains it serves, for the report."""
    parts, start = [], 0
    for counts in phases:
        total = sum(counts.values())
        shares = ", ".join(f"{d} {n / total:.0%}" for d, n in counts.items() if n)
        parts.append(f"queries {start + 1}-{start + total}: {shares}")
        start += total
    return "; ".join(parts)


def decode_ms(profile: Any, shapes: Sequence[Mapping[str, float]], context: float = 256.0
              ) -> dict[str, float]:
    """A profile's decoding at a glance: a plain step and a 9-node verify at ``context``, drafting at the
    recorded ``shapes`` and a 128-token query start, in milliseconds."""
    return {"vanilla_ms": 1e3 * float(profile.vanilla_seconds(context)),
            "verify9_ms": 1e3 * float(profile.verify_seconds(9, context)),
            "draft_ms": mean_shape(profile, shapes)["draft_ms"],
            "prefill128_ms": 1e3 * float(profile.prefill_cost(128))}


def bracket_ms(profile: Any, timed: Mapping[str, Any], shapes: Sequence[Mapping[str, float]]
               ) -> dict[str, dict[str, float]]:
    """``decode_ms`` of ``profile`` with the samples re-timed before, during (pooled) and after a stream
    (``timed``: ``serve``'s ``{"before", "during", "after"}``; the updates are timed before only)."""
    before = timed["before"]
    sides = {"before": before, "during": {**before, **pooled(*timed["during"])} if timed["during"] else None,
             "after": {**before, **timed["after"]}}
    return {side: decode_ms(with_samples(profile, t), shapes) for side, t in sides.items() if t is not None}


def retime_text(costed: Mapping[str, Any]) -> str:
    """The re-timed decoding beside the shipped profile's, for the report ('' when nothing was re-timed)."""
    if not costed.get("retimed"):
        return ""
    rows = {"shipped profile": costed["shipped"]}
    for kind, sides in costed.get("bracket", {}).items():
        rows.update({f"{kind} {side}": t for side, t in sides.items()})
    return ("Decoding re-timed right before, between every few queries of (during) and right after each "
            "policy's stream, all timings pooled (ms: plain step and 9-node verify at context 256, drafting "
            "at the `never` stream's shapes, a 128-token query start): "
            + "; ".join(f"{name} {t['vanilla_ms']:.2f} / {t['verify9_ms']:.2f} / {t['draft_ms']:.2f} / "
                        f"{t['prefill128_ms']:.1f}" for name, t in rows.items()) + ".")


def speed_text(policies: Mapping[str, Any]) -> str:
    """How the machine's speed moved over each policy's stream, for the report ('' when not re-timed)."""
    speeds = {kind: entry["machine_speed"] for kind, entry in policies.items() if entry.get("machine_speed")}
    if not speeds:
        return ""
    return ("The machine's speed over each stream (an iteration's cost at each re-timing over its cost at "
            "all of them pooled; the simulator scales each query's seconds by it, interpolated between "
            "re-timings): " + "; ".join(f"{kind} {min(s['factor']):.2f} to {max(s['factor']):.2f} "
                                         f"({len(s['factor'])} re-timings)" for kind, s in speeds.items())
            + ".")


def update_text(costed: Mapping[str, Any]) -> str:
    """How the simulator charged updates, for the report."""
    retimed = costed.get("retimed")
    if retimed:
        timings = "; ".join(f"{kind} {t['head_single']:.2f} / {t['head']:.2f} s head on "
                            f"{t['windows']['head']} windows, {t['full_single']:.2f} / {t['full']:.2f} s "
                            f"full on {t['windows']['full']}" for kind, t in retimed.items())
        return ("updates linear in the buffered query windows between one window and the full buffer, at "
                "the profile's update samples re-timed right before each training policy's stream, on the "
                f"`never` stream's last queries once it has run (one window / full buffer: {timings}).")
    seconds, windows = costed["update_seconds"], costed.get("update_windows")
    single = costed.get("update_single")
    if windows and single:
        return (f"updates linear in the buffered query windows, from the profile's one-window time "
                f"({single['head']:.2f} s head, {single['full']:.2f} s full) to its full-buffer time "
                f"({seconds['head']:.2f} s for {windows['head']} windows, {seconds['full']:.2f} s for "
                f"{windows['full']}).")
    if windows:
        head, full = (seconds[k] / windows[k] for k in ("head", "full"))
        return (f"updates at the profile's time per buffered query window ({head:.2f} s head, {full:.2f} s "
                "full) times the windows in the buffer.")
    return (f"updates at the profile's full-buffer times ({seconds['head']:.2f} s head, "
            f"{seconds['full']:.2f} s full) times the buffer's fill.")


def plot(result: Mapping[str, Any], path: Path) -> None:
    """Tau and tokens/s per query, measured vs simulated, one column per policy (dashed: where the mix
    shifts, between the stream's phases)."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(result["policies"])
    shifts = np.cumsum([sum(counts.values()) for counts in result["mix"]["phases"]])[:-1]
    fig, axes = plt.subplots(2, len(kinds), figsize=(5 * len(kinds), 6.5), sharex=True, squeeze=False)
    for col, kind in enumerate(kinds):
        entry = result["policies"][kind]
        rows, sim = entry["rows"], entry["simulated"]
        x = np.arange(len(rows))
        for ax, key, label in ((axes[0, col], "tau", "tau"), (axes[1, col], "tokens_per_second", "tokens/s")):
            ax.plot(x, [r[key] for r in rows], "o-", ms=3, lw=1, label="engine")
            ax.plot(x, sim[key], "-", lw=2, alpha=0.8, label="simulator (fitted)")
            for i, r in enumerate(rows):
                if r["update"] is not None:
                    color = "tab:green" if r["update"]["kind"] == "head" else "tab:red"
                    ax.axvline(i, color=color, alpha=0.15)
            for shift in shifts:
                ax.axvline(shift - 0.5, color="k", ls="--", lw=1)
            ax.set_ylabel(label)
        axes[0, col].set_title(f"{kind} (green: head, red: full update)")
        axes[1, col].set_xlabel("query (dashed: the domain mix shifts)")
        axes[0, col].legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


# --- its section of docs/results.md ----------------------------------------------------------------


def _adapt_live_command(name: str, config: Record) -> str:
    plan = config["plan"]  # files written before the paper's stream plan no query count
    quick = plan["queries"] in QUICK_SIZES if "queries" in plan else name.endswith("_quick")
    overlap = str(config.get("clock", "")).startswith("wall clock")  # trained beside decoding
    model = config.get("model", TOY.name)
    return f"specblock adapt-live{flag('--model', model, TOY.name)}{' --quick' if quick else ''}" \
           f"{' --overlap' if overlap else ''}{flag('--name', name, result_name(model, quick, overlap))}"


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
    phases, shifted = mix.get("phases"), ", ".join(mix["shifted"])
    if phases is None or len(phases) == 2:  # the shipped family's one shift (older files record no phases)
        stream = (f"{plan['queries']} queries, equal shares of the domains, the mix shifting after query "
                  f"{plan['shift']} (toward {shifted})")
        window = "half after the shift"
    else:
        start, end = mix["queries"]
        stream = (f"{plan['queries']} queries in {len(phases)} phases ({phase_text(phases)}; shifting to "
                  f"{shifted})")
        window = f"half of queries {start + 1}-{end} (the phase after the first shift)"
    lines = [f"Stream: {stream}, {plan['min_new_tokens']} to "
             f"{plan['max_new_tokens']} new tokens each; distinct held-out prompts per domain: {prompts} "
             "(reused in order when the stream needs more). Measured live, tokens/s with update seconds "
             "charged [95% CI: bootstrap over the queries within each domain], against the simulator's "
             "AdaptStream (sim). Shifted tau: the shifted domains' queries in the first against the second "
             f"{window}. Fidelity error (median |sim / measured - 1|): "
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


RENDERERS: dict[str, Renderer] = {
    "adapt_live": Renderer("Live online adaptation against the simulator", _adapt_live_command,
                           _adapt_live_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
