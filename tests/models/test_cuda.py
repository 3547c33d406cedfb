"""Every model gives on a CUDA device what it gives on the CPU: same weights, same inputs, same scores.

Skipped without CUDA (CI has none); run on a GPU machine, see docs/BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.mhsa import MHSA, MHSAConfig
from models.ranking import recommend, release_tensor
from models.sasrec import SASRec, SASRecConfig
from models.social import SocialConfig, SocialModel, pack_steps
from models.staypoints import collate_staypoints

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def _pair(build: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    cpu = build().eval()
    gpu = build().eval()
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.to(CUDA)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    b = b.cpu()
    assert torch.equal(torch.isinf(a), torch.isinf(b))  # the same candidates hidden
    finite = torch.isfinite(a)
    assert torch.allclose(a[finite], b[finite], atol=1e-4, rtol=1e-4)


# Right-padded ragged rows, a one-item row and the [UNK] row an empty history becomes: the masks matter
# most where rows differ in length.
SEQS = torch.tensor([[3, 4, 5, 0, 0, 0], [7, 0, 0, 0, 0, 0], [2, 3, 4, 5, 6, 7], [1, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("kind", ["sasrec", "bert4rec"])
@pytest.mark.parametrize("filter_kind", ["none", "bsa", "learned", "tv"])
def test_recommenders_score_alike(kind: str, filter_kind: str) -> None:
    shape = dict(vocab_size=12, max_len=8, d_model=16, n_heads=2, n_layers=2, d_ff=32, filter_kind=filter_kind)

    def build() -> torch.nn.Module:
        if kind == "sasrec":
            return SASRec(SASRecConfig(**shape))  # type: ignore[arg-type]
        return BERT4Rec(BERT4RecConfig(**shape))  # type: ignore[arg-type]

    cpu, gpu = _pair(build)
    with torch.inference_mode():
        want = cpu.scores(SEQS)  # type: ignore[operator]
        got = gpu.scores(SEQS.to(CUDA))  # type: ignore[operator]
    assert torch.isfinite(got[:, 2:]).all()  # no NaN from rows that are mostly padding
    _close(want, got)


def test_ranking_with_exclusions_matches_the_cpu() -> None:
    cpu, gpu = _pair(lambda: SASRec(SASRecConfig(vocab_size=40, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)))
    release = release_tensor([str(i) for i in range(38)], {str(i): 2000.0 + i for i in range(0, 38, 3)})
    kw: dict[str, Any] = {
        "k": 10,
        "exclude_seen": [True, False, True],
        "requested": [[9], [], [30, 31]],
        "reference": [2012.0, None, 2030.0],
    }
    hist = [[2, 3, 4], [5], list(range(10, 18))]
    with torch.inference_mode():
        a = recommend(cpu, hist, release=release, **kw)  # type: ignore[arg-type]
        b = recommend(gpu, hist, release=release, device=CUDA, **kw)  # type: ignore[arg-type]
    assert torch.equal(a.indices, b.indices.cpu())
    _close(a.scores, b.scores)
    for name in ("n_seen", "n_future", "n_requested"):
        assert torch.equal(getattr(a, name), getattr(b, name).cpu())


def test_next_location_scores_alike() -> None:
    cpu, gpu = _pair(
        lambda: MHSA(MHSAConfig(n_locations=20, n_users=5, d_model=16, n_heads=2, d_ff=32, n_layers=2, pointer=True))
    )
    batch = collate_staypoints([[(3, 60, 0, 30)], [(3, 60, 0, 30), (4, 120, 0, 30), (5, 180, 3, 300)]], [2, 4])
    with torch.inference_mode():
        _close(cpu.scores(batch), gpu.scores(batch.to(CUDA)))  # type: ignore[operator]


@pytest.mark.parametrize("positions", ["none", "learned", "rope", "time"])
def test_social_scores_alike(positions: str) -> None:
    cpu, gpu = _pair(
        lambda: SocialModel(
            SocialConfig(
                n_users=12, n_actions=5, emb_dim=8, n_heads=2, n_layers=2, d_ff=16, max_history=6, positions=positions
            )
        )
    )
    batch = pack_steps(
        [[(3, 2, 100.0), (4, 3, 500.0), (3, 2, 900.0)], [(7, 4, 50.0)]],
        query_times=[1000.0, 86400.0],
        max_history=6,
        n_buckets=48,
    )
    with torch.inference_mode():
        _close(cpu.scores(batch), gpu.scores(batch.to(CUDA)))  # type: ignore[operator]


def test_a_training_step_under_bf16_autocast_lowers_the_loss() -> None:
    """The training loop's default on CUDA: bf16 autocast, fp32 weights; the loss must still fall."""
    torch.manual_seed(0)
    model = SASRec(
        SASRecConfig(vocab_size=30, max_len=10, d_model=32, n_heads=2, n_layers=2, d_ff=64, dropout=0.0, loss="softmax")
    ).to(CUDA)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seq = (torch.arange(11)[None, :] + torch.arange(16)[:, None]) % 28 + 2  # each row walks the catalog
    seq = seq.to(CUDA)
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(seq)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0]
