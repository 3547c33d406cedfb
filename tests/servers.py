"""Real processes for tests: the service under uvicorn and a redis-server, on loopback only."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from bench import servers
from bench.servers import RedisClusterNodes, free_port

ROOT = Path(__file__).resolve().parents[1]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, every: float = 0.02) -> None:
    """Poll `predicate` until it is true; AssertionError after `timeout` seconds (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout:g} s: {getattr(predicate, '__name__', predicate)}")
        time.sleep(every)


async def wait_until_async(predicate: Callable[[], bool], timeout: float = 10.0, every: float = 0.02) -> None:
    """wait_until for a test running on an event loop: the loop keeps running while it polls."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout:g} s: {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(every)


NEWER = "20991231T235959Z"  # a version name later than any real one (tests/app/conftest.py's `root`)


def workers_env(state: Path, *, workers: int = 2, admin_key: str = "admin-key") -> dict[str, str]:
    """Settings for `workers` processes of one host with their state (SQLite store, reload files) in `state`."""
    return {
        "SEQSERVE_WORKERS": str(workers),
        "SEQSERVE_ADMIN_API_KEY": admin_key,
        "SEQSERVE_HISTORY_PATH": str(state / "h.sqlite3"),
        "SEQSERVE_STATE_DIR": str(state),
    }


def start_api(
    artifacts: Path, env: Mapping[str, str] | None = None, port: int | None = None, timeout_s: float = 60
) -> tuple[subprocess.Popen[bytes], str]:
    """The service's process (bench.servers.start_api) with the tests' settings: one torch thread each."""
    full = {"SEQSERVE_TORCH_THREADS": "1", "SEQSERVE_DRAIN_S": "20", **(env or {})}
    return servers.start_api(artifacts, full, port=port, timeout_s=timeout_s)


# A crash: SIGKILL to the service and its workers (bench.servers.stop is the polite stop).
stop = servers.kill


def installed(command: str, package: str) -> str:
    """`command`'s executable; outside CI a missing one skips the test, in CI it fails (scripts/test.sh
    installs `package`)."""
    found = shutil.which(command)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{command} is not installed; scripts/test.sh installs it (apt-get install {package})")
        pytest.skip(f"{command} not installed (scripts/test.sh installs it when run as root)")
    return found


def redis_binary() -> str:
    return installed("redis-server", "redis-server")


class RedisServer:
    """A private redis-server with append-only persistence fsynced on every write, as in compose."""

    def __init__(self, data_dir: Path, password: str | None = None) -> None:
        self.binary = redis_binary()
        self.dir = data_dir
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "yes",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):  # up (and asking for the password)
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no shutdown save; what survives is what the append-only file holds."""
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def redis_cluster_nodes(data_dir: Path, **kwargs: int) -> RedisClusterNodes:
    """A Redis Cluster on loopback (bench.servers.RedisClusterNodes), skipped where redis-server is not."""
    binary = redis_binary()
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli not installed (it comes with redis-server)")
    return RedisClusterNodes(data_dir, binary=binary, cli=cli, **kwargs)
