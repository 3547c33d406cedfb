"""Shared fixtures: tiny generated interaction logs and a tiny trained artifact."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

import models.tasks  # noqa: F401  (the tests' program loads the task table, as the service and training do)
from training.data import Interactions
from training.data.interactions import per_user

# `--fast` (scripts/test.sh --fast, the edit-run cycle) leaves out the tests that start processes: marked
# slow, asking for a Redis server or cluster, or in a module whose tests start servers, jobs or browsers.
PROCESS_FIXTURES = frozenset({"redis_server", "redis_cluster", "redis_cluster_nodes", "backend", "histories", "state"})
PROCESS_MODULES = frozenset(
    {
        "test_browser.py",
        "test_durability.py",
        "test_server.py",
        "test_balancer.py",
        "test_distributed.py",
        "test_history_shares.py",
        "test_memory.py",
        "test_smoke.py",
        "test_gpu.py",
        "test_secrets.py",
        "test_retrainer.py",
        "test_redis_cluster.py",
        "test_real_data.py",
    }
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="only the tests that start no server, job or Redis")


def starts_processes(item: pytest.Item) -> bool:
    return (
        item.get_closest_marker("slow") is not None
        or bool(PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())))
        or item.path.name in PROCESS_MODULES
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --fast, the tests that start processes are deselected. Under `-n N --dist worksteal` each
    worker starts on a contiguous share of the collection, cut as xdist cuts it, and later ones take the
    tail of the longest queue: so each share here begins with its part of the tests marked slow, and no
    long test is left to run alone at the end (docs/decisions/test-suite-time.md). The order within each
    group is kept."""
    if config.getoption("--fast"):
        left_out = [item for item in items if starts_processes(item)]
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not starts_processes(item)]
    n = getattr(config.option, "numprocesses", None)
    workers = n if isinstance(n, int) and n > 1 else 1
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    order: list[pytest.Item] = []
    left = len(items)
    for w in range(workers):
        size = left // (workers - w)  # xdist's cut: what is left, shared among the workers left
        mine = slow[w::workers]
        order += mine + fast[: size - len(mine)]
        fast = fast[size - len(mine) :]
        left -= size
    items[:] = order + fast


if os.environ.get("PYTEST_XDIST_WORKER"):
    # scripts/test.sh runs a process per core: one intra-op thread each, in this process and in the jobs and
    # servers it starts, or two threads per core spin against each other (the copy task took 114 s so).
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CONFIGS = Path(__file__).resolve().parents[1] / "training" / "configs"

# Items 10..39 released in year 1990 + (item % 10); user timestamps in 1995..1999.
N_ITEMS = 30
YEAR = 365 * 24 * 3600


def stored(art: object, user: str) -> list[tuple[str, float, str | None]]:
    """An artifact's stored history of `user`: (raw id, time, action), oldest first."""
    ids = getattr(art, "items", None) or art.users  # type: ignore[attr-defined]
    return art.histories.timeline(user, ids, getattr(art, "actions", None))  # type: ignore[attr-defined, no-any-return]


def stored_users(art: object) -> list[str]:
    return list(art.histories.users())  # type: ignore[attr-defined]


def synthetic_log(n_users: int = 40, seed: int = 0) -> list[tuple[str, str, int]]:
    """(user, item, unix time) rows where each user walks the items in a cycle: learnable."""
    rng = random.Random(seed)
    rows = []
    for u in range(n_users):
        start = rng.randrange(N_ITEMS)
        t0 = 25 * YEAR + rng.randrange(4 * YEAR)  # 1995..1999
        for step in range(rng.randrange(6, 14)):
            item = 10 + (start + step) % N_ITEMS
            rows.append((f"u{u}", str(item), t0 + step * 3600))
    rng.shuffle(rows)  # files are not chronological; loaders must sort
    return rows


@pytest.fixture(autouse=True)
def _private_history_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's service gets its own SQLite history file (the default path is under the repo)."""
    monkeypatch.setenv("SEQSERVE_HISTORY_PATH", str(tmp_path / "history.sqlite3"))


@pytest.fixture
def redis_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real redis-server on a free loopback port, killed after the test."""
    from tests.servers import RedisServer

    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.kill()


@pytest.fixture(scope="session")
def redis_cluster_nodes(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real Redis Cluster (three primaries, a replica each) on loopback, shared by a worker's tests."""
    from tests.servers import redis_cluster_nodes as cluster

    nodes = cluster(tmp_path_factory.mktemp("cluster")).start()
    yield nodes
    nodes.stop()


@pytest.fixture
def redis_cluster(redis_cluster_nodes):  # type: ignore[no-untyped-def]
    """The shared cluster, emptied for this test."""
    redis_cluster_nodes.flush()
    return redis_cluster_nodes


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RecBole-style dataset folder (.inter + .item with titles, release years and genres)."""
    d = tmp_path_factory.mktemp("synthetic")
    with (d / "syn.inter").open("w") as f:
        f.write("user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
        for u, i, t in synthetic_log():
            f.write(f"{u}\t{i}\t5\t{t}\n")
    with (d / "syn.item").open("w") as f:
        f.write("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n")
        for i in range(10, 10 + N_ITEMS):
            f.write(f"{i}\tItem {i}\t{1990 + i % 10}\tGenre{i % 3} Genre{3 + i % 2}\n")
    return d


def run_job(overrides: list[str], out: Path, data: Path | None = None, config: Path | None = None) -> Path:
    """Run the training job a config names (through the task table, as the CLI does); its artifact folder."""
    from training.config import kind_of, read_raw
    from training.jobs import job_for_kind

    raw = read_raw(config, overrides)
    job = job_for_kind(kind_of(raw))
    folder = job(job.parse_config(raw), out_root=out, data_path=data).run()
    assert folder is not None
    return folder


TINY_REC = [
    "model.max_len=16",
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=32",
    "train.epochs=3",
    "train.batch_size=16",
    "train.patience=5",
    "eval.n_negatives=10",
]


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory: pytest.TempPathFactory, synthetic_dir: Path) -> Path:
    """An artifacts root holding one SASRec and one BERT4Rec trained on the synthetic log."""
    root = tmp_path_factory.mktemp("artifacts")
    run_job(["model.kind='sasrec'", "name='sasrec-tiny'", "model.n_negatives=8", *TINY_REC], root, synthetic_dir)
    run_job(["model.kind='bert4rec'", "name='bert4rec-tiny'", *TINY_REC], root, synthetic_dir)
    return root


@pytest.fixture(scope="session")
def tiny_location_artifact(
    tmp_path_factory: pytest.TempPathFactory, tiny_artifacts: Path, staypoint_file: Path
) -> Path:
    """A root with the tiny recommenders and a tiny MHSA (copy head)."""
    import shutil

    root = tmp_path_factory.mktemp("artifacts-all")
    shutil.copytree(tiny_artifacts, root, dirs_exist_ok=True)
    run_job(
        [
            "model.kind='mhsa'",
            "name='mhsa-tiny'",
            "model.d_model=16",
            "model.n_heads=2",
            "model.d_ff=32",
            "model.n_layers=1",
            "model.pointer=true",
            "train.epochs=2",
            "train.batch_size=32",
            "train.novel_as_unknown=true",
            "train.clip_grad_norm=1.0",
        ],
        root,
        staypoint_file,
    )
    return root


def synthetic_staypoints(n_users: int = 4, days: int = 40, seed: int = 0) -> list[list[object]]:
    """GeoLife-format rows: each user alternates home (morning) and work (day), some new places."""
    rng = random.Random(seed)
    rows: list[list[object]] = []
    n = 0
    for u in range(1, n_users + 1):
        for day in range(days):
            stays = ((f"home{u}", 420, 600), (f"work{u % 2}", 540, 480), (f"p{rng.randrange(30)}", 1200, 60))
            for loc, start, dur in stays:
                rows.append([n, u, loc, dur, day, day, start, (start + dur) % 1440, day % 7])
                n += 1
    return rows


@pytest.fixture(scope="session")
def staypoint_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("geo") / "staypoints.csv"
    with p.open("w") as f:
        f.write("id,user_id,location_id,duration,start_day,end_day,start_min,end_min,weekday\n")
        for r in synthetic_staypoints():
            f.write(",".join(str(v) for v in r) + "\n")
    return p


def synthetic_social(n_users: int = 30, events: int = 1500, seed: int = 0) -> list[tuple[str, str, str, int]]:
    """(src, dst, action, unix time) rows: each user mostly returns to two friends, sometimes someone new."""
    rng = random.Random(seed)
    friends = {u: [(u + 1) % n_users, (u + 7) % n_users] for u in range(n_users)}
    rows = []
    t = 1_400_000_000
    for _ in range(events):
        u = rng.randrange(n_users)
        v = rng.choice(friends[u]) if rng.random() < 0.8 else rng.randrange(n_users)
        t += rng.randrange(60, 7200)
        rows.append((f"s{u}", f"s{v}", rng.choice(["a2q", "c2q", "c2a"]), t))
    return rows


@pytest.fixture(scope="session")
def social_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("social") / "social.csv"
    with p.open("w") as f:
        f.write("src,dst,action,timestamp\n")
        for r in synthetic_social():
            f.write(",".join(str(v) for v in r) + "\n")
    return p


TINY_SOCIAL = [
    "model.kind='social'",
    "name='social-tiny'",
    "model.emb_dim=8",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=16",
    "model.max_history=8",
    "model.positions='time'",
    "model.activity=[3600.0, 86400.0]",
    "model.activity_contacts=3",
    "model.activity_per_action=true",
    "model.activity_by_user=true",
    "model.activity_hidden=8",
    "train.epochs=2",
    "train.batch_size=64",
    "train.refit_epochs=1",
    "data.name='tinysocial'",
]


@pytest.fixture(scope="session")
def tiny_social_artifact(tmp_path_factory: pytest.TempPathFactory, social_file: Path) -> Path:
    root = tmp_path_factory.mktemp("artifacts-social")
    run_job(TINY_SOCIAL, root, social_file)
    return root


def item_lists(data: Interactions) -> list[list[str]]:
    """Each user's raw item ids, oldest first."""
    return per_user([data.item_ids[i] for i in data.items.tolist()], data.ends)


def time_lists(data: Interactions) -> list[list[float]]:
    return per_user(data.times.tolist(), data.ends)
