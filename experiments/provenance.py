"""What every result file records: the config, the seed, package versions and the machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from core.files import write_json
from core.paths import REPO, RESULTS

PACKAGES = ("specblock", "torch", "numpy", "scipy", "cvxpy", "clarabel", "gymnasium", "ray", "pandas",
            "transformers")


def cpu_name() -> str:
    """This machine's CPU model (without importing torch)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=REPO)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape results (None where one is absent)."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine() -> dict[str, Any]:
    """The machine a result was measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch  # optional here, and heavy: commands import this module for --help

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def provenance(config: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """The block every result file carries."""
    return {
        "config": config,
        "seed": seed,
        "versions": versions(),
        "machine": machine(),
        "git_commit": _git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def save_result(name: str, results: Any, config: dict[str, Any], seed: int | None,
                directory: Path = RESULTS) -> Path:
    """Write ``{provenance..., "results": results}`` to ``directory/name.json`` atomically."""
    return write_json(directory / f"{name}.json", {**provenance(config, seed), "results": results})
