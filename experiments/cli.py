"""The `specblock` command: one group, one module per subcommand, loaded only when it runs.

Exit codes (the contract in docs/design.md): 0 success; 2 bad input, with one line on stderr naming the
problem and the fix; 1 a failure while running.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import click

from core import models
from core.errors import InputError
from core.models import DEFAULT_MODEL, TOY, ModelSpec, folder_spec, model_names, resolve_model
from core.names import DOMAINS, draft_options, registry
from experiments.folders import check_writable

# name -> module under experiments.commands that defines a click command called `command`.
COMMANDS = {
    "pipeline": "pipeline",
    "lp": "lp",
    "models": "models",
    "generate": "generate",
    "bench": "bench",
    "train": "train",
    "responses": "responses",
    "profile": "profile",
    "trace": "trace",
    "simulate": "simulate",
    "tune": "tune",
    "shapes": "shapes",
    "results": "results",
    "adapt-live": "adapt_live",
    "fidelity": "fidelity",
    "serve-bench": "serve_bench",
    "study": "study",
    "gpu-check": "gpu_check",
    "benchmark": "benchmark",
}


MAX_SEED = 2**32 - 1  # seeds numpy, gymnasium and torch all take (torch's and numpy's own are wider)
SEED = click.IntRange(0, MAX_SEED)  # the type of every --seed option


def model_result(base: str, model: str) -> str:
    """The results file a command writes for ``model`` when not given a name: ``base`` for the shipped toy
    family, ``<base>_<model>`` for any other (``bench_smollm2-135m``), so a model's runs sit beside the
    toy's instead of replacing them."""
    return base if model == TOY.name else f"{base}_{model}"


def csv_names(value: str, flag: str, allowed: Sequence[str] | None = None, hint: str = "") -> tuple[str, ...]:
    """The distinct names of a comma-separated option value, in order; InputError when it is empty or names
    one outside ``allowed`` (when given; ``hint`` follows the choices)."""
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    if not names:
        raise InputError(f"{flag} is empty: give a comma-separated list")
    for name in names:
        if allowed is not None and name not in allowed:
            raise InputError(f"{flag}: unknown {name!r}: use some of {', '.join(allowed)}{hint}")
    return names


class OutFolder(click.Path):
    """``--out DIR``: the folder a command writes its files into, the same in every command. A missing
    folder is no error: the command creates it, with its parents, when it writes (``core.files`` writers
    create them; a command that writes otherwise creates it first), so bad input never leaves an empty
    folder behind. Refused before any work (exit 2, ``experiments.folders.check_writable``): a file
    where the folder should be, a path under a file, a place this user cannot write in."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        check_writable(Path(value), param.opts[0] if param is not None and param.opts else "--out")
        return Path(super().convert(value, param, ctx))


OUT_FOLDER = OutFolder()  # the type of every --out that names a folder


class LiveChoice(click.Choice):
    """A choice among the names ``names()`` gives each time it is read (a registry's, such as the drafters
    of ``core.names``), so a name registered after the command's import is offered too."""

    def __init__(self, names: Callable[[], Sequence[str]]) -> None:
        self.names = names
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        """The names as they are now."""
        return tuple(self.names())

    @choices.setter
    def choices(self, _: Sequence[str]) -> None:
        """Ignored: click.Choice sets its choices once; these are read live."""


def drafter_params(exclude: Sequence[str] = ()) -> list[click.Option]:
    """One option per registered drafter option (``core.names.draft_options``), named by its flag, passing
    its builder keyword, its help naming the drafters that take it; a count (>= 1) or a probability."""
    out = []
    for option in draft_options.values():
        if option.name in exclude:
            continue
        takers = ", ".join(name for name, spec in registry.items() if option.name in spec.options)
        kind = click.FloatRange(0, 1) if option.probability else int
        out.append(click.Option([option.flag, option.name], type=kind, default=None,
                                show_default=option.default or None, help=f"{option.help} ({takers})"))
    return out


class DrafterCommand(click.Command):
    """A command that takes every registered drafter option (``drafter_params``), read from the registry
    each time it parses or prints help, so a drafter registered after the command's import brings its
    options. The callback receives them as keywords, None where not given."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        """Its own parameters, then the drafter options, then --help."""
        params = super().get_params(ctx)
        own = {p.name for p in self.params}
        extra = drafter_params(exclude=tuple(own))
        if params and params[-1].name == "help":
            return [*params[:-1], *extra, params[-1]]
        return [*params, *extra]


class ModelType(click.ParamType):
    """``--model NAME|DIR``: a registered or converted model's name, or a checkpoint folder, as a
    ``core.models.ModelSpec`` (``resolve_model``). A name or path that is neither is bad input naming the
    choices; an existing folder without ``config.json`` becomes its spec, which the command refuses with
    its own fix when it needs the target (``ModelSpec.require``)."""

    name = "NAME|DIR"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> ModelSpec:
        if isinstance(value, ModelSpec):
            return value
        try:
            return resolve_model(value)
        except InputError:
            folder = Path(str(value)).expanduser()
            if str(value) and folder.is_dir():
                return folder_spec(folder)
            raise


MODEL = ModelType()


def model_option(help: str = "The model: its target, drafters, prompt sets and profiles.",
                 default: str = DEFAULT_MODEL) -> Callable[..., Any]:
    """The ``--model NAME|DIR`` option every command that loads a model takes (its value: a ``ModelSpec``,
    given to the command as ``model``; ``default`` names the model it means when not given)."""
    return click.option("--model", "model", type=MODEL, default=default, show_default=True,
                        help=f"{help} A name ({', '.join(model_names())}; `specblock models list`) or a "
                             "checkpoint folder (config.json + safetensors; its drafters in DIR/drafters).")


def model_arg(model: ModelSpec) -> str:
    """How ``--model`` names ``model`` in a fix: its name, or its folder when it is a checkpoint folder."""
    named = (models.registry.get(model.name) == model
             or models.imported_spec(models.models_home() / model.name) == model)
    return model.name if named else str(model.target)


def drafter_folder(model: ModelSpec, kind: str, given: Path | None = None) -> Path:
    """``given``, else the folder of drafter ``kind`` trained for ``model`` (``ModelSpec.drafter_folder``);
    InputError naming ``specblock train <kind> --model <model>`` when the model's own holds none (a
    trained drafter's config and weights, the draft model's config)."""
    if given is not None:
        return given
    from real_engine.drafters.trained import trained_available  # the engine's: this module imports core only

    folder = model.drafter_folder(kind)
    ok = (folder / "config.json").is_file() if registry[kind].needs_draft_model else trained_available(folder)
    if not ok:
        raise InputError(f"model {model.name!r} has no {kind} drafter in {folder}: train one with "
                         f"`specblock train {kind} --model {model_arg(model)}`")
    return folder


def model_prompts(model: ModelSpec, domains: Sequence[str] | None = None) -> Path:
    """The folder of ``model``'s prompt sets (``ModelSpec.prompts``) where it holds any (and every one of
    ``domains``, when given), else the shipped ones (``data/prompts``: text, the same for every model), as
    for a checkpoint folder before `specblock models fetch` brought the real workloads' prompt sets, or
    asked for the shipped family's domains."""
    own = model.prompts
    present = {p.stem for p in own.glob("*.jsonl")} if own.is_dir() else set()
    return own if present and set(domains or ()) <= present else TOY.prompts


def model_domains(model: ModelSpec, wanted: Sequence[str] = DOMAINS) -> tuple[str, ...]:
    """``wanted`` (the shipped family's domains) where ``model``'s prompt sets have them all, else every
    domain they have (``wanted`` when they have none: the prompt loader then names the fix)."""
    folder = model_prompts(model)
    present = sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []
    return tuple(wanted) if not present or set(wanted) <= set(present) else tuple(present)


def model_profile(model: ModelSpec, given: Path | None = None) -> Path:
    """``given``, else ``model``'s cost profile; InputError naming `specblock profile --model` otherwise (the
    model named as ``--model`` takes it)."""
    if given is not None:
        return given
    if model.profile is None or not model.profile.is_file():
        raise InputError(f"model {model.name!r} has no measured cost profile: measure one with "
                         f"`specblock profile --model {model_arg(model)} --out FILE` and pass --profile FILE")
    return model.profile


def resolve_device(device: str | None) -> str:
    """The torch device a --device option names (None: cuda when available, else cpu); InputError for a
    name torch does not know, or a device this machine or torch build lacks."""
    import torch  # only when a command resolves its device, never for --help

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r} is not a torch device: give cpu, or cuda (cuda:N) on a "
                         "machine with CUDA") from None
    if chosen.type == "cpu":
        return device
    backend = getattr(torch, chosen.type, None)
    available = getattr(backend, "is_available", lambda: False)()
    count = getattr(backend, "device_count", lambda: 1)() if available else 0
    if (chosen.index or 0) >= count:
        raise InputError(f"--device {device}: this machine and torch {torch.__version__} have "
                         f"{count} {chosen.type} device(s): give --device cpu"
                         f"{f' or {chosen.type}:0 to {chosen.type}:{count - 1}' if count else ''}")
    return device


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use, so `--help` never imports torch:
    ``commands_by_name`` maps each name to a module of ``package`` that defines a click command `command`."""

    commands_by_name: ClassVar[dict[str, str]] = COMMANDS
    package = "experiments.commands"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in self.commands_by_name if importlib.util.find_spec(self._module(name))]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands_by_name or importlib.util.find_spec(self._module(name)) is None:
            return None
        return importlib.import_module(self._module(name)).command

    def _module(self, name: str) -> str:
        return f"{self.package}.{self.commands_by_name[name]}"


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specblock")
def app() -> None:
    """specblock: speculative decoding research, from a live engine to tuned policies."""


def fail(message: str, code: int) -> None:
    """Print one line on stderr and exit."""
    click.echo(f"specblock: error: {' '.join(message.split())}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the group, mapping bad input to exit 2 and failures to exit 1."""
    try:
        app.main(args=argv, prog_name="specblock", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        fail("aborted", 1)
    except click.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        fail(f"{exc.format_message()}{hint}", 2)
    except InputError as exc:
        fail(str(exc), 2)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 1)


if __name__ == "__main__":
    main()
