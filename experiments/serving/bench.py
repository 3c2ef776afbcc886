"""`specblock serve-bench`: serving policies live in the batched engine, beside the serving simulator's
prediction of the same requests.

Each round draws an arrival process per rate (Poisson, held-out prompts of every domain, the last
``CONTEXT_TOKENS`` tokens of each, each asking for ``tokens`` new tokens or its reference answer's length
capped at ``tokens``: ``experiments.serving.lengths``; greedy) and replays it through
``real_engine.batch.BatchEngine`` once per setting, the settings in a rotated order each round so that
the machine's drift hits all alike: vanilla (no drafter) and each serving policy steering draft-model
chains (``speculate.ServeSteering``). Requests are submitted when the wall clock passes their arrival
(between iterations, as the engine admits them). Per request: time to first token (from its arrival)
and time per output token (first to last token over the further tokens).

The simulator replays the same arrivals (``SpecServeEnv(arrivals=...)``) with the cost profile measured
in this process, its measuring rounds interleaved with the live rounds (``measure_profile``: the batched
verify, the draft model's chains and prefill on this machine now), acceptance traces recorded in this
process on calibration prompts (``record_acceptance``), and steering charged as the engine spent it
(``steering_samples``, timed in every round: per steered iteration and per question put to the policy), as
``simulator.predict`` runs it (``simulator.rollout.run_serve``): the engine's drafting rule, then the
policy's lengths.
Idle, the live server polls for the next arrival; it serves with the objects alive before it kept out
of the garbage collector's scans (``timing.frozen_heap``), as servers do after start-up, and so do the
measuring rounds (the command runs them all inside it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.cost_profile import CostProfile
from core.names import VANILLA
from experiments.intervals import REPLICATES, interval
from experiments.serving.lengths import CONTEXT_TOKENS, FIXED, output_length, servable, summary
from policies import make_policy, policy_from_dict, policy_to_dict, role_kinds
from policies.base import Policy
from policies.serving import NEVER
from real_engine import profile as prof
from real_engine.batch import BatchEngine, Request
from real_engine.decode import make_drafter
from real_engine.drafters.base import Drafter
from real_engine.drafters.vocab import deployed_count, deployed_vocab
from real_engine.model import Transformer
from real_engine.prompts import Prompt
from real_engine.speculate import ServeSteering
from real_engine.timing import frozen_heap
from real_engine.trace import record
from simulator.acceptance import AcceptanceModel
from simulator.predict import predict
from simulator.replay import TraceReplay
from simulator.spec_serve import Arrivals

KIND = "draft-model"  # the drafter the shipped traces record: chains of the draft model
DEPTH = 8  # the traces' chain depth: what a request's chain can draft
TABLE = "batch-table"  # the per-batch-size table every other policy is compared with, where it runs
SIM_SEEDS = 8  # simulated episodes per round's arrivals (acceptance draws)
STEERING_WAVES = 2  # waves of the batch cap's requests per setting and round that time the steering


@dataclasses.dataclass(frozen=True)
class ServedDraft:
    """The draft model as it serves, is traced and is timed: its weights, drafting the vocabulary its folder's
    saved shape names (``vocab.deployed_count``); every token without a folder or a saved vocabulary."""

    net: Transformer
    folder: Path | None = None

    @property
    def vocab(self) -> int | None:
        """How many of its most frequent tokens it drafts (None: every token)."""
        return None if self.folder is None else deployed_count(self.folder, KIND)

    def ids(self) -> torch.Tensor | None:
        """The token ids it drafts (None: every token)."""
        return None if self.folder is None else deployed_vocab(self.folder, KIND)


def serve_grid(max_batch: int, contexts: Sequence[int], repeats: int) -> prof.ProfileGrid:
    """The profile grid serving needs: the batched verify up to ``max_batch`` requests of up to a
    chain's nodes, the draft model's chains up to ``DEPTH``, prefill at the prompts' lengths."""
    requests = tuple(sorted({1, 2, 3, 4, 6, 8, max_batch} & set(range(1, max_batch + 1))))
    return prof.ProfileGrid(
        nodes=(1, 2, 3, 5, 9), contexts=tuple(contexts), draft_tokens=tuple(range(1, DEPTH + 1)),
        tree_depths=(2,), tree_widths=(2,), tree_budget=4, specblock_starts=(1,), specblock_blocks=(1,),
        eagle_depths=(1,), draft_context=int(np.mean(contexts)), update_batch=(1, 16), repeats=repeats,
        warmup=1, prefill_tokens=(CONTEXT_TOKENS // 2, CONTEXT_TOKENS), batch_requests=requests,
        batch_nodes=(1, 2, 3, 5, 9))


def measure_profile(target: Transformer, draft: ServedDraft, max_batch: int, tokens: int, repeats: int,
                    seed: int, between: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """A wall-clock cost profile of this process's machine on the serving grid (JSON-ready): the median
    of the repeats, which a burst of other load on a shared machine barely moves; ``between(k)`` runs
    after its k-th measuring round."""
    contexts = (CONTEXT_TOKENS, CONTEXT_TOKENS + tokens)
    return prof.measure(target, target_name="target", draft=draft.net, draft_name="draft",
                        grid=serve_grid(max_batch, contexts, repeats), feature=False,
                        threads=torch.get_num_threads(), clock_kind="wall", seed=seed,
                        estimator="median", between=between, draft_vocab=draft.ids())


def draw_arrivals(prompts: Sequence[Prompt], domains: Sequence[str], rate: float, requests: int,
                  tokens: int, seed: int, lengths: str = FIXED) -> tuple[Arrivals, list[Prompt]]:
    """A Poisson arrival process of ``requests`` prompts drawn from ``prompts``' servable ones under
    ``lengths`` (the first at second 0), each asking for its ``output_length`` of new tokens, at most
    ``tokens``."""
    pool = servable(prompts, lengths)
    rng = np.random.default_rng(seed)
    picked = [pool[i] for i in rng.choice(len(pool), size=requests, replace=requests > len(pool))]
    seconds = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, size=requests - 1))))
    arrivals = Arrivals(seconds, np.array([len(p.tokens) for p in picked]),
                        np.array([output_length(p, lengths, tokens) for p in picked]),
                        np.array([list(domains).index(p.domain) for p in picked]))
    return arrivals, picked


def chain_drafter(target: Transformer, draft: ServedDraft) -> Drafter:
    """A fresh draft-model chain drafter, ``DEPTH`` deep over ``draft``'s vocabulary, never stopping on
    its own."""
    return make_drafter(KIND, target, draft.net, folder=draft.folder, deployed=False, depth=DEPTH,
                        vocab=draft.vocab)


def record_acceptance(target: Transformer, draft: ServedDraft, prompts: Sequence[Prompt], tokens: int,
                      seed: int) -> TraceReplay:
    """Acceptance traces of the draft model's ``DEPTH``-deep chains on ``prompts`` (calibration prompts,
    cut as the served ones are), each decoded alone for ``tokens`` tokens (the output cap: as long as the
    longest request, whatever its lengths), as the simulator replays them."""
    recording = record(target, prompts, lambda: chain_drafter(target, draft), KIND, max_new_tokens=tokens,
                       seed=seed)
    return TraceReplay.from_traces(recording.traces)


def steering_samples(policy: Policy, profile: CostProfile, max_batch: int, target: Transformer,
                     draft: ServedDraft, prompts: Sequence[Prompt], tokens: int) -> list[tuple[int, float]]:
    """(questions put to the policy, seconds spent steering) of each iteration of the batched engine
    steered by ``policy`` (``BatchEngine.steering``: the plan, the chains' questions, ranking and trimming
    the real drafts), serving ``prompts`` in waves of ``max_batch`` requests of staggered lengths up to
    ``tokens`` (the output cap), so that every wave runs batches of every size down to one: what it costs
    to steer an iteration depends on the batch, not on how long the requests are."""
    steer = ServeSteering(policy, profile, KIND, max_batch)
    engine = BatchEngine(target, max_batch=max_batch, steer=steer)
    rows = []
    for first in range(0, len(prompts), max_batch):
        wave = prompts[first:first + max_batch]
        for i, prompt in enumerate(wave):
            engine.submit(Request(prompt.tokens, max(2, tokens * (i + 1) // len(wave)),
                                  chain_drafter(target, draft)))
        while engine.busy:
            seconds, asked = engine.steering, steer.asked
            engine.step()
            rows.append((steer.asked - asked, engine.steering - seconds))
    return rows


def steering_fit(rows: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(seconds per steered iteration, per question) of ``steering_samples``' rows: the least-squares
    line of seconds over questions, both parts kept non-negative; all of it per question when every
    iteration asked alike. What the simulator charges (``simulator.rollout.run_serve``)."""
    asked, seconds = np.array(rows, dtype=np.float64).T
    if len(set(asked)) < 2:
        return 0.0, float(seconds.sum() / max(asked.sum(), 1.0))
    per_question, per_iteration = np.polyfit(asked, seconds, 1)
    return max(float(per_iteration), 0.0), max(float(per_question), 0.0)


def serve_live(target: Transformer, draft: ServedDraft, policy: Policy | None, profile: CostProfile,
               arrivals: Arrivals, prompts: Sequence[Prompt], max_batch: int) -> dict[str, Any]:
    """Replay ``arrivals`` through the batched engine (steered by ``policy``; None: vanilla), each request
    asking for its own output length."""
    steer = None if policy is None else ServeSteering(policy, profile, KIND, max_batch)
    engine = BatchEngine(target, max_batch=max_batch, steer=steer)
    ids: list[int] = []
    with frozen_heap():  # as a server serves after start-up
        start = time.perf_counter()
        while len(ids) < len(prompts) or engine.busy:
            now = time.perf_counter() - start
            while len(ids) < len(prompts) and arrivals.seconds[len(ids)] <= now:
                drafter = None if policy is None else chain_drafter(target, draft)
                ids.append(engine.submit(Request(prompts[len(ids)].tokens, int(arrivals.output[len(ids)]),
                                                 drafter)))
            if engine.busy:
                engine.step()  # idle, the loop polls for the next arrival, as a server's does: it keeps
                # the machine's caches and clock as busy decoding leaves them, which the profile measures
    results = [engine.results[i] for i in ids]
    failed = next((r.error for r in results if r.error), None)
    if failed is not None:
        raise RuntimeError(f"a request failed in the batched engine: {failed}")
    arrived = start + arrivals.seconds
    return {"tokens": float(sum(len(r.tokens) for r in results)),
            "iterations": float(sum(len(r.accepted) for r in results)),
            "seconds": max(r.finished for r in results) - start,
            "ttft": [r.first_token - a for r, a in zip(results, arrived, strict=True)],
            "tpot": [(r.finished - r.first_token) / max(len(r.tokens) - 1, 1) for r in results]}


def serve_simulated(policy: Policy, profile: CostProfile, steering: CostProfile, acceptance: AcceptanceModel,
                    arrivals: Arrivals, max_batch: int, steered: tuple[float, float], seed: int
                    ) -> dict[str, Any]:
    """The simulator's prediction of the same arrivals on ``profile``'s costs (the policy shown
    ``steering``'s, as live; steering costing ``steered``: ``steering_fit``), over ``SIM_SEEDS``
    acceptance draws."""
    tokens = seconds = iterations = 0.0
    ttft: list[float] = []
    tpot: list[float] = []
    for k in range(SIM_SEEDS):
        iteration, decision = steered
        prediction = predict(policy, profile, acceptance, KIND, queries=arrivals.seconds.size, seed=seed + k,
                             env_options={"max_batch": max_batch, "arrivals": arrivals, "observed": steering},
                             rollout_options={"iteration_seconds": iteration, "decision_seconds": decision})
        out, env = prediction.outcome, prediction.env
        first, per = env.batch.latencies(0, np.arange(arrivals.seconds.size))
        tokens, seconds = tokens + out.tokens, seconds + float(env.batch.clock[0] - arrivals.seconds[0])
        iterations += out.iterations
        ttft, tpot = ttft + first, tpot + per
    return {"tokens": tokens / SIM_SEEDS, "iterations": iterations / SIM_SEEDS,
            "seconds": seconds / SIM_SEEDS, "ttft": ttft, "tpot": tpot}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One served configuration: a name and its serving policy (None: vanilla, no drafter)."""

    name: str
    policy: dict[str, Any] | None

    def live_policy(self, seed: int) -> Policy | None:
        """A fresh copy of the policy for one run (None for vanilla)."""
        return None if self.policy is None else policy_from_dict(self.policy, seed=seed)

    def simulated_policy(self, seed: int) -> Policy:
        """The policy the simulator runs: vanilla is a table of zeros (a chain never drafts)."""
        if self.policy is None:
            return make_policy("batch-table", dict(NEVER))
        return policy_from_dict(self.policy, seed=seed)


def default_settings(files: Sequence[tuple[str, dict[str, Any]]]) -> list[Setting]:
    """Vanilla first, then each policy file's (name, content), or each serving kind's defaults."""
    given = list(files) or [(kind, policy_to_dict(make_policy(kind))) for kind in role_kinds("serving")]
    return [Setting(VANILLA, None), *(Setting(name, content) for name, content in given)]


def percentile_ms(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of seconds, in milliseconds."""
    return 1e3 * float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(live: list[dict[str, Any]], sim: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """One (setting, rate)'s figures over its rounds: live tokens/s with its bootstrap interval over the
    rounds, TTFT and TPOT percentiles over every request (intervals by resampling rounds), and the
    simulator's prediction of the same rounds."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(live), size=(REPLICATES, len(live)))
    tokens = np.array([r["tokens"] for r in live])
    seconds = np.array([r["seconds"] for r in live])

    def pooled(key: str, q: float) -> list[float]:
        return interval([percentile_ms([v for i in row for v in live[i][key]], q) for row in index[:400]])

    tpot = [v for r in live for v in r["tpot"]]
    ttft = [v for r in live for v in r["ttft"]]
    sim_rate = sum(r["tokens"] for r in sim) / sum(r["seconds"] for r in sim)
    sim_tpot = [v for r in sim for v in r["tpot"]]
    out = {"tokens_per_second": float(tokens.sum() / seconds.sum()),
           "tokens_per_second_ci": interval(tokens[index].sum(1) / seconds[index].sum(1)),
           "tpot_ms_p50": percentile_ms(tpot, 50), "tpot_ms_p50_ci": pooled("tpot", 50),
           "tpot_ms_p99": percentile_ms(tpot, 99), "tpot_ms_p99_ci": pooled("tpot", 99),
           "ttft_ms_p50": percentile_ms(ttft, 50), "ttft_ms_p99": percentile_ms(ttft, 99),
           "simulated_tokens_per_second": float(sim_rate),
           "simulated_tpot_ms_p50": percentile_ms(sim_tpot, 50),
           "simulated_tpot_ms_p99": percentile_ms(sim_tpot, 99),
           "simulated_ttft_ms_p50": percentile_ms([v for r in sim for v in r["ttft"]], 50),
           "tau": float(tokens.sum() / sum(r["iterations"] for r in live)),
           "simulated_tau": sum(r["tokens"] for r in sim) / sum(r["iterations"] for r in sim),
           "rounds": [{k: r[k] for k in ("tokens", "seconds")} for r in live]}
    out["tokens_per_second_error"] = out["simulated_tokens_per_second"] / out["tokens_per_second"] - 1
    out["tpot_p50_error"] = out["simulated_tpot_ms_p50"] / out["tpot_ms_p50"] - 1
    return out


def ratio(runs: list[dict[str, Any]], base: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """tokens/s over ``base``'s on the same arrivals (paired by round), with a bootstrap interval over
    the rounds."""
    rate = np.array([r["tokens"] / r["seconds"] for r in runs])
    plain = np.array([r["tokens"] / r["seconds"] for r in base])
    index = np.random.default_rng(seed).integers(0, len(rate), size=(REPLICATES, len(rate)))
    return {"ratio": float(rate.mean() / plain.mean()), "ratio_ci": interval(rate[index].mean(1) /
                                                                             plain[index].mean(1))}


@dataclasses.dataclass
class ServeBench:
    """One serve-bench: the live rounds (``live_round``, callable between a profile's measuring rounds so
    that the machine's drift touches both alike), then the simulator's predictions of every round's
    arrivals with the cost profile measured alongside (``report``). Policies see ``steering``'s costs,
    live and simulated alike."""

    target: Transformer
    draft: ServedDraft
    steering: CostProfile
    acceptance: AcceptanceModel
    settings: Sequence[Setting]
    prompts: Sequence[Prompt]
    rates: Sequence[float]
    requests: int
    tokens: int
    max_batch: int
    seed: int
    lengths: str = FIXED  # how each request's output length is set (``experiments.serving.lengths``)
    log: Callable[[str], None] = lambda line: None

    def __post_init__(self) -> None:
        self.live: dict[tuple[str, float], list[dict[str, Any]]] = {
            (s.name, r): [] for s in self.settings for r in self.rates}
        self.arrivals: list[tuple[int, float, Arrivals]] = []
        self.steered: dict[str, list[tuple[int, float]]] = {s.name: [] for s in self.settings}

    def warm_up(self) -> None:
        """One untimed run of every setting: a process's first runs pay its allocations and caches."""
        arrivals, picked = draw_arrivals(self.prompts, self.acceptance.domains, max(self.rates),
                                         min(self.requests, self.max_batch), self.tokens, self.seed,
                                         self.lengths)
        for setting in self.settings:
            self.serve(setting, arrivals, picked)

    def serve(self, setting: Setting, arrivals: Arrivals, picked: Sequence[Prompt]) -> dict[str, Any]:
        """One live run of ``setting`` on ``arrivals``."""
        return serve_live(self.target, self.draft, setting.live_policy(self.seed), self.steering, arrivals,
                          picked, self.max_batch)

    def live_round(self, k: int) -> None:
        """Round ``k``: a fresh arrival draw per rate, the rates and within each the settings in a rotated
        order (what runs right after the measuring rounds changes too); then each policy's steering timed
        (``steering_samples``)."""
        for rate in (self.rates[(i + k) % len(self.rates)] for i in range(len(self.rates))):
            seed = self.seed + 1000 * k + int(rate * 100)
            arrivals, picked = draw_arrivals(self.prompts, self.acceptance.domains, rate, self.requests,
                                             self.tokens, seed, self.lengths)
            self.arrivals.append((k, rate, arrivals))
            for i in range(len(self.settings)):
                setting = self.settings[(i + k) % len(self.settings)]
                self.live[setting.name, rate].append(self.serve(setting, arrivals, picked))
            last = {s.name: self.live[s.name, rate][-1] for s in self.settings}
            self.log(f"round {k + 1}, rate {rate:g}/s: tokens/s "
                     + ", ".join(f"{name} {r['tokens'] / r['seconds']:.0f}" for name, r in last.items()))
        rng = np.random.default_rng(self.seed + k)
        for setting in (s for s in self.settings if s.policy is not None):
            wave = [self.prompts[i] for i in rng.choice(len(self.prompts), STEERING_WAVES * self.max_batch)]
            self.steered[setting.name] += steering_samples(
                setting.live_policy(self.seed), self.steering, self.max_batch, self.target, self.draft, wave,
                self.tokens)

    def drawn_lengths(self) -> dict[str, dict[str, float]]:
        """The mean, least and greatest prompt and output lengths (tokens) of every round's requests."""
        return {part: summary([int(v) for _, _, a in self.arrivals for v in getattr(a, part)])
                for part in ("prompt", "output")}

    def report(self, clock: CostProfile) -> dict[str, Any]:
        """Every setting's live figures beside the simulator's on ``clock``'s costs, per rate and over all,
        the ratios to vanilla and to the per-batch-size table, and the fidelity."""
        steered = {s.name: (0.0, 0.0) if s.policy is None else steering_fit(self.steered[s.name])
                   for s in self.settings}
        sim: dict[tuple[str, float], list[dict[str, Any]]] = {key: [] for key in self.live}
        for k, rate, arrivals in self.arrivals:
            for setting in self.settings:
                sim[setting.name, rate].append(serve_simulated(
                    setting.simulated_policy(self.seed), clock, self.steering, self.acceptance, arrivals,
                    self.max_batch, steered[setting.name], self.seed + k))
        live, rates, seed = self.live, self.rates, self.seed
        cells = {s.name: {f"{r:g}": summarize(live[s.name, r], sim[s.name, r], seed) for r in rates}
                 for s in self.settings}
        policies = {}
        for s in self.settings:
            runs = [x for r in rates for x in live[s.name, r]]
            sims = [x for r in rates for x in sim[s.name, r]]
            overall = {k: v for k, v in summarize(runs, sims, seed).items() if k != "rounds"}
            policies[s.name] = {**overall, "steering_ms": {"iteration": 1e3 * steered[s.name][0],
                                                           "question": 1e3 * steered[s.name][1]},
                                "policy": s.policy,
                                "rates": cells[s.name]}
        names = [s.name for s in self.settings]
        for base in (b for b in (VANILLA, TABLE) if b in names):
            for name in (n for n in names if n != base):
                policies[name][f"over_{base}"] = {f"{r:g}": ratio(live[name, r], live[base, r], seed)
                                                  for r in rates}
        errors = [abs(c["tokens_per_second_error"]) for s in cells.values() for c in s.values()]
        tpot_errors = [abs(c["tpot_p50_error"]) for s in cells.values() for c in s.values()]
        return {"policies": policies, "fidelity_error": float(np.median(errors)),
                "tpot_fidelity_error": float(np.median(tpot_errors))}
