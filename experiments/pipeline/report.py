"""The pipeline's report: ``report.md``, ``report.png`` and ``lp.json`` from a run folder's files.

It states what the figures mean, wins and losses alike: the fidelity error with its interval, the
worst policy, whether the simulator ranked the policies as the engine did, whether the adaptive
policies beat the best fixed length live, and the adaptation stream with its ``never`` row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from core.files import MAX_POLICY_BYTES, MAX_RECORD_BYTES, atomic_write, read_json, write_json, write_text
from experiments.lp_table import evaluate_verifiers
from experiments.report_format import Lines, Record, Renderer, flag, table
from simulator.instances import random_instance


def lp_table(quick: bool, seed: int = 0) -> list[dict[str, Any]]:
    """The LP bound beside every verifier on a few small random instances (expected accepted tokens)."""
    rows = []
    for length, drafts in ((2, 1), (2, 2)) if quick else ((2, 1), (3, 1), (2, 2), (3, 2)):
        rng = np.random.default_rng(seed)
        cells = [evaluate_verifiers(random_instance(3, length, rng, "mix"), drafts)
                 for _ in range(2 if quick else 4)]
        rows.append({"vocab": 3, "length": length, "drafts": drafts,
                     **{k: float(np.mean([c[k] for c in cells])) for k in cells[0] if k != "seconds"}})
    return rows


def _ci(values: list[float], fmt: str = ".1f") -> str:
    return f"[{values[0]:{fmt}}, {values[1]:{fmt}}]"


def verdict(deploy: dict[str, Any]) -> list[str]:
    """Plain sentences on the fidelity, the ranking and the adaptive policies against fixed lengths."""
    rows, agreement = deploy["policies"], deploy["rank_agreement"]
    worst = max(rows, key=lambda n: abs(rows[n]["error"]))
    lines = [
        f"- **Fidelity error** (median over policies of |predicted / measured - 1| of tokens/s): "
        f"**{deploy['fidelity_error']:.1%}** (95% interval {_ci(deploy['fidelity_error_ci'], '.1%')}); "
        f"worst policy {worst} at {rows[worst]['error']:+.1%}.",
        f"- **Ranking**: Kendall's tau {agreement['kendall_tau']:.2f} (p = {agreement['p_value']:.2f}) "
        f"between predicted and measured tokens/s. Predicted best {agreement['predicted_best']}, measured "
        f"best {agreement['measured_best']}: the predicted best "
        f"{'is' if agreement['predicted_best_within_interval'] else '**is not**'} the measured best "
        f"within its interval (the measured best's lead over it: "
        f"{_ci(agreement['measured_best_lead_ci'], '.3f')}).",
    ]
    if "predicted_ties" in agreement:  # deploy files written before ties were reported have none
        ties = agreement["predicted_ties"]
        told = (f"cannot tell {', '.join(ties)} from its best" if ties
                else "tells every other policy from its best")
        lines.append(
            f"- **Ties**: the simulator {told} (the paired ratio of their forecasts over the same resampled "
            "calibration queries); the measured best "
            f"{'is' if agreement['measured_best_tied'] else '**is not**'} its best or one of these.")
    if "replay_error" in deploy:
        worst_replay = max(rows, key=lambda n: abs(rows[n]["replay_error"]))
        lines.append(
            f"- **On the held-out prompts' own text** (their probed traces replayed instead of the "
            f"calibration prompts'): median error **{deploy['replay_error']:.1%}**, worst {worst_replay} at "
            f"{rows[worst_replay]['replay_error']:+.1%}. The rest of the fidelity error is how the "
            "calibration prompts differ from the held-out ones.")
    against = deploy.get("against_best_fixed") or {}
    for name, row in sorted(against.get("policies", {}).items()):
        low, high = row["ratio_ci"]
        outcome = ("faster than" if low > 1 else "slower than" if high < 1
                   else "not told apart from")
        lines.append(f"- **{name}** ran {row['ratio']:.3f}x the best fixed length ({against['best_fixed']}; "
                     "not drafting counts as length 0) "
                     f"live, interval {_ci(row['ratio_ci'], '.3f')}: {outcome} it.")
    return lines


def _replayed(row: dict[str, Any]) -> str:
    """A policy's forecast from the held-out prompts' own traces and its error; - when not measured."""
    if "replayed_tokens_per_second" not in row:
        return "-"
    return f"{row['replayed_tokens_per_second']:.1f} ({row['replay_error']:+.1%})"


def _drafting(vocab: int | None) -> str:
    """What the run's draft model drafts over: its deployed vocabulary, or every token."""
    return "every token" if vocab is None else f"its {vocab:,} most frequent tokens"


def write_report(out: Path, quick: bool, seed: int) -> dict[str, Any]:
    """Write the report of the run in ``out`` (its ``deploy.json`` and ``policies/``)."""
    deploy = read_json(out / "deploy.json", MAX_RECORD_BYTES, "deploy result", "resume the run")
    lp = lp_table(quick, seed)
    write_json(out / "lp.json", lp)
    rows = deploy["policies"]
    models = read_json(out / "models.json", MAX_RECORD_BYTES, "models record", "resume the run")
    lines = [
        "# specblock pipeline report",
        "",
        f"Model `{models['model']}` (target {models['target']}, draft {models['draft']}, drafting "
        f"{_drafting(models.get('draft_vocab'))}). "
        f"Run folder `{out}`; clock `{deploy['clock']}`; {deploy['prompts']} held-out prompts; predictions "
        f"from `{deploy['profile']}`, measured in the same process right before the live runs. Intervals "
        "are 95% bootstrap intervals: over held-out prompts for measurements, over the recorded "
        "calibration queries for predictions.",
        "",
        *verdict(deploy),
        "",
        "Per iteration, measured / predicted: tau, then milliseconds of drafting (with the length policy's "
        "own work), verifying, the rest of the loop (which the simulator does not model) and in all. On "
        "held-out text: the forecast from the held-out prompts' own probed traces, and its error.",
        "",
        "| policy | measured tok/s | predicted tok/s | error | on held-out text | measured speedup "
        "| predicted speedup | tau | draft ms | verify ms | rest ms | iteration ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["measured_tokens_per_second"]):
        lines.append(
            f"| {name} | {r['measured_tokens_per_second']:.1f} {_ci(r['measured_ci'])} "
            f"| {r['predicted_tokens_per_second']:.1f} {_ci(r['predicted_ci'])} "
            f"| {r['error']:+.1%} | {_replayed(r)} "
            f"| {r['measured_speedup']:.3f} {_ci(r['measured_speedup_ci'], '.3f')} "
            f"| {r['predicted_speedup']:.3f} | {r['measured_tau']:.2f} / {r['predicted_tau']:.2f} "
            f"| {r['measured_draft_ms']:.2f} / {r['predicted_draft_ms']:.2f} "
            f"| {r['measured_verify_ms']:.2f} / {r['predicted_verify_ms']:.2f} "
            f"| {r['measured_overhead_ms']:.2f} / 0 "
            f"| {r['measured_iteration_ms']:.2f} / {r['predicted_iteration_ms']:.2f} |")
    lines += _adaptation(deploy.get("adaptation", {}))
    lines += ["", "## Tuned policies", ""]
    for path in sorted((out / "policies").glob("*.json")):
        spec = read_json(path, MAX_POLICY_BYTES, "policy file", "delete it to tune it again")
        shown = {k: v for k, v in spec.items() if k != "calibration"}  # its knots are the run's calibration
        with_calibration = " with the run's confidence calibration" if "calibration" in spec else ""
        lines.append(f"- `{path.name}`: `{json.dumps(shown)}`{with_calibration}")
    lines += [
        "",
        "## Verification LP (expected accepted draft tokens, vocabulary 3, mean of random instances)",
        "",
        "| length | drafts | LP bound | token | BV | RRS | SeqBV | GBV |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lp:
        lines.append(f"| {r['length']} | {r['drafts']} | {r['lp']:.3f} | {r['token']:.3f} | {r['block']:.3f} "
                     f"| {r['rrs']:.3f} | {r['seqbv']:.3f} | {r['gbv']:.3f} |")
    write_text(out / "report.md", "\n".join(lines) + "\n")
    _plot(rows, out / "report.png")
    return {"report": str(out / "report.md")}


def _adaptation(adaptation: dict[str, Any]) -> list[str]:
    lines = ["", "## Online adaptation (SpecBlock drafter, a stream whose domain mix shifts)", ""]
    if "skipped" in adaptation:
        return [*lines, f"Skipped: {adaptation['skipped']}"]
    lines += ["| policy | measured tok/s | simulated tok/s | error | measured tau | simulated tau "
              "| shifted-domain tau early -> late | head/full updates |",
              "|---|---:|---:|---:|---:|---:|---|---|"]
    for name, r in adaptation.items():
        error = r["simulated_tokens_per_second"] / r["measured_tokens_per_second"] - 1
        lines.append(f"| {name} | {r['measured_tokens_per_second']:.1f} | "
                     f"{r['simulated_tokens_per_second']:.1f} | {error:+.1%} | {r['measured_tau']:.3f} | "
                     f"{r['simulated_tau']:.3f} | {r['shifted_tau_early']:.3f} -> "
                     f"{r['shifted_tau_late']:.3f} | {r['updates'].get('head', 0)}/"
                     f"{r['updates'].get('full', 0)} |")
    never = adaptation.get("never")
    if never is not None:
        faster = [n for n, r in adaptation.items()
                  if r["measured_tokens_per_second"] > never["measured_tokens_per_second"]]
        lines += ["", f"Never updating ran {never['measured_tokens_per_second']:.1f} tok/s; "
                  + (f"faster: {', '.join(faster)}." if faster else
                     "no updating policy was faster live: on this stream adaptation did not pay.")]
    return lines


def _plot(rows: dict[str, Any], path: Path) -> None:
    """Predicted against measured tokens/s with their intervals, one bar pair per policy."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(rows, key=lambda n: rows[n]["measured_tokens_per_second"])
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.5))
    y = range(len(names))
    for offset, key, label in ((-0.2, "measured", "measured"), (0.2, "predicted", "simulated")):
        values = [rows[n][f"{key}_tokens_per_second"] for n in names]
        errors = [[max(v - rows[n][f"{key}_ci"][0], 0.0) for v, n in zip(values, names, strict=True)],
                  [max(rows[n][f"{key}_ci"][1] - v, 0.0) for v, n in zip(values, names, strict=True)]]
        ax.barh([i + offset for i in y], values, 0.4, xerr=errors, label=label, capsize=2)
    ax.set_yticks(list(y), names)
    ax.set_xlabel("tokens / s (95% intervals)")
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


# --- its section of docs/results.md ----------------------------------------------------------------


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


RENDERERS: dict[str, Renderer] = {
    "fidelity": Renderer("Simulator fidelity: predicted against measured throughput", _fidelity_command,
                         _fidelity_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
