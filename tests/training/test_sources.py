from pathlib import Path

import pytest

from training.data import locate_ml100k


def test_prefers_the_given_path_then_shared_then_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    given, shared, cache = tmp_path / "given", tmp_path / "shared", tmp_path / "cache"
    for d in (given, shared, cache):
        d.mkdir()
        (d / "ml-100k.inter").write_text("user_id:token\titem_id:token\n")
    caplog.set_level("INFO")
    assert locate_ml100k(given, shared, cache) == given
    assert locate_ml100k(None, shared, cache) == shared
    assert "shared copy" in caplog.text
    (shared / "ml-100k.inter").unlink()
    assert locate_ml100k(None, shared, cache) == cache
    with pytest.raises(FileNotFoundError, match="does not exist"):
        locate_ml100k(tmp_path / "nope", shared, cache)
