"""How the worker processes of one host agree, through a shared folder, framework-free.

`POST /admin/reload` reaches one worker. That worker bumps a generation number in `generation`
(under an exclusive lock), reloads itself, and waits until every live worker has reported that
generation; each worker polls the number (one small read a second) and reloads when it grows.
Each worker's report is `<pid>.json`: the generation it has reached and the versions it serves.
Reports of processes that are gone are removed, so a worker that died is not waited for.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.loaded import LoadedModels


@dataclass(frozen=True)
class WorkerReport:
    pid: int
    generation: int
    versions: dict[str, str]  # model name -> version served


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class WorkerSync:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._generation = folder / "generation"
        self.pid = os.getpid()

    def generation(self) -> int:
        try:
            return int(self._generation.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def bump(self) -> int:
        """The next generation, written atomically; concurrent bumps (several workers) each get their own."""
        with (self.folder / "generation.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = self.generation() + 1
            _write_atomic(self._generation, str(n))
            return n

    def report(self, generation: int, versions: dict[str, str]) -> None:
        _write_atomic(
            self.folder / f"{self.pid}.json",
            json.dumps({"generation": generation, "versions": versions, "at": time.time()}),
        )

    def withdraw(self) -> None:
        (self.folder / f"{self.pid}.json").unlink(missing_ok=True)

    def reports(self) -> dict[int, WorkerReport]:
        """Every live worker's report; those of processes that are gone are removed."""
        out = {}
        for path in self.folder.glob("*.json"):
            if not path.stem.isdigit():
                continue
            pid = int(path.stem)
            if not alive(pid):
                path.unlink(missing_ok=True)
                continue
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced right now: read at the next poll
            out[pid] = WorkerReport(pid, int(raw["generation"]), dict(raw["versions"]))
        return out

    async def wait_for(self, generation: int, timeout_s: float) -> tuple[bool, dict[int, WorkerReport]]:
        """(whether every live worker reached `generation` within the timeout, their reports)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = await asyncio.to_thread(self.reports)
            if all(r.generation >= generation for r in found.values()) or time.monotonic() >= deadline:
                return all(r.generation >= generation for r in found.values()), found
            await asyncio.sleep(0.1)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Coordinator:
    """One worker's side of reloads: follow the generation others bump, or bump it and wait for all."""

    def __init__(self, loaded: LoadedModels, sync: WorkerSync, root: Path) -> None:
        self.loaded, self.sync, self.root = loaded, sync, root
        self.seen = sync.generation()

    def announce(self) -> None:
        self.sync.report(self.seen, self.loaded.versions())

    async def follow(self) -> bool:
        """Reload when another worker has bumped the generation since this one last looked (-> True)."""
        generation = await asyncio.to_thread(self.sync.generation)
        if generation <= self.seen:
            return False
        self.seen = generation
        await self.loaded.reload(self.root)
        self.announce()
        return True

    async def reload_everywhere(self, wait_s: float) -> tuple[dict[str, dict[str, str]], bool, dict[int, WorkerReport]]:
        """Reload this worker and make every other one follow: (this worker's report, whether all
        workers reached the new generation within `wait_s`, each worker's report)."""
        self.seen = generation = await asyncio.to_thread(self.sync.bump)  # the others start now
        report = await self.loaded.reload(self.root)
        self.announce()
        complete, workers = await self.sync.wait_for(generation, wait_s)
        return report, complete, workers
