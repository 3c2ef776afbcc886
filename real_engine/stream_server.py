"""Serving a stream of queries while an adaptation policy adapts the SpecBlock drafter.

:class:`StreamServer` serves a stream's queries one call at a time under an adaptation policy
(greedy decoding), through a ``real_engine.adapter.Adapter``; :func:`run_stream` runs one over a whole
stream and returns one row per query.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from core.errors import InputError
from policies.adaptation import ACTIONS
from policies.base import Policy
from real_engine.adapt import AdaptConfig
from real_engine.adapter import Adapter
from real_engine.decode import Iteration, generate
from real_engine.drafters.specblock import SpecBlockDrafter
from real_engine.model import Transformer
from real_engine.timing import CPU_CLOCKS


class StreamServer:
    """Serves a stream's queries one call at a time (greedy) while ``policy`` adapts ``drafter``.

    Before each query the policy acts on ``Adapter.features()``; an update it starts trains in the
    background and, unless ``overlap``, is waited for before the query (its seconds are then the
    query's ``update_seconds``; with ``overlap`` it trains while later queries decode, on the core
    ``AdaptConfig.trainer_core`` names, and its network goes live at the first query after it ends).
    With ``config.clock`` ``"cpu"`` or ``"thread"`` queries are timed in process or decoding-thread CPU
    seconds. A policy with ``should_revert`` (the cost-aware bandit) decides reverts and checkpoints;
    for the others the adapter's own rule does. ``on_iteration(query index, iteration)`` sees each
    speculative iteration. Servers keep no shared state, so several may take turns on one stream; note
    that another server's updates evict what decoding keeps cached, which slows its queries.
    """

    def __init__(self, target: Transformer, drafter: SpecBlockDrafter, domains: Sequence[str], policy: Policy,
                 *, config: AdaptConfig | None = None, max_new_tokens: int = 48, overlap: bool = False,
                 eos_id: int | None = None, seed: int = 0,
                 on_iteration: Callable[[int, Iteration], None] | None = None) -> None:
        config = AdaptConfig() if config is None else config
        if config.clock == "cpu" and overlap:
            raise InputError("the cpu clock needs updates waited for (overlap=False): process CPU time "
                             "would count the trainer's work in the queries")
        self.target, self.policy, self.config = target, policy, config
        self.max_new_tokens, self.overlap, self.eos_id, self.seed = max_new_tokens, overlap, eos_id, seed
        self.own_rule = hasattr(policy, "should_revert")
        self.adapter = Adapter(drafter, replace(config, revert_windows=0) if self.own_rule else config,
                               sorted(set(domains)))
        self.on_iteration = on_iteration
        self._callback = 0.0  # CPU seconds of the current query's on_iteration calls (not its own)
        self._reported = 0  # finished updates already listed in a row's ``trained``

    def serve(self, index: int, domain: str, prompt: Sequence[int]) -> dict[str, Any]:
        """Let the policy act, then serve query ``index``: its row (domain, action, the update whose network
        went live at its start with its report, the kinds and seconds of updates that finished during it,
        tau, tokens/s, seconds, new tokens, the mean nodes its verify forwards ran (root included), revert
        and checkpoint flags).

        ``update_seconds`` is what the query is charged for training: a waited-for update's seconds, and
        nothing with ``overlap`` (training then runs beside decoding: what it costs shows as slower
        queries); ``train_seconds`` is the training's own, either way."""
        adapter, policy = self.adapter, self.policy
        obs = adapter.features()
        action = policy.act(obs)
        started = adapter.apply(action)
        if started and not self.overlap:
            adapter.wait()
        reverts, syncs = adapter.reverts, adapter.drafter.syncs
        previous = adapter.drafter.net  # served the previous query: new weights go live at the next begin
        self._callback = 0.0
        hook = None if self.on_iteration is None else lambda iteration: self._timed(index, iteration)
        timer = CPU_CLOCKS.get(self.config.clock)
        cpu = timer() if timer is not None else 0.0
        generation = generate(self.target, list(prompt), drafter=adapter.drafter,
                              max_new_tokens=self.max_new_tokens, eos_id=self.eos_id, seed=self.seed + index,
                              on_iteration=hook)
        seconds = timer() - cpu - self._callback if timer is not None else None
        live = adapter.live_report() if adapter.drafter.syncs > syncs else None
        info = adapter.end_query(generation.stats, domain, seconds)
        train_seconds = info["update_seconds"]
        if self.overlap:
            info["update_seconds"] = 0.0
        policy.observe(obs, action, -(info["query_seconds"] + info["update_seconds"]), info)
        if self.own_rule and policy.should_revert():  # type: ignore[attr-defined]
            adapter.revert()
            policy.acknowledge_revert()  # type: ignore[attr-defined]
        checkpoint = bool(getattr(policy, "checkpoint_good", False))
        checkpoint_previous = checkpoint and bool(getattr(policy, "checkpoint_previous", False))
        if checkpoint:  # the network the closed window measured, not an update that went live after it
            adapter.checkpoint(previous if checkpoint_previous else None)
        trained, self._reported = adapter.reports[self._reported:], len(adapter.reports)
        return {"query": index, "domain": domain, "action": ACTIONS[action], "started": started,
                "update": None if live is None else asdict(live),
                "trained": [r.kind for r in trained], "train_seconds": train_seconds,
                **info, "new_tokens": generation.stats.new_tokens, "iterations": generation.stats.iterations,
                "tree_nodes": sum(generation.stats.tree_sizes) / max(len(generation.stats.tree_sizes), 1),
                "wall_seconds": generation.stats.seconds, "syncs": adapter.drafter.syncs,
                "reverted": adapter.reverts > reverts, "checkpoint": checkpoint,
                "checkpoint_previous": checkpoint_previous,
                "head_fill": adapter.head.fill, "full_fill": adapter.full.fill, "trigger": adapter.trigger}

    def close(self, last: dict[str, Any] | None = None) -> None:
        """Wait for an update still training (with ``overlap``) and book it in ``last`` (the stream's last
        row): its kind in ``trained`` and its seconds in ``train_seconds``."""
        self.adapter.wait()
        left, self._reported = self.adapter.reports[self._reported:], len(self.adapter.reports)
        if last is not None:
            last["trained"] = [*last["trained"], *(r.kind for r in left)]
            clock = "seconds" if self.config.clock == "wall" else "cpu_seconds"
            last["train_seconds"] += sum(getattr(r, clock) for r in left)

    def _timed(self, index: int, iteration: Iteration) -> None:
        timer = CPU_CLOCKS.get(self.config.clock, time.process_time)
        began = timer()
        self.on_iteration(index, iteration)  # type: ignore[misc]
        self._callback += timer() - began


def run_stream(target: Transformer, drafter: SpecBlockDrafter, prompts: Sequence[tuple[str, Sequence[int]]],
               policy: Policy, *, config: AdaptConfig | None = None, max_new_tokens: int = 48,
               overlap: bool = False, eos_id: int | None = None, seed: int = 0,
               on_iteration: Callable[[int, Iteration], None] | None = None,
               on_query: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Serve ``prompts`` ((domain, token ids), in order) with one ``StreamServer``: one row per query
    (``on_query`` sees each as it comes)."""
    server = StreamServer(target, drafter, [domain for domain, _ in prompts], policy, config=config,
                          max_new_tokens=max_new_tokens, overlap=overlap, eos_id=eos_id, seed=seed,
                          on_iteration=on_iteration)
    rows = []
    for index, (domain, prompt) in enumerate(prompts):
        rows.append(server.serve(index, domain, prompt))
        if on_query is not None:
            on_query(rows[-1])
    server.close(rows[-1] if rows else None)
    return rows
