"""The benches' server processes: the service from a checkout, started, paused, stopped, its output read.

Shared by the benches and the tests (tests/servers.py adds the tests' settings to `start_api`); every
server is started in its own process group (so its workers go with it) and logs to a file, never to a
pipe nobody reads. Also a Redis Cluster on loopback, for the cluster
store's tests and bench.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import IO

import httpx2 as httpx

ROOT = Path(__file__).resolve().parent.parent


# Ports handed out for servers lie below Linux's ephemeral range (32768-60999 by default), where the system
# takes the local port of every outgoing connection: a port it picked there could be some client's before
# the server bound it (a test once lost its port to that: EADDRINUSE).
SERVER_PORTS = range(20_000, 32_768)


_PICK = random.SystemRandom()


def free_port() -> int:
    """A loopback port free at the time of asking, outside the range outgoing connections draw from."""
    # Not the module-level random: a training job seeds it (seed_everything), so two test workers that
    # each trained a model drew the same ports in the same order and started servers on each other's.
    for port in _PICK.sample(SERVER_PORTS, 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free loopback port found in 64 tries")


def free_cluster_port() -> int:
    """A free port whose cluster bus port (it + 10000, Redis Cluster's) is free and valid too."""
    for _ in range(64):
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise OSError("no free loopback port pair found in 64 tries")


def uvicorn_process(
    app: list[str], port: int, *, loop: str, http: str, workers: int, root: Path, env: dict[str, str] | None
) -> subprocess.Popen[bytes]:
    """uvicorn serving `app` (its app arguments) from `root`'s .venv, with the bench's common flags."""
    return subprocess.Popen(
        [
            str(root / ".venv/bin/uvicorn"),
            *app,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
            "--loop",
            loop,
            "--http",
            http,
            "--workers",
            str(workers),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_file(),
        start_new_session=True,
    )


def python_of(root: Path) -> str:
    """The interpreter that serves a checkout: its .venv's, else this one (a GPU machine's own Python)."""
    venv = root / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


def start_server(
    artifacts: Path,
    port: int,
    env_extra: dict[str, str],
    *,
    loop: str = "auto",
    http: str = "auto",
    workers: int = 1,
    root: Path = ROOT,
) -> subprocess.Popen[bytes]:
    """The service from the checkout at `root` (its .venv and its code), ready to answer."""
    with socket.socket() as s:  # a server left on the port would answer the readiness check and every request
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} already answers: stop what listens there, or pick another --port")
    # MALLOC_ARENA_MAX as scripts/serve.sh sets it.
    env = {
        **os.environ,
        "SEQSERVE_ARTIFACTS_DIR": str(artifacts),
        "SEQSERVE_BENCH_ENDPOINTS": "true",  # read by checkouts from before bench/serving/noop.py
        "SEQSERVE_LOG_LEVEL": "WARNING",
        "MALLOC_ARENA_MAX": "2",
        **env_extra,
    }
    # The no-op is the benches' own (bench/serving/noop.py mounts it); a checkout from before serves it itself.
    flat = (root / "bench" / "noop.py").exists()  # a checkout from before bench/ had folders
    own_noop = flat or (root / "bench" / "serving" / "noop.py").exists()
    if (root / "app" / "server.py").exists() and loop == http == "auto":
        # The service's own process (its connection limits included), as scripts/serve.sh runs it.
        env.update({"SEQSERVE_HOST": "127.0.0.1", "SEQSERVE_PORT": str(port), "SEQSERVE_WORKERS": str(workers)})
        command = ["-m", "app.server"]
        if own_noop:
            command = [str(root / "bench" / "noop.py")] if flat else ["-m", "bench.serving.noop"]
        proc = subprocess.Popen(
            [python_of(root), *command],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file(),
            start_new_session=True,
        )
    else:  # a checkout from before app/server.py, or a loop/parser ablation
        app = ["app.main:app_from_env"]
        if own_noop:
            app = ["--app-dir", str(root / "bench"), "noop:create"] if flat else ["bench.serving.noop:create"]
        proc = uvicorn_process(["--factory", *app], port, loop=loop, http=http, workers=workers, root=root, env=env)
    return wait_ready(proc, f"http://127.0.0.1:{port}/readyz")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's whole process group (LitServe and uvicorn workers fork), SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGCONT)  # a paused group would hold the SIGTERM until resumed
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def pause(proc: subprocess.Popen[bytes], paused: bool) -> None:
    """SIGSTOP / SIGCONT a server's whole process group: a paused server takes no CPU from the measured one
    (an idle LitServe polls its queue: about 0.15 of a core on the 2-core box)."""
    os.killpg(proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)


_LOGS: list[IO[bytes]] = []
atexit.register(lambda: [log.close() for log in _LOGS])  # read until the end; closed with the process


def log_file() -> IO[bytes]:
    """Where a server's output goes: a file, never a pipe nobody reads (a server logging every request at
    INFO fills a pipe's 64 KB and then blocks on its next log line). The newest is read if it exits."""
    _LOGS.append(tempfile.TemporaryFile())  # noqa: SIM115 - open for the server's life; read if it exits
    return _LOGS[-1]


def last_output(tail: int = 4000) -> str:
    """What the newest started server wrote: its last `tail` characters (0: all of it)."""
    if not _LOGS:
        return ""
    _LOGS[-1].seek(0)
    return _LOGS[-1].read().decode(errors="replace")[-tail:]


def start_api(
    artifacts: Path, env: Mapping[str, str], *, port: int | None = None, timeout_s: float = 120
) -> tuple[subprocess.Popen[bytes], str]:
    """The service's own process (`python -m app.server`, this interpreter, this checkout) on loopback, in a
    process group of its own (its workers with it), once /readyz answers 200; its URL."""
    port = port or free_port()
    full = {
        **os.environ,
        "SEQSERVE_ARTIFACTS_DIR": str(artifacts),
        "SEQSERVE_LOG_LEVEL": "WARNING",
        "SEQSERVE_HOST": "127.0.0.1",
        "SEQSERVE_PORT": str(port),
        **env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.server"],
        cwd=ROOT,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=log_file(),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    return wait_ready(proc, f"{url}/readyz", timeout_s=timeout_s), url


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL, to the whole group where `proc` leads one (the service with its workers): a crash."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    proc.wait(timeout=10)


def wait_ready(proc: subprocess.Popen[bytes], url: str, *, timeout_s: float = 120) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {last_output()}")
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"server did not become ready in {timeout_s:g} s: {last_output()}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RedisClusterNodes:
    """A Redis Cluster on loopback: `primaries` primaries with a replica each, every node its own
    redis-server (`--cluster-enabled`, append-only, fsync always, as in compose), joined by
    `redis-cli --cluster create`. A node killed with -9 is failed over by its replica within about
    `node_timeout_ms` plus an election."""

    def __init__(
        self, data_dir: Path, *, binary: str, cli: str, primaries: int = 3, node_timeout_ms: int = 1000
    ) -> None:
        self.binary, self.cli = binary, cli
        self.dir = data_dir
        self.node_timeout_ms = node_timeout_ms
        self.ports = [free_cluster_port() for _ in range(2 * primaries)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """A start-up node's URL; the client finds every other node from it."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> RedisClusterNodes:
        for port in self.ports:
            self._spawn(port)
        for port in self.ports:
            _until(partial(self._answers, port), 20, f"node {port} answering")
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [self.cli, "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        _until(self.healthy, 30, "cluster_state:ok on every node")
        _until(self.replicated, 30, "a replica online for every primary")
        return self

    def _spawn(self, port: int) -> None:
        d = self.dir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [
                self.binary,
                *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(d)),
                *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                *("--cluster-node-timeout", str(self.node_timeout_ms)),
                *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )

    def restart(self, port: int) -> None:
        """Start a killed node again from its files: it rejoins, as the replica of whoever took its slots."""
        self._spawn(port)
        _until(partial(self._answers, port), 20, f"node {port} answering")

    def _answers(self, port: int) -> bool:
        return self._cli(port, "PING") == "PONG"

    def _cli(self, port: int, *args: str) -> str:
        proc = subprocess.run([self.cli, "-p", str(port), *args], capture_output=True, text=True, timeout=10)
        return proc.stdout.strip()

    def healthy(self) -> bool:
        """Every live node says the cluster is ok (every slot served)."""
        alive = [p for p, proc in self.procs.items() if proc.poll() is None]
        return all("cluster_state:ok" in self._cli(p, "CLUSTER", "INFO") for p in alive)

    def replicated(self) -> bool:
        """Every live primary has a replica online (cluster_state:ok comes before the replicas' first sync)."""
        alive = [p for p, proc in self.procs.items() if proc.poll() is None]
        infos = [self._cli(p, "INFO", "replication") for p in alive]
        primaries = [i for i in infos if "role:master" in i]
        return bool(primaries) and all("state=online" in i for i in primaries)

    def primary_of(self, key: str) -> int | None:
        """The port of the primary serving `key`'s slot now (None while none does: a failover)."""
        slot = self._cli(self.ports[0], "CLUSTER", "KEYSLOT", key)
        for line in self._cli(self.ports[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" in fields[2] and "fail" not in fields[2]:
                for span in fields[8:]:
                    lo, _, hi = span.partition("-")
                    if lo.isdigit() and int(lo) <= int(slot) <= int(hi or lo):
                        return int(fields[1].split(":")[1].split("@")[0])
        return None

    def replica_of(self, port: int) -> int:
        """The port of the replica of the primary on `port`."""
        lines = [line.split() for line in self._cli(self.ports[0], "CLUSTER", "NODES").splitlines()]
        primary = next(f[0] for f in lines if f[1].split("@")[0].endswith(f":{port}"))
        return next(int(f[1].split(":")[1].split("@")[0]) for f in lines if f[3] == primary)

    def pause(self, port: int, paused: bool) -> None:
        """SIGSTOP (or SIGCONT) one node: it holds its connections and answers nothing."""
        self.procs[port].send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def kill(self, port: int) -> None:
        """SIGKILL one node: no shutdown save; what survives is what its append-only file and replica hold."""
        self.procs[port].kill()
        self.procs[port].wait()

    def flush(self) -> None:
        for port, proc in self.procs.items():
            if proc.poll() is None and "role:master" in self._cli(port, "INFO", "replication"):
                self._cli(port, "FLUSHALL")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.05)
