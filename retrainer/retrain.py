"""One warm retrain of a served model: its serving version's weights continue on its log plus the live
events stored since, the result is published as a new version, and the service reloads.

    python -m retrainer.retrain [NAME] [--from VERSION]   (what scripts/retrain.sh and compose's `retrain` run)

NAME: SEQSERVE_RETRAIN_MODEL, else sasrec-ml100k. The service's SEQSERVE_* settings name the artifacts
folder, the history store and the admin key; SEQSERVE_RETRAIN_MINUTES is the training budget (0.5),
SEQSERVE_RETRAIN_THREADS its threads, and SEQSERVE_API_URL the running service: the version it serves is
the one retrained (unset: the newest on disk; --from names another, as the retrainer does when the serving
version is not a good start) and it is asked to reload afterwards (unset: no reload).
Everything the run writes (the exported log, the job's output) lies in its own folder under
<artifacts>/.runs, locked while it runs and removed at its end; a run killed outright leaves the folder
unlocked, and the retrainer removes it. The new version moves into place by one rename; one the job's gate
held back goes to <artifacts>/.held/<name> (the newest HELD_KEPT of them stay).
The training job dies with this process. With SEQSERVE_NEW_VERSIONS=canary (or
shadow) on the service, the new version starts as a candidate beside the live one. The training job runs
as its own process (`python -m training warm`): the service's package never imports training's. Exit
status: the training job's (3: held back by its gate, nothing published); 2: no such artifact; 1: published
but the service did not reload (no admin key, or not reachable).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from app.settings import SettingsError
from models.artifact import HELD, RUNS, ArtifactError, publish, read_manifest, version_key, versions
from retrainer import export_history
from retrainer.settings import RetrainerSettings

HELD_KEPT = 3  # held-back versions kept per model for a look (the gate's reason is in their manifest)
LOCK = ".lock"
YOUNG_S = 60.0  # a run folder without its lock yet is being made, not left behind


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the process that started it dies (Linux's
    PR_SET_PDEATHSIG): a killed retrain leaves no training running, and so publishes nothing."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the run finishes and publishes whole
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def new_run_folder(artifacts: Path) -> Path:
    """A fresh name for a run's own folder (made by run_folder)."""
    return artifacts / RUNS / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def run_folder(folder: Path) -> Iterator[Path]:
    """`folder`, made and locked for the run's life (an exclusive flock on its lock file, which the kernel
    lets go when the process dies however it dies), and removed at its end."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def sweep_runs(artifacts: Path) -> list[str]:
    """Remove the run folders no live run holds (their lock free: the run was killed outright); -> their names."""
    removed = []
    for folder in sorted((artifacts / RUNS).glob("*")):
        lock = folder / LOCK
        try:
            if not lock.exists():
                if time.time() - folder.stat().st_mtime > YOUNG_S:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder.name)
                continue
            with lock.open("a") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while its run lives
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
        except OSError:
            continue
    return removed


def keep_held(out: Path, artifacts: Path, name: str) -> Path | None:
    """Move the version the job's gate held back (under `out`/.held/`name`) to <artifacts>/.held/`name`, and
    drop all but the newest HELD_KEPT there; -> where it went."""
    found = versions(out / HELD / name)
    if not found:
        return None
    held = publish(found[0], found[0].name, into=artifacts / HELD / name)
    prune_held(artifacts / HELD / name)
    return held


def prune_held(folder: Path) -> list[str]:
    """Keep the newest HELD_KEPT held-back versions in `folder` (<artifacts>/.held/<name>); -> those removed."""
    gone = sorted(versions(folder), key=version_key, reverse=True)[HELD_KEPT:]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return [old.name for old in gone]


def served_models(api_url: str) -> list[dict[str, object]]:
    """The service's models as GET /models lists them (OSError or ValueError when it does not answer)."""
    with urllib.request.urlopen(f"{api_url}/models", timeout=10) as r:
        models = json.load(r)["models"]
    if not isinstance(models, list):
        raise ValueError("GET /models: no list of models")
    return models


def serving_version(api_url: str, name: str) -> str | None:
    """The version of `name` the service at `api_url` serves (pinned, or the newest that loads); None
    when it cannot say."""
    try:
        return str(next(m["version"] for m in served_models(api_url) if m["name"] == name))
    except (OSError, StopIteration, KeyError, ValueError, TypeError):
        return None


def reload(api_url: str, admin_key: str) -> dict[str, object]:
    """POST /admin/reload; the service's report."""
    req = urllib.request.Request(f"{api_url}/admin/reload", method="POST", headers={"X-API-Key": admin_key})
    with urllib.request.urlopen(req, timeout=120) as r:
        report: dict[str, object] = json.load(r)
    return report


def _names(report: dict[str, object], key: str) -> dict[str, str]:
    """A reload report's model name -> version mapping under `key` ({} when absent)."""
    got = report.get(key)
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retrainer.retrain", description=__doc__.split("\n")[0])
    p.add_argument("name", nargs="?", help="the model to retrain (default: SEQSERVE_RETRAIN_MODEL)")
    p.add_argument("--from", dest="base", help="the version to start from (default: the one the service serves)")
    p.add_argument("--minutes", type=float, help="the training budget (SEQSERVE_RETRAIN_MINUTES)")
    p.add_argument("--threads", type=int, help="the training job's threads (SEQSERVE_RETRAIN_THREADS)")
    p.add_argument("--api-url", help="the running service (SEQSERVE_API_URL)")
    p.add_argument("--work", type=Path, help="the run's own folder (default: a new one under <artifacts>/.runs)")
    args = p.parse_args(argv)
    try:
        settings = RetrainerSettings()
    except SettingsError as exc:  # its text names each variable and never a value
        raise SystemExit(f"retrain: {exc}") from None
    args.api_url = settings.api_url if args.api_url is None else args.api_url
    args.name = args.name or settings.retrain_model
    minutes = args.minutes or settings.retrain_minutes
    threads = settings.retrain_threads if args.threads is None else args.threads
    version = args.base or (serving_version(args.api_url, args.name) if args.api_url else None)
    folder = settings.artifacts_dir / args.name / (version or "")
    try:
        base = folder if version else versions(folder)[0]
        namespace = read_manifest(base).namespace
    except (ArtifactError, OSError, IndexError):
        print(f"retrain: no artifact {folder}", file=sys.stderr)
        return 2
    with run_folder(args.work or new_run_folder(settings.artifacts_dir)) as work:
        log = work / f"{namespace}.csv"
        if (status := export_history.main(["--namespace", namespace, "--out", str(log)])) != 0:
            return status
        out = work / "out"
        warm = [sys.executable, "-m", "training", "warm", "--artifact", str(base), "--data", str(log)]
        warm += ["--minutes", str(minutes), "--out", str(out), "--set", f"train.threads={threads}"]
        job = subprocess.run(warm, preexec_fn=die_with_parent, stdout=subprocess.PIPE, text=True)
        if job.returncode == 3:
            held = keep_held(out, settings.artifacts_dir, args.name)
            print(f"retrain: held back by the gate, kept as {held}", file=sys.stderr)
            return 3
        if job.returncode != 0:
            return job.returncode
        made = Path(job.stdout.strip().splitlines()[-1])
        published = publish(made, made.name, into=settings.artifacts_dir / args.name)
        print(published)
        print(f"retrain: published {args.name}/{published.name} from {base.name}", file=sys.stderr)
    if args.api_url:
        key = settings.admin_api_key.get_secret_value() if settings.admin_api_key else ""
        try:
            report = reload(args.api_url, key)
        except urllib.error.HTTPError as exc:  # 403 while the service has no admin key, 401 without one here
            print(
                f"retrain: published, but the reload was refused ({exc.code}): set SEQSERVE_ADMIN_API_KEY",
                file=sys.stderr,
            )
            return 1
        except (OSError, ValueError) as exc:
            print(f"retrain: published, but the service did not reload ({exc})", file=sys.stderr)
            return 1
        started = _names(report, "candidates")
        serving = _names(report, "unchanged") | _names(report, "loaded")
        if args.name in started:
            said = f"{args.name}/{started[args.name]} started as a candidate beside the live version"
        elif serving.get(args.name) == published.name:
            said = f"{args.name}/{published.name} serves"
        else:
            said = (
                f"{args.name}/{published.name} neither serves nor runs as a candidate: a pin, a trial or a"
                " probation keeps the version serving now (GET /models/{name}/versions says which)"
            )
        print(f"retrain: reloaded: {said}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
