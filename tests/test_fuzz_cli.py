"""Property-based fuzzing of the command line (hypothesis): whatever the options and the JSON input files
(cost profile, policy, calibration), a command exits 0, or 2 with exactly one line on stderr, and leaves
no file behind that it did not finish.

Runs in-process through ``experiments.cli.main``, derandomized (the same examples on every run, no
example database) and on a small budget: cheap commands only (``lp`` at tiny sizes, ``simulate
--no-probe`` on a few queries, ``generate --max-new-tokens 1`` a few times, and the commands that write
files only with input they must refuse).
"""

from __future__ import annotations

import copy
import io
import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.paths import PAPER_PROFILE, REPO
from experiments.cli import main
from policies.base import POLICY_KINDS, make_policy, policy_to_dict

BUDGET = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PAPER = json.loads(PAPER_PROFILE.read_text())
KINDS = sorted(POLICY_KINDS)

# Option values: small valid ones, the edges of integers and floats, and text that is no number at all
# (a lone surrogate is what an undecodable byte of argv becomes; argv never holds a NUL).
EDGE_INTS = ["-1", "0", str(2**31), str(2**32), str(2**63), str(2**70), "1" + "0" * 400]
EDGE_TEXT = ["", "nan", "inf", "-inf", "1e-40", "1e400", "0x10", "3.5", " 2", "x", "\udcff", "--json"]
words = st.text(st.characters(blacklist_characters="\x00"), max_size=6)


def values(*valid: str) -> st.SearchStrategy[str]:
    """An option's value: mostly one of ``valid``, else an edge case or arbitrary text."""
    broken = st.one_of(st.sampled_from(EDGE_INTS + EDGE_TEXT), words)
    return st.integers(0, 4).flatmap(lambda pick: broken if pick == 0 else st.sampled_from(valid))


def sometimes(strategy: st.SearchStrategy[Any], default: Any) -> st.SearchStrategy[Any]:
    """``strategy``'s value about one time in four, else ``default``."""
    return st.integers(0, 3).flatmap(lambda pick: strategy if pick == 0 else st.just(default))


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """Run ``specblock argv`` in-process: (exit code, stdout, stderr), with the streams' real encodings
    (stdout strict UTF-8, stderr backslash-escaping what it cannot encode)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code
    for stream in (out, err):
        stream.flush()
    return code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode()


@contextmanager
def folder() -> Iterator[Path]:
    """A fresh temporary folder (under the system's temporary directory) for one example."""
    with tempfile.TemporaryDirectory(prefix="specblock-fuzz-") as name:
        yield Path(name)


def holds_contract(argv: list[str], where: Path, outputs: tuple[str, ...] = ()) -> int:
    """Assert the contract for ``argv`` and return its exit code: 0, or 2 with one line on stderr and
    nothing on stdout; no new file in ``where`` but the finished ``outputs`` of a success."""
    before = set(where.rglob("*"))
    code, out, err = invoke(argv)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("specblock: error: ") and out == "", (argv, err)
    made = {path.relative_to(where).as_posix() for path in set(where.rglob("*")) - before}
    assert made <= (set(outputs) if code == 0 else set()), (argv, code, made)
    return code


def options(draw: st.DrawFn, choices: dict[str, st.SearchStrategy[str]], required: tuple[str, ...] = ()
            ) -> list[str]:
    """The ``required`` options (each left out one time in eight) and some others of ``choices``, each
    with a drawn value, in a drawn order."""
    names = [name for name in required if draw(st.integers(0, 7))]
    names += draw(st.lists(st.sampled_from(sorted(set(choices) - set(required))), unique=True,
                           max_size=len(choices)))
    names = draw(st.permutations(names))
    return [token for name in names for token in (name, draw(choices[name]))]


# ----------------------------------------------------------------------------- JSON inputs

scalars = st.one_of(st.none(), st.booleans(), st.integers(-20, 20), st.sampled_from([2**63, 2**70, 10**40]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=4), inner,
                                                                            max_size=3)), max_leaves=8)
probabilities = st.one_of(st.floats(0, 1), st.sampled_from([-0.5, 1.5, math.nan, math.inf]))


@st.composite
def calibrations(draw: st.DrawFn) -> Any:
    """A calibration ``{"positions": [{"x": [...], "y": [...]}]}``: mostly valid knots, else knots and
    keys broken in the ways a hand-edited file breaks them."""
    positions = []
    for _ in range(draw(st.integers(0, 3))):
        xs = sorted(draw(st.lists(st.floats(0, 1), min_size=1, max_size=5, unique=True)))
        ys = sorted(draw(st.lists(st.floats(0, 1), min_size=len(xs), max_size=len(xs))))
        entry: dict[str, Any] = {"x": xs, "y": ys}
        broken = draw(sometimes(st.sampled_from(["x", "y", "z"]), None))
        if broken is not None:
            entry[broken] = draw(st.one_of(json_values, st.lists(probabilities, max_size=4)))
        positions.append(entry)
    document: Any = {"positions": positions}
    return draw(sometimes(st.one_of(json_values, st.just({**document, "extra": 1})), document))


@st.composite
def policy_files(draw: st.DrawFn) -> str:
    """A policy file's text: a saved policy of any kind, mostly valid, else with parameters, version,
    kind, a key or the whole document replaced, or its text cut short."""
    kind = draw(st.sampled_from(KINDS))
    document: Any = policy_to_dict(make_policy(kind))
    names = st.lists(st.sampled_from(sorted(document["params"]) or ["x"]), max_size=2)
    for name in draw(sometimes(names, [])):
        document["params"][name] = draw(json_values)
    if getattr(POLICY_KINDS[kind], "reads_confidences", False) and draw(st.booleans()):
        document["calibration"] = draw(calibrations())
    mutation = draw(sometimes(st.integers(1, 5), 0))
    if mutation == 1:
        document["version"] = draw(json_values)
    elif mutation == 2:
        document["kind"] = draw(st.one_of(json_values, st.sampled_from(KINDS)))
    elif mutation == 3:
        document.pop(draw(st.sampled_from(sorted(document))))
    elif mutation == 4:
        document = draw(json_values)
    text = json.dumps(document)
    return text[:draw(st.integers(0, len(text)))] if mutation == 5 else text


def _paths(node: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, (*path, key))


PROFILE_PATHS = [path for path in _paths(PAPER) if path]


@st.composite
def profile_files(draw: st.DrawFn) -> str:
    """The paper profile with up to three fields replaced by arbitrary JSON or removed."""
    document = copy.deepcopy(PAPER)
    for path in draw(st.lists(st.sampled_from(PROFILE_PATHS), max_size=3)):
        parent = _node(document, path[:-1])
        if isinstance(parent, dict) and draw(st.integers(0, 3)) == 0:
            parent.pop(path[-1], None)
        elif isinstance(parent, dict) or _has(parent, path[-1]):
            parent[path[-1]] = draw(json_values)
    return json.dumps(document)


def _node(document: Any, path: tuple) -> Any:
    """The node at ``path`` in ``document``, None where an earlier change removed or replaced it."""
    for key in path:
        if not _has(document, key):
            return None
        document = document[key]
    return document


def _has(node: Any, key: str | int) -> bool:
    """Whether ``node`` is a JSON object or array that holds ``key``."""
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and key < len(node)


# ----------------------------------------------------------------------------- properties

@BUDGET
@given(st.data())
def test_lp_options(data: st.DataObject) -> None:
    argv = ["lp", *options(data.draw, {
        "--vocab": values("2", "3"), "--length": values("1", "2"), "--drafts": values("1", "2"),
        "--instances": values("1", "2"), "--seed": values("0", "7", str(2**32 - 1)),
        "--step-p": values("0.5,0.5", "1,0", "0.2,0.3,0.5"), "--step-q": values("0.5,0.5", "0.9,0.1"),
        "--drafter": values("indep", "mix")}, required=("--vocab", "--length"))]
    if data.draw(st.booleans()):
        argv.append("--json")
    with folder() as where:
        holds_contract(argv, where)


@BUDGET
@given(st.data())
def test_simulate_options_and_files(data: st.DataObject) -> None:
    with folder() as where:
        files = {"policy.json": data.draw(policy_files()), "profile.json": data.draw(profile_files()),
                 "traces.parquet": data.draw(st.sampled_from(["", "PAR1", "not parquet"]))}
        for name, text in files.items():
            (where / name).write_text(text)
        argv = ["simulate", "--no-probe", *options(data.draw, {
            "--queries": values("1", "2", "3"), "--seed": values("0", "5"),
            "--profile": values(str(where / "profile.json"), str(PAPER_PROFILE)),
            "--policy": values(str(where / "policy.json")),
            "--traces": sometimes(st.sampled_from([str(where / "traces.parquet"), str(where)]),
                                  str(REPO / "data" / "traces" / "default.parquet"))},
            required=("--queries",))]
        if data.draw(st.booleans()):
            argv.append("--json")
        holds_contract(argv, where)


@BUDGET
@given(policy=policy_files(), calibration=calibrations())
def test_policy_and_calibration_files(policy: str, calibration: Any) -> None:
    """Every policy kind's file, and a calibration carried by the length policies that read one."""
    with folder() as where:
        (where / "policy.json").write_text(policy)
        carried = {**policy_to_dict(make_policy("threshold")), "calibration": calibration}
        (where / "calibrated.json").write_text(json.dumps(carried))
        holds_contract(["simulate", "--no-probe", "--profile", str(PAPER_PROFILE), "--queries", "2", "--json",
                        "--policy", str(where / "policy.json"), "--policy", str(where / "calibrated.json")],
                       where)


@BUDGET
@given(profile=profile_files())
def test_profile_files(profile: str) -> None:
    with folder() as where:
        (where / "profile.json").write_text(profile)
        holds_contract(["simulate", "--no-probe", "--profile", str(where / "profile.json"), "--queries", "2",
                        "--json"], where)


@settings(BUDGET, max_examples=6)
@given(st.data())
def test_generate_options(data: st.DataObject) -> None:
    """A few one-token generations with the shipped model (each loads it: about a second)."""
    argv = ["generate", "--drafter", data.draw(st.sampled_from(["none", "ngram"])), "--max-new-tokens",
            data.draw(values("1")), "--json", *options(data.draw, {
                "--temperature": values("0", "1", "1e-4", "1e30"), "--top-k": values("0", "5"),
                "--top-p": values("1", "0.5"), "--seed": values("0", str(2**32 - 1)),
                "--device": values("cpu"), "--prompt": values("def f(x):", "\u00e9t\u00e9")},
                required=("--prompt",))]
    with folder() as where:
        holds_contract(argv, where)


BAD = {  # per command, options each of which it must refuse before doing any work
    "profile": {"--threads": "0", "--repeats": "0", "--seed": "-1", "--device": "bogus",
                "--model": "/nonexistent", "--dtype": "half"},
    "trace": {"--threads": "0", "--prompts": "0", "--max-new-tokens": "0", "--temperature": "nan",
              "--seed": str(2**70), "--drafter": "bogus", "--domains": ",", "--device": "cuda:99"},
    "bench": {"--threads": "0", "--max-new-tokens": "0", "--tag": "a b", "--drafters": "bogus",
              "--temperatures": "inf", "--seed": "-1", "--device": "bogus"},
    "shapes": {"--threads": "0", "--rounds": "0", "--prompts": "0", "--seed": str(2**32),
               "--model": "/nonexistent"},
    "serve-bench": {"--rates": "0,-1", "--rounds": "1", "--requests": "0", "--max-batch": "0",
                    "--tokens": "1", "--policy": "/nonexistent.json", "--profile": "/nonexistent.json",
                    "--threads": "0", "--seed": "-1"},
}
OUT = {"profile": "profile.json", "trace": "traces.parquet", "bench": ".", "shapes": ".", "serve-bench": "."}


@BUDGET
@given(st.data())
def test_commands_that_write_leave_nothing_on_bad_input(data: st.DataObject) -> None:
    command = data.draw(st.sampled_from(sorted(BAD)))
    bad = data.draw(st.lists(st.sampled_from(sorted(BAD[command])), min_size=1, unique=True))
    with folder() as where:
        argv = [command, "--out", str(where / OUT[command])]
        argv += [token for name in bad for token in (name, BAD[command][name])]
        assert holds_contract(argv, where) == 2
