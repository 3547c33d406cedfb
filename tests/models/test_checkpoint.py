from pathlib import Path

import pytest
import torch

from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from models.ids import IdMap
from models.sasrec import SASRec, SASRecConfig


def test_round_trip_with_weights_only(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = SASRec(SASRecConfig(vocab_size=20, max_len=8, d_model=8, n_heads=1, n_layers=1, d_ff=16)).eval()
    save_checkpoint(tmp_path / "m.pt", "sasrec", m)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)
    assert raw["kind"] == "sasrec" and raw["format_version"] == 1 and raw["config"]["vocab_size"] == 20
    kind, m2 = load_checkpoint(tmp_path / "m.pt")
    assert kind == "sasrec"
    seq = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(m.scores(seq), m2.eval().scores(seq))


def test_corrupt_and_foreign_files_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "bad.pt")
    torch.save({"kind": "sasrec"}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(tmp_path / "partial.pt")
    torch.save({"kind": "nope", "format_version": 1, "config": {}, "state_dict": {}}, tmp_path / "kind.pt")
    with pytest.raises(CheckpointError, match="unknown model kind"):
        load_checkpoint(tmp_path / "kind.pt")


def test_idmap_conventions_and_json(tmp_path: Path) -> None:
    m = IdMap(["x", "y", "x"])
    assert len(m) == 4 and m.n_entities == 2
    assert m.index("x") == 2 and m.index("y") == 3 and m.index("zzz") == 1
    assert m.raw(0) is None and m.raw(1) is None and m.raw(3) == "y"
    m.save(tmp_path / "ids.json")
    assert IdMap.load(tmp_path / "ids.json").raws() == ["x", "y"]
    with pytest.raises(ValueError):
        IdMap.from_json({"ids": ["a"]})
