"""Mutation testing of the core modules with mutmut, each module against its own test files only.

For every module in ``MODULES`` the checkout (tracked and untracked, not ignored files) is copied to a
scratch folder, a ``setup.cfg`` there tells mutmut which one file to mutate and which test files to run
(nothing in the checkout's pyproject is read for it), and ``mutmut run`` works one mutant at a time
until it is done or the module's share of the time budget is spent; then it is stopped, and what it did
not reach is counted as not run. Saves ``benchmarks/results/mutation.json`` (counts per module and
every surviving mutant's diff) and ``mutation.md`` (the same, with what was done about each survivor,
from ``NOTES``).

    specblock benchmark mutation [--budget-minutes 40] [--only real_engine/tree.py ...]
    specblock benchmark mutation --render   # rewrite mutation.md from the saved JSON
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from benchmarks.mutation_notes import DEVICE, DTYPE, MESSAGE, NOTES, STRICT
from benchmarks.output import finish, table
from core.errors import InputError
from core.files import MAX_RECORD_BYTES, read_json, write_text
from core.paths import REPO, RESULTS
from experiments.cli import OUT_FOLDER
from experiments.provenance import save_result
from experiments.report_format import Lines, Record, Renderer, benchmark, flag
from experiments.report_format import table as md_table

NAME = "mutation"
SCRATCH = Path("/tmp/specblock-mutation")
PACKAGES = ("real_engine", "simulator", "policies", "experiments")
MODULES: dict[str, tuple[str, ...]] = {
    "real_engine/verify.py": ("tests/test_verify_api.py", "tests/test_verify_sampling.py",
                              "tests/test_verify_lossless.py"),
    "real_engine/kv_cache.py": ("tests/test_model.py", "tests/test_feedback_paths.py"),
    "real_engine/tree.py": ("tests/test_verify_api.py", "tests/test_model.py", "tests/test_eagle.py",
                            "tests/test_feedback_paths.py"),
    "real_engine/decode.py": ("tests/test_decode.py", "tests/test_decode_edges.py",
                              "tests/test_feedback_paths.py"),
    "core/interpolation.py": ("tests/test_costs.py", "tests/test_costs_shapes.py"),
    "core/cost_profile.py": ("tests/test_costs.py", "tests/test_costs_shapes.py"),
    "simulator/spec_length.py": ("tests/test_envs.py", "tests/test_speclength_accounting.py",
                                 "tests/test_costs_shapes.py", "tests/test_steering.py",
                                 "tests/test_rollout_batch.py", "tests/test_trace_replay_bias.py"),
    "policies/length.py": ("tests/test_policies.py", "tests/test_steering.py"),
    "policies/adaptation.py": ("tests/test_policies.py",),
}
DESELECT: dict[str, tuple[str, ...]] = {
    "real_engine/decode.py": ("tests/test_decode.py::test_trained_drafters_sampled_chains_follow_the_target",
                              "tests/test_decode.py::test_a_trained_drafters_chain_is_sampled_from_its_law_at_"
                              "temperature_one"),
}
"""Tests of a module's files left out of its runs: the trained drafters' own sampling checks (12 of the
decode file's 35 seconds, on drafter code, not the loop's), so that more of the loop's mutants are run."""
SHARE = {"real_engine/verify.py": 0.17, "real_engine/kv_cache.py": 0.06, "real_engine/tree.py": 0.10,
         "real_engine/decode.py": 0.25, "core/interpolation.py": 0.04, "core/cost_profile.py": 0.12,
         "simulator/spec_length.py": 0.14, "policies/length.py": 0.06, "policies/adaptation.py": 0.06}
"""Each module's share of the time budget (by its size and how long its tests take)."""
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          35: "suspicious", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          37: "type check", -11: "segfault", -9: "segfault", None: "not run"}
"""mutmut's exit codes (``mutmut.stats.status_by_exit_code``) as the columns of the report."""
COLUMNS = ("killed", "survived", "timeout", "no tests", "not run")

def checkout_files(root: Path) -> list[str]:
    """Tracked and untracked, not ignored files of the checkout (what a fresh copy of the work tree holds)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return [f for f in out.split("\0") if f and (root / f).is_file()]


def prepare(module: str, tests: tuple[str, ...], root: Path = REPO) -> Path:
    """A scratch copy of the checkout with a setup.cfg that mutates ``module`` against ``tests`` only
    (less ``DESELECT``)."""
    work = SCRATCH / module.replace("/", "__").removesuffix(".py")
    shutil.rmtree(work, ignore_errors=True)
    for name in checkout_files(root):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, work / name)
    lines = ["[mutmut]", "source_paths =", *(f"    {p}" for p in PACKAGES), f"only_mutate = {module}",
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             *(f"    --deselect\n    {t}" for t in DESELECT.get(module, ())),
             "pytest_add_cli_args =", "    -p", "    no:cacheprovider", "also_copy =", "    data",
             "use_git_change_detection = false", ""]
    (work / "setup.cfg").write_text("\n".join(lines))
    return work


def run_mutmut(work: Path, seconds: float, names: list[str]) -> tuple[float, bool, int | None]:
    """``mutmut run`` in ``work`` for at most ``seconds`` (only mutants matching ``names`` when given):
    (elapsed, finished, exit code). Stopped with SIGINT (mutmut saves what it has), then killed, as a
    process group."""
    start = time.monotonic()
    with open(work / "mutmut.log", "wb") as log:
        command = [sys.executable, "-m", "mutmut", "run", "--max-children", "1", *names]
        proc = subprocess.Popen(command, cwd=work,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=seconds)
            return time.monotonic() - start, code == 0, code
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return time.monotonic() - start, False, None


DIFFS = """
import json, sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
out = {}
for name in json.load(sys.stdin):
    try:
        out[name] = get_diff_for_mutant(name, path=find_mutant(name).path)
    except Exception as exc:  # a mutant mutmut cannot show is reported, not fatal
        out[name] = f"(no diff: {exc!r})"
print(json.dumps(out))
"""


def diffs(work: Path, names: list[str]) -> dict[str, str]:
    """Each mutant's diff against the original source, from mutmut itself (one process for all)."""
    if not names:
        return {}
    proc = subprocess.run([sys.executable, "-c", DIFFS], cwd=work, input=json.dumps(names), text=True,
                          capture_output=True, timeout=600)
    if proc.returncode != 0:
        return {name: f"(no diff: {proc.stderr.strip()[-300:]})" for name in names}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compact(diff: str) -> str:
    """Only the changed lines of a diff."""
    lines = diff.splitlines()
    return "\n".join(x for x in lines if x.startswith(("-", "+")) and not x.startswith(("---", "+++")))


def collect(work: Path, module: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts per status and the mutants that were not killed, from mutmut's saved results; with ``base``
    (an earlier row), its outcomes stand for the mutants this run did not select (``--functions``)."""
    meta = work / "mutants" / f"{module}.meta"
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    earlier = {} if base is None else {s["name"]: s["diff"] for s in base["survivors"]}
    for name, code in (base or {}).get("codes", {}).items():
        if codes.get(name) is None:
            codes[name] = code
    counts = dict.fromkeys(COLUMNS, 0)
    other: dict[str, int] = {}
    by_status: dict[str, list[str]] = {}
    for name, code in sorted(codes.items()):
        status = STATUS.get(code, "suspicious")
        if status in counts:
            counts[status] += 1
        else:
            other[status] = other.get(status, 0) + 1
        by_status.setdefault(status, []).append(name)
    shown = [n for s in ("survived", "no tests", "timeout", "suspicious") for n in by_status.get(s, [])]
    text = {**earlier, **diffs(work, [n for n in shown if n not in earlier])}
    return {"mutants": len(codes), **counts, "other": other, "codes": codes,
            "survivors": [{"name": n, "status": STATUS.get(codes[n], "suspicious"),
                           "diff": compact(text.get(n, ""))} for n in shown]}


def digest(paths: list[str]) -> dict[str, str]:
    """sha256 (12 hex digits) of each file, so a result names the exact tests it ran."""
    return {p: hashlib.sha256((REPO / p).read_bytes()).hexdigest()[:12] for p in paths}


def _changed(diff: str) -> tuple[list[str], list[str]]:
    """The removed and added lines of a mutant's diff."""
    lines = [line for line in diff.splitlines() if not line.startswith(("---", "+++"))]
    return [x[1:] for x in lines if x.startswith("-")], [x[1:] for x in lines if x.startswith("+")]


TEXT_ARGS = {"_need(": (2, 4), "_text(": (2,), "_series(": (2,), "_seconds(": (1,), "read_json(": (2, 3),
             ".grid(": (0,)}
"""Calls whose arguments at these positions only word an error message (the field's path, what to put)."""


def _call_args(line: str, call: str) -> list[str] | None:
    """The top-level arguments of the first ``call`` in ``line`` (None when it is not there)."""
    start = line.find(call)
    if start < 0:
        return None
    args, depth, quote, current = [], 0, "", ""
    for ch in line[start + len(call):]:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return [*args, current.strip()]
            depth -= 1
        elif ch == "," and depth == 0:
            args, current = [*args, current.strip()], ""
            continue
        current += ch
    return None


def _text_only(old: str, new: str) -> bool:
    """Whether ``new`` changes only message-wording arguments of a ``TEXT_ARGS`` call to another text."""
    for call, positions in TEXT_ARGS.items():
        a, b = _call_args(old, call), _call_args(new, call)
        if a is None or b is None or len(a) != len(b):
            continue
        changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        literal = re.compile(r"^(f?[\"'].*[\"']|None)$")
        if changed and all(i in positions and literal.match(b[i]) for i in changed) and \
                old[:old.find(call)] == new[:new.find(call)]:
            return True
    return False


def category(diff: str) -> str | None:
    """A note for the mutants that are alike wherever they occur: ``strict`` zips, devices, error text."""
    old, new = _changed(diff)
    if not old or len(old) != len(new):
        return None
    pairs = list(zip(old, new, strict=True))
    if all(re.sub(r",? ?strict=\w+", "", a) == re.sub(r",? ?strict=\w+", "", b).replace(", )", ")")
           or re.sub(r",? ?strict=\w+", "", a).replace(", )", ")") == re.sub(r",? ?strict=\w+", "", b)
           .replace(", )", ")") for a, b in pairs) and "strict" in " ".join(old):
        return STRICT
    if all(re.sub(r",? ?device=[\w.]+", "", a).replace(", )", ")")
           == re.sub(r",? ?device=[\w.]+", "", b).replace(", )", ")") for a, b in pairs):
        return DEVICE
    if all(_text_only(a, b) for a, b in pairs):
        return MESSAGE
    if all(re.search(r"raise |Error\(", a) or re.match(r"\s*f?[\"']", a) for a in old) and all(
            "XX" in b or b.lower() == a.lower() or re.search(r"Error\(None\)|join\(None\)", b)
            for a, b in pairs):
        return MESSAGE
    return None


def note(name: str, diff: str = "") -> str:
    """What was done about survivor ``name``: ``NOTES`` (by name or glob), else its ``category``."""
    found = (text for pattern, text in NOTES.items() if fnmatch.fnmatchcase(name, pattern))
    return next(found, None) or category(diff) or "not reviewed"


BY_HAND = (
    "The three input-edge bugs that every test missed were made by hand, each test run against it, and the "
    "file restored (`git diff` empty): `real_engine/decode.py` handing `accept` the first n target rows "
    "(`rows = slice(n)`) fails four tests of `tests/test_feedback_paths.py` (the rows two stub drafters "
    "receive against a fresh target forward, and EAGLE's and SpecBlock's next trees against drafters begun "
    "afresh on the committed text); `core/interpolation.py` `blend` without the floor at 0 fails "
    "`test_extrapolation_never_falls_below_the_last_grid_value_nor_slopes_down` and `test_blend_is_linear_"
    "inside_and_never_slopes_down_outside`; the bandit's revert rule with `tau > previous` fails "
    "`test_bandit_equal_tau_windows_are_never_drops` (3 cases). SpecLength without the bonus token fails "
    "`tests/test_speclength_accounting.py`. mutmut does not mutate decorated functions, so `generate` "
    "(`@torch.inference_mode()`), where the first bug lived, is covered only by those hand-made mutants.",
    "Passes: the first ran every module within its share of 40 minutes (31 minutes); the modules were then "
    "run again after the tests written against their survivors (about 55 minutes more in all, envs four "
    "times). The decode module's second pass ran the loop's step functions only (`--functions`), its "
    "first-pass outcomes standing for the rest; its first-pass survivors in `make_drafter` and "
    "`Stats.to_dict` were each applied with `mutmut apply` and the new tests run against it (37 of 37 "
    "fail). Survivors marked \"checked by applying the mutant\" were killed by a test added after the last "
    "mutmut pass of their module.",
)
"""Paragraphs of mutation.md written by hand: what was checked outside mutmut, and how the passes ran."""


def _short(name: str, module: str) -> str:
    """A mutant's name without its module's prefix."""
    return name.removeprefix(module.removesuffix(".py").replace("/", ".") + ".")


def _table(rows: dict[str, Any]) -> list[str]:
    """The per-module counts as a markdown table."""
    out = ["| module | tests | mutants | killed | survived | timed out | no tests | not run | minutes | "
           "first pass |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for module, row in rows.items():
        tests = ", ".join(Path(t).stem.removeprefix("test_") for t in row["tests"])
        before = row.get("previous")
        first = "" if before is None else (f"{before['killed']} killed, {before['survived']} survived, "
                                           f"{before['no tests']} no tests, {before['not run']} not run")
        out.append(f"| `{module}` | {tests} | {row['mutants']} | {row['killed']} | {row['survived']} | "
                   f"{row['timeout']} | {row['no tests']} | {row['not run']} | {row['elapsed_s'] / 60:.1f} | "
                   f"{first} |")
    return out


def render(data: dict[str, Any]) -> str:
    """mutation.md: the table per module, then every survivor and what was done about it: those alike by
    kind in one list per kind, the others one by one with their diff."""
    rows = data["results"]["modules"]
    out = ["# Mutation testing", "",
           f"mutmut {data['config']['mutmut']}, one mutant at a time, each module against its own test "
           "files within its share of a 40-minute budget, then again for the modules whose tests were added "
           f"to (`benchmarks/mutation.py`; commit {data.get('git_commit')}; the test files hashed in the "
           "JSON).", "", *(x for line in BY_HAND for x in (line, "")), *_table(rows), "",
           "\"not run\": mutants mutmut did not reach within the module's budget (it was stopped); "
           "\"no tests\": mutants in code none of the module's tests runs; \"first pass\": the figures "
           "before the tests written against that pass's survivors, where the module was run again. "
           "Functions under a decorator (``generate``, ``propose``) are not mutated by mutmut.", ""]
    for module, row in rows.items():
        if not row["survivors"]:
            continue
        out += [f"## `{module}`", ""]
        kinds: dict[str, list[str]] = {}
        single = []
        for s in row["survivors"]:
            text = note(s["name"], s["diff"])
            if text in (STRICT, DEVICE, MESSAGE, DTYPE):
                kinds.setdefault(text, []).append(f"`{_short(s['name'], module)}`")
            else:
                single.append((s, text))
        for text, names in kinds.items():
            out += [f"- {text}: {', '.join(names)}", ""]
        for s, text in single:
            out += [f"- `{_short(s['name'], module)}` ({s['status']}): {text}", "", "  ```diff",
                    *(f"  {line}" for line in s["diff"].splitlines()), "  ```", ""]
    return "\n".join(out).rstrip() + "\n"


def saved_results(path: Path) -> dict[str, Any]:
    """The saved mutation results (with provenance)."""
    return read_json(path, MAX_RECORD_BYTES, "mutation results", "run `specblock benchmark mutation` again")


@click.command("mutation")
@click.option("--budget-minutes", type=float, default=40.0, show_default=True,
              help="Total time for all modules.")
@click.option("--only", multiple=True, type=click.Choice(sorted(MODULES)),
              help="Run this module only (repeatable), merged into the saved results.")
@click.option("--functions", multiple=True,
              help="With --only: run only the mutants of this function (repeatable), as mutmut names them "
                   "after its 'x' (_f for f, Cǁm for C.m; globs allowed).")
@click.option("--render", "render_only", is_flag=True, help="Only rewrite mutation.md from the saved JSON.")
@click.option("--out", type=OUT_FOLDER, default=RESULTS,
              show_default="benchmarks/results", help="Folder for mutation.json and mutation.md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the counts per module.")
def command(budget_minutes: float, only: tuple[str, ...], functions: tuple[str, ...], render_only: bool,
            out: Path, as_json: bool) -> None:
    """Mutation testing of the core modules with mutmut, each module against its own test files only."""
    saved, report = out / f"{NAME}.json", out / f"{NAME}.md"
    if render_only:
        data = saved_results(saved)
        finish(as_json, data["results"], saved, write_text(report, render(data)))
        return
    if not budget_minutes > 0:
        raise InputError(f"--budget-minutes {budget_minutes}: give a positive number of minutes")
    if functions and not only:
        raise InputError("--functions selects mutants of the --only modules: add --only MODULE")
    modules = dict(MODULES) if not only else {m: MODULES[m] for m in only}
    old = saved_results(saved)["results"]["modules"] if only and saved.exists() else {}
    results: dict[str, Any] = dict(old)
    show = table(as_json)
    for module, tests in modules.items():
        budget = SHARE[module] * budget_minutes * 60
        show(f"{module}: {budget / 60:.1f} min against {', '.join(tests)}")
        work = prepare(module, tests)
        names = [f"{module.removesuffix('.py').replace('/', '.')}.x{f}__mutmut_*" for f in functions]
        elapsed, finished, code = run_mutmut(work, budget, names)
        row = {"tests": list(tests), "deselected": list(DESELECT.get(module, ())),
               "functions": list(functions), "test_sha256": digest(list(tests)), "budget_s": round(budget, 1),
               "elapsed_s": round(elapsed, 1), "finished": finished, "exit_code": code,
               **collect(work, module, old.get(module) if functions else None)}
        if module in old:  # a rerun (after new tests): keep the first pass's figures beside the new ones
            first = old[module].get("previous")
            row["previous"] = first or {k: old[module][k] for k in ("mutants", *COLUMNS, "test_sha256")}
        results[module] = row
        counts = ", ".join(f"{c} {row[c]}" for c in COLUMNS)
        show(f"  {counts} of {row['mutants']} in {elapsed / 60:.1f} min")
    ordered = {m: results[m] for m in MODULES if m in results}
    config = {"mutmut": importlib.metadata.version("mutmut"), "budget_minutes": budget_minutes,
              "share": SHARE, "modules": {m: list(t) for m, t in MODULES.items()}, "max_children": 1}
    save_result(NAME, {"modules": ordered}, config, seed=None, directory=out)
    per_module = {m: {c: row[c] for c in ("mutants", *COLUMNS)} for m, row in ordered.items()}
    finish(as_json, per_module, saved, write_text(report, render(saved_results(saved))))


# --- its section of docs/results.md ----------------------------------------------------------------


def _mutation_command(name: str, config: Record) -> str:
    return f"{benchmark('mutation')}{flag('--budget-minutes', config['budget_minutes'], 40.0)}"


def _mutation_body(record: Record) -> Lines:
    keys = ("mutants", "killed", "survived", "timeout", "no tests", "not run")
    rows = [[f"`{module}`", *(m[k] for k in keys)] for module, m in record["results"]["modules"].items()]
    return [f"mutmut {record['config']['mutmut']}; each module against its own tests.", "",
            *md_table(["module", *keys], rows)]


RENDERERS: dict[str, Renderer] = {
    "mutation": Renderer("Mutation testing", _mutation_command, _mutation_body),
}
"""How its results read on docs/results.md (``experiments.results.renderers`` collects them)."""
