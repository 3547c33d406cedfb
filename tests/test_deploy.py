"""The deployment files, checked by parsing (no Docker engine runs here) and by running their scripts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers import installed

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _volumes(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) for short and long volume syntax."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
    return out


def test_services_and_start_order(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"api", "lb", "redis", "trainer", "train", "retrain"} <= set(services)
    deps = services["api"]["depends_on"]
    assert deps["trainer"]["condition"] == "service_completed_successfully"
    assert deps["redis"]["condition"] == "service_healthy"
    assert services["train"]["profiles"] == ["train"]
    assert services["retrain"]["profiles"] == ["retrain"]  # warm, from the live events in Redis
    assert services["retrain"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["retrain"]["environment"]["SEQSERVE_HISTORY_STORE"] == "redis"
    loop = services["retrainer"]  # the loop by itself: beside the api, sharing its store, bounded
    assert loop["profiles"] == ["loop"] and loop["restart"] == "unless-stopped"
    assert loop["environment"]["SEQSERVE_HISTORY_STORE"] == "redis"
    assert loop["environment"]["SEQSERVE_API_URL"] == "http://api:8000"
    assert str(loop["cpus"]).startswith("${SEQSERVE_RETRAINER_CPUS:-") and "mem_limit" in loop
    assert loop.get("healthcheck") == {"disable": True}  # the image's check polls the api's /readyz
    assert "profiles" not in services["trainer"]  # runs on every `up`, and trains only into an empty volume
    assert services["trainer"]["restart"] == "no"


def test_api_uses_redis_and_reads_artifacts_read_only(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    env = api["environment"]
    assert env["SEQSERVE_HISTORY_STORE"] == "redis" and env["SEQSERVE_REDIS_URL"].startswith("redis://redis:")
    assert ("artifacts", "/app/artifacts", True) in _volumes(api)
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    for name in ("trainer", "train", "retrain", "retrainer"):
        assert ("artifacts", "/app/artifacts", False) in _volumes(compose["services"][name])
    assert "artifacts" in compose["volumes"] and "redis-data" in compose["volumes"]


def test_redis_persists_every_write(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    cmd = " ".join(redis["command"])
    assert "--appendonly yes" in cmd and "--appendfsync always" in cmd
    assert ("redis-data", "/data", False) in _volumes(redis)
    assert "ping" in " ".join(redis["healthcheck"]["test"])


def test_entrypoints_are_the_scripts_used_here(compose: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["scripts/serve\.sh"\]$', dockerfile, re.M)
    assert "scripts/serve.sh" in (ROOT / "README.md").read_text()
    for name, entry in (
        ("trainer", ["scripts/train_defaults.sh"]),
        ("train", ["scripts/train_defaults.sh", "--force"]),
        ("retrain", ["scripts/retrain.sh"]),
        ("retrainer", ["scripts/retrainer.sh"]),
    ):
        assert compose["services"][name]["entrypoint"] == entry
    for script in ("serve.sh", "train_defaults.sh", "retrain.sh", "retrainer.sh", "bootstrap.sh"):
        assert os.access(ROOT / "scripts" / script, os.X_OK), script


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(stages) >= 2, "multi-stage build"
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.\d+-slim", text, re.M)
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M) and "cuda)" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/readyz", text, re.M)
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "artifacts", "runs", ".git"} <= set(ignored)


def test_trainer_does_nothing_when_models_exist(tiny_artifacts: Path) -> None:
    env = {**os.environ, "SEQSERVE_ARTIFACTS_DIR": str(tiny_artifacts)}
    out = subprocess.run(
        [str(ROOT / "scripts" / "train_defaults.sh")], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert "already holds models" in out.stderr


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


def test_compose_waits_longer_than_the_service_drains(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    drain = float(api["environment"]["SEQSERVE_DRAIN_S"])
    from app.settings import Settings

    assert Settings().drain_s == drain
    # Compose SIGKILLs after stop_grace_period (10 s when unset): in-flight requests would be cut.
    assert _seconds(str(api.get("stop_grace_period", "10s"))) >= drain + 5


def _default(text: str) -> str:
    """A compose value with every ${VAR:-default} at its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def test_one_shot_services_have_no_healthcheck(compose: dict[str, Any]) -> None:
    """The image's HEALTHCHECK polls the api's /readyz: a trainer would be shown 'unhealthy' while it trains."""
    one_shot = [n for n, s in compose["services"].items() if s.get("restart") == "no"]
    assert {"trainer", "train", "retrain", "secrets"} <= set(one_shot)
    for name in one_shot:
        assert compose["services"][name].get("healthcheck") == {"disable": True}, name


def test_the_balancer_listens_on_loopback_unless_told_and_the_api_scales_behind_it(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    services = compose["services"]
    [port] = services["lb"]["ports"]
    assert _default(port) == "127.0.0.1:8000:8080" and "${SEQSERVE_BIND" in port
    # No host port on the api: `--scale api=N` would collide on it. Its replicas are reached through lb.
    assert "ports" not in services["api"] and services["api"]["expose"] == ["8000"]
    assert services["lb"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert services["lb"]["build"]["context"] == "ops/lb" and services["lb"]["restart"] == "unless-stopped"
    cfg = (ROOT / "ops" / "lb" / "haproxy.cfg").read_text()
    # Every replica compose's DNS names, re-read while running; each checked on /readyz.
    assert re.search(r"server-template api \d+ api:8000", cfg) and "nameserver dns 127.0.0.11:53" in cfg
    assert "option httpchk GET /readyz" in cfg and "resolvers docker" in cfg
    assert "bind :8080" in cfg and "retry-on conn-failure empty-response" in cfg
    dockerfile = (ROOT / "ops" / "lb" / "Dockerfile").read_text()
    assert "apt-get install" in dockerfile and "haproxy -c -f" in dockerfile  # Debian's package, checked at build
    assert "python" not in services["lb"]["healthcheck"]["test"][-1]  # the image has no Python
    haproxy = installed("haproxy", "haproxy")
    # The image's paths, pointed at the files the image copies in.
    cfg_here = tmp_path / "haproxy.cfg"
    cfg_here.write_text(cfg.replace("/etc/haproxy/", f"{ROOT / 'ops' / 'lb'}/"))
    out = subprocess.run([haproxy, "-c", "-f", str(cfg_here)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    copied = re.findall(r"COPY (.+) /etc/haproxy/", dockerfile)
    for path in re.findall(r"/etc/haproxy/(\S+)", cfg):  # every file the config names is in the image
        assert any(path == f or path.startswith(f.rstrip("/") + "/") for c in copied for f in c.split()), path


def test_redis_needs_a_password_and_never_evicts(compose: dict[str, Any]) -> None:
    services = compose["services"]
    cmd = services["redis"]["command"]
    assert cmd[1] == "/secrets/redis.conf"
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction" and _default(cmd[cmd.index("--maxmemory") + 1])
    assert services["api"]["environment"]["SEQSERVE_REDIS_PASSWORD_FILE"] == "/secrets/redis-password"
    assert "password" not in services["api"]["environment"]["SEQSERVE_REDIS_URL"]
    assert "REDISCLI_AUTH" in services["redis"]["healthcheck"]["test"][1]


def test_secrets_script_makes_one_password_and_keeps_it(compose: dict[str, Any], tmp_path: Path) -> None:
    """The one-shot `secrets` service's own script, run here with its folder under tmp_path."""
    svc = compose["services"]["secrets"]
    script = svc["command"][0].replace("$$", "$").replace("/secrets", str(tmp_path))
    script = script.replace("chown 999 redis.conf && chown 10001 redis-password", "true")  # not root everywhere
    env = {"PATH": os.environ["PATH"], "SEQSERVE_REDIS_PASSWORD": ""}
    subprocess.run(["sh", "-c", script], env=env, check=True)
    password = (tmp_path / "redis-password").read_text()
    assert len(password) == 48 and (tmp_path / "redis.conf").read_text() == f"requirepass {password}\n"
    assert oct((tmp_path / "redis-password").stat().st_mode & 0o777) == "0o600"
    subprocess.run(["sh", "-c", script], env={**env, "SEQSERVE_REDIS_PASSWORD": "other"}, check=True)
    assert (tmp_path / "redis-password").read_text() == password  # kept across starts
    given = tmp_path / "given"
    given.mkdir()
    subprocess.run(
        ["sh", "-c", script.replace(str(tmp_path), str(given))],
        env={**env, "SEQSERVE_REDIS_PASSWORD": "chosen"},
        check=True,
    )
    assert (given / "redis-password").read_text() == "chosen"


def test_api_keys_can_come_from_compose_secrets() -> None:
    """The api and the processes that call it (the retrainer and a retrain reload it with the admin key; the
    retrainer starts only with the events key) read the same key files."""
    override = yaml.safe_load((ROOT / "docker-compose.secrets.yml").read_text())
    for service in ("api", "settings", "retrainer", "retrain"):
        env = override["services"][service]["environment"]
        assert env == {
            "SEQSERVE_ADMIN_API_KEY_FILE": "/run/secrets/admin_key",
            "SEQSERVE_EVENTS_API_KEY_FILE": "/run/secrets/events_key",
        }, service
        assert override["services"][service]["secrets"] == ["admin_key", "events_key"]
    assert set(override["secrets"]) == {"admin_key", "events_key"}
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["retrainer"]["environment"]
    for name in ("EVENTS_API_KEY", "RETRAIN_COOLDOWN_S", "RETRAIN_CHECK_S", "RETRAIN_LEASE_S", "RETRAIN_BACKOFF_MAX_S"):
        assert f"SEQSERVE_{name}" in base, name  # settable in compose, as every setting the loop reads


def test_alert_rules_pass_promtool_and_name_metrics_the_code_exports() -> None:
    """ops/prometheus/alerts.yml: valid rules, their unit tests (alerts_test.yml) pass, and every metric an
    expression reads is one app/ or retrainer/ defines (a renamed metric would leave an alert that never fires)."""
    promtool = installed("promtool", "prometheus")
    rules = ROOT / "ops" / "prometheus"
    checks = (
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
        ["check", "config", "prometheus.yml"],
    )
    for args in checks:
        out = subprocess.run([promtool, *args], cwd=rules, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    exported = "".join(p.read_text() for package in ("app", "retrainer") for p in (ROOT / package).rglob("*.py"))
    for name in set(re.findall(r"(seqserve_[a-z_]+?)(?:_total)?\b", (rules / "alerts.yml").read_text())):
        assert f'"{name}' in exported, name


def test_every_setting_can_be_given_to_compose_and_is_checked_before_the_api_starts(compose: dict[str, Any]) -> None:
    """ops/seqserve.env lists every setting (compose reads it into the api, the retrainer and a retrain);
    a one-shot `settings` service checks the api's settings first, with the api's own environment."""
    from app.settings import Settings
    from retrainer.settings import RetrainerSettings

    listed = (ROOT / "ops" / "seqserve.env").read_text()
    for name in {*Settings.model_fields, *RetrainerSettings.model_fields}:
        assert f"# SEQSERVE_{name.upper()}=" in listed, name
    services = compose["services"]
    for name in ("api", "settings", "retrainer", "retrain"):
        assert services[name]["env_file"] == "${SEQSERVE_ENV_FILE:-ops/seqserve.env}", name
    check = services["settings"]
    assert check["entrypoint"][-2:] == ["-m", "app.settings"] and check["restart"] == "no"
    assert check["environment"] == services["api"]["environment"]
    assert services["api"]["depends_on"]["settings"]["condition"] == "service_completed_successfully"
    for name in ("SEQSERVE_KEEP_VERSIONS", "SEQSERVE_PROBATION_MAX_S", "SEQSERVE_FORWARDED_ALLOW_IPS"):
        assert name in services["api"]["environment"], name


def test_the_settings_check_names_what_is_wrong(tmp_path: Path) -> None:
    env = {**os.environ, "SEQSERVE_PROBATION_S": "soon", "SEQSERVE_FORWARDED_ALLOW_IPS": "*"}
    out = subprocess.run([sys.executable, "-m", "app.settings"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 2
    assert (
        "SEQSERVE_PROBATION_S" in out.stderr
        and "SEQSERVE_FORWARDED_ALLOW_IPS" in out.stderr
        and "soon" not in out.stderr
    )
    good = subprocess.run([sys.executable, "-m", "app.settings"], cwd=ROOT, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr


def test_rolling_restart_script_starts_new_replicas_before_it_stops_old_ones() -> None:
    script = (ROOT / "ops" / "rolling-restart.sh").read_text()
    assert os.access(ROOT / "ops" / "rolling-restart.sh", os.X_OK)
    assert subprocess.run(["bash", "-n", str(ROOT / "ops" / "rolling-restart.sh")]).returncode == 0
    up, stop = script.index("--no-recreate --scale api="), script.index('docker stop -t 30 "$id"')
    healthy = script.index("{{.State.Health.Status}}")
    assert up < healthy < stop  # new ones up and healthy before any old one stops
