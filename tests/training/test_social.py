import json
from pathlib import Path

import numpy as np
import pytest
import torch

from models.artifact import latest_versions
from models.social import pack_steps
from models.tasks.social import load_artifact
from tests.conftest import SHARED_DATA, stored, stored_users
from training.data.social import Periods, Timelines, load_social, period_queries
from training.data.tables import DataFormatError
from training.jobs.social_eval import Baselines, QuerySet, evaluate_scorer, target_ranks


def _write(tmp_path: Path, text: str, name: str = "log.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_loader_sorts_drops_loops_and_duplicates_and_reads_iso_times(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "src,dst,action,timestamp\n"
        "a,b,x,2020-01-01T00:00:10Z\nb,b,x,5\na,c,y,3\na,c,y,3\nc,a,follow,2020-01-01T00:00:00\n",
    )
    log = load_social(p)
    assert list(log.src) == ["a", "c", "a"] and list(log.action) == ["y", "follow", "x"]
    assert log.dropped_self_loops == 1 and log.dropped_duplicates == 1
    assert log.time[2] - log.time[1] == 10.0
    assert len(load_social(p, drop_self_loops=False)) == 4


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("src,dst,action\na,b,x\n", "missing column(s) ['timestamp']"),
        ("src,dst,action,timestamp\na,b,x,1\na,b,x,yesterday\n", ":3: timestamp 'yesterday'"),
        ("src,dst,action,timestamp\na,,x,1\n", ":2: empty dst"),
    ],
)
def test_malformed_logs_name_file_and_line(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(
        DataFormatError, match=where.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        load_social(_write(tmp_path, text))


def test_queries_need_an_earlier_actor_event_and_a_known_target(tmp_path: Path) -> None:
    rows = [
        ("a", "b", 1),
        ("b", "c", 2),
        ("a", "c", 3),
        ("a", "b", 4),
        ("d", "b", 5),
        ("a", "e", 6),
        ("e", "a", 7),
        ("b", "a", 8),
        ("a", "d", 9),
        ("e", "b", 10),
    ]
    p = _write(tmp_path, "src,dst,action,timestamp\n" + "".join(f"{s},{d},x,{t}\n" for s, d, t in rows))
    log = load_social(p)
    periods = Periods.of(len(log), valid_share=0.2, test_share=0.4)
    assert (periods.valid, periods.test) == (4, 6)
    q = period_queries(log, periods.test, len(log))
    # e->a: e has an earlier event (as actor? no: only as target) -> not a query; b->a yes, repeat no;
    # a->d: d known before the test period -> yes; e->b: e acted at index 6 -> yes.
    assert q.event.tolist() == [7, 8, 9] and q.repeat.tolist() == [False, False, False]


def test_windows_equal_the_serving_packer(social_file: Path) -> None:
    log = load_social(social_file)
    idx = {u: n + 2 for n, u in enumerate(sorted(set(log.src) | set(log.dst)))}
    acts = {a: n + 2 for n, a in enumerate(sorted(set(log.action)))}
    tgt = np.array([idx[d] for d in log.dst])
    act = np.array([acts[a] for a in log.action])
    tl = Timelines(log.src, tgt, act, log.time)
    events = np.array([50, 400, 1200, len(log) - 1])
    targets, actions, times = tl.window(events, 8)
    rows = []
    for e in events:
        mine = [i for i in range(e) if log.src[i] == log.src[e]][-8:]
        rows.append([(int(tgt[i]), int(act[i]), float(log.time[i])) for i in mine])
    packed = pack_steps(rows, query_times=[float(log.time[e]) for e in events], max_history=8, n_buckets=48)
    assert torch.equal(targets, packed.targets) and torch.equal(actions, packed.actions)
    assert torch.equal(times[targets != 0], torch.tensor([s[2] for r in rows for s in r], dtype=torch.float64))


def test_ranks_break_ties_in_expectation_and_skip_non_candidates() -> None:
    scores = torch.tensor([[0.0, 0.0, 5.0, 1.0, 1.0, 1.0, 9.0]])
    cand = torch.tensor([[False, False, True, True, True, True, False]])
    assert target_ranks(scores, torch.tensor([3]), cand).tolist() == [3.0]  # behind 2, tied with 4 and 5
    assert target_ranks(scores, torch.tensor([2]), cand).tolist() == [1.0]  # 6 scores higher but is no candidate


def test_most_recent_baseline_ranks_the_latest_distinct_target_first(social_file: Path) -> None:
    log = load_social(social_file)
    users = {u: n + 2 for n, u in enumerate(sorted(set(log.src) | set(log.dst)))}
    tgt = np.array([users[d] for d in log.dst])
    tl = Timelines(log.src, tgt, np.zeros(len(log), dtype=np.int64), log.time)
    events = np.array([e for e in range(1000, 1100) if tl.earlier(np.array([e]))[0] > 0])
    pool = torch.ones(len(users) + 2, dtype=torch.bool)
    pool[:2] = False
    # As if each query's target were its actor's previous target: most-recent must rank it first.
    prev = np.array([tgt[[i for i in range(e) if log.src[i] == log.src[e]][-1]] for e in events])
    src = np.array([users[s] for s in log.src[events]])
    keep = prev != src
    qs = QuerySet(
        events[keep],
        torch.from_numpy(prev[keep]),
        torch.from_numpy(src[keep]),
        torch.ones(int(keep.sum()), dtype=torch.bool),
        torch.from_numpy(log.time[events[keep]]),
        pool,
    )
    b = Baselines(tl, torch.from_numpy(tgt), log.time, len(users) + 2)
    assert evaluate_scorer(qs, b.most_recent(qs))["all"]["HR@10"] == 1.0
    assert evaluate_scorer(qs, b.most_recent(qs))["all"]["MRR"] == 1.0


def test_tiny_social_job_beats_popularity_and_exports_the_contract(tiny_social_artifact: Path) -> None:
    folder = latest_versions(tiny_social_artifact)["social-tiny"]
    names = {p.name for p in folder.iterdir()}
    assert {
        "manifest.json",
        "model.pt",
        "users.json",
        "actions.json",
        "histories",
        "user_meta.json",
        "metrics.json",
        "run_config.json",
        "curves.png",
    } <= names
    m = json.loads((folder / "metrics.json").read_text())
    assert set(m["baselines_test"]) == {
        "popularity",
        "recent_popularity",
        "most_recent",
        "most_recent_contact",
        "most_frequent",
    }
    assert {"all", "repeat", "new"} == set(m["test"])
    assert m["test"]["all"]["NDCG@10"] > m["baselines_test"]["popularity"]["all"]["NDCG@10"]
    assert m["queries"]["test_scored"] == m["queries"]["test"] == m["test"]["all"]["n"]  # within its budget: all
    art = load_artifact(folder)
    assert art.manifest.task == "social" and art.manifest.namespace == "tinysocial"
    assert sorted(art.actions.raws()) == ["<-a2q", "<-c2a", "<-c2q", "a2q", "c2a", "c2q"]
    # Each event sits on its actor's history and, received, on its target's.
    own = sum(not (a or "").startswith("<-") for u in stored_users(art) for _, _, a in stored(art, u))
    received = sum((a or "").startswith("<-") for u in stored_users(art) for _, _, a in stored(art, u))
    assert own == received == m["events"]["total"]


def _two_way(rows: list[tuple[str, str, str, int]], tmp_path: Path) -> tuple[Timelines, np.ndarray, dict[str, int]]:
    body = "".join(f"{s},{d},{a},{t}\n" for s, d, a, t in rows)
    log = load_social(_write(tmp_path, "src,dst,action,timestamp\n" + body))
    users = {u: n + 2 for n, u in enumerate(sorted(set(log.src) | set(log.dst)))}
    acts = {"x": 2, "<-x": 3}
    tl, row = Timelines.both_directions(
        log.src,
        log.dst,
        src_index=np.array([users[u] for u in log.src]),
        dst_index=np.array([users[u] for u in log.dst]),
        actions=np.array([acts[a] for a in log.action]),
        incoming_actions=np.array([acts["<-" + a] for a in log.action]),
        times=log.time,
    )
    return tl, row, users


def test_two_way_windows_hold_what_others_did_before_and_never_at_the_same_second(tmp_path: Path) -> None:
    # b acts on a at 1; a on c at 2; d on a at 3 and a on d at 3 (same second: d's step is not a's history yet);
    # a on b at 4 is the query.
    tl, row, u = _two_way(
        [("b", "a", "x", 1), ("a", "c", "x", 2), ("d", "a", "x", 3), ("a", "d", "x", 3), ("a", "b", "x", 4)], tmp_path
    )
    targets, actions, _ = tl.window(row[[3, 4]], 5)
    assert [x for x in targets[0].tolist() if x] == [u["b"], u["c"]]  # a->d at 3: d->a at 3 not yet seen
    assert [x for x in targets[1].tolist() if x] == [u["b"], u["c"], u["d"], u["d"]]
    assert [x for x in actions[1].tolist() if x] == [3, 2, 2, 3]  # own steps before received ones at 3
    assert tl.earlier(row[[0]]).tolist() == [0]  # b's first event: nothing before it


def test_most_recent_contact_finds_who_reached_out(tmp_path: Path) -> None:
    # c acted on a after a last acted: "most recent" cannot rank c, the contact baseline ranks it first.
    tl_rows = [("a", "b", "x", 1), ("c", "a", "x", 2), ("a", "c", "x", 3)]
    tl2, row, u = _two_way(tl_rows, tmp_path)
    log = load_social(tmp_path / "log.csv")
    tgt = np.array([u[d] for d in log.dst])
    own = Timelines(log.src, tgt, np.zeros(len(log), dtype=np.int64), log.time)
    pool = torch.ones(len(u) + 2, dtype=torch.bool)
    pool[:2] = False
    qs = QuerySet(
        np.array([2]),
        torch.tensor([u["c"]]),
        torch.tensor([u["a"]]),
        torch.tensor([False]),
        torch.from_numpy(log.time[[2]]),
        pool,
    )
    b = Baselines(own, torch.from_numpy(tgt), log.time, len(u) + 2, contacts=tl2, contact_row=row)
    assert evaluate_scorer(qs, b.most_recent_contact(qs))["all"]["MRR"] == 1.0
    assert evaluate_scorer(qs, b.most_recent(qs))["all"]["MRR"] < 1.0


def test_loader_reads_the_service_export_columns(tmp_path: Path) -> None:
    log = load_social(_write(tmp_path, "user_id,item_id,timestamp,action\na,b,1,x\nb,a,2,y\n"))
    assert list(log.src) == ["a", "b"] and list(log.dst) == ["b", "a"]


REAL = SHARED_DATA / "mathoverflow" / "mathoverflow_interactions.csv.gz"


@pytest.mark.skipif(not REAL.is_file(), reason=f"MathOverflow log not found at {REAL} (../shared/data)")
def test_mathoverflow_protocol_counts() -> None:
    log = load_social(REAL)
    p = Periods.of(len(log))
    known = set(log.src[: p.test]) | set(log.dst[: p.test])
    q = period_queries(log, p.test, len(log))
    assert (len(log), len(known), len(q.event)) == (390_414, 21_931, 27_372)
    assert 0.53 < q.repeat.mean() < 0.55


def test_a_budget_too_small_for_every_query_validates_a_sample_and_tests_until_its_deadline(
    social_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each epoch validates a seeded sample sized to the budget; a budget spent before the test scores one
    batch of its queries, in a seeded order, the same for all scorers; metrics.json says how many of how
    many (a warm retrain's 30 s took 100 s on MathOverflow with neither)."""
    from tests.conftest import TINY_SOCIAL, run_job

    monkeypatch.setattr("training.jobs.social.COST_SAMPLE", 20)  # the sample's floor, under the tiny log's count
    overrides = [*TINY_SOCIAL, "train.epochs=1", "train.refit_epochs=0", "train.max_minutes=0.0001"]
    folder = run_job([*overrides, "eval.every_query_s=0", "eval.batch_size=16"], tmp_path, social_file)
    m = json.loads((folder / "metrics.json").read_text())
    assert m["queries"]["valid_scored"] == 20 < m["queries"]["valid"]
    assert m["history"]["val"][0]["n"] == 20
    assert m["queries"]["test_scored"] == 16 < m["queries"]["test"]
    assert m["test"]["all"]["n"] == 16 and {b["all"]["n"] for b in m["baselines_test"].values()} == {16}


def test_without_received_steps_histories_and_events_are_one_way(social_file: Path, tmp_path: Path) -> None:
    from models.engine import EngineOptions
    from models.tasks.social import SocialEngine
    from tests.conftest import TINY_SOCIAL, run_job

    folder = run_job(
        [*TINY_SOCIAL, "data.incoming=false", "train.epochs=1", "train.refit_epochs=0", "eval.baselines=false"],
        tmp_path,
        social_file,
    )
    art = load_artifact(folder)
    assert sorted(art.actions.raws()) == ["a2q", "c2a", "c2q"]
    assert not any((a or "").startswith("<-") for u in stored_users(art) for _, _, a in stored(art, u))
    assert SocialEngine(art, EngineOptions()).received_step("s1", "s2", "a2q") is None


def test_training_counts_recent_activity_as_serving_does(tiny_social_artifact: Path, social_file: Path) -> None:
    from models.engine import EngineOptions
    from models.tasks.recommend import RecQuery
    from models.tasks.social import SocialEngine, SocialExtra
    from tests.conftest import TINY_SOCIAL
    from training.config import read_raw
    from training.jobs.social import SocialJob

    job = SocialJob(SocialJob.parse_config(read_raw(None, [*TINY_SOCIAL, f"data.path='{social_file}'"])))
    job.prepare_data()
    art = load_artifact(latest_versions(tiny_social_artifact)["social-tiny"])
    engine = SocialEngine(art, EngineOptions(trace=False))

    def both(events: np.ndarray) -> tuple[dict, dict]:
        """The training batch's counts and the engine's for the same queries, by (query, user)."""
        b = job.batch(events, art.model)
        assert b.activity_index is not None and b.activity_counts is not None
        trained = {
            (int(r), int(u)): c.tolist()
            for (r, u), c in zip(b.activity_index.T.tolist(), b.activity_counts, strict=True)
        }
        # Each query as the history the training example holds (the stored one runs past these times).
        targets, actions, times = job.steps.window(job.step_row[events], art.model.config.max_history)
        queries = [
            RecQuery(
                None,
                [
                    (art.users.raw(int(x)) or "", float(t), art.actions.raw(int(a)))
                    for x, a, t in zip(targets[n].tolist(), actions[n].tolist(), times[n].tolist(), strict=True)
                    if x
                ],
                k=3,
                as_of=float(job.log.time[e]),
            )
            for n, e in enumerate(events)
        ]
        prepared = engine.prepare(queries, {})
        engine.add_recent(prepared, [])
        served = {}
        for n, p in enumerate(prepared):
            assert isinstance(p.extra, SocialExtra) and p.extra.activity is not None
            served |= {
                (n, int(u)): c.tolist() for u, c in zip(p.extra.activity.users, p.extra.activity.counts, strict=True)
            }
        return trained, served

    events = np.array([40, 700, 1300, len(job.log) - 1])
    trained, served = both(events)
    assert served == trained and len(trained) > 10
    b = job.batch(events, art.model)
    # A batch whose histories are all shorter than the 3 contacts: every step's target counts.
    short = np.flatnonzero(job.steps.earlier(job.step_row) == 2)[:2]
    assert len(short) == 2
    short_trained, short_served = both(short)
    assert short_served == short_trained and short_trained
    # By hand for one query: the events of the hour and of the day strictly before it, per user:
    # received, made, with a target of the actor's newest 3 steps, then received and made per action.
    e, hour, day = int(events[2]), 3600.0, 86400.0
    t = float(job.log.time[e])
    contacts = {int(x) for x in b.targets[2, -3:].tolist()} - {0}
    by_hand: dict[int, list[float]] = {}

    def add(u: int, side: int, age: float) -> None:
        if u >= 2:  # known to the model
            c = by_hand.setdefault(u, [0.0] * 2 * (3 + 2 * 3))
            c[2 * side + 1] += 1
            c[2 * side] += age < hour

    for i in range(len(job.log)):
        age = t - float(job.log.time[i])
        if 0 < age < day:
            src, dst, act = int(job.src[i]), int(job.tgt[i]), int(job.act[i]) - 2
            add(dst, 0, age)
            add(src, 1, age)
            if src in contacts:
                add(dst, 2, age)
            if dst in contacts:
                add(src, 2, age)
            add(dst, 3 + act, age)
            add(src, 6 + act, age)
    assert {u: c for (n, u), c in trained.items() if n == 2} == by_hand


def _windows_on(log: Path, unit: str) -> tuple[list[float], float]:
    from training.config import read_raw
    from training.jobs.social import SocialJob

    raw = read_raw(None, ["model.kind='social'", "model.activity=[0.5, 2.0]", f"model.activity_unit='{unit}'"])
    job = SocialJob(SocialJob.parse_config(raw), data_path=log)
    job.prepare_data()
    return job.build_model().config.activity, job.median_gap


def test_activity_windows_in_median_gaps_follow_the_network_s_clock(social_file: Path, tmp_path: Path) -> None:
    """The same network on a clock ten times slower gets windows ten times wider: the features the model
    counts are the same, where windows in seconds would count ten times fewer events."""
    windows, gap = _windows_on(social_file, "median_gap")
    assert gap > 0 and windows == pytest.approx([0.5 * gap, 2.0 * gap])
    slow = tmp_path / "slow.csv"
    lines = social_file.read_text().splitlines()
    rows = [line.rsplit(",", 1) for line in lines[1:]]
    slow.write_text("\n".join([lines[0], *(f"{head},{int(t) * 10}" for head, t in rows)]) + "\n")
    slow_windows, slow_gap = _windows_on(slow, "median_gap")
    assert slow_gap == pytest.approx(10 * gap) and slow_windows == pytest.approx([10 * w for w in windows])
    assert _windows_on(slow, "second")[0] == [0.5, 2.0]  # seconds stay seconds
    with pytest.raises(ValueError, match="activity_unit"):
        _windows_on(social_file, "hours")
