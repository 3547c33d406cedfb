import json
from pathlib import Path

import pytest
import torch

from models.artifact import latest_versions
from models.tasks.next_location import load_artifact as load_location_artifact
from tests.conftest import SHARED_DATA
from training.data import DataFormatError
from training.data.staypoints import Staypoint, build_protocol, load_staypoints, samples, split_by_day
from training.jobs.next_location_eval import location_metrics, most_frequent_scores, most_recent_scores, weighted_f1

GEOLIFE = SHARED_DATA / "geolife-staypoints" / "dataSet_geolife.csv"


def _pt(user: str, loc: str, day: int, minute: int = 0) -> Staypoint:
    return Staypoint(user, loc, day, minute, 30, day % 7)


def test_protocol_counts_worked_by_hand() -> None:
    # One user, one staypoint a day on days 0..29 (max_day 29): train days < 17.4 -> 0..17 (18 points),
    # validation < 23.2 -> 18..23 (6), test 24..29 (6). Samples need day - first_day >= 7 and >= 3 history
    # points within the previous 7 days: train days 7..17 -> 11 samples with 7 history points each;
    # validation first day is 18, so days 25+ would qualify: none; test likewise: none.
    pts = [_pt("1", f"L{d % 4}", d) for d in range(30)]
    parts = split_by_day(pts)
    assert [len(parts[k][0]) for k in ("train", "valid", "test")] == [18, 6, 6]
    train = samples(parts["train"][0])
    assert len(train) == 11 and all(len(s.history) == 7 for s in train)
    assert train[0].target.day == 7 and [h.day for h in train[0].history] == list(range(7))
    # Two points a day: history = the previous 7 days plus the earlier point of the same day.
    two = sorted(
        [_pt("2", "A", d, 60) for d in range(10)] + [_pt("2", "B", d, 600) for d in range(10)],
        key=lambda p: (p.day, p.start_min),
    )
    s = samples(two)
    assert len(s) == 6 and len(s[0].history) == 14 and len(s[1].history) == 15
    # Location ids are fitted on train: 0 padding, 1 unknown, known ids from 2.
    split = build_protocol(type("D", (), {"points": [*pts, _pt("1", "NEW", 29)]})())  # type: ignore[arg-type]
    assert len(split.locations) == 2 + 4 and split.locations.index("NEW") == 1


def test_loader_errors_name_the_row(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text("user_id,location_id,start_day,start_min,duration,weekday\n1,2,0,1500,30,0\n")
    with pytest.raises(DataFormatError, match=r"s.csv:2: start_min '1500' must be an integer in \[0, 1439\]"):
        load_staypoints(p)
    p.write_text("user_id,location_id,started_at,finished_at\n1,2,2024-01-01T10:00,2024-01-01T09:00\n")
    with pytest.raises(DataFormatError, match=r"s\.csv:2: finished_at is before started_at"):
        load_staypoints(p)
    p.write_text(
        "user_id,location_id,started_at,finished_at\n1,2,2024-01-01T10:00,2024-01-01T12:30\n"
        "1,3,2024-01-03T08:15,2024-01-03T09:00\n"
    )
    pts = load_staypoints(p).points
    assert [(q.day, q.start_min, q.duration, q.weekday) for q in pts] == [(0, 600, 150, 0), (2, 495, 45, 2)]


def test_metrics_and_baselines_by_hand() -> None:
    hist = torch.tensor([[2, 3, 3, 0], [4, 2, 4, 2]])
    freq = most_frequent_scores(hist, 6)
    assert freq[0].argmax().item() == 3  # 3 visited twice
    assert freq[1].argmax().item() == 4  # tie 2-2 broken by first appearance
    rec = most_recent_scores(hist, 6)
    assert rec[0].argmax().item() == 3 and rec[1].argmax().item() == 2
    m = location_metrics(freq, torch.tensor([3, 2]))
    assert m["Acc@1"] == 0.5 and m["Acc@5"] == 1.0 and m["MRR"] == pytest.approx(0.75)
    # Weighted F1: classes 2 (support 2) and 3 (support 1); predictions [2, 2, 3].
    f1 = weighted_f1(torch.tensor([2, 2, 3]), torch.tensor([2, 3, 2]), 5)
    assert f1 == pytest.approx((2 * 0.5 + 1 * 0.0) / 3)


def test_location_artifact(tiny_location_artifact: Path) -> None:
    folder = latest_versions(tiny_location_artifact)["mhsa-tiny"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["task"] == "next_location" and manifest["bucketing"]["slot_minutes"] == 15
    assert {"most_recent", "most_frequent", "markov"} == set(manifest["metrics"]["baselines_test"])
    assert {"all", "known"} == set(manifest["metrics"]["test"])
    assert (folder / "locations.json").exists() and (folder / "curves.png").exists()
    art = load_location_artifact(folder)
    assert art.model.config.pointer


@pytest.mark.skipif(not GEOLIFE.exists(), reason=f"real data absent: {GEOLIFE}")
def test_geolife_protocol_counts() -> None:
    split = build_protocol(load_staypoints(GEOLIFE))
    assert (len(split.train), len(split.valid), len(split.test)) == (7424, 3334, 3502)
    assert len(split.locations) == 1187 and split.users.n_entities == 45
