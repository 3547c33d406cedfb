"""Checkpoints written before every model shared one encoder layer still load and answer the same.

tests/data/checkpoints/*.pt and expected.json were written by commit 8f3b316 (torch's
nn.TransformerEncoderLayer in SASRec, BERT4Rec and MHSA; separate q, k, v projections in the social
model and the seq2seq): tiny models with perturbed weights, and their outputs on fixed inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models.checkpoint import load_checkpoint
from models.ids import N_SPECIAL
from models.ranking import pack_histories
from models.social import pack_steps
from models.staypoints import collate_staypoints

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
EXPECTED = json.loads((DATA / "expected.json").read_text())
ROWS: list[list[int]] = EXPECTED["rows"]
L = 12


def _outputs(kind: str, model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        if kind in ("sasrec", "bert4rec"):
            return model.scores(pack_histories(ROWS, model.max_history))  # type: ignore[operator]
        if kind == "mhsa":
            stays = [[(x, 61 * i % 1440, i % 7, 29 * i) for i, x in enumerate(r)] for r in ROWS]
            return model.scores(collate_staypoints(stays, [2, 3, 4, 2], max_len=L))  # type: ignore[operator]
        if kind == "social":
            steps = [[(x, N_SPECIAL + x % 3, 1e6 - 977.0 * (len(r) - i)) for i, x in enumerate(r)] for r in ROWS]
            batch = pack_steps(steps, query_times=[1e6] * 4, max_history=L, n_buckets=model.config.n_time_buckets)
            return model.scores(batch)  # type: ignore[operator]
        src = pack_histories(ROWS, L)
        tgt = torch.cat([torch.ones(len(ROWS), 1, dtype=torch.long), src[:, :-1]], 1)
        return model(src, tgt)


@pytest.mark.parametrize("kind", ["sasrec", "bert4rec", "mhsa", "social", "seq2seq"])
def test_an_old_checkpoint_loads_and_answers_as_it_did(kind: str) -> None:
    loaded_kind, model = load_checkpoint(DATA / f"{kind}.pt")
    assert loaded_kind == kind
    got = _outputs(kind, model.eval())
    want = torch.tensor(EXPECTED["outputs"][kind])
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
