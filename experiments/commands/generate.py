"""`specblock generate`: decode one prompt with the live engine, vanilla or speculative."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from core.errors import InputError
from core.files import MAX_PROMPT_BYTES, read_text
from core.models import ModelSpec
from core.names import (
    RUN_DTYPES,
    VANILLA,
    DrafterSpec,
    draft_options,
    drafter_choices,
    drafter_spec,
    registry,
    trained_drafters,
)
from core.verifiers import check_fit, default_verifier, defaults_help, verifier_names
from experiments.cli import (
    SEED,
    DrafterCommand,
    LiveChoice,
    drafter_folder,
    model_option,
    model_profile,
    resolve_device,
)
from real_engine.drafters.trained import deployed_shape


def _uses(spec: DrafterSpec | None) -> tuple[str, ...]:
    """The draft flags the drafter reads (None: vanilla decoding reads none)."""
    if spec is None:
        return ()
    return (*(("--drafter-model",) if spec.trained else ()),
            *(option.flag for name, option in draft_options.items() if name in spec.options))


def _either(names: tuple[str, ...]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else "none"


def _which(keep: Callable[[DrafterSpec], bool]) -> tuple[str, ...]:
    """The registered drafters whose spec ``keep`` holds for (for --help)."""
    return tuple(name for name, spec in registry.items() if keep(spec))


def _drafter_help() -> str:
    """--drafter's help: what each choice is."""
    kinds = "; ".join(f"{name}: {spec.summary}" for name, spec in registry.items())
    return f"{VANILLA}: vanilla decoding; {kinds}. Trained (--drafter-model): {', '.join(trained_drafters())}"


def _folder(path: Path, flag: str, train: str) -> Path:
    if not (path / "config.json").is_file():
        raise InputError(f"{flag} {path} is not a model folder (no config.json): train one with "
                         f"`specblock train {train}` or pass {flag} DIR")
    return path


def _drafter_folder(model: ModelSpec, spec: DrafterSpec | None, draft_dir: Path | None,
                    drafter_dir: Path | None) -> Path | None:
    """Where the drafter's weights or deployed shape lie: the draft model's folder (--draft-model, else the
    model's own) for a drafter drafting with it, a trained drafter's (--drafter-model, else the one trained
    for the model); None for the others."""
    if spec is not None and spec.needs_draft_model:
        return (drafter_folder(model, spec.name) if draft_dir is None
                else _folder(draft_dir, "--draft-model", "draft-model"))
    if spec is not None and spec.trained:
        return drafter_folder(model, spec.name, drafter_dir)
    return None


def _check_policy(path: Path, drafter: str, paths: int | None) -> Any:
    """The length policy in ``path``; InputError when it cannot steer this generation."""
    from policies import check_role, load_policy  # numpy, torch: not for --help

    policy = check_role(load_policy(path), "length", f"--policy {path}")
    if drafter == VANILLA:
        raise InputError("--policy chooses how much of each draft to verify: give a --drafter")
    if (paths or 1) > 1:
        raise InputError("--policy trims a draft by confidence, which would bias K sampled paths: "
                         "drop --paths or --policy")
    return policy


def _prompt_text(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt: --prompt, else --prompt-file's text (at most ``MAX_PROMPT_BYTES``, read only then);
    InputError when it is not UTF-8 (an argument's undecodable bytes reach Python as surrogates)."""
    if (prompt is None) == (prompt_file is None):
        raise InputError("give exactly one of --prompt TEXT or --prompt-file FILE")
    if prompt is None:
        return read_text(prompt_file, MAX_PROMPT_BYTES, "prompt file", "give --prompt-file a UTF-8 text file")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"--prompt is not UTF-8 text (character {exc.start} is an undecodable byte): give "
                         "UTF-8 text, or --prompt-file FILE") from None
    return prompt


def _check_options(drafter: str, spec: DrafterSpec | None, given: dict[str, Any]) -> None:
    """Refuse a drafter option the chosen drafter would not use (rather than ignore it)."""
    uses = _uses(spec)
    unused = [flag for flag, value in given.items() if value is not None and flag not in uses]
    if unused:
        takes = ", ".join(uses) or "no draft options"
        raise InputError(f"{unused[0]} does not apply to --drafter {drafter} (it takes {takes}): drop it")


def _auto_verifier(temperature: float, spec: DrafterSpec | None, tree_width: int | None, paths: int) -> str:
    """The default verifier (``core.verifiers.default_verifier``) for the draft's shape: paths, a top-k tree
    (tree width > 1, or None for a trained drafter: its trained tree), else a chain (n-gram's, the draft
    model's, a SpecBlock or EAGLE chain of tree width 1)."""
    tree = (tree_width or 1) > 1 or (tree_width is None and spec is not None and spec.trained)
    return default_verifier(temperature, "paths" if paths > 1 else "tree" if tree else "chain")


class _Stream:
    """Prints the decoded text as tokens arrive, holding back an incomplete UTF-8 character."""

    def __init__(self, decode: Any) -> None:
        self.decode, self.ids, self.shown = decode, [], ""

    def __call__(self, new: list[int]) -> None:
        self.ids.extend(new)
        text = self.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            self.show(text)

    def show(self, text: str) -> None:
        """Print what ``text`` adds to the text shown so far."""
        click.echo(text[len(self.shown):] if text.startswith(self.shown) else f"\n{text}", nl=False)
        sys.stdout.flush()
        self.shown = text


@click.command(cls=DrafterCommand)
@model_option()
@click.option("--draft-model", "draft_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own",
              help=f"Draft model folder, for --drafter {_either(_which(lambda s: s.needs_draft_model))}.")
@click.option("--drafter", type=LiveChoice(drafter_choices), default="ngram", show_default=True,
              help=_drafter_help())
@click.option("--drafter-model", "drafter_dir", type=click.Path(path_type=Path), default=None,
              show_default="the model's own",
              help=f"Trained weights folder, for --drafter {_either(trained_drafters())} [default: the one "
                   "trained for --model].")
@click.option("--verifier", type=LiveChoice(verifier_names), default=None,
              help=defaults_help(("chain", "tree", "paths")))
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy decoding.")
@click.option("--top-k", type=int, default=0, show_default=True, help="Keep the k likeliest tokens (0: off).")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus mass to keep (1: off).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds every random draw.")
@click.option("--policy", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A length policy file (JSON, e.g. from `specblock tune length`): it chooses how much of "
                   "each "
                   "draft the target verifies.")
@click.option("--profile", "profile_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, show_default="the model's own",
              help="The cost profile whose iteration times the policy sees (the one it was tuned on).")
@click.option("--device", default=None, help="torch device (default: cuda if available, else cpu).")
@click.option("--dtype", type=click.Choice(RUN_DTYPES), default=None, show_default="the model's own",
              help="The dtype the models load in.")
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--chat", is_flag=True,
              help="Put the prompt through the model's chat template as a user turn (default: verbatim, as "
                   "llama.cpp and vLLM take a prompt).")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Read the prompt from this file instead.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, token ids, stats).")
def command(model: ModelSpec, draft_dir: Path | None, drafter: str, drafter_dir: Path | None,
            verifier: str | None, temperature: float, top_k: int, top_p: float, max_new_tokens: int,
            seed: int, policy: Path | None, profile_path: Path | None, device: str | None, dtype: str | None,
            prompt: str | None, chat: bool, prompt_file: Path | None, as_json: bool,
            **given: float | None) -> None:
    """Generate text from a prompt, with speculative decoding unless --drafter none.

    Without --json the text streams to stdout and a stats line goes to stderr.
    """
    text = _prompt_text(prompt, prompt_file)
    spec = None if drafter == VANILLA else drafter_spec(drafter)
    tree_width, paths = given.get("width"), given.get("paths")  # (the registry's draft options)
    length_policy = None if policy is None else _check_policy(policy, drafter, paths)
    _check_options(drafter, spec, {"--drafter-model": drafter_dir,
                                   **{draft_options[k].flag: v for k, v in given.items()}})
    for name in ("min_confidence", "staged", "lookup"):
        if given.get(name) and max(tree_width or 1, paths or 1) > 1:
            flag = draft_options[name].flag
            raise InputError(f"{flag} shapes a chain, not a tree or paths: drop it, or drop --tree-width and "
                             "--paths")
    from real_engine.decode import generate, make_drafter  # torch and the engine: not for --help
    from real_engine.model import load_model
    from real_engine.tokenizer import Tokenizer
    from real_engine.warp import Sampling

    sampling = Sampling(temperature, top_k, top_p)
    model_dir = model.require().target
    dtype = dtype or model.dtype
    needs_draft = spec is not None and spec.needs_draft_model
    width = tree_width
    if spec is not None and "width" in spec.shape_options and width is None and paths is None:
        saved = _drafter_folder(model, spec, draft_dir, drafter_dir)
        deployed = deployed_shape(drafter, saved, dtype) if saved else {}
        width = deployed.get("width", None if spec.trained else 1)
    verifier = verifier or _auto_verifier(temperature, spec, width, paths or 1)
    check_fit(verifier, spec, width, _which(lambda s: "paths" in s.options))  # those sample i.i.d. paths
    folder = _drafter_folder(model, spec, draft_dir, drafter_dir)  # where its weights or drafting.json lie
    if length_policy is not None:
        profile_path = model_profile(model, profile_path)
    device = resolve_device(device)
    target = load_model(model_dir, dtype, device)
    draft = None
    if needs_draft:
        draft = load_model(folder, dtype, device)
    speculator = make_drafter(drafter, target, draft, folder=folder, **given)
    if length_policy is not None:
        from core.cost_profile import load_profile  # numpy: only with a policy
        from real_engine.speculate import LengthControlled

        speculator = LengthControlled(speculator, length_policy, load_profile(profile_path), drafter)
    tokenizer = Tokenizer.load(model_dir, target.args.vocab_size, target.args.eos_token_id)
    ids = tokenizer.encode_chat(text) if chat else tokenizer.encode(text)
    if not ids:
        raise InputError("the prompt is empty: give some text with --prompt or --prompt-file")
    stream = None if as_json else _Stream(tokenizer.decode)
    result = generate(target, ids, drafter=speculator, verifier=verifier, sampling=sampling,
                      max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, seed=seed, on_tokens=stream)
    stats = result.stats
    if as_json:
        click.echo(json.dumps({
            "text": tokenizer.decode(list(result.tokens)), "token_ids": list(result.tokens),
            "prompt_tokens": len(ids), **stats.to_dict(), "drafter": drafter,
            "verifier": verifier if speculator is not None else None, "temperature": temperature,
            "seed": seed,
            "policy": None if length_policy is None else length_policy.kind,
            "verified_per_iteration": None if length_policy is None else
            [n for _, n in speculator.decisions],
        }))
        return
    stream.show(tokenizer.decode(list(result.tokens)))
    click.echo()
    click.echo(f"{stats.new_tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_second:.1f} tok/s), "
               f"tau {stats.tau:.2f} over {stats.iterations} target forwards; "
               f"draft {stats.draft_seconds:.2f} s, verify {stats.verify_seconds:.2f} s, "
               f"overhead {stats.overhead_seconds:.2f} s", err=True)
