"""Decoding speed of two checkouts side by side: did a change to the engine make decoding faster?

This machine's speed drifts by 15 to 30% within minutes, so two runs one after the other cannot tell
a 10% change. Here each checkout runs in its own worker process (its own code and shipped weights,
one thread), and every (drafter, prompt) generation runs in both, alternating, once to warm up and
once timed. The result per drafter is the median over prompts of the paired time ratio (base time
over candidate time: above 1 when the candidate is faster), beside each side's tokens/s, speedup
over its own vanilla decoding and tau. Greedy (T = 0) on the last prompts of each held-out file.

    .venv/bin/python benchmarks/checkout_ab.py BASE [--candidate .] [--drafters vanilla,ngram,...]
        [--domains code] [--prompts 8] [--max-new-tokens 48] [--name checkout_ab]

BASE is another checkout (``git worktree add /tmp/base HEAD~1``, or a clone); both must have the
shipped models. Saves ``benchmarks/results/<name>.json`` with both commits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

SEED = 0
DRAFTERS = "vanilla,ngram,draft-model,eagle,medusa,specblock"
DOMAINS = ("code", "tests", "prose", "text")


def worker(prompts: int) -> None:
    """Serve ``drafter domain index max_new_tokens`` lines with one JSON result line each."""
    import torch

    from real_engine.decode import generate, make_drafter
    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer

    torch.set_num_threads(1)
    target, draft = load_model("data/models/target"), load_model("data/models/draft")
    tokenizer = Tokenizer.load("data/models/target")
    encoded = {}
    for d in DOMAINS:
        lines = Path(f"data/prompts/{d}.jsonl").read_text().splitlines()[-prompts:]
        encoded[d] = [tokenizer.encode(json.loads(line)["text"]) for line in lines]
    drafters: dict[str, Any] = {}
    print("ready", flush=True)
    for line in sys.stdin:
        name, domain, index, new = line.split()
        if name not in drafters:
            drafters[name] = None if name == "vanilla" else make_drafter(name, target, draft)
        stats = generate(target, encoded[domain][int(index)], drafter=drafters[name],
                         max_new_tokens=int(new), seed=SEED).stats
        print(json.dumps({"seconds": stats.seconds, "tokens": stats.new_tokens,
                          "iterations": stats.iterations}), flush=True)


class Side:
    """One checkout's worker process."""

    def __init__(self, root: Path, prompts: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker",
                                         "--prompts", str(prompts)], cwd=root, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit(f"the worker in {root} did not start: is it a checkout with shipped models?")

    def run(self, request: str) -> dict[str, float]:
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"a worker stopped on {request!r}")
        return json.loads(line)


def commit(root: Path) -> str | None:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or None


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    tokens = sum(r["tokens"] for r in runs)
    return {"tokens_per_s": tokens / sum(r["seconds"] for r in runs),
            "tau": tokens / sum(r["iterations"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, nargs="?")
    parser.add_argument("--candidate", type=Path, default=Path("."))
    parser.add_argument("--drafters", default=DRAFTERS)
    parser.add_argument("--domains", default="code")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--name", default="checkout_ab")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.prompts)
        return
    drafters, domains = args.drafters.split(","), args.domains.split(",")
    if args.base is None or not (args.base / "real_engine").is_dir():
        parser.error(f"BASE {args.base} is not a checkout of this project: give its folder")
    if drafters[0] != "vanilla" or any(d not in DOMAINS for d in domains) or min(args.prompts,
                                                                                    args.max_new_tokens) < 1:
        parser.error("--drafters must start with vanilla, --domains come from "
                     f"{','.join(DOMAINS)}, --prompts and --max-new-tokens be >= 1")
    sides = [Side(args.base.resolve(), args.prompts), Side(args.candidate.resolve(), args.prompts)]
    runs: dict[str, list[list[dict[str, float]]]] = {d: [[], []] for d in drafters}
    for domain in domains:
        for index in range(args.prompts):
            for name in drafters:
                request = f"{name} {domain} {index} {args.max_new_tokens}"
                for side in sides:  # warm-up, then the timed pair
                    side.run(request)
                for k, side in enumerate(sides):
                    runs[name][k].append(side.run(request))
    vanilla = [summary(runs["vanilla"][k])["tokens_per_s"] for k in (0, 1)]
    rows = []
    for name in drafters:
        base, cand = (summary(runs[name][k]) for k in (0, 1))
        ratio = statistics.median(b["seconds"] / c["seconds"] for b, c in zip(*runs[name], strict=True))
        rows.append({"drafter": name, "candidate_over_base": ratio,
                     "base": {**base, "speedup": base["tokens_per_s"] / vanilla[0]},
                     "candidate": {**cand, "speedup": cand["tokens_per_s"] / vanilla[1]},
                     "runs": runs[name]})
        b, c = rows[-1]["base"], rows[-1]["candidate"]
        print(f"{name:12s} base {b['tokens_per_s']:6.1f} tok/s ({b['speedup']:.2f}x, tau {b['tau']:.2f})  "
              f"candidate {c['tokens_per_s']:6.1f} tok/s ({c['speedup']:.2f}x, tau {c['tau']:.2f})  "
              f"candidate {ratio:.2f}x as fast")
    from experiments.provenance import save_result

    config = {"base": str(args.base), "base_commit": commit(args.base),
              "candidate_commit": commit(args.candidate), "drafters": drafters, "domains": domains,
              "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "threads": 1}
    print(save_result(args.name, rows, config, SEED))


if __name__ == "__main__":
    main()
