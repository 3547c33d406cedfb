"""Settings: secrets from files (SEQSERVE_<NAME>_FILE), as compose and Kubernetes secrets mount them."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import Settings, SettingsError


def test_secrets_come_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "admin").write_text("from-a-file\n")
    (tmp_path / "redis").write_text("pw")
    monkeypatch.setenv("SEQSERVE_ADMIN_API_KEY_FILE", str(tmp_path / "admin"))
    monkeypatch.setenv("SEQSERVE_REDIS_PASSWORD_FILE", str(tmp_path / "redis"))
    s = Settings()
    assert s.admin_api_key is not None and s.admin_api_key.get_secret_value() == "from-a-file"
    assert s.redis_password is not None and s.redis_password.get_secret_value() == "pw"
    assert "from-a-file" not in repr(s) and "pw'" not in repr(s)
    assert Settings(admin_api_key="direct").admin_api_key.get_secret_value() == "direct"  # type: ignore[union-attr]


def test_an_unreadable_secret_file_names_the_variable_not_the_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEQSERVE_EVENTS_API_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="SEQSERVE_EVENTS_API_KEY_FILE: cannot read the file"):
        Settings()
    monkeypatch.setenv("SEQSERVE_EVENTS_API_KEY_FILE", "")
    assert Settings().events_api_key is None


def test_instances_with_sqlite_files_in_one_folder_share_no_state(tmp_path: Path) -> None:
    one = Settings(history_path=tmp_path / "a.sqlite3")
    two = Settings(history_path=tmp_path / "b.sqlite3")
    assert one.shared_dir != two.shared_dir and one.shared_dir.parent == tmp_path
    assert Settings(history_path=tmp_path / "a.sqlite3", state_dir=tmp_path / "s").shared_dir == tmp_path / "s"


def test_the_promotion_rule_s_count_is_named_for_lists_and_its_first_name_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEQSERVE_EVENTS_API_KEY", "k")
    monkeypatch.setenv("SEQSERVE_PROMOTE_MIN_EVENTS", "7")
    assert Settings().promote_min_lists == 7
    monkeypatch.setenv("SEQSERVE_PROMOTE_MIN_LISTS", "9")
    assert Settings().promote_min_lists == 9  # the new name wins
    monkeypatch.setenv("SEQSERVE_PROMOTE_MIN_LISTS", "many")
    with pytest.raises(SettingsError) as bad:
        Settings()
    assert "SEQSERVE_PROMOTE_MIN_LISTS:" in str(bad.value) and "SEQSERVE_SEQSERVE" not in str(bad.value)
    monkeypatch.delenv("SEQSERVE_EVENTS_API_KEY")
    monkeypatch.setenv("SEQSERVE_PROMOTE_MIN_LISTS", "3")
    with pytest.raises(SettingsError, match="SEQSERVE_PROMOTE_MIN_LISTS needs SEQSERVE_EVENTS_API_KEY"):
        Settings()


def test_each_part_reads_its_own_group_of_the_same_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSERVE_PORT", "9001")
    monkeypatch.setenv("SEQSERVE_PROBATION_MIN_USERS", "9")
    monkeypatch.setenv("SEQSERVE_NEW_VERSIONS", "canary")
    s = Settings()
    assert (s.server.port, s.server.workers) == (9001, 1)
    assert s.loop.new_versions == "canary" and s.loop.probation == s.probation
    assert s.loop.probation.probation_min_users == 9 and not s.loop.scored  # no events key: nothing scored
    monkeypatch.setenv("SEQSERVE_EVENTS_API_KEY", "k")
    assert Settings().loop.scored
