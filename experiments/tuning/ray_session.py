"""Ray for the studies: a private local Ray (``address="local"``, never a cluster an earlier ``ray start``
left recorded), or a cluster at a checked ``--address``, joined within ``CONNECT_SECONDS`` or refused
with the fix.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from core.errors import InputError
from core.files import read_text

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1"), ("RAY_AIR_NEW_OUTPUT", "0")):
    os.environ.setdefault(_name, _value)  # read when ray is imported, so set before any import of it

CONNECT_SECONDS = 20
"""Longest wait for a trial ``ray.init`` to join the cluster at ``--address`` (with the probe's two
steps, at most 30 s before a bad address is refused)."""
PROBE_SECONDS = 5
"""Longest wait for each step of the probe of ``--address`` before Ray is started: a TCP connection, then
the gRPC server's first frame."""
ADDRESS_FIX = ("start a cluster with `ray start --head` and pass the address it prints, "
               "or drop --address for a private local Ray")
_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                      r":(?P<port>[0-9]{1,5})")

def check_address(address: str | None) -> str | None:
    """The Ray address to join, checked: ``host:port`` or ``ray://host:port`` where a gRPC server (a Ray
    GCS or Ray Client server) answers and a trial join succeeds, ``auto`` resolved to the cluster ``ray
    start`` recorded; None (no address) for a private local Ray. InputError, naming the fix, within 30 s."""
    if address is None:
        return None
    text = _recorded_address() if address.strip() == "auto" else address.strip()
    match = _ADDRESS.fullmatch(text)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise InputError(f"--address {text!r} is not host:port, ray://host:port or auto: {ADDRESS_FIX}")
    try:
        grpc = _speaks_grpc(match["host"].strip("[]"), int(match["port"]))
    except OSError as err:
        raise InputError(f"no Ray cluster answers at --address {text} ({err.strerror or err}): "
                         f"{ADDRESS_FIX}") from None
    if not grpc:
        raise InputError(f"the server at --address {text} is not a Ray cluster (it does not speak gRPC): "
                         f"{ADDRESS_FIX}")
    _trial_join(text)
    return text


def _speaks_grpc(host: str, port: int) -> bool:
    """Whether the server at ``host:port`` answers an HTTP/2 client preface with a SETTINGS frame, as every
    gRPC server does (True, unchecked, under Ray's TLS); OSError when none accepts a connection."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # an empty SETTINGS
    with socket.create_connection((host, port), PROBE_SECONDS) as sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return True
        sock.settimeout(PROBE_SECONDS)
        try:
            sock.sendall(preface)
            head = b""
            while len(head) < 9 and (chunk := sock.recv(9 - len(head))):
                head += chunk
        except OSError:  # a silent or resetting server is no gRPC server
            return False
    return len(head) == 9 and head[3] == 4  # the frame type of the server's first frame: SETTINGS


def _recorded_address() -> str:
    """The cluster ``auto`` means, found as Ray finds it (``RAY_ADDRESS``, else the address file of the
    last ``ray start`` under ``RAY_TMPDIR``), but never a private Ray some other command runs."""
    if os.environ.get("RAY_ADDRESS", "").strip() not in ("", "auto"):
        return os.environ["RAY_ADDRESS"].strip()
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    path = Path(tmp) / "ray" / "ray_current_cluster"
    try:
        recorded = read_text(path, 4096, "Ray address file", ADDRESS_FIX).strip()  # one host:port line
    except InputError:
        recorded = ""
    if not recorded:
        raise InputError(f"--address auto finds no running Ray cluster (none recorded in {path}, "
                         f"RAY_ADDRESS unset): {ADDRESS_FIX}")
    return recorded


def start_ray(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (one ``check_address`` returned) or start a
    private, quiet local Ray on 2 CPUs (``address="local"``: never a cluster an earlier ``ray start`` left
    recorded); False when Ray was already up."""
    import ray  # heavy: only to start a session (check_address needs none)

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    return True


_TRIAL_JOIN = "import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); ray.shutdown()"


def _trial_join(address: str) -> None:
    """Join the cluster at ``address`` in a child process given ``CONNECT_SECONDS`` (Ray's own client waits
    about 40 s, deaf to signals, for a GCS that never answers, and a shortened Ray timeout kills the
    process); InputError with the fix when that fails."""
    try:
        trial = subprocess.run([sys.executable, "-c", _TRIAL_JOIN, address], capture_output=True, text=True,
                               timeout=CONNECT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"cannot join the Ray cluster at --address {address} (no answer within "
                         f"{CONNECT_SECONDS} s): {ADDRESS_FIX}") from None
    if trial.returncode != 0:
        lines = [line for line in trial.stderr.strip().splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else f"exit code {trial.returncode}"
        raise InputError(f"cannot join the Ray cluster at --address {address} ({detail}): {ADDRESS_FIX}")
