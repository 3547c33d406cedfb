"""One warm retrain of a served model: its serving version's weights continue on its log plus the live
events stored since, the result is published as a new version, and the service reloads.

    python -m app.retrain [NAME]          (what scripts/retrain.sh and compose's `retrain` profile run)

NAME: SEQSERVE_RETRAIN_MODEL, else sasrec-ml100k. The service's SEQSERVE_* settings name the artifacts
folder, the history store and the admin key; SEQSERVE_RETRAIN_MINUTES is the training budget (0.5),
SEQSERVE_RETRAIN_THREADS its threads, and SEQSERVE_API_URL the running service: the version it serves is
the one retrained (unset: the newest on disk) and it is asked to reload afterwards (unset: no reload).
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
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from app import export_history
from app.settings import Settings, SettingsError
from models.artifact import ArtifactError, read_manifest, versions


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the process that started it dies (Linux's
    PR_SET_PDEATHSIG): a killed retrain leaves no training running, and so publishes nothing."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the run finishes and publishes whole
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.retrain", description=__doc__.split("\n")[0])
    p.add_argument("name", nargs="?", default=os.environ.get("SEQSERVE_RETRAIN_MODEL") or "sasrec-ml100k")
    p.add_argument("--minutes", type=float, help="the training budget (SEQSERVE_RETRAIN_MINUTES)")
    p.add_argument("--threads", type=int, help="the training job's threads (SEQSERVE_RETRAIN_THREADS)")
    p.add_argument("--api-url", help="the running service (SEQSERVE_API_URL)")
    args = p.parse_args(argv)
    try:
        settings = Settings()
    except SettingsError as exc:  # its text names each variable and never a value
        raise SystemExit(f"retrain: {exc}") from None
    args.api_url = settings.api_url if args.api_url is None else args.api_url
    minutes = args.minutes or settings.retrain_minutes
    threads = settings.retrain_threads if args.threads is None else args.threads
    version = serving_version(args.api_url, args.name) if args.api_url else None
    folder = settings.artifacts_dir / args.name / (version or "")
    try:
        base = folder if version else versions(folder)[0]
        namespace = read_manifest(base).namespace
    except (ArtifactError, OSError, IndexError):
        print(f"retrain: no artifact {folder}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / f"{namespace}.csv"
        if (status := export_history.main(["--namespace", namespace, "--out", str(log)])) != 0:
            return status
        warm = [sys.executable, "-m", "training", "warm", "--artifact", str(base), "--data", str(log)]
        warm += ["--minutes", str(minutes), "--set", f"train.threads={threads}"]
        if (status := subprocess.run(warm, preexec_fn=die_with_parent).returncode) != 0:
            return status
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
        print(f"reload: loaded {report.get('loaded')} candidates {report.get('candidates', {})}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
