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
    DTYPES,
    VANILLA,
    VERIFIERS,
    DrafterSpec,
    drafter_choices,
    drafter_spec,
    registry,
    trained_drafters,
)
from experiments.cli import SEED, LiveChoice, drafter_folder, model_option, model_profile, resolve_device
from real_engine.drafters.trained import deployed_shape

# make_drafter's options and the flags that set them, in the order --help lists them
FLAGS = {"depth": "--draft-length", "width": "--tree-width", "budget": "--tree-budget", "paths": "--paths",
         "min_confidence": "--min-confidence", "vocab": "--draft-vocab", "staged": "--staged",
         "lookup": "--lookup", "blocks": "--blocks", "max_ngram": "--ngram-max"}


def _uses(spec: DrafterSpec | None) -> tuple[str, ...]:
    """The draft flags the drafter reads (None: vanilla decoding reads none)."""
    if spec is None:
        return ()
    return (*(("--drafter-model",) if spec.trained else ()),
            *(flag for option, flag in FLAGS.items() if option in spec.options))


def _either(names: tuple[str, ...]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else "none"


def _which(keep: Callable[[DrafterSpec], bool]) -> tuple[str, ...]:
    """The registered drafters whose spec ``keep`` holds for (for --help)."""
    return tuple(name for name, spec in registry.items() if keep(spec))


def _taking(option: str) -> str:
    """The registered drafters taking ``option`` (for --help)."""
    return ", ".join(_which(lambda spec: option in spec.options))


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


def _check_verifier(verifier: str, spec: DrafterSpec | None, tree_width: int | None) -> None:
    """gbv needs i.i.d. sampled paths (only a drafter taking paths samples them); gbv and seqbv need
    unmerged paths of equal length; the trained drafters' deterministic top-k trees are verified by rrs
    (or greedy); their sampled chains (tree width 1, where they take a width) by any single-draft
    verifier. ``tree_width`` is set only for a drafter that takes one."""
    if spec is None:
        return
    chain = tree_width == 1
    if spec.trained and verifier not in ("greedy", "rrs", *(("token", "block") if chain else ())):
        chain_hint = ", or --tree-width 1 (a sampled chain) for token, block" * ("width" in spec.options)
        raise InputError(f"the {spec.name} drafter drafts a deterministic top-k tree: use --verifier rrs "
                         f"(or greedy at temperature 0){chain_hint}")
    if verifier == "gbv" and ("paths" not in spec.options or (tree_width or 1) > 1):
        raise InputError("gbv verifies i.i.d. sampled paths: use --drafter draft-model with --tree-width 1 "
                         "(and --paths K), or another verifier")
    if verifier == "seqbv" and (tree_width or 1) > 1:
        raise InputError("seqbv verifies unmerged paths, not a top-k tree: use --paths K instead of "
                         "--tree-width, or --verifier rrs")


def _check_options(drafter: str, spec: DrafterSpec | None, given: dict[str, Any]) -> None:
    """Refuse a drafter option the chosen drafter would not use (rather than ignore it)."""
    uses = _uses(spec)
    unused = [flag for flag, value in given.items() if value is not None and flag not in uses]
    if unused:
        takes = ", ".join(uses) or "no draft options"
        raise InputError(f"{unused[0]} does not apply to --drafter {drafter} (it takes {takes}): drop it")


def _auto_verifier(temperature: float, spec: DrafterSpec | None, tree_width: int | None, paths: int) -> str:
    """Greedy at T = 0; else SeqBV for paths, RRS for a top-k tree (tree width > 1, or None for a trained
    drafter: its trained tree), block verification for a chain (n-gram's, the draft model's, a SpecBlock
    or EAGLE chain of tree width 1)."""
    if temperature == 0:
        return "greedy"
    tree = (tree_width or 1) > 1 or (tree_width is None and spec is not None and spec.trained)
    return "seqbv" if paths > 1 else "rrs" if tree else "block"


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


@click.command()
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
@click.option("--verifier", type=click.Choice(VERIFIERS), default=None,
              help="Default: greedy at temperature 0, else block (chain), rrs (tree) or seqbv (paths).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy decoding.")
@click.option("--top-k", type=int, default=0, show_default=True, help="Keep the k likeliest tokens (0: off).")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus mass to keep (1: off).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds every random draw.")
@click.option("--draft-length", type=int, default=None, show_default="4; trained: as trained",
              help=f"Draft depth: tokens per chain or path, levels of a tree ({_taking('depth')}).")
@click.option("--tree-width", type=int, default=None, show_default="1; EAGLE: as trained",
              help="Draft model: >1 drafts a top-k tree this wide per level; EAGLE: its top-k; SpecBlock: "
                   "children per node at most (1: a chain).")
@click.option("--tree-budget", type=int, default=None, show_default="16; trained: as trained",
              help=f"Most draft nodes kept (the likeliest): {_taking('budget')}.")
@click.option("--min-confidence", type=click.FloatRange(0, 1), default=None, show_default="0",
              help="Draft model's chain: draft a further token only while the draft's top probability is "
                   "at least this (assisted generation's assistant_confidence_threshold).")
@click.option("--draft-vocab", type=int, default=None, show_default="the drafter's own",
              help=f"Draft only this many of the most frequent tokens (draft_vocab.json in the drafter's "
                   f"folder; the vocabulary's size: all): {_taking('vocab')}.")
@click.option("--staged", type=int, default=None, show_default="off",
              help="Draft model's chain: guess ahead by n-gram lookup, running the guesses in the same "
                   "forward, and end the chain at the first wrong guess once this many forwards ran.")
@click.option("--lookup", type=int, default=None, show_default="off",
              help="Draft model's chain: where the context's last this many tokens (1 to 3) occurred "
                   "before, propose the n-gram lookup's chain alone, without running the draft model.")
@click.option("--paths", type=int, default=None, show_default="1",
              help="Draft model: >1 samples this many independent paths (for rrs, gbv, seqbv).")
@click.option("--blocks", type=int, default=None, show_default="2",
              help="SpecBlock: block forwards per draft (M); the tree reaches depth M x block size.")
@click.option("--ngram-max", type=int, default=None, show_default="3",
              help="n-gram drafter: longest n tried.")
@click.option("--policy", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A length policy file (JSON, e.g. from `specblock tune length`): it chooses how much of "
                   "each "
                   "draft the target verifies.")
@click.option("--profile", "profile_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, show_default="the model's own",
              help="The cost profile whose iteration times the policy sees (the one it was tuned on).")
@click.option("--device", default=None, help="torch device (default: cuda if available, else cpu).")
@click.option("--dtype", type=click.Choice(DTYPES), default=None, show_default="the model's own",
              help="The dtype the models load in.")
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--chat", is_flag=True,
              help="Put the prompt through the model's chat template as a user turn (default: verbatim, as "
                   "llama.cpp and vLLM take a prompt).")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Read the prompt from this file instead.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, token ids, stats).")
def command(model: ModelSpec, draft_dir: Path | None, drafter: str, drafter_dir: Path | None,
            verifier: str | None,
            temperature: float, top_k: int, top_p: float, max_new_tokens: int, seed: int,
            draft_length: int | None, tree_width: int | None, tree_budget: int | None,
            min_confidence: float | None, draft_vocab: int | None, staged: int | None, lookup: int | None,
            paths: int | None,
            blocks: int | None,
            ngram_max: int | None,
            policy: Path | None, profile_path: Path | None, device: str | None, dtype: str | None,
            prompt: str | None,
            chat: bool, prompt_file: Path | None, as_json: bool) -> None:
    """Generate text from a prompt, with speculative decoding unless --drafter none.

    Without --json the text streams to stdout and a stats line goes to stderr.
    """
    text = _prompt_text(prompt, prompt_file)
    spec = None if drafter == VANILLA else drafter_spec(drafter)
    length_policy = None if policy is None else _check_policy(policy, drafter, paths)
    given = {"depth": draft_length, "width": tree_width, "budget": tree_budget, "paths": paths,
             "min_confidence": min_confidence, "vocab": draft_vocab, "staged": staged, "lookup": lookup,
             "blocks": blocks, "max_ngram": ngram_max}  # make_drafter's options, in FLAGS order
    _check_options(drafter, spec, {"--drafter-model": drafter_dir, **{FLAGS[k]: v for k, v in given.items()}})
    for flag, value in (("--min-confidence", min_confidence), ("--staged", staged), ("--lookup", lookup)):
        if value and max(tree_width or 1, paths or 1) > 1:
            raise InputError(f"{flag} shapes a chain, not a tree or paths: drop it, or drop --tree-width and "
                             "--paths")
    import torch  # torch and the engine: not for --help

    from real_engine.decode import generate, make_drafter
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
        width = (deployed_shape(drafter, saved) if saved else {}).get("width", None if spec.trained else 1)
    verifier = verifier or _auto_verifier(temperature, spec, width, paths or 1)
    _check_verifier(verifier, spec, width)
    folder = _drafter_folder(model, spec, draft_dir, drafter_dir)  # where its weights or drafting.json lie
    if length_policy is not None:
        profile_path = model_profile(model, profile_path)
    device = resolve_device(device)
    target = load_model(model_dir, getattr(torch, dtype), device)
    draft = None
    if needs_draft:
        draft = load_model(folder, getattr(torch, dtype), device)
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
