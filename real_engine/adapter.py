"""The online adaptation lifecycle an adaptation policy drives once per query (SpecBlock appendix A.3).

An :class:`Adapter` wraps the live drafter in a ``real_engine.feedback.FeedbackDrafter`` and runs:

- **Buffers** (``real_engine.feedback.FeedbackBuffer``): each rejected position is one signal, with its
  query's rows, routed to the head buffer (with the drafter's state there) or to the full buffer, of
  fixed capacities (the oldest leave first; the routing rule is ``real_engine.feedback``'s); ``s_trig``
  counts the signals of both since the last training event.
- **Updates** (``apply(HEAD | FULL)``): a background thread trains a copy of the newest drafter network
  (``real_engine.adapt.update_drafter``); a head update drains the head buffer, a full update both (as
  ``AdaptStream`` does; the head signals' states are the old body's). An adapting drafter drafts the
  whole vocabulary: a reduced one, fixed offline from the training corpus, lost most of what the
  updates learnt on a shifted stream (see ``Adapter``). On a GPU the thread's work runs on its own
  CUDA stream (``side_stream``), overlapping the target's verify forwards; ``drafters.base.clock``
  waits only for the decode thread's stream, so decode timings exclude it.
- **Swap**: the trained copy, its fp16 weights packed by the trainer (``packed.prepack``), is handed
  over under a lock and goes live at the next ``begin``, by replacing the drafter's network reference.
  A live network is never modified, so a query sees one set of weights from its first to its last
  draft, whatever the trainer is doing.
- **Revert**: after a swap, measurement windows of ``window`` queries open; when mean tau falls across
  ``revert_windows`` windows in a row (the first compared with the last good drafter's window) the last
  good drafter goes live again; a window that does not fall makes the live drafter the last good one.
  A policy with its own revert rule (the cost-aware bandit) calls ``revert``/``checkpoint`` instead,
  naming the network its window measured.
- **Observation and outcome**: ``features`` builds the policy's observation with
  ``policies.features.adapt_features``; ``info`` holds ``policies.adaptation.ADAPT_INFO_KEYS``.

``real_engine.stream_server`` serves whole streams under a policy with it.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from core.errors import InputError
from policies.adaptation import ACTIONS, ADAPT_INFO_KEYS, FULL, HEAD, SKIP
from policies.features import adapt_features
from real_engine.adapt import AdaptConfig, UpdateReport, side_stream, update_drafter
from real_engine.decode import Stats
from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter, with_draft_vocab
from real_engine.feedback import Feedback, FeedbackBuffer, FeedbackDrafter
from real_engine.packed import prepack


class Adapter:
    """Online adaptation of a live SpecBlock drafter, driven once per query (see the module doc).

    Decode with ``adapter.drafter``; after each query call ``end_query``. Before each query a policy
    reads ``features()`` and its action goes to ``apply``; ``info()`` describes the last query. The
    drafter's network drafts the whole vocabulary from then on (a reduced one is dropped, in place).
    """

    def __init__(self, drafter: SpecBlockDrafter, config: AdaptConfig | None = None,
                 domains: Sequence[str] = ()) -> None:
        config = AdaptConfig() if config is None else config
        self.config, self.domains = config, tuple(domains)
        # Draft the whole vocabulary: after a domain shift many target tokens fall outside a reduced one
        # (even one each update widens with its windows' target tokens), and updates then raise tau far
        # less than with the whole vocabulary.
        with_draft_vocab(drafter.net, None)
        self.drafter = FeedbackDrafter(drafter, config.top_k)
        self.head = FeedbackBuffer(config.head_capacity, "head")
        self.full = FeedbackBuffer(config.full_capacity, "full")
        self.trigger = 0  # s_trig: signals buffered since the last training event
        self.since = 0  # queries since the last training event
        self.queries = self.updates = self.reverts = 0
        self.recent = self.long = 0.0
        self.shares = np.zeros(len(self.domains))
        self.reports: list[UpdateReport] = []  # every finished update, in order
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._unreported: list[UpdateReport] = []
        self._epoch = 0  # bumped by revert: a result trained before it is dropped
        self._good = drafter.net  # the last good network (live networks are never modified)
        # the last trained networks offered, with their reports: the live one and one offered since
        self._offered: deque[tuple[SpecBlock, UpdateReport]] = deque(maxlen=2)
        self._syncs_seen = 0
        self._window: list[float] = []
        self._good_tau = self._last_tau = math.nan
        self._drops = 0
        self._info = dict.fromkeys(ADAPT_INFO_KEYS, 0.0)

    def features(self, domain_shares: np.ndarray | None = None) -> np.ndarray:
        """The policy's observation (``adapt_features``); domain shares are tracked unless given."""
        with self._lock:
            shares = self.shares if domain_shares is None else domain_shares
            return adapt_features(self.head.fill, self.full.fill, float(self.trigger), self.recent,
                                  self.recent - self.long, self.since, shares)

    def info(self) -> dict[str, float]:
        """``ADAPT_INFO_KEYS`` of the last query served, and its signals routed to each buffer."""
        return dict(self._info)

    @property
    def training(self) -> bool:
        """Whether an update is training now (its thread alive)."""
        return self._thread is not None and self._thread.is_alive()

    def apply(self, action: int) -> bool:
        """Start the update ``action`` asks for, in a background thread; False when nothing started
        (skip, an empty buffer, or an update still running)."""
        if action not in (SKIP, HEAD, FULL):
            raise InputError(f"unknown adaptation action {action!r}: use 0 (skip), 1 (head) or 2 (full)")
        if action == SKIP:
            return False
        with self._lock:
            if self.training:
                return False
            buffer = self.full if action == FULL else self.head
            if not len(buffer):
                return False
            fill, data = buffer.fill, buffer.drain()
            if action == FULL:
                self.head.drain()
            self.trigger = self.since = 0
            self.updates += 1
            args = (self.drafter.newest(), data, ACTIONS[action], fill, self._epoch,
                    self.config.seed * 1_000_003 + self.updates)
            self._thread = threading.Thread(target=self._train, args=args, name="adapt", daemon=True)
            self._thread.start()
        return True

    def _train(self, net: SpecBlock, data: list[tuple[Feedback, list[int]]], kind: str, fill: float,
               epoch: int, seed: int) -> None:
        if self.config.trainer_core is not None:  # Linux: pid 0 is this thread, not the process
            os.sched_setaffinity(0, {self.config.trainer_core})
        try:
            with side_stream(net.lm_head.weight.device):
                new, report = update_drafter(net, data, kind, self.config, seed)
                prepack(new)  # here, not in the first query the new network serves
        except BaseException as exc:  # re-raised in the caller's thread by wait() / end_query()
            self._error = exc
            return
        report = replace(report, fill=fill)
        with self._lock:
            self.reports.append(report)
            self._unreported.append(report)
            if epoch == self._epoch and report.steps:
                self.drafter.offer(new)
                self._offered.append((new, report))

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the drafter update failed") from error

    def wait(self) -> UpdateReport | None:
        """Block until a running update has finished; the last finished update's report."""
        thread = self._thread
        if thread is not None:
            thread.join()
        self._raise()
        return self.reports[-1] if self.reports else None

    def live_report(self) -> UpdateReport | None:
        """The report of the update whose network is live (None: the drafter as loaded, or a revert's)."""
        with self._lock:
            return next((report for net, report in self._offered if net is self.drafter.net), None)

    def checkpoint(self, net: SpecBlock | None = None) -> None:
        """Make ``net`` (a network that served a measured window; default: the live one) the last good one."""
        self._good = self.drafter.net if net is None else net

    def revert(self) -> None:
        """Put the last good drafter live again at the next query (a running update's result is dropped)."""
        with self._lock:
            self._epoch += 1
            self.reverts += 1
            self.drafter.offer(self._good)
            self._offered.clear()
            self._window, self._drops, self._last_tau = [], 0, math.nan

    def end_query(self, stats: Stats, domain: str, seconds: float | None = None) -> dict[str, float]:
        """Book the query just served with ``adapter.drafter``: buffer its feedback, update the observation's
        statistics and the revert rule; ``seconds`` overrides ``stats.seconds`` (another clock).
        Returns ``info()``."""
        self._raise()
        if self.domains and domain not in self.domains:
            raise InputError(f"unknown domain {domain!r}: the adapter tracks {', '.join(self.domains)}")
        feedback = self.drafter.take(domain)
        seconds = stats.seconds if seconds is None else seconds
        with self._lock:
            if feedback is not None:
                self.head.add(feedback)
                self.full.add(feedback)
                self.trigger += len(feedback.rejected)
            done, self._unreported = self._unreported, []
            first, a, tau = self.queries == 0, self.config, stats.tau
            self.recent = tau if first else (1 - a.recent_alpha) * self.recent + a.recent_alpha * tau
            self.long = tau if first else (1 - a.long_alpha) * self.long + a.long_alpha * tau
            if self.domains:
                onehot = np.eye(len(self.domains))[self.domains.index(domain)]
                self.shares = onehot if first else (1 - a.share_alpha) * self.shares + a.share_alpha * onehot
            self.queries += 1
            self.since += 1
        cost = sum(r.seconds if self.config.clock == "wall" else r.cpu_seconds for r in done)
        self._info = {"tokens_per_second": stats.new_tokens / seconds, "tau": stats.tau,
                      "query_seconds": seconds, "update_seconds": cost,
                      "head_signals": 0 if feedback is None else len(feedback.head_rows),
                      "full_signals": 0 if feedback is None else len(feedback.full_roots)}
        self._watch(stats.tau)
        return self.info()

    def _watch(self, tau: float) -> None:
        """The revert rule over measurement windows (see the module doc)."""
        if self.config.revert_windows == 0:
            return
        if self.drafter.syncs != self._syncs_seen:  # new weights went live: a fresh window opens
            self._syncs_seen, self._window = self.drafter.syncs, []
        self._window.append(tau)
        if len(self._window) < self.config.window:
            return
        mean, self._window = float(np.mean(self._window)), []
        if self.drafter.net is self._good:
            self._good_tau, self._drops = mean, 0
            return
        previous = self._good_tau if self._drops == 0 else self._last_tau
        self._last_tau = mean
        if math.isnan(previous) or mean >= previous:
            self.checkpoint()
            self._good_tau, self._drops = mean, 0
        else:
            self._drops += 1
            if self._drops >= self.config.revert_windows:
                self.revert()
