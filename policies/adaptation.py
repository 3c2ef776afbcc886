"""Online-adaptation policies: after each query, whether to spend compute updating the drafter.

Actions: ``SKIP`` (0), ``HEAD`` (1: train only the LM/rank head, cheap), ``FULL`` (2: train the drafter
decoder, several times a head update's cost: the profile's ``update`` samples say how much). An update
action means "train now on that buffer's contents".
Observations come from ``policies.features.adapt_features``.

The loop the engine and the simulator run, once per query::

    action = policy.act(obs)                  # obs describes the state after the previous query
    ... run the update (if any), serve the next query ...
    policy.observe(obs, action, reward, info) # the same obs; info describes that query
    if policy.should_revert(): restore the last good drafter, then policy.acknowledge_revert()
    if policy.checkpoint_good: save the drafter the closed window measured as the last good checkpoint:
        the current one, or with ``policy.checkpoint_previous`` the one that served the previous query

``info`` keys (``ADAPT_INFO_KEYS``), all for the query served after ``action``:
    ``tokens_per_second``: tokens emitted / ``query_seconds`` (the update's time excluded);
    ``tau``: mean accepted tokens per target forward (bonus included) during that query;
    ``query_seconds``: wall seconds serving that query;
    ``update_seconds``: wall seconds the update added to serving (0.0 when nothing ran; a background
    update may report its cost on a later query: the bandit charges it to the open measurement window).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies.base import Params, info_value, register
from policies.features import ADAPT_INDEX, check_adapt_obs

SKIP, HEAD, FULL = 0, 1, 2
ACTIONS: tuple[str, ...] = ("skip", "head", "full")
ADAPT_INFO_KEYS: tuple[str, ...] = ("tokens_per_second", "tau", "query_seconds", "update_seconds")
_FILL = {HEAD: ADAPT_INDEX["head_fill"], FULL: ADAPT_INDEX["full_fill"]}


def _ewma(old: float, new: float, alpha: float) -> float:
    """Exponentially weighted moving average; the first value (``old`` is NaN) is taken as is."""
    return new if math.isnan(old) else (1.0 - alpha) * old + alpha * new


class _AdaptPolicy:
    """Shared plumbing: parameters, a seeded generator, and no outcome-learning by default."""

    kind: ClassVar[str]
    role: ClassVar[str] = "adaptation"
    params_type: ClassVar[type[Params]]

    def __init__(self, params: Params | None = None, seed: int | None = None) -> None:
        self.params = params if params is not None else self.params_type()
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        """Reseed the generator."""
        self.rng = np.random.default_rng(seed)

    def observe(self, obs: np.ndarray, action: int, reward: float, info: Mapping[str, float]) -> None:
        """Fixed rules learn nothing from outcomes."""
        del obs, action, reward, info


@dataclass(frozen=True)
class NeverParams(Params):
    """No parameters."""


@register
class NeverAdapt(_AdaptPolicy):
    """Never update the drafter (the no-adaptation baseline)."""

    kind = "never"
    params_type = NeverParams
    tune_rank = None  # nothing to search

    def act(self, obs: np.ndarray) -> int:
        """Always skip."""
        check_adapt_obs(obs)
        return SKIP


@dataclass(frozen=True)
class AlwaysParams(Params):
    """``update``: which update to run after every query."""

    update: str = "head"
    RANGES: ClassVar = {"update": ("head", "full")}


@register
class AlwaysAdapt(_AdaptPolicy):
    """Update after every query, whatever it costs (the paper's "always update" ablation)."""

    kind = "always"
    params_type = AlwaysParams
    tune_rank = None  # an ablation, tuned only when named: its two settings are compared by name

    def act(self, obs: np.ndarray) -> int:
        """The configured update, every time."""
        check_adapt_obs(obs)
        return ACTIONS.index(self.params.update)


@dataclass(frozen=True)
class EpsilonGreedyParams(Params):
    """``epsilon``: exploration rate; ``alpha``: EWMA weight of the newest reward."""

    epsilon: float = 0.1
    alpha: float = 0.3
    RANGES: ClassVar = {"epsilon": (0.0, 1.0, False), "alpha": (0.0, 1.0, False)}


@register
class EpsilonGreedyAdapt(_AdaptPolicy):
    """Cost-blind bandit: with probability epsilon a uniform random action, else the best EWMA reward.

    The reward of an action is ``info["tau"]`` of the query served after it: accepted length only, no
    cost term. Untried actions count as best, so each is tried once.
    """

    kind = "epsilon-greedy"
    params_type = EpsilonGreedyParams
    tune_rank = 2

    def reset(self, seed: int | None = None) -> None:
        """Reseed and forget the reward estimates."""
        super().reset(seed)
        self.estimates = np.full(len(ACTIONS), np.nan)

    def act(self, obs: np.ndarray) -> int:
        """Explore with probability epsilon, else exploit the estimates (lowest action on ties)."""
        check_adapt_obs(obs)
        if self.rng.random() < self.params.epsilon:
            return int(self.rng.integers(len(ACTIONS)))
        return int(np.argmax(np.nan_to_num(self.estimates, nan=np.inf)))

    def observe(self, obs: np.ndarray, action: int, reward: float, info: Mapping[str, float]) -> None:
        """Fold the accepted length that followed ``action`` into its estimate."""
        tau = info_value(info, "tau", self.kind)
        self.estimates[action] = _ewma(self.estimates[action], tau, self.params.alpha)


@dataclass(frozen=True)
class BanditParams(Params):
    """Every constant of the SpecBlock appendix A.3 lifecycle; defaults are the paper's values.

    ``window`` (queries per measurement window) and the two EWMA weights are not given by the paper.
    """

    warmup: int = 10
    cold_start_events: int = 8
    epsilon_start: float = 0.30
    epsilon_end: float = 0.10
    cooldown: int = 2
    s_min: float = 5.0
    gain_alpha: float = 0.3
    throughput_alpha: float = 0.2
    saturation: float = 1.0
    window: int = 4
    revert_windows: int = 3
    RANGES: ClassVar = {
        "warmup": (0, 100_000, True), "cold_start_events": (0, 100_000, True),
        "epsilon_start": (0.0, 1.0, False), "epsilon_end": (0.0, 1.0, False),
        "cooldown": (0, 100_000, True), "s_min": (0.0, math.inf, False),
        "gain_alpha": (0.0, 1.0, False), "throughput_alpha": (0.0, 1.0, False),
        "saturation": (0.0, 1.0, False), "window": (1, 100_000, True), "revert_windows": (1, 100_000, True),
    }
    SEARCH: ClassVar = {"warmup": (0, 50), "cold_start_events": (0, 16), "cooldown": (0, 8),
                        "s_min": (0.0, 200.0), "window": (1, 16), "revert_windows": (1, 6)}


@dataclass
class _Window:
    """The measurement window opened by one training event."""

    action: int
    trigger: float
    reference_tps: float
    tokens: float = 0.0
    seconds: float = 0.0
    update_seconds: float = 0.0
    tau_sum: float = 0.0
    queries: int = 0


@register
class CostAwareBandit(_AdaptPolicy):
    """SpecBlock's cost-aware bandit (its paper's appendix A.3) with its whole lifecycle.

    1. Warm-up: the first ``warmup`` queries always skip; their throughput and tau are the baseline.
    2. An update can fire only when its buffer is saturated (fill >= ``saturation``) and no cooldown
       runs: after each training event the next ``cooldown`` decisions are skips.
    3. Cold start: the first ``cold_start_events`` events are epsilon-greedy between the saturated
       updates, epsilon falling linearly from ``epsilon_start`` (event 0) to ``epsilon_end`` (last);
       an action never measured counts as best.
    4. Then: predicted gains are the EWMA estimates; skip when no saturated update has a gain > 0,
       else the saturated update with the larger gain.
    5. Each event opens a measurement window of ``window`` queries (a new event closes it early). Its
       gain is the throughput over the window, the update's seconds included, relative to the recent
       throughput before the event, minus 1. It updates that action's estimate only when the trigger
       signal s_trig at the event was >= ``s_min``.
    6. A window whose mean tau is below the previous one (the first compared with the last good
       checkpoint) is a drop; ``revert_windows`` drops in a row set ``should_revert()``. A window that
       is not a drop sets ``checkpoint_good`` for that step: the drafter it measured is the last good
       one. When a new event closed it early, that drafter is the one that served the previous query
       (this query's update may already be live): ``checkpoint_previous`` says so.
    """

    kind = "cost-aware-bandit"
    params_type = BanditParams
    tune_rank = 1

    def reset(self, seed: int | None = None) -> None:
        """Reseed and restart the lifecycle from the warm-up."""
        super().reset(seed)
        self.queries = 0
        self.events = 0
        self.cooldown_left = 0
        self.gains = {HEAD: math.nan, FULL: math.nan}
        self.baseline_tps = math.nan
        self.baseline_tau = math.nan
        self.recent_tps = math.nan
        self.good_tau = math.nan
        self.checkpoint_good = False
        self.checkpoint_previous = False
        self._warm = _Window(SKIP, 0.0, math.nan)
        self._window: _Window | None = None
        self._last_window_tau = math.nan
        self._drops = 0
        self._revert = False

    @property
    def epsilon(self) -> float:
        """Exploration rate of the next cold-start event (0 once the cold start is over)."""
        p = self.params
        if self.events >= p.cold_start_events:
            return 0.0
        frac = self.events / (p.cold_start_events - 1) if p.cold_start_events > 1 else 0.0
        return p.epsilon_start + (p.epsilon_end - p.epsilon_start) * frac

    def act(self, obs: np.ndarray) -> int:
        """Skip, head or full for the next query (see the class docstring for the rule)."""
        obs = check_adapt_obs(obs)
        if self.queries < self.params.warmup or self.cooldown_left > 0:
            return SKIP
        ready = [a for a in (HEAD, FULL) if obs[_FILL[a]] >= self.params.saturation]
        if not ready:
            return SKIP
        if self.events < self.params.cold_start_events:
            if self.rng.random() < self.epsilon:
                return ready[int(self.rng.integers(len(ready)))]
            return max(ready, key=lambda a: math.inf if math.isnan(self.gains[a]) else self.gains[a])
        worth = [a for a in ready if self.gains[a] > 0]
        return max(worth, key=self.gains.__getitem__) if worth else SKIP

    def observe(self, obs: np.ndarray, action: int, reward: float, info: Mapping[str, float]) -> None:
        """Advance the lifecycle with the query served after ``action`` (reads ``ADAPT_INFO_KEYS``)."""
        obs = check_adapt_obs(obs)
        tps, tau, seconds, update = (info_value(info, key, self.kind) for key in ADAPT_INFO_KEYS)
        self.checkpoint_good = self.checkpoint_previous = False
        self.queries += 1
        if self.queries <= self.params.warmup:
            self._add(self._warm, tps, tau, seconds, update)
            if self.queries == self.params.warmup:
                self.baseline_tps = self._warm.tokens / self._warm.seconds if self._warm.seconds else tps
                self.baseline_tau = self.good_tau = self._warm.tau_sum / self._warm.queries
                self.recent_tps = self.baseline_tps
            return
        if action != SKIP:
            self._close_window(early=True)
            self.events += 1
            self.cooldown_left = self.params.cooldown
            trigger = float(obs[ADAPT_INDEX["trigger"]])
            self._window = _Window(action, trigger, self.recent_tps)
        elif self.cooldown_left > 0:
            self.cooldown_left -= 1
        if self._window is not None:
            self._add(self._window, tps, tau, seconds, update)
            if self._window.queries >= self.params.window:
                self._close_window()
        self.recent_tps = _ewma(self.recent_tps, tps, self.params.throughput_alpha)

    def should_revert(self) -> bool:
        """True once accepted length fell across ``revert_windows`` windows in a row, until acknowledged."""
        return self._revert

    def acknowledge_revert(self) -> None:
        """The caller restored the last good drafter: clear the signal, drop the open window's measurement
        and restart the drop count."""
        self._revert = False
        self._window = None
        self._drops = 0
        self._last_window_tau = math.nan

    @staticmethod
    def _add(window: _Window, tps: float, tau: float, seconds: float, update: float) -> None:
        window.tokens += tps * seconds
        window.seconds += seconds
        window.update_seconds += update
        window.tau_sum += tau
        window.queries += 1

    def _close_window(self, early: bool = False) -> None:
        """Close the open window (``early``: a new event ends it before this query, which it excludes)."""
        w, self._window = self._window, None
        if w is None:
            return
        spent = w.seconds + w.update_seconds
        gain = (w.tokens / spent) / w.reference_tps - 1.0 if spent > 0 and w.reference_tps > 0 else math.nan
        if w.trigger >= self.params.s_min and math.isfinite(gain):
            self.gains[w.action] = _ewma(self.gains[w.action], gain, self.params.gain_alpha)
        tau = w.tau_sum / w.queries
        previous = self.good_tau if self._drops == 0 else self._last_window_tau
        if math.isnan(previous) or tau >= previous:
            self._drops = 0
            self.good_tau = tau
            self.checkpoint_good, self.checkpoint_previous = True, early
        else:
            self._drops += 1
            self._revert = self._revert or self._drops >= self.params.revert_windows
        self._last_window_tau = tau
