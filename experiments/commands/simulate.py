"""`specblock simulate`: predict each policy's tokens/s, tau and latency on the simulator.

Defaults: the profile is the model's own (``--model``; the toy family's is
``data/profiles/cpu_shipped.json``: when it does not exist, the paper-derived A100 profile; another
model without one is refused, naming `specblock profile --model`); the acceptance model replays the
model's traces (the toy family's ``data/traces/default.parquet``) when its own profile is used and
the traces exist, else it is the paper-derived parametric model
(``simulator.parametric.default_acceptance``). The drafter is the one the traces were recorded with,
else ``specblock`` when profiled, else the profile's first.
Without ``--policy`` the baselines are fixed lengths 1, 2, 4 and 8. Vanilla decoding (length 0) is
always evaluated: ``speedup`` is tokens/s over vanilla's. Length policies serve ``--queries`` queries
(SpecLength); adaptation policies serve one stream of ``--queries`` queries (AdaptStream); at most
``MAX_QUERIES``.

Where the predictions hold: a profile's seconds are those of the machine it was measured on. Without
``--profile``, the command says which device the shipped profile was measured on and when (its own date
field, else the date of the git commit that last changed it, else the file's modification time; the
output names the source), and runs a probe of about one second that times this machine's vanilla step of
the model's target (the toy family's ``data/models/target``) at one of the profile's contexts, on the
clock and with the torch threads the profile records (median of runs of
``real_engine.profile.VANILLA_RUN`` steps, as the profile times it), and compares it with the profile's
vanilla step there: ``ratio`` = this machine's milliseconds / the profile's (above 1: this machine is
slower). The table output prints this on stderr; ``--json`` carries it under ``where``. ``--no-probe``
skips the probe (and torch); a profile given with ``--profile`` gets neither. The probe is skipped, with
the reason, when the default profile is paper-derived, times a GPU this machine lacks, or times another
target than the model's.

``--measure`` profiles this machine first (``real_engine.profile.measure`` on a quick grid like the
pipeline's, the model's target and draft model, no feature drafters, CPU seconds with one torch
thread: a few seconds) and simulates with that profile; it is written to ``--measure-out FILE``, else to
a new temporary folder, and kept there to be reused with ``--profile``. The model's traces stay the
default acceptance model, as they were recorded with the models the measured profile times.
``--measure`` with ``--profile`` is bad input (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.files import MAX_PROFILE_BYTES, read_json
from core.models import TOY, ModelSpec
from core.paths import REPO
from experiments.cli import SEED, model_arg, model_option
from experiments.defaults import default_drafter, default_profile, shipped_traces
from experiments.provenance import cpu_name

BASELINES = (1, 2, 4, 8)
MAX_QUERIES = 100_000  # queries per policy: time and memory grow with it; estimates are tight long before
PROBE_SECONDS = 1.0  # wall seconds the probe times this machine's vanilla step for
PROBE_CONTEXT = 256  # the probe runs at the profile's vanilla context nearest this
PROBE_MIN_RUNS = 5
DATE_FIELDS = ("date", "measured_at", "created")  # where a profile may record when it was measured
DATE_SOURCES = {"git commit": "the date of the git commit that last changed the file",
                "file mtime": "the file's modification time"}


def _git(*args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None


def profile_date(path: Path, data: dict[str, Any]) -> tuple[str, str]:
    """When the profile at ``path`` (its JSON ``data``) was measured, and where that date comes from:
    its own date field (``profile <field>``), else the last git commit that changed the file (``git
    commit``; not when the file differs from that commit), else the file's modification time (``file
    mtime``)."""
    for where, block in (("measurement.", data.get("measurement") or {}), ("", data)):
        for name in DATE_FIELDS:
            if isinstance(block, dict) and block.get(name):
                return str(block[name]), f"profile {where}{name}"
    relative = str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else None
    if relative is not None:
        log = _git("log", "-1", "--format=%cI", "--", relative)
        clean = _git("diff", "--quiet", "HEAD", "--", relative)
        if log is not None and log.returncode == 0 and log.stdout.strip() and clean is not None \
                and clean.returncode == 0:
            return log.stdout.strip(), "git commit"
    mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    return mtime.isoformat(timespec="seconds"), "file mtime"


def _probe_context(profile: Any) -> int:
    contexts = [int(c) for c in profile.fits["vanilla"].axes[0]]
    return min(contexts, key=lambda c: (abs(c - PROBE_CONTEXT), c))


def probe(profile: Any, data: dict[str, Any], seconds: float | None = None,
          target_dir: Path = TOY.target) -> dict[str, Any]:
    """Time this machine's vanilla step of the target in ``target_dir`` (the model's) as ``profile`` (its
    JSON ``data``) timed it:
    at the profile's vanilla context nearest ``PROBE_CONTEXT``, on its clock and torch threads, in runs
    of ``VANILLA_RUN`` steps for about ``seconds`` (default ``PROBE_SECONDS``) of wall time; the median
    against the profile's.
    Raises ``LookupError`` with the reason when the probe cannot compare like with like."""
    if profile.derived_from is not None:
        raise LookupError("the profile is derived from publications, not measured")
    if not (target_dir / "config.json").is_file():
        raise LookupError(f"no target at {target_dir}")
    import torch  # torch and the engine: not for --help

    from real_engine import profile as prof
    from real_engine.decode import GREEDY, MAX_TREE_NODES, prefill, vanilla_step
    from real_engine.model import load_model
    from real_engine.timing import make_timer
    from real_engine.verify import TorchSampler

    measurement = data.get("measurement") or {}
    clock_kind = str(measurement.get("clock", "wall"))
    threads = measurement.get("threads")
    on_cpu = profile.device.startswith("CPU")
    if not on_cpu and not torch.cuda.is_available():
        raise LookupError(f"the profile times a GPU ({profile.device}) and this machine has none")
    device = torch.device("cpu" if on_cpu else "cuda")
    context = _probe_context(profile)
    seconds = PROBE_SECONDS if seconds is None else seconds
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(int(threads))
        model = load_model(target_dir, getattr(torch, str(data.get("dtype", "float32"))), device)
        name = prof.model_name(model, target_dir)
        if name != profile.target:
            raise LookupError(f"the profile times another target ({profile.target}) than {name}")
        timer = make_timer(device, clock_kind)
        run = prof.VANILLA_RUN
        gen = torch.Generator().manual_seed(0)
        sampler = TorchSampler(torch.Generator(device=device).manual_seed(0))
        vocab = model.args.vocab_size
        step_seconds: list[float] = []
        with torch.inference_mode():
            cache = model.new_cache(context + 1 + MAX_TREE_NODES)
            prefill(model, cache, torch.randint(1, vocab, (context,), generator=gen).to(device))
            roots = torch.randint(1, vocab, (run,), generator=gen).tolist()
            started = time.perf_counter()
            for i in range(10_000):
                start = timer()
                for root in roots:
                    vanilla_step(model, cache, root, GREEDY, sampler)
                    cache.truncate(context)
                if i > 0:  # the first run warms up
                    step_seconds.append((timer() - start) / run)
                if len(step_seconds) >= PROBE_MIN_RUNS and time.perf_counter() - started >= seconds:
                    break
            wall = time.perf_counter() - started
    finally:
        torch.set_num_threads(before)
    this_ms = 1e3 * statistics.median(step_seconds)
    profile_ms = 1e3 * float(profile.vanilla_seconds(context))
    return {"context": context, "this_machine_ms": this_ms, "profile_ms": profile_ms,
            "ratio": this_ms / profile_ms, "clock": clock_kind, "threads": int(threads) if threads else None,
            "runs": len(step_seconds), "steps_per_run": run, "wall_seconds": wall,
            "this_device": prof.device_name(device)}


def where_shipped(profile_path: Path, run_probe: bool, target_dir: Path = TOY.target) -> dict[str, Any]:
    """Where the default profile comes from and, unless ``run_probe`` is false, how this machine's
    vanilla step of the target in ``target_dir`` compares with it (``probe``; null with ``probe_skipped``
    saying why)."""
    from core.cost_profile import load_profile  # numpy: not for --help

    profile = load_profile(profile_path)
    data = read_json(profile_path, MAX_PROFILE_BYTES, "cost profile",
                     "pass a file written by `specblock profile`")
    date, source = profile_date(profile_path, data)
    measurement = data.get("measurement") or {}
    where: dict[str, Any] = {"profile_device": profile.device, "profile_date": date,
                             "profile_date_source": source, "profile_clock": measurement.get("clock"),
                             "profile_threads": measurement.get("threads"),
                             "profile_torch": measurement.get("torch"), "this_device": f"CPU: {cpu_name()}",
                             "probe": None, "measured_here": False}
    if not run_probe:
        where["probe_skipped"] = "--no-probe"
        return where
    try:
        result = probe(profile, data, target_dir=target_dir)
    except LookupError as err:
        where["probe_skipped"] = str(err)
        return where
    where["this_device"] = result.pop("this_device")
    where["probe"] = result
    return where


def measure_here(out: Path | None, seed: int, model: ModelSpec = TOY) -> tuple[Path, dict[str, Any]]:
    """Profile this machine on a quick grid (``model``'s target and draft model, CPU seconds, one torch
    thread), write it to ``out`` (else a new temporary folder) and say where it comes from."""
    import torch  # torch and the engine: not for --help

    from real_engine import profile as prof
    from real_engine.model import load_model

    folders = {"target": model.target, "draft": model.draft_model}
    for kind, folder in folders.items():
        if not (folder / "config.json").is_file():
            train = "target" if kind == "target" else f"draft-model --model {model_arg(model)}"
            raise InputError(f"--measure needs the model's {kind} model at {folder}: train it with "
                             f"`specblock train {train}` or pass --profile FILE")
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="specblock-measure-")) / "cost_profile.json"
    # As the pipeline's quick profile, with drafts as long as the longest baseline.
    grid = dataclasses.replace(prof.QUICK, nodes=(1, 2, 4, 7, 12, 17), contexts=(64, 256),
                               draft_tokens=tuple(range(1, max(BASELINES) + 1)), draft_context=128)
    before = torch.get_num_threads()
    started = time.perf_counter()
    try:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        target = load_model(folders["target"], torch.float32, device)
        draft = load_model(folders["draft"], torch.float32, device)
        data = prof.measure(target, target_name=prof.model_name(target, folders["target"]), draft=draft,
                            draft_name=prof.model_name(draft, folders["draft"]), grid=grid, feature=False,
                            threads=1, clock_kind="cpu", seed=seed)
    finally:
        torch.set_num_threads(before)
    now = data["measurement"]["date"]
    prof.save(data, out)
    return out, {"profile_device": data["device"], "profile_date": now, "profile_date_source": "measured now",
                 "profile_clock": "cpu", "profile_threads": 1, "profile_torch": torch.__version__,
                 "this_device": data["device"], "probe": None,
                 "probe_skipped": "the profile was measured on this machine", "measured_here": True,
                 "measure": {"out": str(out), "grid": "quick", "feature_drafters": False,
                             "wall_seconds": time.perf_counter() - started}}


def _evaluate(profile_path: Path, traces_path: Path | None, policy_paths: tuple[Path, ...],
              queries: int, seed: int) -> dict[str, Any]:
    from core.cost_profile import load_profile  # numpy and the simulator: not for --help
    from policies import USES, policy_role
    from policies.base import load_policy, make_policy
    from simulator.parametric import default_acceptance
    from simulator.predict import predict
    from simulator.replay import TraceReplay
    from simulator.traces import load_traces

    profile = load_profile(profile_path)
    traces = None if traces_path is None else load_traces(traces_path)
    drafter = default_drafter(profile, traces)
    model = default_acceptance() if traces is None else TraceReplay.from_traces(traces)
    named = [("vanilla", make_policy("fixed", {"length": 0}))]
    if policy_paths:
        named += [(path.stem, load_policy(path, seed=seed)) for path in policy_paths]
    else:
        named += [(f"fixed-{n}", make_policy("fixed", {"length": n})) for n in BASELINES]
    rows = []
    for name, policy in named:
        role = policy_role(policy)
        if role == "serving":
            raise InputError(f"--policy {name}: {USES[role]}; `specblock simulate` runs length and "
                             "adaptation policies")
        outcome = predict(policy, profile, model, drafter, queries=queries, seed=seed).outcome
        where = "AdaptStream" if role == "adaptation" else "SpecLength"
        rows.append({"name": name, "kind": policy.kind, "env": where,
                     "tokens_per_second": outcome.tokens_per_second, "tau": outcome.tau,
                     "latency_seconds": outcome.latency_seconds})
    for row in rows:
        row["speedup"] = row["tokens_per_second"] / rows[0]["tokens_per_second"]
    return {"profile": str(profile_path), "derived": profile.derived_from is not None,
            "traces": None if traces_path is None else str(traces_path),
            "acceptance": "parametric" if traces is None else "replay", "drafter": drafter,
            "queries": queries, "seed": seed, "policies": rows}


def _where_lines(where: dict[str, Any]) -> list[str]:
    """The ``where`` block in words, for stderr."""
    threads = where.get("profile_threads")
    how = ", ".join(x for x in (f"{where['profile_clock']} clock" if where.get("profile_clock") else "",
                                f"{threads} torch thread{'s' if threads != 1 else ''}" if threads else "")
                    if x)
    if where["measured_here"]:
        return [f"measured this machine ({where['this_device']}; {how}, quick grid) in "
                f"{where['measure']['wall_seconds']:.1f} s: predictions are in this machine's seconds; "
                f"profile written to {where['measure']['out']} (reuse it with --profile)"]
    lines = [f"predictions are in the seconds of the shipped profile's machine: {where['profile_device']}"
             f"{f' ({how})' if how else ''}, dated {where['profile_date']} "
             f"({DATE_SOURCES.get(where['profile_date_source'], where['profile_date_source'])})"]
    probe = where["probe"]
    if probe is None:
        lines.append(f"this machine ({where['this_device']}) was not compared ({where['probe_skipped']}): "
                     "pass --measure to profile this machine first")
        return lines
    ratio = probe["ratio"]
    pace = f"{ratio:.2f}x slower" if ratio >= 1 else f"{1 / ratio:.2f}x faster"
    lines.append(f"this machine ({where['this_device']}) is {pace}: its vanilla step at context "
                 f"{probe['context']} takes {probe['this_machine_ms']:.3f} ms against the profile's "
                 f"{probe['profile_ms']:.3f} ms ({probe['clock']} clock, median of {probe['runs']} runs); "
                 "pass --measure to profile this machine first")
    return lines


def _table(result: dict[str, Any]) -> None:
    from rich.console import Console  # rich: not for --help
    from rich.table import Table

    source = "paper-derived" if result["derived"] else "measured"
    table = Table(title=f"Simulated decoding: {result['drafter']} drafter, {result['acceptance']} acceptance",
                  caption=f"profile {result['profile']} ({source}); {result['queries']} queries, "
                          f"seed {result['seed']}")
    for name in ("policy", "kind", "env", "tokens/s", "tau", "latency s", "speedup"):
        table.add_column(name, justify="left" if name in ("policy", "kind", "env") else "right")
    for row in result["policies"]:
        table.add_row(row["name"], row["kind"], row["env"], f"{row['tokens_per_second']:.2f}",
                      f"{row['tau']:.3f}", f"{row['latency_seconds']:.3f}", f"{row['speedup']:.3f}")
    Console().print(table)


@click.command("simulate")
@model_option("The model whose profile, traces and target the defaults are.")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path),
              help="Cost profile JSON [default: the model's own (toy-16m: data/profiles/cpu_shipped.json, "
                   "else the A100 paper profile); then the output says which device and date it comes from "
                   "and how this machine's vanilla step compares].")
@click.option("--measure", is_flag=True,
              help="Profile this machine first (quick grid, the model's target and draft model, CPU seconds "
                   "on one thread: seconds) and simulate with that profile; not with --profile.")
@click.option("--measure-out", type=click.Path(path_type=Path),
              help="With --measure: write the measured profile here [default: a new temporary folder].")
@click.option("--no-probe", is_flag=True,
              help="Do not time this machine's vanilla step against the default profile (no torch); "
                   "a --profile is never probed.")
@click.option("--traces", "traces_path", type=click.Path(path_type=Path),
              help="Acceptance traces (parquet) to replay [default: the model's own (toy-16m: "
                   "data/traces/default.parquet) with its profile or a --measure profile, else the "
                   "parametric model].")
@click.option("--policy", "policy_paths", type=click.Path(path_type=Path), multiple=True,
              help="Policy file to evaluate (repeatable) [default: fixed lengths 1, 2, 4, 8].")
@click.option("--queries", type=int, default=100, show_default=True,
              help=f"Queries per policy (at most {MAX_QUERIES:,}).")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the simulated queries (and of a --measure profile).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object instead of a table (with the default profile, its `where`).")
def command(model: ModelSpec, profile_path: Path | None, measure: bool, measure_out: Path | None,
            no_probe: bool, traces_path: Path | None, policy_paths: tuple[Path, ...], queries: int, seed: int,
            as_json: bool) -> None:
    """Predict tokens/s, tau and latency of speculation policies on the simulator."""
    if queries < 1:
        raise InputError(f"--queries {queries} is too few: simulate at least 1 query")
    if queries > MAX_QUERIES:
        raise InputError(f"--queries {queries} is too many: simulate at most {MAX_QUERIES:,} queries")
    if measure and profile_path is not None:
        raise InputError("--measure and --profile both choose the profile: drop --profile to measure "
                         "this machine, or drop --measure to use that file")
    if measure_out is not None and not measure:
        raise InputError("--measure-out names where --measure writes its profile: add --measure")
    where = None
    if measure:
        profile_path, where = measure_here(measure_out, seed, model.require())
    elif profile_path is None:
        profile_path = default_profile(model)
        where = where_shipped(profile_path, not no_probe, model.target)
    if traces_path is None:
        traces_path = shipped_traces(profile_path, measured_here=measure, model=model)
    result = _evaluate(profile_path, traces_path, policy_paths, queries, seed)
    if where is not None:
        result["where"] = where
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    for line in [] if where is None else _where_lines(where):
        click.echo(f"specblock: {line}", err=True)
    _table(result)
