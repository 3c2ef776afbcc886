"""The main job, `specblock pipeline`: measure the engine, build the simulator, tune policies in it,
deploy them in the engine, and report how well the simulator predicted what the engine did.

Seven steps, each writing into one run folder (``--resume`` skips the finished ones, recorded in
``run.json`` with the plan they ran under):

1. ``models``   load the target, the draft model and the tokenizer -> ``models.json``
2. ``profile``  measure this machine's costs -> ``cost_profile.json``
3. ``traces``   probe the draft-model chain at every calibration answer position -> ``traces.parquet``
4. ``simulate`` the baseline length policies in the simulator -> ``simulate.json``
5. ``tune``     Ray Tune over the length policies (and, unless quick, the adaptation policies) ->
                ``tune/<task>/`` with ``best_<kind>.json`` policy files, copied to ``policies/``
6. ``deploy``   every length policy file in the live engine on held-out prompts (round-robin prompt
                by prompt, steady-state throughput on the profile's clock) beside the simulator's
                prediction for the same prompts, and from their own probed traces
                (``held_out_traces.parquet``) -> ``deploy.json``; unless quick, the adaptation policies
                (never, always head, always full, epsilon-greedy, the cost-aware bandit, and the tuned
                ones) serve a stream with a domain shift with online updates of the SpecBlock drafter
                (``experiments.adapt.live``) -> ``adaptation.json``
7. ``report``   ``report.md`` and ``report.png``: predicted against measured tokens/s per policy, the
                fidelity error (median absolute relative error), the tuned policies, the LP table

The engine and the simulator see the same observations (``policies.features``) and the same cost
profile, so a policy file behaves the same way in both.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from core.cost_profile import load_profile
from core.errors import InputError
from core.files import MAX_POLICY_BYTES, MAX_RECORD_BYTES, read_json, write_json
from core.models import TOY, ModelSpec
from core.paths import repo_relative
from experiments.adapt import live as adapt_live
from experiments.adapt.plan import QUICK_PLAN, SMOKE_PLAN, StreamPlan
from experiments.cli import drafter_folder, model_arg, model_domains, model_profile, model_prompts
from experiments.folders import LOCK, PROFILE_MAX_AGE_HOURS, check_writable, hold, measurement_age
from experiments.pipeline.deploy import LiveRun, compare, decision_cost, forecast
from experiments.pipeline.report import write_report
from experiments.tuning.ray_session import check_address
from experiments.tuning.tune import load_calibration, make_setting, tune_policies
from policies import (
    POLICY_KINDS,
    canonical_kind,
    load_policy,
    make_policy,
    policy_from_dict,
    policy_role,
    policy_to_dict,
    role_kinds,
)
from real_engine import profile as prof
from real_engine.decode import make_drafter
from real_engine.drafters.vocab import deployed_count, deployed_vocab
from real_engine.model import load_model
from real_engine.prompts import Prompt, encode_row, interleave, read_prompt_file, select_part
from real_engine.speculate import LengthControlled
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts, record
from real_engine.training.drafter_data import target_fingerprint
from simulator.calibration import fit_calibration
from simulator.traces import load_traces, save_traces

STEPS = ("models", "profile", "traces", "simulate", "tune", "deploy", "report")
DRAFTER = "draft-model"
MAX_FILE_PROMPTS = 10_000  # rows per category read from a prompt file (the plan takes its few)


@dataclass(frozen=True)
class PipelinePlan:
    """Sizes of one pipeline run: ``FULL``, ``QUICK`` (a few minutes on 2 CPU cores, ``make run``) and
    ``SMOKE`` (the fewest prompts and queries that still run every step: the tests)."""

    quick: bool
    domains: tuple[str, ...] = ("code", "tests", "prose", "text")
    depth: int = 6  # the draft-model chain the engine drafts each iteration
    calibration: int = 24  # calibration prompts per domain (traces): fewer let a few easy prompts set tau
    evaluation: int = 6  # held-out prompts per domain (deployment)
    max_new_tokens: int = 96
    prompt_tokens: int = 256  # each prompt's last tokens
    tune_samples: int = 12  # configurations per policy kind
    tune_queries: int = 256
    sim_queries: int = 512  # simulated queries per prediction
    forecast_replicates: int = 40  # resamples of the calibration queries behind a prediction's interval
    adapt: bool = True  # also tune the adaptation policies
    clock: str = "cpu"  # the profile's and the deployment's clock (process CPU time on one thread)
    seed: int = 0
    prompt_file: str | None = None  # a user's prompt file instead of the model's sets (its categories)
    stream: StreamPlan | None = QUICK_PLAN  # the adaptation stream the deploy step serves (None: none)


FULL = PipelinePlan(quick=False)
QUICK = PipelinePlan(
    quick=True,
    max_new_tokens=48,  # 64 reached the 10-minute goal on a slower 2-core machine (pipeline_quick at c73a6ba)
    prompt_tokens=128,
    tune_samples=4,
    tune_queries=128,
    sim_queries=256,
    forecast_replicates=30,
    adapt=False,
    stream=None,  # `specblock adapt-live --quick` serves it alone
)
SMOKE = replace(
    QUICK,
    calibration=2, evaluation=2,
    max_new_tokens=24, prompt_tokens=64,
    tune_samples=1, tune_queries=32,
    sim_queries=64, forecast_replicates=5,
    stream=SMOKE_PLAN,
)


@dataclass
class Run:
    """The run folder, its plan and what the steps share in memory."""

    out: Path
    plan: PipelinePlan
    model_dir: Path
    draft_dir: Path
    address: str | None = None
    log: Callable[[str], None] = lambda _: None
    loaded: dict[str, Any] | None = None
    model: ModelSpec = TOY  # whose drafters, prompt sets and profile the steps take

    def path(self, name: str) -> Path:
        """A file of the run folder."""
        return self.out / name

    def models(self) -> dict[str, Any]:
        """The target, the draft model, how many tokens it drafts (its deployed drafting vocabulary, None:
        every token) and the tokenizer, loaded once (on one torch thread for the CPU clock, so measurements
        do not depend on how busy the other core is)."""
        if self.loaded is None:
            if self.plan.clock == "cpu":
                torch.set_num_threads(1)
            dtype = getattr(torch, self.model.dtype)
            target = load_model(self.model_dir, dtype)
            self.loaded = {
                "target": target,
                "draft": load_model(self.draft_dir, dtype),
                "draft_vocab": deployed_count(self.draft_dir, DRAFTER),
                "tokenizer": Tokenizer.load(self.model_dir, target.args.vocab_size, target.args.eos_token_id),
            }
        return self.loaded

    def drafter(self) -> Any:
        """A fresh drafter as every step drafts: the draft model's chain ``plan.depth`` deep over its
        deployed drafting vocabulary (the head over a real model's whole vocabulary can cost more than the
        layers), its other deployed options (lookup) left out, since the length policies set the chain."""
        m = self.models()
        return make_drafter(DRAFTER, m["target"], m["draft"], folder=self.draft_dir, deployed=False,
                            depth=self.plan.depth, vocab=m["draft_vocab"])

    def prompts(self, part: str) -> list[Any]:
        """The plan's calibration or evaluation prompts, domains interleaved: of the model's prompt sets,
        or of the plan's prompt file (each category's rows by their split, else by halves)."""
        count = self.plan.calibration if part == "calibration" else self.plan.evaluation
        tokenizer = self.models()["tokenizer"]
        if self.plan.prompt_file is None:
            return load_prompts(self.plan.domains, count, tokenizer.encode, part,
                                max_tokens=self.plan.prompt_tokens,
                                folder=model_prompts(self.model, self.plan.domains),
                                chat_encode=tokenizer.chat_encoder())
        path = Path(self.plan.prompt_file)
        groups = read_prompt_file(path, MAX_FILE_PROMPTS)
        last = self.plan.prompt_tokens
        chat = tokenizer.chat_encoder()
        return interleave([[Prompt(r.name, r.domain, tuple(encode_row(r, tokenizer.encode, chat)[-last:]))
                            for r in select_part(groups[d], part, path)[:count]] for d in self.plan.domains])


# ----------------------------------------------------------------------------- steps


def step_models(run: Run) -> dict[str, Any]:
    """Load the models and record what they are."""
    m = run.models()
    info = {
        "model": run.model.name,
        "target": prof.model_name(m["target"], run.model_dir),
        "target_dir": repo_relative(run.model_dir),
        "target_fingerprint": target_fingerprint(m["target"]),
        "draft": prof.model_name(m["draft"], run.draft_dir),
        "draft_dir": repo_relative(run.draft_dir),
        "draft_vocab": m["draft_vocab"],
    }
    write_json(run.path("models.json"), info)
    return info


def _measure_profile(run: Run, path: Path, rounds: int | None = None,
                     between: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Measure the cost profile of the target and the draft model on this machine into ``path``
    (``rounds`` timed rounds, each followed by ``between(round)``, when given)."""
    m, plan = run.models(), run.plan
    grid = (
        replace(
            prof.QUICK,
            nodes=(1, 2, 4, 7, 12, 17),
            contexts=(64, 256),
            draft_tokens=tuple(range(1, plan.depth + 1)),
            draft_context=128,
            repeats=5,
        )
        if plan.quick
        else prof.FULL
    )
    if rounds is not None:
        grid = replace(grid, repeats=rounds)
    data = prof.measure(
        m["target"],
        target_name=prof.model_name(m["target"], run.model_dir),
        draft=m["draft"],
        draft_name=prof.model_name(m["draft"], run.draft_dir),
        grid=grid,
        feature=not plan.quick,
        dtype=run.model.dtype,
        threads=1 if plan.clock == "cpu" else None,
        clock_kind=plan.clock,
        seed=plan.seed,
        models_dir=run.model.drafters,
        between=between,
        draft_vocab=deployed_vocab(run.draft_dir),
    )
    prof.save(data, path)
    return prof.summary(data)


def step_profile(run: Run) -> dict[str, Any]:
    """Measure the cost profile the simulator and the tuning use."""
    return _measure_profile(run, run.path("cost_profile.json"))


def step_traces(run: Run) -> dict[str, Any]:
    """Record the calibration traces of the draft-model chain, probed (a draft at every position of the
    greedy text, ``real_engine.trace.Probe``, so a simulated length policy walks the text as the engine
    would: ``simulator.replay.TraceReplay.walk``) for ``plan.depth`` tokens past the answers the
    simulator decodes, so that none of their drafts is cut short by the end; fit the drafter's confidence
    calibration (``calibration.json``) from them."""
    prompts = run.prompts("calibration")
    traces = _probe(run, prompts, "traces.parquet")
    calibration = fit_calibration(traces)
    write_json(run.path("calibration.json"), calibration.to_dict())
    return {"queries": len(prompts), "positions": len(traces),
            "mean_accepted": float(traces["accepted"].mean()), "calibrated_positions": len(calibration.knots)}


def _probe(run: Run, prompts: list[Any], name: str) -> Any:
    """Probed traces of the draft-model chain on ``prompts`` (greedy, ``plan.depth`` tokens past the answer
    length), saved as the run's file ``name``."""
    plan = run.plan
    traces = record(run.models()["target"], prompts, run.drafter, DRAFTER, eos_id=None, seed=plan.seed,
                    max_new_tokens=plan.max_new_tokens + plan.depth, probe=True).traces
    save_traces(traces, run.path(name))
    return traces


def _predict(run: Run, policy: Any, profile: Any = None, replicates: int = 0, observed: Any = None,
             traces: Any = None) -> Any:
    """The simulator's forecast for ``policy`` (None: vanilla) on prompts like the evaluation set, from a
    cost ``profile`` (default: the run's ``cost_profile.json``) and ``traces`` (default: the calibration
    traces), the policy shown ``observed``'s step times when given and its decisions timed here
    (``experiments.pipeline.deploy.Forecast``)."""
    plan = run.plan
    profile = load_profile(run.path("cost_profile.json")) if profile is None else profile
    traces = load_traces(run.path("traces.parquet")) if traces is None else traces
    decision = 0.0 if policy is None else decision_cost(policy, traces, profile, DRAFTER)
    return forecast(profile, traces, policy, run.prompts("evaluation"), plan.max_new_tokens, plan.sim_queries,
                    plan.seed, replicates, DRAFTER, observed, decision)


def _baselines(run: Run) -> dict[str, Any]:
    """The untuned policies every run reports: fixed lengths, and each kind's defaults reading the
    drafter's confidences as they are and, for the kinds that read them, through the run's calibration
    (``calibration.json``), as the tuned ones do."""
    plan = run.plan
    lengths = (plan.depth // 2, plan.depth) if plan.quick else (1, 2, plan.depth // 2, plan.depth)
    out = {f"fixed-{n}": make_policy("fixed", {"length": n}) for n in sorted(set(lengths))}
    calibration = load_calibration(run.path("calibration.json"))
    for kind in ("libraspec",) if plan.quick else ("threshold", "heuristic", "libraspec"):
        out[kind] = make_policy(kind)
        if POLICY_KINDS[kind].reads_confidences:
            out[f"{kind}-calibrated"] = make_policy(kind, calibration=calibration)
    return out


def step_simulate(run: Run) -> dict[str, Any]:
    """Simulate vanilla and the baseline policies."""

    named = {"vanilla": None, **_baselines(run)}
    rows = {}
    for name, policy in named.items():
        f = _predict(run, policy)
        rows[name] = {"tokens_per_second": f.tokens_per_second, "tau": f.tau,
                      "iteration_seconds": f.iteration_seconds}
    write_json(run.path("simulate.json"), rows)
    return {name: round(row["tokens_per_second"], 1) for name, row in rows.items()}


def length_kinds() -> tuple[str, ...]:
    """The length kinds the pipeline tunes: those tuned by default (``policies.role_kinds``), in
    registration order."""
    return role_kinds("length", tuned=True)


def step_tune(run: Run) -> dict[str, Any]:
    """Tune the length policies (and the adaptation ones) with Ray Tune; export the best of each kind."""
    plan = run.plan
    tasks = [("length", length_kinds(), run.path("cost_profile.json"), run.path("traces.parquet"))]
    if plan.adapt:
        tasks.append(("adaptation", (), run.path("cost_profile.json"), None))
    summary: dict[str, Any] = {}
    (run.out / "policies").mkdir(exist_ok=True)
    for task, kinds, profile, traces in tasks:
        setting = make_setting(
            task,
            profile,
            traces,
            queries=plan.tune_queries if task == "length" else None,
            seed=plan.seed,
            drafter=DRAFTER,
            calibration=run.path("calibration.json") if task == "length" else None,
        )
        folder = run.out / "tune" / task
        if folder.exists():  # an interrupted study of an unfinished step: start it over
            shutil.rmtree(folder)
        result = tune_policies(
            setting, kinds, plan.tune_samples, folder, address=run.address, progress=run.log
        )
        for kind in result.best_by_kind:
            shutil.copyfile(folder / f"best_{kind}.json", run.out / "policies" / f"tuned-{kind}.json")
        summary[task] = {
            "trials": len(result.table),
            "best": result.best,
            "seconds": round(result.seconds, 1),
        }
    return summary


def _policies(run: Run) -> dict[str, Any]:
    """Every deployed policy by name: the tuned files and the baselines."""
    out = _baselines(run)
    for path in sorted((run.out / "policies").glob("*.json")):
        policy = load_policy(path, seed=run.plan.seed)
        if policy_role(policy) == "length":
            out[path.stem] = policy
    return out


def step_deploy(run: Run) -> dict[str, Any]:
    """Measure every policy in the live engine beside the simulator's prediction
    (``experiments.pipeline.deploy``). The prediction's costs come from a profile measured in this process
    with its rounds interleaved with the live prompts, so both see the machine alike; policies see the step
    times of the profile they were tuned with, in the engine and in the simulator."""
    m, plan = run.models(), run.plan
    tuned = load_profile(run.path("cost_profile.json"))
    policies = _policies(run)
    prompts = run.prompts("evaluation")

    def builder(policy: Any) -> Any:
        return lambda i: LengthControlled(run.drafter(),
                                          policy_from_dict(policy_to_dict(policy), seed=plan.seed + i),
                                          tuned, DRAFTER)

    builders = {"vanilla": lambda _: None, **{name: builder(p) for name, p in policies.items()}}
    live = LiveRun(m["target"], prompts, builders, plan.max_new_tokens, plan.seed, run.log)
    run.log(f"deploy: {len(prompts)} prompts, each after a round of the cost profile")
    _measure_profile(run, run.path("deploy_profile.json"), len(prompts), live.prompt)
    profile = load_profile(run.path("deploy_profile.json"))
    predicted = {name: _predict(run, policies.get(name), profile, plan.forecast_replicates, tuned)
                 for name in builders}
    held_out = _probe(run, prompts, "held_out_traces.parquet")  # the simulator's error on their own text
    replayed = {name: _predict(run, policies.get(name), profile, 0, tuned, held_out) for name in builders}
    kinds = {name: policy.kind for name, policy in policies.items()}
    result = compare(live.result(plan.clock), predicted, [p.domain for p in prompts], plan.seed, kinds,
                     replayed=replayed)
    for name, row in result["policies"].items():
        row["policy"] = policy_to_dict(policies[name]) if name in policies else None
    result = {"clock": plan.clock, "prompts": len(prompts), "profile": "deploy_profile.json", **result,
              "adaptation": _adaptation(run)}
    write_json(run.path("deploy.json"), result)
    agreement = result["rank_agreement"]
    return {
        "fidelity_error": round(result["fidelity_error"], 4),
        "fidelity_error_ci": [round(x, 4) for x in result["fidelity_error_ci"]],
        "kendall_tau": round(agreement["kendall_tau"], 3),
        "best_measured": agreement["measured_best"],
        "best_predicted": agreement["predicted_best"],
    }


SUMMARY_KEYS = ("measured_tokens_per_second", "measured_ci", "predicted_tokens_per_second", "predicted_ci",
                "error", "error_ci", "measured_speedup", "measured_speedup_ci", "predicted_speedup",
                "measured_tau", "predicted_tau", "replayed_tokens_per_second", "replay_error")


def _adaptation(run: Run) -> dict[str, Any]:
    """Serve the adaptation stream with the default and tuned adaptation policies (SpecBlock drafter): per
    policy, measured and simulated tokens/s and tau; a note instead when the plan has no stream or the
    drafter cannot run."""
    if run.plan.stream is None:
        return {"skipped": f"not with --quick: `specblock adapt-live --quick --model {run.model.name}`"}
    policies = adapt_live.default_policies()
    for path in sorted((run.out / "policies").glob("tuned-*.json")):
        spec = read_json(path, MAX_POLICY_BYTES, "policy file", "delete it to tune it again")
        kind = canonical_kind(spec["kind"])
        if kind in role_kinds("adaptation"):
            policies[path.stem] = {"kind": kind, "params": spec["params"]}
    profile = run.path("cost_profile.json")
    domains = model_domains(run.model)  # the model's own prompt domains (not a prompt file's categories)
    quick = "specblock" not in load_profile(profile).drafters  # a quick profile times no feature drafter
    threads = torch.get_num_threads()
    try:
        if quick:
            profile = model_profile(run.model)
        result = adapt_live.run(
            run.model_dir,
            drafter_folder(run.model, "specblock"),
            profile,
            run.plan.stream,
            run.plan.seed,
            "adaptation",
            policies,
            results=run.out,
            prompts=model_prompts(run.model, domains),
            model=run.model.name,
            domains=domains,
            dtype=run.model.dtype,
        )
    except InputError as err:
        return {"skipped": str(err)}
    finally:
        torch.set_num_threads(threads)
    out = {}
    for name, entry in result["policies"].items():
        measured, simulated = entry["measured"], entry["simulated_summary"]
        out[name] = {
            "measured_tokens_per_second": measured["tokens_per_second"],
            "simulated_tokens_per_second": simulated["tokens_per_second"],
            "measured_tau": measured["tau"],
            "simulated_tau": simulated["tau"],
            "shifted_tau_early": measured["shifted_tau_early"],
            "shifted_tau_late": measured["shifted_tau_late"],
            "updates": entry["updates"],
        }
    return out


def step_report(run: Run) -> dict[str, Any]:
    """Write report.md, report.png and lp.json from the other steps' files."""
    return write_report(run.out, run.plan.quick, run.plan.seed)


STEP_FUNCTIONS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "models": step_models,
    "profile": step_profile,
    "traces": step_traces,
    "simulate": step_simulate,
    "tune": step_tune,
    "deploy": step_deploy,
    "report": step_report,
}


# ----------------------------------------------------------------------------- the run


def _check_models(model_dir: Path, draft_dir: Path, model: ModelSpec = TOY) -> None:
    for folder, kind in ((model_dir, "target"), (draft_dir, f"draft-model --model {model_arg(model)}")):
        if not (folder / "config.json").is_file():
            raise InputError(
                f"{folder} is not a model folder (no config.json): train one with "
                f"`specblock train {kind}` or point to one"
            )


def _state(
    out: Path, plan: PipelinePlan, resume: bool, log: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """The run record: new, or the resumed one after checking its shape and plan, less the steps to run
    again when its cost profile is older than ``experiments.folders.PROFILE_MAX_AGE_HOURS``."""
    record = out / "run.json"
    if not resume:
        if out.exists() and any(path.name != LOCK for path in out.iterdir()):
            raise InputError(
                f"{out} is not empty: pass --resume to continue that run, or choose another --out"
            )
        return {"plan": asdict(plan), "steps": {}}
    if not record.exists():
        raise InputError(f"no pipeline run in {out} to resume: drop --resume to start one there")
    fix = "choose another --out, or delete the folder to start over"
    state = read_json(record, MAX_RECORD_BYTES, "pipeline run record", fix)
    try:
        steps = state["steps"]
        if not all(name in STEPS and isinstance(steps[name]["seconds"], (int, float)) for name in steps):
            raise ValueError("its steps are not the pipeline's")
    except (ValueError, KeyError, TypeError) as err:
        detail = str(err).splitlines()[0] if isinstance(err, ValueError) else "wrong shape"
        raise InputError(f"{record} is not a pipeline run record ({detail}): {fix}") from None
    if state.get("plan") != json.loads(json.dumps(asdict(plan))):
        raise InputError(
            f"{out} was run with another plan (see its run.json): resume with the same "
            "options (--quick, --smoke or neither), or choose another --out"
        )
    if "profile" not in steps:
        return state
    age = measurement_age(out / "cost_profile.json")
    if age is not None and age <= PROFILE_MAX_AGE_HOURS * 3600:
        log(f"profile: reusing cost_profile.json, measured {age / 3600:.1f} h ago")
        return state
    rerun = ("profile", "simulate", "tune", "deploy", "report")  # the steps that read the profile
    measured = "missing" if age is None else f"measured {age / 3600:.1f} h ago"
    log(f"profile: cost_profile.json is {measured}, over the {PROFILE_MAX_AGE_HOURS:g} h limit: "
        f"running {', '.join(rerun)} again")
    state["steps"] = {name: step for name, step in steps.items() if name not in rerun}
    return state


def run_pipeline(
    out: Path,
    plan: PipelinePlan = QUICK,
    *,
    resume: bool = False,
    model: ModelSpec = TOY,
    model_dir: Path | None = None,
    draft_dir: Path | None = None,
    address: str | None = None,
    log: Callable[[str], None] = lambda _: None,
    advance: Callable[[str], None] = lambda _: None,
    prompt_file: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) every step into ``out``, held by this process alone; return the summary that
    ``--json`` prints, with the age of the cost profile its results rest on. ``model`` is the model the
    steps work on: its target (``model_dir`` overrides it), draft model (``draft_dir``), drafters, prompt
    sets (the plan's domains where they have them all, else all of theirs) and profile."""
    model_dir = model.target if model_dir is None else model_dir
    draft_dir = model.draft_model if draft_dir is None else draft_dir
    _check_models(model_dir, draft_dir, model)
    if prompt_file is None:
        plan = replace(plan, domains=model_domains(model, plan.domains))
    else:
        groups = read_prompt_file(prompt_file, MAX_FILE_PROMPTS)
        short = [d for d, rows in groups.items() if len(rows) < 2]
        if short:
            raise InputError(f"--prompt-file {prompt_file}: category {short[0]!r} has one prompt: "
                             "the pipeline traces on one half of each category and deploys on the other; "
                             "give two or more")
        plan = replace(plan, domains=tuple(groups), prompt_file=str(Path(prompt_file).resolve()))
    address = check_address(address)
    out = Path(out).resolve()
    check_writable(out)
    with hold(out):
        state = _state(out, plan, resume, log)
        reused = "profile" in state["steps"]
        run = Run(out, plan, Path(model_dir), Path(draft_dir), address, log, model=model)
        start = time.perf_counter()
        for name in STEPS:
            if name in state["steps"]:
                log(f"{name}: done before, skipped")
                advance(name)
                continue
            log(f"{name} ...")
            t0 = time.perf_counter()
            summary = STEP_FUNCTIONS[name](run)
            state["steps"][name] = {"seconds": round(time.perf_counter() - t0, 2), "summary": summary}
            write_json(out / "run.json", state)
            log(f"{name}: {state['steps'][name]['seconds']:.1f} s {json.dumps(summary)[:160]}")
            advance(name)
        deploy = read_json(run.path("deploy.json"), MAX_RECORD_BYTES, "deploy result",
                           "resume to remeasure it")
        age = measurement_age(run.path("cost_profile.json"))
    return {
        "run_dir": str(out),
        "model": model.name,
        "seconds": round(time.perf_counter() - start, 2),
        "steps": {k: v["seconds"] for k, v in state["steps"].items()},
        "profile_age_hours": None if age is None else round(age / 3600, 3),
        "profile_reused": reused,
        "policies": {
            name: {key: r[key] for key in SUMMARY_KEYS if key in r} for name, r in deploy["policies"].items()
        },
        **{key: deploy[key] for key in ("fidelity_error", "fidelity_error_ci", "worst_error", "replay_error",
                                        "rank_agreement", "against_best_fixed") if key in deploy},
        "report": str(run.path("report.md")),
    }
