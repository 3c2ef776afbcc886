"""The bench's readable outputs: a markdown report and a PNG (speedup per category and drafter; acceptance
by chain position)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.files import atomic_write, write_text
from core.models import TOY, registry
from core.names import VANILLA
from experiments.cli import model_result
from experiments.report_format import Lines, Record, Renderer, flag, interval, listed, pairs, table


def _label(row: dict[str, Any]) -> str:
    return "/".join(str(row[k]) for k in ("drafter", "shape", "verifier") if row[k])


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _versus(rows: Sequence[dict[str, Any]], ours: str = "specblock", theirs: str = "eagle") -> list[str]:
    """SpecBlock against EAGLE-style over all categories, per temperature and verifier, as the paper states
    its claim: the ratio of their speedups and of their drafting times per iteration; at their deployed
    shapes, and at their training shapes (the papers' deep trees) where the bench ran those."""
    best = {}
    for r in rows:
        if r["category"] == "all" and not r.get("policy") and r["drafter"] in (ours, theirs):
            shapes = "trained" if r["shape"] == "trained" else "deployed"
            best.setdefault((shapes, r["temperature"], r["verifier"], r["drafter"]), r)
    pairs = [(s, t, v) for (s, t, v, d) in best if d == ours and (s, t, v, theirs) in best]
    if not pairs:
        return []
    lines = [f"## {ours} against {theirs} (all categories)", "",
             "The paper reports 1.08 to 1.13 times EAGLE-3's speedup at 0.44 to 0.52 of its drafting "
             "time.", "",
             "| shapes | T | verifier | speedup ratio | drafting time ratio (ms/iter) | tau "
             "| drafter calls/iter |",
             "|---|---|---|---|---|---|---|"]
    for s, t, v in sorted(pairs, key=lambda p: (p[0] == "trained", p[1], p[2])):
        a, b = best[(s, t, v, ours)], best[(s, t, v, theirs)]
        time_ratio = a["draft_ms"] / b["draft_ms"] if b.get("draft_ms") and "draft_ms" in a else None
        lines.append(f"| {s} | {t:g} | {v} | {a['speedup'] / b['speedup']:.2f} ({a['speedup']:.2f}x / "
                     f"{b['speedup']:.2f}x) | {_num(time_ratio)} ({_num(a.get('draft_ms'))} / "
                     f"{_num(b.get('draft_ms'))}) | {a['tau']:.2f} / {b['tau']:.2f} | "
                     f"{_num(a['draft_calls'])} / {_num(b['draft_calls'])} |")
    return [*lines, ""]


def _ci(bounds: list[float] | None) -> str:
    """`` [low, high]`` of a 95% interval, or nothing for rows saved before intervals were kept."""
    return f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else ""


def markdown(results: dict[str, Any], title: str) -> str:
    """The rows as markdown tables (one per temperature), the draft model's agreement, SpecBlock's
    rank-head confusion and the notes."""
    rows = results["rows"]
    lines = [f"# {title}", ""]
    for t in sorted({r["temperature"] for r in rows}):
        lines += [f"## Temperature {t:g}", "",
                  "| category | config | tau | tok/s | speedup [95% CI] | HF ratio | draft share "
                  "| draft ms/iter | draft calls | alpha | greedy identical |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["temperature"] == t):
            alpha = " ".join(_num(a) for a in r["alpha"]) if r["alpha"] else "-"
            same = "-" if r["greedy_identical"] is None else "yes" if r["greedy_identical"] else "**NO**"
            lines.append(f"| {r['category']} | {_label(r)} | {r['tau']:.2f} | {r['tokens_per_second']:.1f} | "
                         f"{r['speedup']:.2f}x{_ci(r.get('speedup_ci'))} | {_num(r.get('hf_speedup'))} | "
                         f"{r['draft_share']:.2f} | "
                         f"{_num(r.get('draft_ms'))} | {_num(r['draft_calls'])} | {alpha} | {same} |")
        lines.append("")
    lines += _versus(rows)
    agreement = results.get("agreement") or {}
    if agreement:
        lines += ["## Draft model: teacher-forced top-1 agreement with the target, beside tau", "",
                  "| category | tokens | top-1 agreement | tau draft-model/chain T=0 "
                  "| tau draft-model/tree T=0 |",
                  "|---|---|---|---|---|"]
        for category, a in agreement.items():
            taus = {r["shape"]: r["tau"] for r in rows
                    if r["category"] == category and r["drafter"] == "draft-model" and r["temperature"] == 0}
            lines.append(f"| {category} | {a['tokens']} | {a['top1']:.3f} | {_num(taus.get('chain'))} | "
                         f"{_num(taus.get('tree'))} |")
        lines.append("")
    on_text = results.get("text_acceptance") or {}
    if on_text:
        lines += ["## Acceptance on real held-out text, beside decoding (T = 0, greedy)", "",
                  "A draft after every 16th token of each prompt, its context the text before it, verified "
                  "against the target's top tokens: the drafter's teacher-forced agreement by position. "
                  "Trained drafters draft at the shape they were trained with here (every position they "
                  "learnt), at their deployed shape when decoding. Decoding drafts after the target's own "
                  "output instead.", "",
                  "| category | config | drafts | tau on text | tau decoding | alpha on text |",
                  "|---|---|---|---|---|---|"]
        decoding = {(r["category"], _label(r)): r["tau"] for r in rows
                    if r["temperature"] == 0 and r["verifier"] == "greedy" and not r.get("policy")}
        for label, per in on_text.items():
            for category, a in per.items():
                alpha = " ".join(_num(x) for x in a["alpha"]) or "-"
                lines.append(f"| {category} | {label} | {a['drafts']} | {_num(a['tau'])} | "
                             f"{_num(decoding.get((category, label)))} | {alpha} |")
        lines.append("")
    confusion = results.get("rank_confusion") or {}
    if confusion:
        lines += ["## SpecBlock rank head: teacher-forced confusion on the prompts' text", "",
                  "Rows: the bucket of the target token's rank in the draft law (0: rank 1, 1: ranks 2-4, "
                  "2: ranks 5-10, 3: beyond); columns: the predicted bucket; counts over the valid-prefix "
                  "positions of two blocks started at every position.", "",
                  "| category | true bucket | pred 0 | pred 1 | pred 2 | pred 3 | accuracy |",
                  "|---|---|---|---|---|---|---|"]
        for category, c in confusion.items():
            for bucket, counts in enumerate(c["confusion"]):
                accuracy = f"{c['accuracy']:.3f}" if bucket == 0 else ""
                lines.append(f"| {category if bucket == 0 else ''} | {bucket} | "
                             + " | ".join(str(n) for n in counts) + f" | {accuracy} |")
        lines.append("")
    if results.get("notes"):
        lines += ["## Notes", "", *(f"- {n}" for n in results["notes"]), ""]
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Per temperature: grouped bars of speedup by category and config, and alpha by position (all
    categories)."""
    import matplotlib  # loads only to draw, with the Agg backend chosen before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(len(temps), 2, figsize=(13, 4 * len(temps)), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1]})
    for (bars, lines), t in zip(axes, temps, strict=True):
        group = [r for r in rows if r["temperature"] == t]
        categories = list(dict.fromkeys(r["category"] for r in group))
        labels = list(dict.fromkeys(_label(r) for r in group))
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            speed = {r["category"]: r["speedup"] for r in group if _label(r) == label}
            bars.bar([c + i * width for c in range(len(categories))], [speed.get(c, 0.0) for c in categories],
                     width, label=label, color=f"C{i % 10}")
            alpha = next((r["alpha"] for r in group if _label(r) == label and r["category"] == "all"), None)
            if alpha:
                lines.plot(range(1, len(alpha) + 1), [float("nan") if a is None else a for a in alpha],
                           marker="o", label=label, color=f"C{i % 10}")
        bars.axhline(1.0, color="black", linewidth=0.8)
        bars.set_xticks([c + 0.4 - width / 2 for c in range(len(categories))], categories)
        bars.set_ylabel("speedup over vanilla")
        bars.set_title(f"Speedup per category, T={t:g}")
        bars.legend(fontsize=7, ncol=2)
        lines.set_xlabel("draft position i")
        lines.xaxis.get_major_locator().set_params(integer=True)
        lines.set_ylabel("P(accept i | accepted i-1)")
        lines.set_ylim(0, 1.05)
        lines.set_title(f"Acceptance by position (all categories), T={t:g}")
        if lines.get_legend_handles_labels()[0]:
            lines.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def write_report(results: dict[str, Any], folder: Path, name: str) -> tuple[Path, Path]:
    """Write ``<name>.md`` and ``<name>.png`` into ``folder``."""
    md = write_text(folder / f"{name}.md", markdown(results, f"specblock bench ({name})"))
    return md, plot(results["rows"], folder / f"{name}.png")


# --- its section of docs/results.md ----------------------------------------------------------------


def model_flags(config: Record) -> str:
    """`` --model NAME`` and `` --dtype D`` as a results file records them, each left out where it is the
    default (the toy family; the model's own dtype)."""
    model = config.get("model", TOY.name)
    spec, dtype = registry.get(model), config.get("dtype")
    shown = dtype is not None and (spec is None or dtype != spec.dtype)
    return f"{flag('--model', model, TOY.name)}{flag('--dtype', dtype) if shown else ''}"


def _bench_command(name: str, config: Record) -> str:
    default = model_result("bench", config.get("model", TOY.name))
    tag = "" if name == default else f" --tag {name.removeprefix('bench_')}"
    counts = sorted(set(config["categories"].values()))
    prompts = f" --prompts {counts[0]}" if len(counts) == 1 else ""
    return (f"specblock bench --drafters {listed(config['drafters'])}"
            f" --verifiers {listed(config['verifiers'])} --temperatures {listed(config['temperatures'])}"
            f" --shapes {listed(config['shapes'])} --categories {listed(list(config['categories']))}{prompts}"
            f" --max-new-tokens {config['max_new_tokens']}{flag('--threads', config.get('threads'))}"
            f"{' --trained-shapes' if config['trained_shapes'] else ''}"
            f"{' --every-verifier' if config.get('every_verifier') else ''}"
            f"{' --no-hf' if config.get('hf_assisted') is None else ''}{model_flags(config)}"
            f"{tag}")


def config_label(row: Record) -> str:
    """A bench row's configuration as the page names it: ``draft-model/chain/greedy`` (+ its policy)."""
    return "/".join(str(row[key]) for key in ("drafter", "shape", "verifier") if row[key]) + (
        f" + {row['policy']}" if row.get("policy") else "")


def _pooled(row: Record) -> str:
    """A row's speedup, with its interval where the file records one."""
    ci = row.get("speedup_ci")
    return interval(row["speedup"], ci, ".2f") if ci else f"{row['speedup']:.2f}x"


def _bench_body(record: Record) -> Lines:
    rows = record["results"]["rows"]
    categories = list(record["config"]["categories"])
    speedups = {(config_label(r), r["temperature"], r["category"]): r["speedup"] for r in rows}
    lines = ["Speedup: tokens/s over vanilla decoding's in the same run, all categories pooled (with its 95% "
             "interval over prompts), then per category; tau: new tokens per target forward; draft ms: the "
             "drafter's time per iteration."]
    if record["config"].get("dtype", "float32") != "float32":
        lines.append("Greedy identical \"no\" in 16-bit: rounding differs between a one-token step and a "
                     "many-token verify, so greedy outputs part at near-ties; losslessness is checked in "
                     "float32 (`--dtype float32 --every-verifier`).")
    lines.append("")
    out = []
    for r in (r for r in rows if r["category"] == "all"):
        label = config_label(r)
        per_category = [speedups.get((label, r["temperature"], c)) for c in categories]
        out.append([f"{r['temperature']:g}", label, f"{r['tau']:.2f}", f"{r['tokens_per_second']:.1f}",
                    _pooled(r), *("-" if s is None else f"{s:.2f}x" for s in per_category),
                    f"{r['draft_ms']:.2f}", {True: "yes", False: "no"}.get(r.get("greedy_identical"), "-")])
    return [*lines, *table(["T", "configuration", "tau", "tok/s", "speedup", *categories, "draft ms",
                            "greedy identical"], out), "", *_fastest_lines(rows)]


def fastest(rows: Sequence[Record]) -> dict[tuple[float, str], Record]:
    """The fastest drafting configuration by (temperature, category): what the bench says to deploy, and
    the figure a speedup goal is read against (``experiments.results.headline``)."""
    best: dict[tuple[float, str], Record] = {}
    for r in (r for r in rows if r["drafter"] not in (VANILLA, "hf-vanilla")):
        key = (r["temperature"], r["category"])
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return best


def _fastest_lines(rows: Sequence[Record]) -> Lines:
    """The fastest configuration by temperature and category (pooled first), with its interval and tau."""
    best = fastest(rows)
    order = sorted(best, key=lambda k: (k[0], k[1] != "all", k[1]))
    return ["The fastest configuration by temperature and category:", "",
            *table(["T", "category", "fastest", "speedup", "tau"],
                   [[f"{t:g}", c, config_label(best[t, c]), _pooled(best[t, c]), f"{best[t, c]['tau']:.2f}"]
                    for t, c in order])]


def _shapes_command(name: str, config: Record) -> str:
    return (f"specblock shapes --drafters {listed(config['drafters'])}"
            f" --domains {listed(config['domains'])} --prompts {config['prompts']}"
            f" --rounds {config['rounds']} --max-new-tokens {config['max_new_tokens']}"
            f"{flag('--drafters-dir', config.get('drafters_dir', 'data/models'), 'data/models')}"
            f"{flag('--threads', config['threads'], 1)}{model_flags(config)}"
            f"{flag('--tag', name, model_result('shapes', config.get('model', TOY.name)))}"
            f"{' --apply' if config.get('apply') else ''}")


def _shapes_body(record: Record) -> Lines:
    result = record["results"]
    lines = [f"Greedy, round-robin with vanilla decoding ({result['vanilla_tokens_per_second']:.1f} "
             "tokens/s). Speedup: median over prompts of vanilla's time over the shape's (quartiles beside "
             "it). With `--apply` the command saves each fastest shape as the drafter's "
             f"`{record['config'].get('saved_as', 'drafting.json')}`.", ""]
    rows = []
    header = ["drafter", "shapes measured", "fastest shape", "tokens/s", "speedup [quartiles]", "tau"]
    exact = record["config"].get("dtype", "float32") == "float32"  # 16-bit runs count identical outputs
    for drafter, shapes in sorted(result["drafters"].items()):
        best = shapes[0]
        rows.append([drafter, len(shapes), pairs(best["shape"]), f"{best['tokens_per_second']:.1f}",
                     interval(best["speedup"], best["speedup_quartiles"], ".2f"), f"{best['tau']:.2f}",
                     *([] if exact else [f"{best['same_as_vanilla']:.0%}"])])
    return lines + table([*header, *([] if exact else ["same output as vanilla"])], rows)


RENDERERS: dict[str, Renderer] = {
    "bench": Renderer("Benchmark of the drafters and verifiers", _bench_command, _bench_body),
    "shapes": Renderer("Drafter shapes (what `generate` and `bench` deploy)", _shapes_command, _shapes_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
