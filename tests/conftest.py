"""Shared fixtures: tiny random checkpoints written by ``transformers``' ``save_pretrained``; the
pytest-timeout backstop scaled to the machine.

Session-scoped so ``transformers`` is imported and each checkpoint built once per test run. Every
checkpoint is seeded; the engine loads them with ``real_engine.model.load_model``.

Time limits scale with the machine (``time_limits``): the per-test pytest-timeout backstop (``timeout`` in
pyproject.toml) is scaled here, at collection, by the slowness measured then.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import time_limits
import torch

from real_engine.model import Transformer, load_model

CHARS = string.ascii_letters + string.digits + " .,:;()=+-*/_'\"\n"
EOS = "<|endoftext|>"
# Two busy cores shared with other jobs: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}


def save_char_tokenizer(folder: Path) -> None:
    """A character-level ``tokenizer.json``: EOS is id 0, then one id per character of ``CHARS``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {EOS: 0, **{ch: i + 1 for i, ch in enumerate(CHARS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=" "))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(folder / "tokenizer.json"))


def build_checkpoint(folder: Path, kind: str = "llama", *, seed: int = 0, vocab: int = 96, hidden: int = 64,
                     layers: int = 2, init: float = 0.02, tied: bool = False, noise: float = 0.0,
                     noise_seed: int = 1, tokenizer: bool = False, max_positions: int = 256) -> Path:
    """Save a random Llama (llama3 rope scaling) or Qwen3 model with ``save_pretrained``.

    ``noise`` adds seeded Gaussian noise of that scale to every weight after the seeded init, so two
    calls that differ only in ``noise`` give a model and a perturbed copy of it.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden,
             "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": hidden // 4, "max_position_embeddings": max_positions, "initializer_range": init,
             "tie_word_embeddings": tied, "eos_token_id": 0, "bos_token_id": None}
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape, rope_scaling=LLAMA3_ROPE, rope_theta=10000.0))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**shape, rope_theta=1000000.0))
    if noise:
        generator = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(noise * torch.randn(param.shape, generator=generator))
    model.save_pretrained(folder)
    if tokenizer:
        save_char_tokenizer(folder)
    return folder


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scale the pytest-timeout backstop (the ini ``timeout``) by the machine's slowness, measured here at
    the start of the run (``time_limits.slowness``), for every test without a timeout of its own, unless
    ``--timeout`` was given."""
    if not items or not config.pluginmanager.hasplugin("timeout") or config.getoption("timeout") is not None \
            or not config.getini("timeout"):
        return
    seconds = time_limits.limit(float(config.getini("timeout")))
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))


@pytest.fixture(scope="session")
def build() -> Callable[..., Path]:
    """``build_checkpoint``, for tests that need checkpoints of their own."""
    return build_checkpoint


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama (untied, llama3 rope scaling) with a character tokenizer."""
    return build_checkpoint(tmp_path_factory.mktemp("llama"), "llama", init=0.1, tokenizer=True)


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A perturbed copy of ``llama_dir``'s model: a draft model that is often, not always, right."""
    return build_checkpoint(tmp_path_factory.mktemp("draft"), "llama", init=0.1, noise=0.02)


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen3 (qk-norm, tied embeddings)."""
    return build_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=3, init=0.1, tied=True)


@pytest.fixture(scope="session")
def other_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft model whose vocabulary (80) differs from the target's (96)."""
    return build_checkpoint(tmp_path_factory.mktemp("other_vocab"), "llama", vocab=80)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One quiet local Ray (2 CPUs, no dashboard) shared by every test that runs Ray Tune."""
    import ray

    from experiments.tuning.ray_session import start_ray  # sets Ray's quiet environment before ray starts

    started = start_ray()
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def target(llama_dir: Path) -> Transformer:
    """The tiny Llama target, loaded once per test module."""
    return load_model(llama_dir)


@pytest.fixture(scope="module")
def draft(draft_dir: Path) -> Transformer:
    """The tiny draft model, loaded once per test module."""
    return load_model(draft_dir)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a test module (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """``specblock argv`` run in-process: (exit code, stdout, stderr)."""
    from experiments.cli import main  # the command line loads its commands on first use

    def invoke(argv: list[str]) -> tuple[int, str, str]:
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke


@pytest.fixture
def refused(cli: Callable[[list[str]], tuple[int, str, str]]) -> Callable[[list[str]], str]:
    """``specblock argv`` that must be bad input: exit 2, nothing on stdout, one line on stderr (returned)."""
    def invoke(argv: list[str]) -> str:
        code, out, err = cli(argv)
        assert (code, out) == (2, ""), err
        assert len(err.strip().splitlines()) == 1 and err.startswith("specblock: error:"), err
        return err

    return invoke
