"""The benchmarks that start servers, each run once on the tiny artifacts so none rots unnoticed."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models.artifact import latest_versions
from tests.servers import ROOT, free_port


def _run(module: str, *args: str, timeout: float = 240) -> str:
    """`python -m bench.<module> ARGS` from the checkout's root, as docs/BENCHMARKS.md runs them."""
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_compare_alternates_two_variants_one_logging_every_request(tiny_artifacts: Path, tmp_path: Path) -> None:
    """A variant at INFO writes a line per request: its server must never block on its own output."""
    out = tmp_path / "compare.json"
    _run(
        "serving.compare",
        *("--artifacts", str(tiny_artifacts), "--models", "sasrec-tiny", "--paths", "/recommend"),
        *("--concurrency", "4", "--rounds", "2", "--seconds", "1", "--warmup", "0.2"),
        *("--variant", "quiet", "--variant", "logged:SEQSERVE_LOG_LEVEL=INFO"),
        *("--port", "0", "--out", str(out)),  # each variant on a port free when it starts
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["quiet", "logged"]
    assert all(r["rps"] > 0 and r["errors"] == 0 for r in rows)


@pytest.mark.slow
def test_hostile_attacks_report_what_they_measured(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    _run(
        "serving.hostile",
        *("--artifacts", str(tiny_artifacts), "--model", "sasrec-tiny"),
        *("--attacks", "bodies-in-flight", "half-open", "--bodies", "3", "--half-open", "20"),
        *("--port", str(free_port()), "--out", str(out)),
    )
    found = json.loads(out.read_text())
    assert found["bodies-in-flight"]["connections"] == 3 and found["bodies-in-flight"]["rss_mb_peak"] > 0
    assert found["half-open"]["other_client"]["healthz"] == 200


def test_inprocess_drives_the_app_without_sockets(tiny_artifacts: Path) -> None:
    text = _run(
        "serving.inprocess",
        *("--artifacts", str(tiny_artifacts), "--model", "sasrec-tiny", "--path", "/recommend"),
        *("--concurrency", "4", "--requests", "64", "--canned"),
    )
    assert "req/s in-process" in text and "loop thread" in text


def test_online_memory_reports_bytes_per_user_and_scores_every_list() -> None:
    report = json.loads(_run("production.online_memory", "--users", "2000", "--k", "10"))
    assert report["left_after_scoring"] == 0  # one arrival per user scored each user's list
    assert 100 < report["bytes_per_active_user"] < 5000


def test_the_heavy_log_is_carried_by_few_users_who_never_take_an_item_twice() -> None:
    from bench.production.heavy_log import describe, heavy_log

    df = heavy_log(users=40, series=60, seed=3)
    assert not df.duplicated(["user_id", "item_id"]).any() and df["timestamp"].is_monotonic_increasing
    said = describe(df)
    assert said["last_fifth_users"] < said["users"] and said["last_fifth_top5_share"] > 5 / said["last_fifth_users"]
    assert heavy_log(users=40, series=60, seed=3).equals(df)  # the seed makes the log


def test_probation_aa_counts_false_rollbacks_and_finds_a_far_worse_side(tmp_path: Path) -> None:
    """On lists whose users differ a lot, the same version is rarely found worse; a hundredth of it always."""
    import pandas as pd

    rng = random.Random(0)
    rows = [(n, f"u{n % 60}", rng.choice([0.0, 1.0, 0.63]) * (0.2 + (n % 60) / 60)) for n in range(3000)]
    lists = tmp_path / "lists.csv"
    pd.DataFrame(rows, columns=["row", "user_id", "ndcg10"]).to_csv(lists, index=False)
    out = tmp_path / "aa.json"
    _run("production.probation_aa", "--lists", str(lists), "--splits", "40", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["same"]["found_worse"] <= 4 and report["hundredfold_worse"]["share"] == 1.0


def test_gen_log_writes_the_rows_asked_for_as_csv_and_parquet(tmp_path: Path) -> None:
    import pandas as pd

    _run(
        "scale.gen_log",
        "--rows",
        "3000",
        "--users",
        "40",
        "--items",
        "200",
        "--part-rows",
        "1000",
        "--out",
        str(tmp_path),
    )
    csv = pd.read_csv(tmp_path / "log.csv")
    parts = sorted((tmp_path / "parquet").glob("*.parquet"))
    assert len(csv) == 3000 and list(csv.columns) == ["user_id", "item_id", "timestamp"]
    assert len(parts) == 3 and sum(len(pd.read_parquet(p)) for p in parts) == 3000
    assert csv["user_id"].nunique() <= 40 and csv["item_id"].nunique() <= 200


@pytest.mark.slow
def test_catalog_scaling_times_each_catalog_and_a_trained_artifact(tiny_artifacts: Path) -> None:
    from models.artifact import latest_versions

    text = _run("scale.catalog_scaling", "--items", "2000", "--batch", "4", "--threads", "1", "--repeats", "1")
    assert "2000" in text.replace(",", "")
    version = latest_versions(tiny_artifacts)["sasrec-tiny"]
    out = _run("scale.catalog_scaling", "--artifact", str(version), "--batch", "4", "--users", "8", "--repeats", "1")
    assert "floor_us_per_query" in out and "with_floor_over_without" in out


def test_rec_table_prints_the_model_beside_its_baselines(tiny_artifacts: Path) -> None:
    from models.artifact import latest_versions

    versions = latest_versions(tiny_artifacts)
    text = _run("training.rec_table", str(versions["sasrec-tiny"]), str(versions["bert4rec-tiny"]))
    assert "sasrec-tiny" in text and "bert4rec-tiny" in text and "transitions" in text


@pytest.mark.slow
def test_transition_width_scores_validation_by_width_and_weight(
    tiny_artifacts: Path, synthetic_dir: Path, tmp_path: Path
) -> None:
    from models.artifact import latest_versions

    config = tmp_path / "c.toml"
    config.write_text('name = "x"\n[model]\nkind = "sasrec"\n')
    for model in ("sasrec-tiny", "bert4rec-tiny"):  # any next-item scorer takes the prior
        version = latest_versions(tiny_artifacts)[model]
        args = ("--config", str(config), "--data", str(synthetic_dir), "--widths", "0", "4")
        text = _run("training.transition_width", str(version), *args)
        assert "width 0: 0: " in text and "width 4: 0: " in text and "| 3: " in text, text


@pytest.mark.slow
def test_train_speed_times_the_jobs_loop_in_each_tree_and_compares_them(synthetic_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('name = "x"\n[model]\nkind = "sasrec"\nmax_len = 8\nd_model = 8\n[train]\nbatch_size = 4\n')
    out = tmp_path / "speed.json"
    root = str(Path(__file__).resolve().parents[2])
    args = ("--config", str(config), "--data", str(synthetic_dir), "--batches", "3", "--warmup", "1", "--rounds", "1")
    _run("training.train_speed", *args, "--variant", f"a:{root}", "--variant", f"b:{root}", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["a"]["ratio"] == 1.0 and report["b"]["ratio"] > 0
    assert [r["windows"] for r in report["b"]["runs"]] == [12]  # 3 batches of 4, one round


def test_eval_cost_times_every_scorer_in_each_tree(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    root = str(Path(__file__).resolve().parents[2])
    args = ("--items", "3000", "--users", "300", "--scored", "50", "--rounds", "1", "--threads", "1")
    _run("training.eval_cost", *args, "--variant", f"a:{root}", "--variant", f"b:{root}", "--out", str(out))
    report = json.loads(out.read_text())["report"]
    assert set(report["b"]["ms_per_user"]) == {"network", "popularity", "transitions", "item_knn"}
    assert set(report["b"]["fit_s"]) == {"popularity", "transitions", "item_knn"}
    assert all(m["ratio"] == 1.0 for part in report["a"].values() for m in part.values())
    assert all(m["median"] > 0 for part in report["b"].values() for m in part.values())


@pytest.mark.slow
def test_load_measures_the_ceiling_the_no_op_and_the_service(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    _run(
        "serving.load",
        *("--artifacts", str(tiny_artifacts), "--models", "sasrec-tiny", "--modes", "raw", "noop", "batched"),
        *("--concurrency", "2", "--seconds", "1", "--warmup", "0.2", "--idle-seconds", "0.5"),
        *("--port", str(free_port()), "--out", str(out)),
    )
    rows = json.loads(out.read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert {r["mode"] for r in rows} >= {"raw", "noop", "batched"}
    assert all(r["rps"] > 0 and r.get("errors", 0) == 0 for r in rows)


@pytest.mark.slow
def test_scale_serve_starts_the_service_on_a_synthetic_user_count(tiny_artifacts: Path, tmp_path: Path) -> None:
    text = _run(
        "scale.scale_serve",
        *("--artifact", str(tiny_artifacts / "sasrec-tiny"), "--users", "500", "--events", "5", "--workers", "1"),
        *("--requests", "50", "--seconds", "1", "--no-cold", "--work", str(tmp_path / "work")),
    )
    assert "| 500 |" in text.replace(",", "")


def test_social_activity_chooses_on_validation_and_scores_test(tiny_social_artifact: Path, social_file: Path) -> None:
    from models.artifact import latest_versions

    (version,) = latest_versions(tiny_social_artifact).values()
    text = _run("training.social_activity", "--choose-on", str(version), "--data", str(social_file))
    assert "| model |" in text and "model +" in text


@pytest.fixture(scope="module")
def rated_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated log in ml-100k's .inter layout (user, item, rating, time), what the replay benches read."""
    import pandas as pd

    folder = tmp_path_factory.mktemp("rated")
    _run(
        "scale.gen_log",
        *("--rows", "3000", "--users", "100", "--items", "300", "--formats", "csv"),
        "--out",
        str(folder),
    )
    df = pd.read_csv(folder / "log.csv")
    df.insert(2, "rating", 5)
    df.columns = ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]
    df.to_csv(folder / "log.inter", sep="\t", index=False)
    return folder / "log.inter"


@pytest.mark.slow
def test_replay_then_interleave_power_on_the_models_it_trained(rated_log: Path, tmp_path: Path) -> None:
    """The replay's online figures equal its own computation; interleave_power then reuses its --work folder
    (the two trained models), as docs/BENCHMARKS.md runs them."""
    out, work = tmp_path / "replay.json", tmp_path / "work"
    _run(
        "production.replay",
        *("--data", str(rated_log), "--minutes", "0.02", "--warm-minutes", "0.02", "--min-events", "20"),
        *("--workers", "1", "--decide-s", "0.5", "--port", str(free_port()), "--work", str(work), "--out", str(out)),
        timeout=400,
    )
    report = json.loads(out.read_text())
    assert report["errors"] == 0 and report["online"]
    # On a busy box the scoring loop can fall behind a user's quick answers and evict lists unscored;
    # the service then counts them, and that is the only way its figures may differ from the bench's.
    assert report["equal"] is True or report["unscored"], report["online"]
    out = tmp_path / "power.json"
    trained = sorted(p.name for p in work.glob("*/sasrec-ml100k/2*"))
    _run(
        "production.interleave_power",
        *("--data", str(rated_log), "--work", str(work), "--block", "150", "--max-events", "300"),
        *("--port", str(free_port()), "--out", str(out)),
        timeout=400,
    )
    assert set(p.name for p in work.glob("*/sasrec-ml100k/2*")) <= set(trained)  # the replay's models, no new one
    modes = json.loads(out.read_text())["modes"]
    assert [len(modes[m]["blocks"]) for m in ("canary", "interleave")] == [2, 2]
    assert all(m["errors"] == 0 for m in modes.values())
    assert {"difference", "half_width"} <= set(modes["canary"]["blocks"][-1])
    assert modes["interleave"]["blocks"][-1]["answers"] > 0 and "e_value" in modes["interleave"]["blocks"][-1]
    # The loop running itself on the replay's live version: both runs, every quarter, a broken version in.
    out = tmp_path / "loop.json"
    live = min(p for p in (work / "arts" / "sasrec-ml100k").glob("2*") if not p.name.startswith("2000"))
    _run(
        "production.loop_replay",
        *("--data", str(rated_log), "--live", str(live), "--rate", "300"),
        *("--warm-minutes", "0.02", "--retrain-events", "100", "--min-events", "20", "--probation-lists", "20"),
        *("--workers", "1", "--shards", "4", "--port", str(free_port()), "--work", str(tmp_path / "loop")),
        *("--out", str(out)),
        timeout=400,
    )
    loop = json.loads(out.read_text())
    assert [len(q) for q in loop["quarters"]] == [3, 3, 3, 3] and loop["quarters"][0]["frozen"]["lists"] > 0
    assert loop["frozen"]["errors"] == 0 and loop["loop"]["errors"] == 0
    served = {p.name for p in (tmp_path / "loop" / "loop" / "arts" / "sasrec-ml100k").iterdir()} - {"20000101T000002Z"}
    assert loop["loop"]["broken"]["replaced"] in served  # the serving version's weights, shuffled, then promoted
    assert any("20000101T000002Z promoted (admin call)" in line for line in loop["loop"]["service_log"])


@pytest.mark.slow
def test_trial_cost_alternates_the_loop_and_each_trial_mode(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    version = latest_versions(tiny_artifacts)["sasrec-tiny"]
    other = tmp_path / "other" / "sasrec-tiny" / "20000101T000000Z"
    shutil.copytree(version, other)
    _run(
        "production.trial_cost",
        *("--live", str(version), "--candidate", str(other), "--concurrency", "1", "--rounds", "1"),
        *("--seconds", "0.5", "--port", "0", "--out", str(out)),
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["off", "loop", "canary", "interleave"]
    assert all(r["errors"] == 0 and r["rps"] > 0 for r in rows)


@pytest.mark.slow
def test_warm_retrain_publishes_a_version_and_tests_it_beside_a_cold_one(rated_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "warm.json"
    _run(
        "production.warm_retrain",
        *("--data", str(rated_log), "--events", "300", "--minutes", "0.02", "--cold-minutes", "0.02"),
        *("--port", str(free_port()), "--out", str(out)),
        timeout=400,
    )
    report = json.loads(out.read_text())
    assert report["warm"]["warm_start"]["items_kept"] > 0 and report["warm"]["version"]
    assert report["cold"]["test_ndcg10"] > 0 and report["warm_over_cold"] > 0


@pytest.mark.slow
def test_store_fill_measures_each_store_against_its_empty_fill(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "fill.json"
    _run(
        "production.store_fill",
        *("--artifacts", str(tiny_artifacts), "--model", "sasrec-tiny", "--stores", "sqlite"),
        *("--fills", "0", "500", "--queried", "5", "--per-user", "3", "--spread", "50"),
        *("--concurrency", "2", "--seconds", "0.5", "--warmup", "0.1", "--rounds", "1"),
        *("--port", str(free_port()), "--out", str(out)),
    )
    fills = json.loads(out.read_text())["fills"]["sqlite"]
    assert set(fills) == {"empty", "0", "500"} and fills["0"]["ratio_median"] == 1.0
    assert all(f["rps"][0] > 0 for f in fills.values())


@pytest.mark.slow
def test_retrain_beside_alternates_the_api_alone_and_beside_each_job(
    tiny_artifacts: Path, synthetic_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "beside.json"
    _run(
        "production.retrain_beside",
        *("--artifacts", str(tiny_artifacts), "--model", "sasrec-tiny", "--data", str(synthetic_dir)),
        *("--concurrency", "2", "--seconds", "0.5", "--warmup", "0.1", "--lead", "2", "--rounds", "1"),
        *("--port", str(free_port()), "--out", str(out)),
    )
    got = json.loads(out.read_text())["conditions"]
    assert set(got) == {"alone", "retrainer", "unbounded"} and all(c["errors"] == 0 for c in got.values())
    assert got["alone"]["job_cores"]["median"] == 0 and got["retrainer"]["job_cores"]["median"] > 0


@pytest.mark.slow
def test_redis_cluster_measures_appends_on_one_server_and_on_a_cluster(tiny_artifacts: Path, tmp_path: Path) -> None:
    from tests.servers import redis_binary

    redis_binary()  # skips (fails under CI) without redis-server
    out = tmp_path / "cluster.json"
    _run(
        "scale.redis_cluster",
        *("--artifacts", str(tiny_artifacts), "--models", "sasrec-tiny", "--writers", "2", "--seconds", "0.3"),
        *("--rounds", "1", "--compare-seconds", "0", "--out", str(out)),  # the req/s half is compare.py's run
    )
    report = json.loads(out.read_text())
    assert set(report["events"]) == {"one server", "cluster", "cluster, WAIT 1 replica"}
    assert all(e["events_per_s_median"] > 0 and e["errors"] == 0 for e in report["events"].values())
    assert report["events"]["one server"]["over_one_server"] == 1.0 and "recommend_by_user" not in report


def test_capacity_plan_follows_the_unit_costs_it_measured(tiny_artifacts: Path, tmp_path: Path) -> None:
    from models.artifact import latest_versions
    from tests.servers import redis_binary

    redis_binary()
    version = latest_versions(tiny_artifacts)["sasrec-tiny"]
    out = tmp_path / "capacity.json"
    args = ("--artifact", str(version), "--users", "1e6", "--events", "1e8", "--items", "1e5", "--out", str(out))
    _run("scale.capacity", *args)
    got = json.loads(out.read_text())
    units, plan = got["units"], got["plan"]
    assert units["table"]["bytes_per_step"] > 0 and units["redis"]["bytes_per_live_event"] > 0
    # The plan follows its units: the history table is users x bytes a user + events x bytes a step.
    table = (1e6 * units["table"]["bytes_per_user"] + 1e8 * units["table"]["bytes_per_step"]) / 1e9
    assert plan["artifact"]["history_table_gb"] == round(table, 1)
    assert plan["training"]["rate_is"] == "measured" and plan["api"]["hosts"] >= 1 and plan["redis"]["primaries"] >= 1


@pytest.mark.slow
def test_rank_shares_reports_each_rank_s_peak_and_the_pooled_test(tmp_path: Path) -> None:
    import pandas as pd

    from tests.conftest import TINY_REC, synthetic_log

    parts = tmp_path / "parts"
    parts.mkdir()
    log = pd.DataFrame(synthetic_log(), columns=["user_id", "item_id", "timestamp"])
    log.iloc[:200].to_parquet(parts / "part-0.parquet", index=False)
    log.iloc[200:].to_parquet(parts / "part-1.parquet", index=False)
    out = tmp_path / "shares.json"
    sets = [*TINY_REC, "train.epochs=1", "train.batch_size=4", "model.n_negatives=8", "data.name='syn'"]
    text = _run("scale.rank_shares", "--data", str(parts), "--settings", "1", "2", "--set", *sets, "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["ranks"], r["reads"], len(r["peak_rss_gb_by_rank"])) for r in rows] == [
        (1, "the whole log", 1),
        (2, "its share", 2),
    ]
    assert all(r["artifact_users"] == 40 and r["test_users"]["of"] == 40 for r in rows)
    assert all(p > 0 for r in rows for p in r["peak_rss_gb_by_rank"]) and "| 2 | its share |" in text
    assert set(rows[1]["rank0_peak_rss_gb_at_the_end_of"]) >= {"data", "training_loop", "evaluation"}


def test_eval_memory_reports_each_round_s_rss_in_each_tree(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    root = str(Path(__file__).resolve().parents[2])
    args = ("--items", "3000", "--scored", "100", "--weights", "2", "--rounds", "2")
    _run("training.eval_memory", *args, "--variant", f"a:{root}", "--variant", f"b:{root}", "--out", str(out))
    report = json.loads(out.read_text())
    assert set(report) == {"a", "b"}
    assert all(len(r["rss_gb"]) == len(r["seconds"]) == 2 and min(r["rss_gb"]) > 0 for r in report.values())
