"""A real model's headline on docs/results.md: its fastest measured configurations against the targets
the project set for speculative decoding on a real model, each read plainly as met, missed or unsettled.

The targets come from the real-model benchmark's brief (the Spec-Bench anchors scaled down to a small
target on a CPU): the best drafter's speedup over this engine's vanilla decoding by temperature and
category, and our fastest speculative engine against llama.cpp's vanilla and prompt-lookup decoding on the
model's quantized file, in absolute tokens/s on the same prompts. The figures are read from the model's
bench file (``bench_<model>.json``: the fastest configuration per temperature and category, as its own
section lists it) and its peers file (the paired per-prompt ratio of tokens/s, pooled over the categories:
the file's own figure against llama.cpp's vanilla; against its prompt lookup, computed here with a 95%
bootstrap interval resampled within each category). A target is met when the whole interval
clears it, missed when the whole interval falls short, and unsettled when the interval straddles it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from experiments.intervals import REPLICATES, interval, resamples
from experiments.report_format import Lines, Record, table
from experiments.report_format import interval as md_interval
from experiments.specbench.report import config_label, fastest

SPEEDUP_TARGETS: dict[tuple[float, str], float] = {(0.0, "chat"): 2.0, (0.0, "code"): 2.5, (1.0, "all"): 1.5}
"""(temperature, category) -> the speedup over this engine's vanilla the best drafter should reach."""
PEER_TARGET = 1.0
"""Our fastest speculative engine's tokens/s over each llama.cpp engine on the quantized file: above it."""
SEED = 0


def verdict(target: float, ci: Sequence[float]) -> str:
    """Met when the whole interval clears ``target``, missed when it falls short, else unsettled."""
    if ci[0] >= target:
        return "met"
    return "missed" if ci[1] < target else "unsettled (the interval straddles it)"


def bench_lines(record: Record) -> list[list[str]]:
    """One table row per speedup target the bench file measured: its fastest configuration there."""
    out = []
    for (temperature, category), target in SPEEDUP_TARGETS.items():
        best = fastest(record["results"]["rows"]).get((temperature, category))
        if best is None or not best.get("speedup_ci"):
            continue
        label = config_label(best)
        out.append([f"speedup over our vanilla, T={temperature:g}, {category}", f"at least {target:.1f}x",
                    f"{label}: {md_interval(best['speedup'], best['speedup_ci'], '.2f')}",
                    verdict(target, best["speedup_ci"])])
    return out


def peer_ratio(records: Sequence[Record], ours: str, theirs: str) -> tuple[float, list[float]]:
    """The mean per-prompt tokens/s ratio of engine ``ours`` over ``theirs``, with its 95% interval."""
    ratio = np.array([r["engines"][ours]["tokens_per_second"] / r["engines"][theirs]["tokens_per_second"]
                      for r in records])
    index = resamples([r["category"] for r in records], REPLICATES, SEED)
    return float(ratio.mean()), interval(ratio[index].mean(axis=1))


def peer_lines(record: Record) -> list[list[str]]:
    """Our fastest speculative engine (pooled tokens/s) against llama.cpp's vanilla and prompt-lookup
    decoding on the quantized file; none when llama.cpp did not run."""
    results = record["results"]
    rival = results.get("rival")
    if rival is None:
        return []
    pooled = [r for r in results["rows"] if r["category"] == "pooled"]
    ours = max((r for r in pooled if r["engine"].startswith("specblock ") and not r["engine"].endswith(
        " vanilla")), key=lambda r: r["tokens_per_second"])["engine"]
    own = next(r for r in pooled if r["engine"] == ours)
    out = []
    for theirs in (rival, rival.removesuffix(" vanilla") + " prompt lookup"):
        if theirs not in results["engines"]:
            continue
        mean, ci = ((own["over_rival"], own["over_rival_ci"]) if theirs == rival
                    else peer_ratio(results["per_prompt"], ours, theirs))
        out.append([f"tokens/s over {theirs}", f"above {PEER_TARGET:.1f}x",
                    f"{ours}: {md_interval(mean, ci, '.2f')}", verdict(PEER_TARGET, ci)])
    return out


def headline(bench: Record | None, peers: Record | None) -> Lines:
    """The headline table from a real model's bench and peers files (either may be missing, or laid out
    as an older version wrote it: then its rows are left out); empty when neither gives a row."""
    rows = []
    for record, lines in ((bench, bench_lines), (peers, peer_lines)):
        try:
            rows += lines(record) if record else []
        except (KeyError, TypeError, IndexError, ValueError, ZeroDivisionError):
            continue
    if not rows:
        return []
    return ["### Against the targets", "",
            "The fastest measured configurations against the targets set for a real model (each figure's "
            "section below gives its command and file). Met: the whole 95% interval clears the target; "
            "missed: the whole interval falls short.", "",
            *table(["target", "goal", "measured [95% interval]", "verdict"], rows), ""]
