"""Ray Tune studies: search each policy kind's parameters on the simulator and export the best policy.

A study tunes one task, named by the role of its policies (``length``: speculation-length policies on
SpecLength; ``adaptation``: adaptation policies on AdaptStream streams with a domain shift; ``serving``:
serving policies on SpecServe episodes of ``queries`` Poisson arrivals at ``rate`` per second,
``max_batch`` at once; ``adapt`` and ``serve`` are older names of the last two) as one Ray Tune experiment
whose trials are the configurations of every policy kind (by default ``policies.tune_kinds`` of the role),
drawn from search spaces derived from each kind's parameter ``RANGES``, ``SEARCH`` and ``ORDERED``
(``policies.base.Params``; ``configurations``). The objective is simulated tokens/s. Every trial serves
the same simulated work: chunk k of every trial runs with seed ``seed + k`` (common random numbers), so
trials differ only by their policy. A trial reports its cumulative tokens/s after each chunk, which is
what the ASHA scheduler stops early on.

``length`` chunks split ``queries`` queries into ``chunks`` batches; ``adaptation`` chunks are
``chunks`` independent streams of ``queries`` queries each (a stream cannot be cut without changing
what the policy learns).

Out folder: ``study.json`` (the configuration, then the summary), ``trials/NNNNN.json`` (one record per
finished trial, written as it ends: its policy, tokens/s, tau, chunks run and error; NNNNN is the
configuration's index in the study), ``results.parquet`` and ``results.csv`` (the records as a table, one
row per trial), ``best_policy.json`` (the best complete trial's policy file), ``best_<kind>.json`` per
kind, and ``ray/`` (Ray Tune's working files of the last run: logs, never read back). ``resume`` runs the
configurations that have no record, or an error record, and rebuilds the table from the records; the
configurations and their simulated work are fixed by ``study.json``, so a resumed FIFO study ends where
an uninterrupted one does (ASHA's stops depend on the order trials finish in). Nothing is unpickled. While
a study runs, ``.lock`` holds the folder for it alone (``experiments.folders``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import math
import shutil
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.cost_profile import CostProfile, load_profile
from core.errors import InputError
from core.files import MAX_CALIBRATION_BYTES, MAX_RECORD_BYTES, atomic_write, read_json, write_json
from core.names import ROLE_ALIASES, ROLES
from core.paths import TUNE_RUNS
from experiments.defaults import default_drafter, default_profile, shipped_traces
from experiments.folders import check_writable, hold
from experiments.tuning.ray_session import (  # quiets Ray: ray is imported later, locally
    check_address,
    start_ray,
)
from policies import check_role, tune_kinds
from policies.base import POLICY_KINDS, Policy, canonical_kind, make_policy, policy_to_dict, save_policy
from policies.calibration import Calibration
from simulator.acceptance import AcceptanceModel
from simulator.parametric import PAPER_DOMAINS, paper_acceptance
from simulator.predict import predict
from simulator.replay import TraceReplay
from simulator.rollout import Outcome
from simulator.spec_serve import ServeTraffic
from simulator.traces import load_traces

DEFAULT_QUERIES = {"length": 256, "adaptation": 2000, "serving": 64}
DEFAULT_CHUNKS = {"length": 4, "adaptation": 2, "serving": 2}
SEARCHES = ("random", "grid")
SCHEDULERS = ("fifo", "asha")
MAX_GRID = 4096
"""Most trials one kind's grid search may hold."""
MAX_SAMPLES = 4096
"""Most ``samples`` a study takes (configurations per kind, or values per parameter of a grid): more
would only fill memory with configurations before the first trial runs."""
TRIALS = "trials"
"""The folder of trial records under a study's out folder."""
METRIC = "tokens_per_second"
EXPERIMENT = "study"
"""Name of the Ray Tune experiment under ``out/ray``."""


SERVE_TRAFFIC = ServeTraffic()


@dataclass(frozen=True)
class Traffic:
    """A paper-derived parametric acceptance model (``simulator.parametric.paper_acceptance``)."""

    domains: tuple[tuple[str, float], ...] = tuple(PAPER_DOMAINS.items())
    shared_sd: float = 1.0
    own_sd: float = 0.75


@dataclass(frozen=True)
class Setting:
    """What every trial of a study simulates: plain data, shipped to the Ray workers as is."""

    task: str
    """The role of the policies it tunes (``core.names.ROLES``)."""
    profile: str
    drafter: str
    traces: str | None = None
    traffic: Traffic | None = Traffic()
    """The parametric acceptance model when ``traces`` is None (else None)."""
    queries: int = 256
    chunks: int = 4
    seed: int = 0
    calibration: str | None = None
    """A calibration file (``policies.calibration``) for the kinds that read confidences, or None."""
    serve: ServeTraffic = SERVE_TRAFFIC
    """serving: the arrival rate, batch cap and prompt and output lengths."""

    def describe(self) -> dict[str, Any]:
        """JSON-ready form (for results and resume checks)."""
        return dataclasses.asdict(self)


def make_setting(task: str, profile: str | Path | None = None, traces: str | Path | None = None,
                 queries: int | None = None, chunks: int | None = None, seed: int = 0,
                 traffic: Traffic | None = None, drafter: str | None = None,
                 calibration: str | Path | None = None, serve: ServeTraffic = SERVE_TRAFFIC) -> Setting:
    """A validated ``Setting``. Profile, traces and drafter default as ``specblock simulate`` resolves
    them (``experiments.defaults``); a ``traffic`` replaces the shipped traces; ``calibration`` (a file)
    comes with every length policy that reads confidences; ``serve`` is the serving study's traffic
    (``queries`` requests per episode, ``chunks`` episodes)."""
    task = check_task(task)
    queries = DEFAULT_QUERIES[task] if queries is None else queries
    chunks = DEFAULT_CHUNKS[task] if chunks is None else chunks
    for name, value, low in (("queries", queries, 1), ("chunks", chunks, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"{name} = {value!r} is invalid: use an integer >= {low}")
    if task == "length" and queries < chunks:
        raise InputError(f"{queries} queries cannot fill {chunks} chunks: use queries >= chunks")
    if profile is None:
        profile = default_profile()
        if traces is None and traffic is None:
            traces = shipped_traces(profile)
    loaded = load_profile(profile)
    recorded = None if traces is None else load_traces(traces)
    drafter = drafter or default_drafter(loaded, recorded)
    if drafter not in loaded.drafters:
        raise InputError(f"drafter {drafter!r} is not in the profile: "
                         f"use one of {', '.join(loaded.drafters)}")
    if traces is not None:
        traces, traffic = str(Path(traces).resolve()), None
    elif traffic is None:
        traffic = Traffic()
    if calibration is not None:
        if task == "adaptation":
            raise InputError("a calibration is for length and serving policies: drop --calibration for the "
                             "adaptation study")
        load_calibration(calibration)  # a bad file fails here, not in every trial
        calibration = str(Path(calibration).resolve())
    return Setting(task, str(Path(profile).resolve()), drafter, traces, traffic, queries, chunks, seed,
                   calibration, serve)


@functools.lru_cache(maxsize=8)
def load_calibration(path: str | Path) -> Calibration:
    """A calibration file (``{"positions": [...]}``), validated."""
    raw = read_json(path, MAX_CALIBRATION_BYTES, "calibration file",
                    "pass the calibration.json of a pipeline run")
    return Calibration.from_dict(raw, str(path))


def make_tuned(setting: Setting, kind: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``kind(params)`` as the setting's trials run it: with its calibration when it reads
    confidences."""
    kind = canonical_kind(kind)
    reads = getattr(POLICY_KINDS[kind], "reads_confidences", False)
    calibration = load_calibration(setting.calibration) if setting.calibration and reads else None
    return make_policy(kind, params, seed=setting.seed, calibration=calibration)


def check_task(task: str) -> str:
    """The role ``task`` names (an older name, ``core.names.ROLE_ALIASES``, as its role); InputError for an
    unknown one."""
    task = ROLE_ALIASES.get(task, task)
    if task not in ROLES:
        raise InputError(f"unknown study {task!r}: use one of {', '.join(ROLES)}")
    return task


def check_kinds(task: str, kinds: Sequence[str]) -> tuple[str, ...]:
    """The policy kinds to tune for ``task`` (``policies.tune_kinds`` of its role when empty; old spellings
    as they are registered); InputError for a wrong one."""
    task = check_task(task)
    kinds = tuple(dict.fromkeys(canonical_kind(kind) for kind in kinds)) or tune_kinds(task)
    for kind in kinds:
        if kind not in POLICY_KINDS:
            raise InputError(f"unknown policy kind {kind!r}: use one of {', '.join(sorted(POLICY_KINDS))}")
        check_role(make_policy(kind), task, f"specblock tune {task}")
    return kinds


@functools.lru_cache(maxsize=8)
def world(profile: str, traces: str | None, traffic: Traffic | None) -> tuple[CostProfile, AcceptanceModel]:
    """The cost profile and acceptance model of a setting, built once per process (and Ray worker)."""
    if traffic is None:
        model: AcceptanceModel = TraceReplay.from_traces(load_traces(traces))
    else:
        model = paper_acceptance(dict(traffic.domains), shared_sd=traffic.shared_sd, own_sd=traffic.own_sd)
    return load_profile(profile), model


def simulate_chunks(setting: Setting, kind: str, params: Mapping[str, Any]) -> Iterator[Outcome]:
    """The outcome of each chunk of ``setting`` for the policy ``kind(params)``; chunk k uses seed + k."""
    profile, model = world(setting.profile, setting.traces, setting.traffic)
    policy = make_tuned(setting, kind, params)
    if setting.task == "length":  # the queries split over the chunks; a stream or an episode per chunk
        sizes = np.diff(np.linspace(0, setting.queries, setting.chunks + 1).astype(int)).tolist()
    else:
        sizes = [setting.queries] * setting.chunks
    options = setting.serve.options() if setting.task == "serving" else {}
    for k, size in enumerate(sizes):
        yield predict(policy, profile, model, setting.drafter, queries=int(size), seed=setting.seed + k,
                      env_options=options).outcome


def combine(outcomes: Sequence[Outcome]) -> Outcome:
    """Totals of several runs as one outcome."""
    return Outcome(*(sum(getattr(o, f.name) for o in outcomes) for f in dataclasses.fields(Outcome)))


def evaluate(setting: Setting, kind: str, params: Mapping[str, Any] | None = None) -> Outcome:
    """The study's objective for one configuration: totals over every chunk of ``setting``."""
    return combine(list(simulate_chunks(setting, kind, params or {})))


def _domain(kind: str, name: str) -> Any:
    """Ray Tune's sampling domain of one parameter: its ``RANGES`` entry, narrowed by its ``SEARCH`` one."""
    from ray import tune  # after experiments.tuning.ray_session has set Ray's environment

    params_type = POLICY_KINDS[kind].params_type
    spec = params_type.RANGES[name]
    if all(isinstance(choice, str) for choice in spec):
        return tune.choice(list(spec))
    low, high, integer = spec
    low, high = params_type.SEARCH.get(name, (low, high))
    return tune.randint(int(low), int(high) + 1) if integer else tune.uniform(float(low), float(high))


def _grid_values(domain: Any, samples: int) -> list[Any]:
    """``samples`` evenly spaced values of a numeric domain (every integer when fewer), or every choice."""
    from ray.tune.search.sample import Categorical, Integer  # after ray_session set Ray's environment

    if isinstance(domain, Categorical):
        return list(domain.categories)
    if isinstance(domain, Integer):  # randint's upper bound is exclusive
        return sorted({round(v) for v in np.linspace(domain.lower, domain.upper - 1, samples)})
    return [float(v) for v in np.linspace(domain.lower, domain.upper, samples)]


def configurations(kind: str, search: str = "random", samples: int = 16,
                   seed: int = 0) -> list[dict[str, Any]]:
    """The parameter sets a study tries for ``kind``.

    ``random``: the defaults, then ``samples - 1`` draws from each parameter's Ray Tune domain (seeded by
    ``seed`` and the kind). ``grid``: every combination of ``samples`` evenly spaced values per parameter.
    Duplicates are dropped.
    """
    if search not in SEARCHES:
        raise InputError(f"unknown search {search!r}: use one of {', '.join(SEARCHES)}")
    names = tuple(POLICY_KINDS[kind].params_type.RANGES)
    domains = [_domain(kind, name) for name in names]
    if search == "grid":
        axes = [_grid_values(domain, samples) for domain in domains]
        size = math.prod(len(axis) for axis in axes)
        if size > MAX_GRID:
            raise InputError(f"a grid over the parameters of {kind!r} holds {size} configurations (more than "
                             f"{MAX_GRID}): use --search random, or fewer --samples")
        combos = [dict(zip(names, values, strict=True)) for values in itertools.product(*axes)]
    else:
        rng = np.random.default_rng([seed, zlib.crc32(kind.encode())])
        combos = [default_params(kind)] + [{name: domain.sample(random_state=rng) for name, domain
                                            in zip(names, domains, strict=True)} for _ in range(samples - 1)]
    unique = {json.dumps(params := policy_params(kind, combo), sort_keys=True): params for combo in combos}
    return list(unique.values())


def policy_params(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The valid parameters ``config`` stands for: plain int/float/str by the kind's ``RANGES``, the
    ``ORDERED`` ones sorted."""
    params_type = POLICY_KINDS[kind].params_type
    params: dict[str, Any] = {}
    for name, spec in params_type.RANGES.items():
        value = config[name]
        if all(isinstance(choice, str) for choice in spec):
            params[name] = str(value)
        else:
            params[name] = int(value) if spec[2] else float(value)
    names = params_type.ORDERED
    params.update(zip(names, sorted(params[name] for name in names), strict=True))
    return params


def default_params(kind: str) -> dict[str, Any]:
    """Every parameter of ``kind`` at its default (the first point each random search evaluates)."""
    return policy_to_dict(make_policy(kind))["params"]


def _trial(config: dict[str, Any], setting: Setting) -> None:
    """One Ray Tune trial: simulate chunk by chunk, reporting cumulative tokens/s after each."""
    from ray import tune  # after experiments.tuning.ray_session has set Ray's environment

    policy = config["policy"]
    done: list[Outcome] = []
    for outcome in simulate_chunks(setting, policy["kind"], policy["params"]):
        done.append(outcome)
        total = combine(done)
        tune.report({METRIC: total.tokens_per_second, "tau": total.tau, "chunks": len(done)})


def _trial_dirname(trial: Any) -> str:
    """Trial folders named by the configuration's index (Ray's default spells the configuration out)."""
    return f"{trial.config['policy']['index']:05d}"


class StudyError(RuntimeError):
    """A study ended without a result: interrupted (it can be resumed), or no trial ran to the end."""


@dataclass(frozen=True)
class TuneResult:
    """A finished study: the trial table, the best trial, where the files went, and how fast it ran."""

    table: pd.DataFrame
    best: dict[str, Any]
    best_by_kind: dict[str, dict[str, Any]]
    out: Path
    seconds: float
    tune_seconds: float
    trials_run: int = -1
    """Trials Ray Tune ran in this call (the others were resumed from their records); -1: all of them."""

    @property
    def trials_per_minute(self) -> float:
        """Trials run per minute of Ray Tune time (the experiment's fit; Ray's start excluded); NaN when
        none ran."""
        ran = len(self.table) if self.trials_run < 0 else self.trials_run
        return 60.0 * ran / self.tune_seconds if ran and self.tune_seconds > 0 else math.nan

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (the ``specblock tune --json`` object, less the command's own keys)."""
        rate = self.trials_per_minute
        ran = len(self.table) if self.trials_run < 0 else self.trials_run
        return {"trials": len(self.table), "trials_run": ran, "best": self.best,
                "best_by_kind": self.best_by_kind, "out": str(self.out), "seconds": self.seconds,
                "tune_seconds": self.tune_seconds, "trials_per_minute": None if math.isnan(rate) else rate}


def _recorder(folder: Path) -> Any:
    """A Ray Tune callback (run in this process) that writes each trial's record as the trial ends."""
    from ray.tune import Callback  # after experiments.tuning.ray_session has set Ray's environment

    class Recorder(Callback):
        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            if (trial.last_result or {}).get("chunks"):  # a trial that never reported did not run
                _write_record(folder, trial.config["policy"], trial.last_result, None)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            _write_record(folder, trial.config["policy"], trial.last_result or {}, _error_line(trial))

    return Recorder()


def _error_line(trial: Any) -> str:
    """The last line of a failed trial's error text (the exception), never unpickled."""
    try:
        text = Path(trial.error_file).read_text(errors="replace") if trial.error_file else ""
    except OSError:  # a missing error file must not lose the record
        text = ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else "the trial failed"


def _write_record(folder: Path, policy: Mapping[str, Any], result: Mapping[str, Any],
                  error: str | None) -> None:
    """Write one trial's record (``trials/NNNNN.json``): its policy and last report."""
    def number(key: str) -> float | None:
        value = result.get(key)
        return None if value is None or not math.isfinite(float(value)) else float(value)

    record = {"index": int(policy["index"]), "policy": {"kind": policy["kind"], "params": policy["params"]},
              METRIC: number(METRIC), "tau": number("tau"), "chunks": int(result.get("chunks", 0)),
              "error": error}
    write_json(folder / f"{record['index']:05d}.json", record)


def _read_records(folder: Path, policies: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """The trial records in ``folder`` by index, each checked against the study's configurations."""
    records = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = _read_record(path, policies)
        records[record["index"]] = record
    return records


def _read_record(path: Path, policies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    fix = "delete it to run that trial again"
    record = read_json(path, MAX_RECORD_BYTES, "trial record", fix)
    index = record.get("index") if isinstance(record, dict) else None
    numbers = (int, float, type(None))
    valid = (type(index) is int and 0 <= index < len(policies) and path.stem == f"{index:05d}"
             and type(record.get("chunks")) is int and isinstance(record.get("error"), (str, type(None)))
             and all(isinstance(record.get(key), numbers) for key in (METRIC, "tau")))
    if not valid:
        raise InputError(f"{path} is not a trial record of this study (wrong shape): {fix}")
    expected = {key: policies[index][key] for key in ("kind", "params")}
    if record.get("policy") != json.loads(json.dumps(expected)):
        raise InputError(f"{path} records another configuration than trial {index} of this study: {fix}")
    return record


def _tuner(setting: Setting, policies: list[dict[str, Any]], scheduler: str, out: Path) -> Any:
    """A fresh Ray Tune experiment over ``policies`` whose trials record themselves in ``out/trials``."""
    from ray import tune  # after experiments.tuning.ray_session has set Ray's environment
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator

    trainable = tune.with_parameters(_trial, setting=setting)
    stopper = (ASHAScheduler(time_attr="chunks", max_t=setting.chunks, grace_period=1, reduction_factor=2)
               if scheduler == "asha" else FIFOScheduler())
    return tune.Tuner(
        trainable,
        param_space={"policy": tune.grid_search(policies)},
        tune_config=tune.TuneConfig(metric=METRIC, mode="max", search_alg=BasicVariantGenerator(),
                                    scheduler=stopper, reuse_actors=True,
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=str(out / "ray"), verbose=0,
                                  callbacks=[_recorder(out / TRIALS)]),
    )


def _table(records: Mapping[int, Mapping[str, Any]], chunks: int) -> pd.DataFrame:
    """The results table: one row per trial record, in the study's order."""
    rows = []
    for index, record in sorted(records.items()):
        policy, done = record["policy"], record["chunks"]
        rows.append({"kind": policy["kind"], "trial_id": f"{index:05d}",
                     **{f"params/{name}": value for name, value in policy["params"].items()},
                     **{key: math.nan if record[key] is None else float(record[key])
                        for key in (METRIC, "tau")},
                     "chunks": done, "complete": done == chunks and record["error"] is None,
                     "error": record["error"]})
    table = pd.DataFrame(rows)
    params = sorted(name for name in table.columns if name.startswith("params/"))
    return table[["kind", "trial_id", *params, METRIC, "tau", "chunks", "complete", "error"]]


def best_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The best trial of each kind among its error-free trials that ran the most chunks (ASHA may have
    stopped every trial of a kind early); complete ones first, then by tokens/s."""
    ok = table[table["error"].isna() & (table["chunks"] > 0)]
    deepest = ok[ok["chunks"] == ok.groupby("kind")["chunks"].transform("max")]
    best = deepest.loc[deepest.groupby("kind")[METRIC].idxmax()]
    return best.sort_values(["complete", METRIC], ascending=False)


def row_policy(row: pd.Series) -> dict[str, Any]:
    """``{"kind", "params", "tokens_per_second"}`` of a table row."""
    names = POLICY_KINDS[row["kind"]].params_type.RANGES
    params = policy_params(row["kind"], {name: row[f"params/{name}"] for name in names})
    return {"kind": row["kind"], "params": params, METRIC: float(row[METRIC])}


def tune_policies(setting: Setting, kinds: Sequence[str] = (), samples: int = 16,
                  out: str | Path = TUNE_RUNS / "length", search: str = "random", scheduler: str = "fifo",
                  resume: bool = False, address: str | None = None,
                  progress: Callable[[str], None] | None = None) -> TuneResult:
    """Tune the policy kinds ``kinds`` (the task's defaults when empty) on ``setting`` in one Ray Tune run.

    ``samples``: configurations per kind (``configurations``). Writes the out folder described in the
    module docstring, held by this process alone while it runs. ``resume`` continues the study already in
    ``out`` (it must have the same configuration), running only the trials it has no record of; without
    it, ``out`` must not hold a study yet. ``progress`` receives one line once the inputs are checked.
    """
    start = time.perf_counter()
    kinds = check_kinds(setting.task, kinds)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise InputError(f"samples = {samples!r} is invalid: use an integer from 1 to {MAX_SAMPLES} "
                         "(configurations per kind)")
    if scheduler not in SCHEDULERS:
        raise InputError(f"unknown scheduler {scheduler!r}: use one of {', '.join(SCHEDULERS)}")
    address = check_address(address)
    out = Path(out).resolve()
    check_writable(out)
    policies = [{"index": index, **policy} for index, policy in enumerate(
        {"kind": kind, "params": params} for kind in kinds
        for params in configurations(kind, search, samples, setting.seed))]
    config = {"setting": setting.describe(), "kinds": list(kinds), "samples": samples, "search": search,
              "scheduler": scheduler}
    with hold(out):
        _check_out(out, config, resume)
        done = {i: r for i, r in _read_records(out / TRIALS, policies).items() if r["error"] is None}
        pending = [policy for policy in policies if policy["index"] not in done]
        resumed = f" ({len(done)} resumed from their records)" if done else ""
        started = start_ray(address) if pending else False  # joining a cluster checks --address too
        try:
            if progress:
                progress(f"tuning {len(policies)} configurations{resumed} of {', '.join(kinds)} ({search} "
                         f"search, {scheduler}) on {address or 'local Ray'}: drafter {setting.drafter}, "
                         f"profile {setting.profile}")
            tune_seconds = _run(setting, pending, scheduler, out, config)
        finally:
            if started:
                import ray  # after experiments.tuning.ray_session has set Ray's environment

                ray.shutdown()
        return _finish(setting, config, policies, out, start, tune_seconds, len(pending))


def _run(setting: Setting, pending: list[dict[str, Any]], scheduler: str, out: Path,
         config: dict[str, Any]) -> float:
    """Run the ``pending`` trials on the Ray already up; their fit's seconds."""
    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")  # it warns that no result.json
    level = quiet.level  # exists: the automatic result loggers are off on purpose
    try:
        write_json(out / "study.json", {"config": config})
        if not pending:
            return 0.0
        shutil.rmtree(out / "ray", ignore_errors=True)  # scratch of an earlier run: never read back
        quiet.setLevel(logging.ERROR)
        fit_start = time.perf_counter()
        _tuner(setting, pending, scheduler, out).fit()
        return time.perf_counter() - fit_start
    finally:
        quiet.setLevel(level)


def _finish(setting: Setting, config: dict[str, Any], policies: list[dict[str, Any]], out: Path,
            start: float, tune_seconds: float, ran: int) -> TuneResult:
    """Build the table from the trial records; write the results, the best policies and the summary."""
    records = _read_records(out / TRIALS, policies)
    if len(records) < len(policies):
        raise StudyError(f"the study in {out} stopped before every trial ran: continue it with --resume")
    table = _table(records, setting.chunks)
    best = best_rows(table)
    if best.empty or not best["complete"].iloc[0]:
        errors = table["error"].dropna()
        detail = f": {errors.iloc[0]}" if len(errors) else ""
        raise StudyError(f"no trial ran to the end (see {out / 'ray'}){detail}")
    by_kind = {row["kind"]: {**row_policy(row), "complete": bool(row["complete"])}
               for _, row in best.iterrows()}
    for kind, chosen in by_kind.items():  # a kind whose trials all stopped early: its best so far
        save_policy(make_tuned(setting, kind, chosen["params"]), out / f"best_{kind}.json")
    overall = row_policy(best.iloc[0])
    save_policy(make_tuned(setting, overall["kind"], overall["params"]), out / "best_policy.json")
    atomic_write(out / "results.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write(out / "results.csv", lambda tmp: table.to_csv(tmp, index=False))
    result = TuneResult(table, overall, by_kind, out, time.perf_counter() - start, tune_seconds, ran)
    write_json(out / "study.json", {"config": config, "summary": result.summary()})
    return result


def _check_out(out: Path, config: dict[str, Any], resume: bool) -> None:
    """Without ``resume``, ``out`` must hold no study; with it, only a study of the same configuration."""
    stored = out / "study.json"
    if not resume:
        if any((out / name).exists() for name in ("study.json", TRIALS, "ray")):
            raise InputError(f"{out} already holds a tune study: pass --resume to continue it, "
                             "or choose another --out")
        return
    if not stored.exists():
        return
    previous = read_json(stored, MAX_RECORD_BYTES, "study record",
                         "choose another --out, or delete the folder to start over")
    if not isinstance(previous, dict) or previous.get("config") != json.loads(json.dumps(config)):
        raise InputError(f"{out} holds a study with another configuration: resume it with the same "
                         "options (see its study.json), or choose another --out")
