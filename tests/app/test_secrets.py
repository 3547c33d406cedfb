"""No setting's value appears in any log line or error: every secret set to a marker, all output read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import pytest

from app.settings import Settings, SettingsError
from tests.servers import ROOT, free_port, start_api

# Values made of no words, so that any five characters of one in the output can only be a leak.
MARKERS = {
    "SEQSERVE_ADMIN_API_KEY": "Qz7vXw2KpLm9Tr",
    "SEQSERVE_EVENTS_API_KEY": "k3yZq8WvNx4Jd",
    "SEQSERVE_READ_API_KEY": "Rj5XbQ9mVz2Hk",
    "SEQSERVE_REDIS_PASSWORD": "Pw6ZqYx3NvB8",
    # A long URL: a truncated repr of it would still show its ends.
    "SEQSERVE_REDIS_URL": "redis://user:Uq4ZxWv7Km@127.0.0.1:1/0?x=" + "Yq" * 40 + "Tz9QwXk",
}


def _leaks(text: str) -> list[str]:
    """Every 5-character piece of a secret found in `text` (of the URL: its password and query value)."""
    url = MARKERS["SEQSERVE_REDIS_URL"]
    parts = [v for k, v in MARKERS.items() if k != "SEQSERVE_REDIS_URL"]
    parts += [url.split(":")[2].split("@")[0], url.split("x=")[1]]
    return sorted({p[i : i + 5] for p in parts for i in range(len(p) - 4) if p[i : i + 5] in text})


def _run_server(env: dict[str, str], *, secrets: dict[str, str] = MARKERS, timeout_s: float = 60) -> tuple[int, str]:
    full = {**os.environ, **secrets, "SEQSERVE_PORT": str(free_port()), **env}
    proc = subprocess.run(
        [sys.executable, "-m", "app.server"], cwd=ROOT, env=full, capture_output=True, timeout=timeout_s, text=True
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_an_unreadable_secret_file_stops_the_start_without_showing_any_value(tmp_path: Path) -> None:
    secret = tmp_path / "admin"
    secret.write_text("x")
    secret.chmod(0)
    # root reads a mode-0 file; a folder in the file's place is unreadable for everyone
    path = str(secret) if not os.access(secret, os.R_OK) else str(tmp_path)
    env = {"SEQSERVE_ADMIN_API_KEY_FILE": path, "SEQSERVE_ADMIN_API_KEY": ""}
    # One short secret (as reported: the whole value in pydantic's text), then all of them.
    for secrets in ({"SEQSERVE_EVENTS_API_KEY": MARKERS["SEQSERVE_EVENTS_API_KEY"]}, MARKERS):
        code, out = _run_server(env, secrets=secrets)
        assert code != 0
        assert "SEQSERVE_ADMIN_API_KEY_FILE: cannot read the file" in out
        assert _leaks(out) == [], out


def test_an_invalid_setting_names_the_variable_without_any_value() -> None:
    code, out = _run_server({"SEQSERVE_PORT": "not-a-port", "SEQSERVE_DEVICE": "tpuQz7vXw2KpLm9Tr"})
    assert code != 0
    assert "SEQSERVE_PORT" in out and "SEQSERVE_DEVICE" in out
    assert _leaks(out) == [], out


def test_settings_errors_in_process_carry_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in MARKERS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEQSERVE_MAX_K", "Qz7vXw2KpLm9Tr")
    with pytest.raises(SettingsError) as info:
        Settings()
    assert "SEQSERVE_MAX_K" in str(info.value)
    assert _leaks(str(info.value)) == [] and info.value.__cause__ is None and info.value.__context__ is None


def test_a_running_service_logs_no_secret(tiny_artifacts: Path, tmp_path: Path) -> None:
    """Redis unreachable (its URL holds a password), every key set, wrong keys sent, debug logs on."""
    env = {
        **MARKERS,
        "SEQSERVE_HISTORY_STORE": "redis",
        "SEQSERVE_LOG_LEVEL": "DEBUG",
        "SEQSERVE_HISTORY_PATH": str(tmp_path / "h.sqlite3"),
    }
    proc, url = _start_unready(tiny_artifacts, env)
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            c.get("/readyz")
            c.get("/models")
            c.get("/metrics")
            c.get("/history", params={"user_id": "u1"}, headers={"X-API-Key": "wrong"})
            c.post("/recommend", json={"queries": [{"user_id": "u1"}]})
            c.post("/events", json={"events": []}, headers={"X-API-Key": "wrong"})
            c.post("/admin/reload", headers={"X-API-Key": "wrong"})
            c.post("/admin/reload", headers={"X-API-Key": MARKERS["SEQSERVE_ADMIN_API_KEY"]})
    except Exception:
        proc.kill()
        print(proc.communicate()[0].decode()[-5000:])
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    text = out.decode(errors="replace")
    assert "history store" in text or "redis" in text.lower()  # the store's failure was logged
    assert _leaks(text) == [], text[-3000:]


def _start_unready(artifacts: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """The service with stdout and stderr merged, once it answers /healthz (Redis being away, /readyz is 503)."""
    port = free_port()
    full = {
        **os.environ,
        "SEQSERVE_ARTIFACTS_DIR": str(artifacts),
        "SEQSERVE_TORCH_THREADS": "1",
        "SEQSERVE_PORT": str(port),
        **env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.server"], cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"server did not start: {proc.communicate()[0].decode()[-2000:]}")


assert start_api  # the helper the other server tests use; this module needs merged output instead
