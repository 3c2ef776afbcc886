"""A real model's main job on docs/results.md: the loop's goals, each read from the committed result files
as met, missed or unsettled, and its answers to what a user asks of it (does updating the drafter online
pay, at which load speculation should switch off).

The goals are the real-model loop's: the simulator predicts the live engine's tokens/s within 10% (median
over policies, the worst policy within 20%) in each quick pipeline and within 5% in the full one; the
predicted best policy is the measured best within its interval; a tuned LibraSpec or threshold policy is
at least as fast live as the best fixed length; the serving and adaptation simulators predict within 10%;
the quick pipeline takes at most 10 minutes. A fidelity or time goal is read on the figure itself, a
speed ratio on its 95% interval (``headline.verdict``); a goal over several runs says in how many it
holds. The files are the pipeline runs (``pipeline_quick_<model>``, ``pipeline_full_<model>``),
``serve_bench_<model>``, the adaptation stream (``adapt_live_<model>``, else its quick run) and the
break-even map (``adapt_breakeven_<model>``); a missing file, or one laid out as an older version wrote
it, leaves its rows out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from experiments.adapt.plan import result_name
from experiments.cli import model_result
from experiments.report_format import Lines, Record, run_seconds, table
from experiments.report_format import interval as md_interval
from experiments.results.headline import verdict

QUICK_GOAL, QUICK_WORST_GOAL, FULL_GOAL = 0.10, 0.20, 0.05
"""The simulator's fidelity error per pipeline run: median over policies (and worst policy, quick)."""
SIMULATOR_GOAL = 0.10
"""The serving and the adaptation simulators' fidelity error."""
QUICK_SECONDS = 600.0
"""The quick pipeline's wall time."""
TUNED = ("tuned-libraspec", "tuned-threshold")
"""The tuned adaptive length policies held against the best fixed length."""


def counted(verdicts: Sequence[str]) -> str:
    """``met in all 3 runs``, or how many runs each verdict took (its first word)."""
    words = [v.split()[0] for v in verdicts]
    if len(set(words)) == 1:
        return f"{words[0]} in {'the' if len(words) == 1 else 'all'} {len(words)} run{'s' * (len(words) > 1)}"
    return "; ".join(f"{word} in {words.count(word)} of {len(words)}" for word in dict.fromkeys(words))


def at_most(goal: float, value: float) -> str:
    """Met when ``value`` is at most ``goal``."""
    return "met" if value <= goal else "missed"


def _fidelity(run: Record, worst: bool) -> str:
    """A run's fidelity error with its interval, and its worst policy's error where that has a goal."""
    shown = md_interval(run["fidelity_error"], run["fidelity_error_ci"], ".1%")
    return f"{shown} (worst {abs(run['worst_error']):.1%})" if worst else shown


def _fidelity_verdict(run: Record, goal: float, worst: float | None) -> str:
    """Met when the median error, and the worst policy's where it has a goal, are within their goals."""
    held = run["fidelity_error"] <= goal and (worst is None or abs(run["worst_error"]) <= worst)
    return "met" if held else "missed"


def fidelity_rows(quick: Record | None, full: Record | None) -> list[list[str]]:
    """The pipelines' fidelity, their pick of the best policy, the tuned policies against the best fixed
    length, and the quick pipeline's wall time."""
    runs = {"quick": quick["results"] if quick else [], "full": full["results"] if full else []}
    rows = []
    for plan, goal, worst in (("quick", QUICK_GOAL, QUICK_WORST_GOAL), ("full", FULL_GOAL, None)):
        if runs[plan]:
            target = f"at most {goal:.0%}" + (f" (worst policy {worst:.0%})" if worst else "")
            rows.append([f"simulator's fidelity error, each {plan} pipeline", target,
                         "; ".join(_fidelity(r, worst is not None) for r in runs[plan]),
                         counted([_fidelity_verdict(r, goal, worst) for r in runs[plan]])])
    every = runs["quick"] + runs["full"]
    if every:
        within = {plan: [r["rank_agreement"]["predicted_best_within_interval"] for r in rs]
                  for plan, rs in runs.items() if rs}
        rows.append(["predicted best policy is the measured best within its interval", "every run",
                     "; ".join(f"{plan} {sum(w)} of {len(w)}" for plan, w in within.items()),
                     counted(["met" if w else "missed" for ws in within.values() for w in ws])])
        labels = [f"{plan} {i}" for plan, rs in runs.items() for i in range(1, len(rs) + 1)]
        best = [_best_tuned(r) for r in every]
        if all(best):
            rows.append(["tuned LibraSpec or threshold, live, over the best fixed length", "at least 1.0x",
                         "; ".join(f"{label}: {name} {md_interval(c['ratio'], c['ratio_ci'])}"
                                   for label, (name, c) in zip(labels, best, strict=True)),
                         counted([verdict(1.0, c["ratio_ci"]) for _, c in best])])
    if runs["quick"]:
        seconds = ", ".join(run_seconds(r) for r in runs["quick"])
        rows.append(["the quick pipeline's wall time", f"at most {QUICK_SECONDS:.0f} s on 2 CPU cores",
                     f"{seconds} s ({quick['machine']['cpu']})",
                     counted([at_most(QUICK_SECONDS, r["seconds"]) for r in runs["quick"]])])
    return rows


def _best_tuned(run: Record) -> tuple[str, Record] | None:
    """The tuned adaptive policy with the higher ratio over the run's best fixed length; None if neither."""
    policies = run["against_best_fixed"]["policies"]
    found = [(name, policies[name]) for name in TUNED if name in policies]
    return max(found, key=lambda item: item[1]["ratio"]) if found else None


def simulator_rows(serve: Record | None, adapt: Record | None) -> list[list[str]]:
    """The serving and adaptation simulators' fidelity errors against their goal."""
    rows = []
    if serve:
        error = serve["results"]["fidelity_error"]
        rows.append(["serving simulator's fidelity error (tokens/s, over settings and rates)",
                     f"at most {SIMULATOR_GOAL:.0%}", f"{error:.1%}", at_most(SIMULATOR_GOAL, error)])
    if adapt:
        error = adapt["results"]["figures"]["fidelity_error"]
        queries = len(adapt["results"]["stream"])
        rows.append([f"adaptation simulator's fidelity error ({queries}-query stream)",
                     f"at most {SIMULATOR_GOAL:.0%}", f"{error:.1%}", at_most(SIMULATOR_GOAL, error)])
    return rows


def answer_rows(serve: Record | None, breakeven: Record | None) -> list[list[str]]:
    """Where speculation should switch off under load, and whether updating the drafter online pays."""
    rows = []
    if serve:
        rows.append(["load at which speculation should switch off (live tokens/s)",
                     "the lowest rate where not drafting beats every speculating setting",
                     *_switch_off(serve)])
    if breakeven:
        for m in (m for m in breakeven["results"]["maps"] if not m["simulated"]):
            length = max(c["length"] for c in m["cells"])
            at_one = next(c for c in m["cells"] if c["length"] == length and c["factor"] == 1.0)
            even = next(b for b in m["break_even"] if b["length"] == length)
            word = verdict(1.0, at_one["gain_ci"]).split()[0]
            rows.append(["does updating the drafter online pay? (cost-aware bandit over never, simulated "
                         "at this model's update costs)", "above 1.0x",
                         f"{md_interval(at_one['gain'], at_one['gain_ci'])} over {length:,} queries; "
                         f"break-even at {even['factor']:.3g}x the update cost",
                         {"met": "pays", "missed": "does not pay"}.get(word, word)])
    return rows


def _switch_off(serve: Record) -> list[str]:
    """The lowest arrival rate where the best speculating setting's tokens/s over not drafting's falls
    short of 1 by its whole interval, with that ratio; 'not within the rates measured' if none."""
    policies = serve["results"]["policies"]
    speculating = {name: p for name, p in policies.items() if name != "none" and "over_none" in p}
    for rate in sorted(policies["none"]["rates"], key=float):
        name, best = max(((n, p["over_none"][rate]) for n, p in speculating.items()),
                         key=lambda item: item[1]["ratio"])
        if best["ratio_ci"][1] < 1.0:
            return [f"{float(rate):g} requests/s (best speculating: {name}, "
                    f"{md_interval(best['ratio'], best['ratio_ci'], '.2f')}x)", "answered"]
    return ["not within the rates measured", "not reached"]


def loop_goals(model: str, files: Mapping[str, Record]) -> Lines:
    """The table for ``model`` from its results files (name -> record); empty when none gives a row."""
    adapt = files.get(result_name(model, False, False)) or files.get(result_name(model, True, False))
    parts: list[Callable[[], list[list[str]]]] = [
        lambda: fidelity_rows(files.get(model_result("pipeline_quick", model)),
                              files.get(model_result("pipeline_full", model))),
        lambda: simulator_rows(files.get(model_result("serve_bench", model)), adapt),
        lambda: answer_rows(files.get(model_result("serve_bench", model)),
                            files.get(model_result("adapt_breakeven", model))),
    ]
    rows = []
    for part in parts:
        try:
            rows += part()
        except (KeyError, TypeError, IndexError, ValueError, StopIteration):  # an older layout
            continue
    if not rows:
        return []
    return ["### The main job against its goals", "",
            "The simulator against the live engine, and the loop's answers, from the files whose sections "
            "follow (each names its machine: compare figures within one file). A fidelity or time goal is "
            "read on the figure, a ratio on its 95% interval.", "",
            *table(["goal or question", "target", "measured [95% interval]", "verdict"], rows), ""]
