"""Ray for the studies: a private local Ray (``address="local"``, never a cluster an earlier ``ray start``
left recorded), or a cluster at a checked ``--address``, joined within ``CONNECT_SECONDS`` or refused
with the fix.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from policies.errors import InputError

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1"), ("RAY_AIR_NEW_OUTPUT", "0")):
    os.environ.setdefault(_name, _value)  # read when ray is imported, so set before any import of it

CONNECT_SECONDS = 30
"""Longest wait for ``ray.init`` to join the cluster at ``--address`` (Ray notices the alarm when its
current call to the GCS returns)."""
PROBE_SECONDS = 10
"""Longest wait for each step of the probe of ``--address`` before Ray is started: a TCP connection, then
the gRPC server's first frame."""
ADDRESS_FIX = ("start a cluster with `ray start --head` and pass the address it prints, "
               "or drop --address for a private local Ray")
_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                      r":(?P<port>[0-9]{1,5})")

def check_address(address: str | None) -> str | None:
    """The Ray address to join, checked: ``host:port`` or ``ray://host:port`` where a gRPC server (a Ray
    GCS or Ray Client server) answers, ``auto`` resolved to the cluster ``ray start`` recorded; None (no
    address) for a private local Ray. InputError, naming the fix, within ``PROBE_SECONDS`` or so."""
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
        recorded = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        recorded = ""
    if not recorded:
        raise InputError(f"--address auto finds no running Ray cluster (none recorded in {path}, "
                         f"RAY_ADDRESS unset): {ADDRESS_FIX}")
    return recorded


def start_ray(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``check_address``; at most ``CONNECT_SECONDS``) or start a
    private, quiet local Ray on 2 CPUs (``address="local"``: never a cluster an earlier ``ray start`` left
    recorded); False when Ray was already up."""
    import ray

    if ray.is_initialized():
        return False
    address = check_address(address)
    if address:
        _join(address)
    else:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    return True


class _Expired(BaseException):
    """The connection alarm: a BaseException, so Ray's retry loops (``except Exception``) let it through."""


def _join(address: str) -> None:
    """``ray.init`` on a cluster, given up after ``CONNECT_SECONDS`` (an alarm, in the main thread)."""
    import ray

    def expire(signum: int, frame: Any) -> None:
        raise _Expired(f"no answer within {CONNECT_SECONDS} s")

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, expire) if main else None
    if main:
        signal.setitimer(signal.ITIMER_REAL, CONNECT_SECONDS)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (_Expired, ConnectionError, RuntimeError, ValueError) as err:
        ray.shutdown()
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"cannot join the Ray cluster at --address {address} ({detail}): "
                         f"{ADDRESS_FIX}") from None
    finally:
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
