"""``specblock/SpecServe-v0``: speculative decoding under continuous batching, as ``real_engine.batch``
serves it, with a speculation length per running request.

The core (:class:`ServeBatch`) runs N independent servers at once (numpy arrays over servers and batch
slots); the single environment (:class:`SpecServeEnv`) is the core with N = 1, the vector form
(:class:`SpecServeVectorEnv`) the same core with N servers (``simulator.env_base`` explains the
layout). A server's requests arrive by a Poisson process (``rate`` per second) with prompt and output
lengths uniform in their ranges, or given; a request joins a free slot of the batch
(at most ``max_batch``) once it has arrived, after its prefill (``CostProfile.prefill_cost``), and
leaves when its output is complete. One step is one iteration of the batched engine: each running
request drafts the length the action gives it, one target forward verifies every request's draft, and
each emits its accepted tokens and one more.

**Iteration cost** (``core.serve_costs``, as the live engine's serving policies see it): each request's
chain drafting time for its length (a draft-model chain that drafts after a while without, or for the
first time, first runs what it committed meanwhile, or its prompt), and one batched verify forward.
Acceptance per request comes from an acceptance model (trace replay or the parametric one), drawn per
iteration for the request's domain, as in ``SpecLength-v0``: with trace replay each request replays the
iterations of one recorded query (that of a uniformly random text position of its domain). Prompt and
output lengths are a ``(low, high)`` tuple (uniform) or a numpy array of lengths to draw from (a prompt
set's, say).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from core.cost_profile import resolve_profile
from core.errors import InputError
from core.serve_costs import (
    ServeCosts,
    backlog_seconds,
    batch_verify_seconds,
    chains_fit,
    drafting_seconds,
    drafting_table,
    iteration_costs,
)
from policies.features import LENGTH_CAP, SERVE_SLOT_DIM, SERVE_SLOT_SLICES, serve_bounds
from simulator.acceptance import check_domains
from simulator.env_base import (
    DEFAULT_PROMPT,
    AcceptanceArg,
    BatchEnv,
    BatchVectorEnv,
    ProfileArg,
    StepResult,
    VectorStepResult,
)
from simulator.replay import resolve_acceptance

DEFAULT_RATE = 2.0  # requests per second
DEFAULT_REQUESTS = 32  # arrivals per episode
DEFAULT_BATCH = 8
DEFAULT_OUTPUT = (64, 256)


def lengths(value: Sequence[int] | np.ndarray, name: str) -> np.ndarray:
    """A ``(low, high)`` tuple or an array of lengths to draw from, as the array of the lengths."""
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.size < 1 or not np.issubdtype(arr.dtype, np.integer) or arr.min() < 1:
        raise InputError(f"{name} = {value!r}: give (low, high) with 1 <= low <= high, or lengths >= 1")
    if arr.size == 2 and isinstance(value, tuple):
        if arr[0] > arr[1]:
            raise InputError(f"{name} = {value!r}: give (low, high) with low <= high")
        return np.arange(arr[0], arr[1] + 1)
    return arr


@dataclass(frozen=True)
class Arrivals:
    """A recorded arrival process (trace-driven serving): each request's arrival second, prompt and output
    lengths and domain index, in arrival order."""

    seconds: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    domain: np.ndarray

    def __post_init__(self) -> None:
        arrays = [np.asarray(getattr(self, f)) for f in ("seconds", "prompt", "output", "domain")]
        size = arrays[0].size
        if any(a.ndim != 1 or a.size != size for a in arrays) or size < 1:
            raise InputError("arrivals: give seconds, prompt, output and domain as 1-D arrays of one "
                             "length >= 1")
        seconds, prompt, output, domain = arrays
        if not (np.all(np.isfinite(seconds)) and seconds[0] >= 0 and np.all(np.diff(seconds) >= 0)):
            raise InputError("arrivals: seconds must be finite, non-negative and in arrival order")
        if min(prompt.min(), output.min()) < 1 or domain.min() < 0:
            raise InputError("arrivals: prompt and output lengths must be >= 1 and domains indices >= 0")
        for name, value in zip(("seconds", "prompt", "output", "domain"), arrays, strict=True):
            object.__setattr__(self, name, value.astype(np.float64 if name == "seconds" else np.int64))


def check_serving(rate: float, requests: int, max_batch: int) -> tuple[float, int, int]:
    """Validated (arrival rate, requests per episode, batch cap)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (np.isfinite(rate) and rate > 0):
        raise InputError(f"rate = {rate!r}: give a positive arrival rate (requests per second)")
    for name, value in (("requests", requests), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(f"{name} = {value!r}: give a whole number >= 1")
    return float(rate), int(requests), int(max_batch)


@dataclass(frozen=True)
class ServeTraffic:
    """What serving episodes serve, as plain data (a tuning study ships it to its workers): the arrival
    rate, the batch cap and the prompt and output lengths, each a ``(low, high)`` range (validated)."""

    rate: float = DEFAULT_RATE
    max_batch: int = DEFAULT_BATCH
    prompt_tokens: tuple[int, int] = DEFAULT_PROMPT
    output_tokens: tuple[int, int] = DEFAULT_OUTPUT

    def __post_init__(self) -> None:
        check_serving(self.rate, 1, self.max_batch)
        for name in ("prompt_tokens", "output_tokens"):
            value = tuple(getattr(self, name))
            if len(value) != 2:
                raise InputError(f"{name} = {value!r}: give (low, high)")
            lengths(value, name)
            object.__setattr__(self, name, value)

    def options(self) -> dict[str, Any]:
        """``SpecServeEnv``'s options for episodes of this traffic."""
        return {"rate": self.rate, "max_batch": self.max_batch, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens}


class ServeBatch:
    """N servers at once: the state and dynamics both SpecServe environments run."""

    def __init__(self, num: int, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", rate: float = DEFAULT_RATE, requests: int = DEFAULT_REQUESTS,
                 max_batch: int = DEFAULT_BATCH, prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 output_tokens: Sequence[int] = DEFAULT_OUTPUT,
                 domain_weights: Mapping[str, float] | None = None, arrivals: Arrivals | None = None,
                 observed: ProfileArg = None) -> None:
        requests = requests if arrivals is None else arrivals.seconds.size
        self.rate, self.requests, self.cap = check_serving(rate, requests, max_batch)
        self.arrivals = arrivals
        self.profile = resolve_profile(profile)
        self.model = resolve_acceptance(acceptance)
        if self.model.cap != LENGTH_CAP:
            raise InputError(f"the acceptance model offers {self.model.cap} positions, serving {LENGTH_CAP}: "
                             f"build it with cap={LENGTH_CAP}")
        self.drafter = drafter
        self.drafting = drafting_table(self.profile, drafter, self.cap, LENGTH_CAP)
        # The costs the observation shows (the policy's view), by default the ones the clock charges.
        self.observed = self.profile if observed is None else resolve_profile(observed)
        self.observed_chains = chains_fit(drafting_table(self.observed, drafter, self.cap, LENGTH_CAP))
        self.cdf = np.cumsum(check_domains(domain_weights, self.model.domains))
        if arrivals is not None and arrivals.domain.max() >= len(self.model.domains):
            raise InputError(f"arrivals name domain {arrivals.domain.max()}, the acceptance model has "
                             f"{len(self.model.domains)} ({', '.join(self.model.domains)})")
        self.prompts = lengths(prompt_tokens, "prompt_tokens")
        self.outputs = lengths(output_tokens, "output_tokens")
        self.num = num
        shape, queue = (num, self.cap), (num, self.requests)
        self.arrival, self.prompt = np.zeros(queue), np.zeros(queue, dtype=np.int64)
        self.output, self.domain = np.zeros(queue, dtype=np.int64), np.zeros(queue, dtype=np.int64)
        # A model with ``episodes`` (trace replay) keeps each request inside one recorded query, whose
        # iterations it replays: pooled rows would weigh easy text by its tokens per iteration.
        self.episode = np.zeros(queue, dtype=np.int64) if hasattr(self.model, "episodes") else None
        self.first, self.finish = np.full(queue, np.nan), np.full(queue, np.nan)
        self.admitted = np.zeros(num, dtype=np.int64)  # requests admitted so far (FIFO)
        self.clock, self.done = np.zeros(num), np.zeros(num, dtype=np.int64)
        self.slot_request = np.full(shape, -1, dtype=np.int64)  # request index in each slot (-1: empty)
        self.context, self.remaining = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        self.backlog = np.zeros(shape, dtype=np.int64)  # committed tokens the draft model has not run
        self.confidences = np.zeros((*shape, LENGTH_CAP))
        self.drafted = np.zeros(shape, dtype=np.int64)  # positions each pending draft offers
        self.accepted_by = np.zeros((*shape, LENGTH_CAP + 1), dtype=np.int64)  # accepted for each length

    @property
    def active(self) -> np.ndarray:
        """(N, max_batch) bool: slots holding a running request."""
        return self.slot_request >= 0

    def start(self, rng: np.random.Generator, mask: np.ndarray) -> np.ndarray:
        """A new episode in every server of ``mask``: draw its arrivals, admit the first; returns the
        seconds each server spent prefilling them."""
        k = int(mask.sum())
        if self.arrivals is not None:  # trace-driven: every episode serves the recorded arrivals
            a = self.arrivals
            self.arrival[mask], self.prompt[mask], self.output[mask], self.domain[mask] = (
                a.seconds, a.prompt, a.output, a.domain)
        else:
            gaps = rng.exponential(1.0 / self.rate, size=(k, self.requests))
            self.arrival[mask] = np.cumsum(gaps, axis=1)
            self.prompt[mask] = rng.choice(self.prompts, size=(k, self.requests))
            self.output[mask] = rng.choice(self.outputs, size=(k, self.requests))
            domain = np.searchsorted(self.cdf, rng.random((k, self.requests)), side="right")
            self.domain[mask] = np.minimum(domain, self.cdf.size - 1)
        if self.episode is not None:
            self.episode[mask] = self.model.episodes(rng, self.domain[mask].ravel()).reshape(k, self.requests)
        self.first[mask], self.finish[mask] = np.nan, np.nan
        self.admitted[mask], self.done[mask], self.clock[mask] = 0, 0, 0.0
        self.slot_request[mask], self.context[mask], self.remaining[mask] = -1, 0, 0
        return self.admit(mask)

    def admit(self, mask: np.ndarray) -> np.ndarray:
        """Fill the free slots of each server in ``mask`` with the requests that have arrived (an idle
        server waits for its next arrival), each after its prefill; one that arrives during these prefills
        waits for the next iteration's admission, as in the engine. Returns the prefill seconds."""
        spent = np.zeros(self.num)
        for e in np.flatnonzero(mask):  # a loop over servers, few admissions per step
            if not self.active[e].any() and self.admitted[e] < self.requests:
                self.clock[e] = max(self.clock[e], self.arrival[e, self.admitted[e]])
            queued = self.clock[e]  # as the engine: who arrives during these prefills waits for the next
            for slot in np.flatnonzero(~self.active[e]):
                r = self.admitted[e]
                if r >= self.requests or self.arrival[e, r] > queued:
                    break
                seconds = float(self.profile.prefill_cost(self.prompt[e, r]))
                self.clock[e] += seconds
                spent[e] += seconds
                self.slot_request[e, slot], self.admitted[e] = r, r + 1
                self.context[e, slot], self.remaining[e, slot] = self.prompt[e, r], self.output[e, r]
                self.backlog[e, slot] = self.prompt[e, r] - 1  # the prompt but its last token, the root
        return spent

    def draft(self, rng: np.random.Generator) -> None:
        """Draw every running request's next drafted iteration (its confidences and acceptance)."""
        self.confidences[:], self.drafted[:], self.accepted_by[:] = 0.0, 0, 0
        where = np.nonzero(self.active)
        if not where[0].size:
            return
        requests = (where[0], self.slot_request[where])
        if self.episode is None:
            draws = self.model.sample(rng, self.domain[requests])
        else:
            draws = self.model.sample(rng, self.domain[requests], self.episode[requests])
        self.confidences[where], self.drafted[where] = draws.confidences, draws.drafted
        for n in range(LENGTH_CAP + 1):
            self.accepted_by[(*where, np.full(where[0].size, n))] = draws.accepted(
                np.minimum(n, draws.drafted))

    def verify(self, action: np.ndarray, drafted: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """One iteration of every server with requests: each request verifies ``action`` positions of its
        draft ((N, max_batch) ints; empty slots ignore theirs). Then finished requests leave and arrived
        ones join. Returns per server: tokens, seconds (iteration and joiners' prefill), and counts.

        ``drafted`` ((N, max_batch)): the chain positions each request drafted before the policy chose
        (``rollout.serve_drafts`` decides them as the engine does), all charged, at most those verified.
        None: each chain drafts exactly what it verifies."""
        active = self.active
        n = np.where(active, np.minimum(np.clip(action, 0, LENGTH_CAP), self.drafted), 0)
        drafted = n if drafted is None else np.where(active, np.clip(drafted, 0, LENGTH_CAP), 0)
        n = np.minimum(n, drafted)
        accepted = np.take_along_axis(self.accepted_by, n[..., None], axis=2)[..., 0]
        running = active.sum(1)
        safe = np.maximum(running, 1)
        nodes = np.where(active, n + 1, 0).sum(1) / safe
        context = np.where(active, self.context, 0).sum(1) / safe
        chains = active & (drafted > 0)
        drafting = drafting_seconds(self.drafting, np.where(active, drafted, 0)) + np.where(
            chains, backlog_seconds(self.profile, self.drafter, self.backlog), 0.0).sum(1)
        iteration = drafting + batch_verify_seconds(self.profile, running, nodes, context)
        tokens = np.where(active, np.minimum(accepted + 1, self.remaining), 0)
        self.clock += iteration
        servers, slots = np.nonzero(active)
        requests = self.slot_request[servers, slots]
        fresh = np.isnan(self.first[servers, requests])
        self.first[servers[fresh], requests[fresh]] = self.clock[servers[fresh]]
        self.context += tokens
        self.remaining -= tokens
        self.backlog = np.where(chains, 0, self.backlog + tokens)
        ended = active & (self.remaining <= 0)
        e, s = np.nonzero(ended)
        self.finish[e, self.slot_request[e, s]] = self.clock[e]
        finished = [self.slot_request[i][ended[i]].copy() for i in range(self.num)]
        self.slot_request[ended] = -1
        self.done += ended.sum(1)
        prefill = self.admit(running > 0)
        return {"tokens": tokens.sum(1), "seconds": iteration + prefill, "iteration_seconds": iteration,
                "draft_seconds": drafting, "running": running,
                "accepted": np.where(active, accepted, 0).sum(1), "finished": finished,
                "done": self.done >= self.requests}

    def waiting(self) -> np.ndarray:
        """(N,) requests that have arrived and wait for a slot."""
        arrived = (self.arrival <= self.clock[:, None]).sum(1)
        return np.maximum(arrived - self.admitted, 0)

    def observations(self) -> np.ndarray:
        """(N, 3 + max_batch * SERVE_SLOT_DIM): each row ``serve_features`` of its server."""
        slots = np.zeros((self.num, self.cap, SERVE_SLOT_DIM))
        active = self.active
        slots[..., SERVE_SLOT_SLICES["active"]] = active[..., None]
        slots[..., SERVE_SLOT_SLICES["context_length"]] = np.where(active, self.context, 0)[..., None]
        slots[..., SERVE_SLOT_SLICES["remaining"]] = np.where(active, self.remaining, 0)[..., None]
        slots[..., SERVE_SLOT_SLICES["confidences"]] = self.confidences
        head = np.stack((active.sum(1), self.waiting(), np.full(self.num, self.cap), *self.costs()), axis=1)
        return np.concatenate((head.astype(np.float64), slots.reshape(self.num, -1)), axis=1)

    def costs(self) -> ServeCosts:
        """(N,) each: the next iteration's cost fields of the serving observation
        (``core.serve_costs.iteration_costs``), from the ``observed`` profile."""
        active = self.active
        running = active.sum(1)
        context = np.where(active, self.context, 0).sum(1) / np.maximum(running, 1)
        return iteration_costs(self.observed, self.observed_chains, running, context)

    def latencies(self, server: int, requests: np.ndarray) -> tuple[list[float], list[float]]:
        """TTFT (arrival to first token) and TPOT (first to last token over the further tokens) of
        ``requests`` of ``server``, in seconds."""
        ttft = self.first[server, requests] - self.arrival[server, requests]
        tpot = (self.finish[server, requests] - self.first[server, requests]) / np.maximum(
            self.output[server, requests] - 1, 1)
        return ttft.tolist(), tpot.tolist()


class SpecServeEnv(BatchEnv[np.ndarray]):
    """
    ## Description

    Speculative decoding under continuous batching: how many draft positions each running request
    verifies at the next iteration of a batched engine. An episode serves ``requests`` arrivals of a
    Poisson process; a step is one iteration of the batch (module doc: costs, arrivals, admission).

    ## Action Space

    ``MultiDiscrete([LENGTH_CAP + 1] * max_batch)``: per batch slot, the positions its request verifies
    (0: a plain decoding step for it); empty slots' entries are ignored.

    ## Observation Space

    ``policies.features.serve_features``: running and waiting requests, the batch cap, the next
    iteration's costs (base, per node, per drafted position, a chain's start), then per slot whether it
    runs a request, its context length, its remaining tokens and its pending draft's confidences
    c_1..c_16 (``SERVE_SLOT_SLICES``).

    ## Rewards

    The iteration's tokens per second: tokens emitted by every request over the step's seconds (the
    iteration and the prefill of the requests that joined after it).

    ## Starting State

    The episode's arrivals, prompt and output lengths and domains are drawn; the clock starts at the
    first arrival with the requests that have arrived admitted.

    ## Episode End

    Termination when every request has completed. No truncation.

    ## Arguments

    ``profile`` (None: the paper-derived A100 profile), ``acceptance`` (None: the default parametric
    model), ``drafter`` (its chain drafting cost), ``rate`` (arrivals per second), ``requests`` (per
    episode), ``max_batch``, ``prompt_tokens`` and ``output_tokens`` ((low, high) or an array of lengths to
    draw from, e.g. a prompt set's), ``domain_weights``, ``arrivals`` (an :class:`Arrivals` trace that
    every episode replays instead of drawing its requests; ``rate`` and ``requests`` are then unused),
    ``observed`` (the profile whose costs the observation shows, as a deployed policy sees the profile it
    was tuned on while the machine's costs are ``profile``'s; None: ``profile``).

    ``info`` after each step: ``tokens``, ``seconds``, ``iteration_seconds``, ``draft_seconds``,
    ``running`` (requests in the iteration), ``accepted`` (draft tokens accepted over them), ``ttft`` and
    ``tpot`` (seconds, of the requests that completed at this step) and ``clock``.

    ## Examples

    ```python
    >>> import gymnasium as gym
    >>> import simulator
    >>> env = gym.make("specblock/SpecServe-v0", rate=4.0, max_batch=4)
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

    ```
    """

    def __init__(self, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", rate: float = DEFAULT_RATE, requests: int = DEFAULT_REQUESTS,
                 max_batch: int = DEFAULT_BATCH, prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 output_tokens: Sequence[int] = DEFAULT_OUTPUT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 arrivals: Arrivals | None = None, observed: ProfileArg = None) -> None:
        batch = ServeBatch(1, profile, acceptance, drafter, rate, requests, max_batch, prompt_tokens,
                           output_tokens, domain_weights, arrivals, observed)
        super().__init__(batch, *_spaces(batch), render_mode)

    def step(self, action: np.ndarray) -> StepResult:
        """One iteration of the batch with each slot's speculation length ``action``."""
        self._check(np.asarray(action, dtype=np.int64))
        out = self.batch.verify(np.asarray(action, dtype=np.int64)[None])
        self.batch.draft(self.np_random)
        terminated = self._ended(out["done"])
        ttft, tpot = self.batch.latencies(0, out["finished"][0])
        keys = ("tokens", "seconds", "iteration_seconds", "draft_seconds", "running", "accepted")
        info = {key: out[key][0].item() for key in keys}
        info.update(ttft=ttft, tpot=tpot, clock=float(self.batch.clock[0]))
        reward = info["tokens"] / info["seconds"] if info["seconds"] > 0 else 0.0
        return self._observation(), float(reward), terminated, False, info


class SpecServeVectorEnv(BatchVectorEnv):
    """``num_envs`` SpecServe servers stepped together; see :class:`SpecServeEnv`. ``infos``
    holds per server ``tokens``, ``seconds``, ``iteration_seconds``, ``draft_seconds``, ``running``,
    ``accepted`` and ``completed`` (requests completed at the step); latencies are the single env's."""

    def __init__(self, num_envs: int = 1, profile: ProfileArg = None, acceptance: AcceptanceArg = None,
                 drafter: str = "specblock", rate: float = DEFAULT_RATE, requests: int = DEFAULT_REQUESTS,
                 max_batch: int = DEFAULT_BATCH, prompt_tokens: Sequence[int] = DEFAULT_PROMPT,
                 output_tokens: Sequence[int] = DEFAULT_OUTPUT,
                 domain_weights: Mapping[str, float] | None = None, render_mode: str | None = None,
                 arrivals: Arrivals | None = None, observed: ProfileArg = None) -> None:
        batch = ServeBatch(num_envs, profile, acceptance, drafter, rate, requests, max_batch,
                           prompt_tokens, output_tokens, domain_weights, arrivals, observed)
        super().__init__(num_envs, batch, *_spaces(batch), render_mode)

    def step(self, actions: np.ndarray) -> VectorStepResult:
        """One iteration of every server; servers that ended on the previous step start anew."""
        self._check(np.asarray(actions, dtype=np.int64))
        out = self.batch.verify(np.asarray(actions, dtype=np.int64))
        keys = ("tokens", "seconds", "iteration_seconds", "draft_seconds", "running", "accepted")
        info = {key: out[key] for key in keys}
        info["completed"] = np.array([f.size for f in out["finished"]])
        restart = self.prev_done
        if restart.any():
            self.batch.start(self.np_random, restart)
            for values in info.values():
                values[restart] = 0
        self.batch.draft(self.np_random)
        self.prev_done = out["done"] & ~restart
        seconds = info["seconds"]
        reward = np.divide(info["tokens"], seconds, out=np.zeros(self.num_envs), where=seconds > 0)
        truncated = np.zeros(self.num_envs, dtype=bool)
        return self.batch.observations(), reward, self.prev_done.copy(), truncated, info


def _spaces(batch: ServeBatch) -> tuple[spaces.MultiDiscrete, spaces.Box]:
    """A SpecServe step's action and observation spaces (one entry, one slot block per batch slot)."""
    low, high = serve_bounds(batch.cap)
    return spaces.MultiDiscrete([LENGTH_CAP + 1] * batch.cap), spaces.Box(low, high, dtype=np.float64)
