"""The worker process ``benchmarks/checkout_ab.py`` runs in each checkout: it decodes what it is asked on
stdin and answers one JSON line per request.

Run by path in the checkout (``cwd`` and ``PYTHONPATH`` there), so it imports that checkout's engine;
it imports nothing else of the project (an older checkout may lack ``core``), hence its relative paths.

    python benchmarks/checkout_worker.py PROMPTS DOMAINS  # DOMAINS comma-separated; then, on stdin,
                                                          # lines of: drafter domain index max_new_tokens
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SEED = 0
TRAINED = ("specblock", "eagle", "medusa")  # built from data/models/<name>, which the worker names itself


def worker(prompts: int, domains: list[str]) -> None:
    """Serve ``drafter domain index max_new_tokens`` lines with one JSON result line each (the last
    ``prompts`` prompts of each of ``domains``' held-out file, greedy, one thread)."""
    import torch  # the engine loads in the worker only: checkout_ab imports this module for its constants

    from real_engine.decode import generate, make_drafter
    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer

    torch.set_num_threads(1)
    target, draft = load_model("data/models/target"), load_model("data/models/draft")
    tokenizer = Tokenizer.load("data/models/target")
    encoded = {}
    for d in domains:
        lines = Path(f"data/prompts/{d}.jsonl").read_text().splitlines()[-prompts:]
        encoded[d] = [tokenizer.encode(json.loads(line)["text"]) for line in lines]
    drafters: dict[str, Any] = {}
    print("ready", flush=True)
    for line in sys.stdin:
        name, domain, index, new = line.split()
        if name not in drafters:
            shipped = {"folder": f"data/models/{name}"} if name in TRAINED else {}
            drafters[name] = None if name == "vanilla" else make_drafter(name, target, draft, **shipped)
        stats = generate(target, encoded[domain][int(index)], drafter=drafters[name],
                         max_new_tokens=int(new), seed=SEED).stats
        print(json.dumps({"seconds": stats.seconds, "tokens": stats.new_tokens,
                          "iterations": stats.iterations}), flush=True)


if __name__ == "__main__":  # the process each side of `specblock benchmark checkout_ab` starts
    worker(int(sys.argv[1]), sys.argv[2].split(","))
