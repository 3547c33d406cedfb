import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from models.artifact import latest_versions
from models.kinds import build_recommender
from models.tasks.recommend import load_artifact as load_rec_artifact
from tests.conftest import CONFIGS, TINY_REC, run_job, stored, stored_users
from training.config import kind_of, read_raw
from training.preflight import PreflightError, preflight


def test_artifact_contract(tiny_artifacts: Path) -> None:
    versions = latest_versions(tiny_artifacts)
    assert set(versions) == {"sasrec-tiny", "bert4rec-tiny"}
    for folder in versions.values():
        names = {p.name for p in folder.iterdir()}
        assert {
            "manifest.json",
            "model.pt",
            "items.json",
            "item_meta.json",
            "histories",
            "metrics.json",
            "run_config.json",
            "curves.png",
        } <= names
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["format_version"] == 1 and len(manifest["data"]["sha256"]) == 64
        assert {"full", "popularity", "uniform"} <= manifest["metrics"]["test"].keys()
        assert set(manifest["metrics"]["baselines_test"]) == {"popularity", "transitions", "item_knn"}
        # The same baselines on the users each epoch was validated on, under the validation protocol.
        valid = manifest["metrics"]["baselines_valid_per_epoch_users"]
        assert set(valid) == {"popularity", "transitions", "item_knn"}
        assert all(0.0 <= m["NDCG@10"] <= 1.0 and m["n"] > 0 for m in valid.values())
        art = load_rec_artifact(folder)
        assert art.items.n_entities == 30 and len(art.histories) == 40 and "users.json" not in names
        assert art.release_unit == "year"


def test_training_is_reproducible(tiny_artifacts: Path, synthetic_dir: Path, tmp_path: Path) -> None:
    again = run_job(
        ["model.kind='sasrec'", "name='sasrec-tiny'", "model.n_negatives=8", *TINY_REC], tmp_path, synthetic_dir
    )
    first = latest_versions(tiny_artifacts)["sasrec-tiny"]
    a = torch.load(first / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(again / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_config_overrides_and_unknown_keys(tmp_path: Path) -> None:
    from training.jobs.next_location import NextLocationJob
    from training.jobs.recommend import RecommendJob

    p = tmp_path / "c.toml"
    p.write_text("name='x'\n[model]\nkind='sasrec'\nd_model=8\n[train]\nepochs=2\n")
    cfg = RecommendJob.parse_config(read_raw(p, ["train.lr=0.01", "model.loss=bce", "train.refit_epochs=1"]))
    assert cfg.train.lr == 0.01 and cfg.train.epochs == 2 and cfg.model == {"d_model": 8, "loss": "bce"}
    assert cfg.train.refit_epochs == 1 and cfg.eval.protocol == "full"
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['epoch'\] in \[train\]"):
        RecommendJob.parse_config(read_raw(p, ["train.epoch=3"]))
    # Each task has its own sections: a next-location knob is not a recommender's.
    with pytest.raises(ValueError, match=r"\['novel_as_unknown'\] in \[train\]"):
        RecommendJob.parse_config(read_raw(p, ["train.novel_as_unknown=true"]))
    assert NextLocationJob.parse_config(read_raw(None, ["model.kind='mhsa'", "train.novel_as_unknown=true"]))
    with pytest.raises(ValueError, match=r"unknown protocol 'ful'"):
        RecommendJob.parse_config(read_raw(p, ["eval.protocol='ful'"]))
    with pytest.raises(ValueError, match=r"train\.device"):
        RecommendJob.parse_config(read_raw(p, ["train.device='gpu'"]))


def test_preflight_catches_a_model_that_sees_the_future() -> None:
    from models.sasrec import SASRec, SASRecConfig

    model = SASRec(SASRecConfig(vocab_size=20, max_len=8, d_model=8, n_heads=1, n_layers=1, d_ff=16))
    batch = torch.tensor([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]])
    preflight(model, batch, 20)  # a correct model passes
    model.encoder.causal = False  # the bug: bidirectional attention in a next-item model
    with pytest.raises(PreflightError, match="future"):
        preflight(model, batch, 20)


def test_cli_train_and_predict(tmp_path: Path, synthetic_dir: Path, tiny_artifacts: Path) -> None:
    import csv

    from training.__main__ import main

    folder = latest_versions(tiny_artifacts)["sasrec-tiny"]
    assert main(["predict", "--artifact", str(folder), "--k", "5", "--out", str(tmp_path)]) == 0
    out = next(tmp_path.glob("predictions_sasrec-tiny_k5_*.csv"))
    rows = list(csv.DictReader(out.open()))
    art = load_rec_artifact(folder)
    assert {r["user_id"] for r in rows} == set(stored_users(art))
    by_user: dict[str, list[str]] = {}
    for r in rows:
        by_user.setdefault(r["user_id"], []).append(r["item_id"])
    for user, items in by_user.items():
        seen = {i for i, _, _ in stored(art, user)}
        assert len(items) <= 5 and not seen & set(items)
        last_year = max(t for _, t, _ in stored(art, user)) // (365.25 * 86400) + 1970
        assert all(art.release[i] <= last_year for i in items)
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nkind='sasrec'\n")
    assert main(["train", "--config", str(cfg), "--data", str(bad), "--out", str(tmp_path)]) == 2
    cfg.write_text("[model]\nkind='nope'\n")
    assert main(["train", "--config", str(cfg), "--data", str(synthetic_dir), "--out", str(tmp_path)]) == 2


def test_a_cold_version_under_its_best_baseline_is_held_back_unless_it_is_the_first(
    tmp_path: Path, synthetic_dir: Path
) -> None:
    """The first training of a deployment has a gate too: under its run's best simple baseline (here a bound
    no tiny run reaches, 100x) the first version is published all the same (nothing else could serve; the
    service warns: tests/app/test_api.py), and a later one is held back (exit 3), the earlier serving."""
    from models.artifact import HELD, read_manifest, versions
    from training.__main__ import main

    config = CONFIGS / "sasrec_ml100k.toml"
    args = ["train", "--config", str(config), "--data", str(synthetic_dir), "--out", str(tmp_path / "arts")]
    args += [a for o in ["name='gated'", "train.max_minutes=0.05", *TINY_REC] for a in ("--set", o)]
    assert main([*args, "--gate", "100"]) == 0
    (first,) = versions(tmp_path / "arts" / "gated")
    assert "held_back" not in read_manifest(first).metrics
    assert main([*args, "--gate", "100"]) == 3
    assert versions(tmp_path / "arts" / "gated") == [first]
    (held,) = versions(tmp_path / "arts" / HELD / "gated")
    reason = read_manifest(held).metrics["held_back"]
    assert reason.endswith(f"under 100; {first.name} serves instead"), reason
    assert main([*args, "--gate", "0"]) == 0 and len(versions(tmp_path / "arts" / "gated")) == 2  # 0: never


def test_cli_reports_bad_model_keys(tmp_path: Path, synthetic_dir: Path) -> None:
    from training.__main__ import main

    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nkind='sasrec'\nd_modle=8\n")
    assert main(["train", "--config", str(cfg), "--data", str(synthetic_dir), "--out", str(tmp_path)]) == 2


def test_refit_adds_the_validation_items(synthetic_dir: Path, tmp_path: Path) -> None:
    from training.jobs.recommend import short_sequences
    from training.splits import leave_one_out

    split = leave_one_out([[2, 3, 4, 5], [6, 7]])
    assert split.test.histories == [[2, 3, 4]] and short_sequences(split) == [[6, 7]]
    folder = run_job(
        [
            "model.kind='sasrec'",
            "name='refit'",
            "model.n_negatives=8",
            *TINY_REC,
            "train.epochs=2",
            "train.refit_epochs=1",
        ],
        tmp_path,
        synthetic_dir,
    )
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["protocol"]["refit_epochs_with_validation_items"] == 1
    assert "1 refit epochs" in metrics["stopped"] and metrics["valid"]["full"]["n"] == 40


def test_lr_schedule_warms_up_then_decays_to_zero_at_the_last_epoch() -> None:
    from training.config import LoopConfig
    from training.loop import lr_schedule

    cfg = LoopConfig(epochs=2, lr=1.0, warmup_steps=4, schedule="cosine")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = lr_schedule(opt, cfg, steps_per_epoch=10)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert seen[4] == pytest.approx(1.0) and all(a >= b for a, b in itertools.pairwise(seen[4:]))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match=r"train\.schedule"):
        LoopConfig(schedule="linear")


def test_cosine_schedule_ends_with_the_time_budget_when_that_comes_first() -> None:
    from training.config import LoopConfig
    from training.distributed import Dist
    from training.loop import Budget, lr_schedule

    cfg = LoopConfig(epochs=100, lr=1.0, schedule="cosine", max_minutes=1.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    budget = Budget(cfg.max_minutes, Dist())
    sched = lr_schedule(opt, cfg, steps_per_epoch=10, budget=budget)
    lrs = []
    for spent in (0.0, 0.5, 0.999, 1.0):  # step 1..4 of 1,000: the clock, not the step count, decides
        budget.spent = spent
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[0] == pytest.approx(1.0, abs=1e-4) and lrs[1] == pytest.approx(0.5)
    assert lrs[2] == pytest.approx(0.0, abs=1e-4) and lrs[3] == pytest.approx(0.0, abs=1e-12)
    constant = lr_schedule(opt, LoopConfig(lr=1.0), steps_per_epoch=10, budget=budget)
    constant.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)  # a constant schedule ignores the clock


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_parse_and_recommenders_default_to_the_product_protocol(path: Path) -> None:
    from training.jobs import job_for_kind
    from training.jobs.recommend import RecommendJob

    raw = read_raw(path, [])
    job = job_for_kind(kind_of(raw))
    cfg = job.parse_config(raw)
    if job is RecommendJob:
        build_recommender(cfg.kind, {**cfg.model, "vocab_size": 100})
        # What /recommend serves is whole-catalog ranking: only configs named for the paper's
        # sampled protocol choose their epoch on it.
        paper = path.stem.endswith("_paper")
        assert (cfg.eval.protocol == "full") != paper, path.name
        assert cfg.name.endswith("-paper") == paper, path.name


def test_test_metrics_on_a_seeded_sample_of_users(synthetic_dir: Path, tmp_path: Path) -> None:
    """eval.test_users: the model and every baseline scored on the same sample, which metrics.json states."""
    overrides = [
        "model.kind='sasrec'",
        "name='sampled'",
        "model.n_negatives=8",
        *TINY_REC,
        "train.epochs=1",
        "eval.test_users=10",
    ]
    metrics = json.loads((run_job(overrides, tmp_path / "a", synthetic_dir) / "metrics.json").read_text())
    assert metrics["protocol"]["test_users"] == {"scored": 10, "of": 40, "sample": 10, "seed": 42}
    assert {m["n"] for m in metrics["test"].values()} == {10.0}
    assert {p["n"] for b in metrics["baselines_test"].values() for p in b.values()} == {10.0}
    assert {m["n"] for m in metrics["valid"].values()} == {10.0}
    phases = metrics["seconds"]
    assert set(phases) == {
        "data",
        "before_training",
        "training_loop",
        "after_training",
        "evaluation",
        "export_files",
        "after_data",
        "budget",
    }
    assert all(v >= 0 for v in phases.values()) and phases["budget"] == 30 * 60
    again = json.loads((run_job(overrides, tmp_path / "b", synthetic_dir) / "metrics.json").read_text())
    assert again["baselines_test"] == metrics["baselines_test"]  # the same users: seeded


def test_a_spent_budget_cuts_evaluation_to_whole_batches_of_the_same_users(synthetic_dir: Path, tmp_path: Path) -> None:
    """train.max_minutes covers the phases after the loop: with nothing left, validation and test score
    one batch of their seeded samples, the model and every baseline the same users, and say so (a phase
    planned under eval.every_user_s, here 0, would score everyone)."""
    overrides = ["model.kind='sasrec'", "name='spent'", *TINY_REC, "train.max_minutes=0.0001", "eval.batch_size=8"]
    overrides.append("eval.every_user_s=0")
    metrics = json.loads((run_job(overrides, tmp_path, synthetic_dir) / "metrics.json").read_text())
    assert metrics["protocol"]["test_users"] == {"scored": 8, "of": 40, "sample": 40, "seed": 42}
    assert metrics["protocol"]["valid_users"] == {"scored": 8, "of": 40}
    assert {m["n"] for m in metrics["test"].values()} == {8.0}
    assert {p["n"] for b in metrics["baselines_test"].values() for p in b.values()} == {8.0}
    assert metrics["protocol"]["baselines_valid_users"] == 8
    assert "time budget" in metrics["stopped"]
    assert metrics["seconds"]["budget"] == pytest.approx(0.006)
    everyone = json.loads((run_job(overrides[:-1], tmp_path, synthetic_dir) / "metrics.json").read_text())
    assert everyone["protocol"]["test_users"]["scored"] == everyone["protocol"]["valid_users"]["scored"] == 40


def test_predict_covers_every_task_that_keeps_user_histories(
    tmp_path: Path, tiny_social_artifact: Path, tiny_location_artifact: Path
) -> None:
    import csv

    from training.__main__ import main

    social = next(iter(latest_versions(tiny_social_artifact).values()))
    assert main(["predict", "--artifact", str(social), "--k", "3", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(next(tmp_path.glob("predictions_*_k3_*.csv")).open()))
    assert rows and {r["rank"] for r in rows} <= {"1", "2", "3"}
    places = latest_versions(tiny_location_artifact)["mhsa-tiny"]
    assert main(["predict", "--artifact", str(places), "--k", "3", "--out", str(tmp_path)]) == 2  # no stored users


def test_the_transition_prior_weight_is_chosen_on_validation_and_served(synthetic_dir: Path, tmp_path: Path) -> None:
    from models.tasks.recommend import load_artifact
    from tests.models.test_transitions import transition_table
    from training.jobs.recommend import RecommendJob, short_sequences

    overrides = [
        "model.kind='sasrec'",
        "name='prior'",
        "model.n_negatives=8",
        *TINY_REC,
        "train.epochs=1",
        "train.refit_epochs=1",
        "model.transition_width=4",
        "eval.transition_weights=[0.0, 1.0, 50.0]",
    ]
    folder = run_job(overrides, tmp_path, synthetic_dir)
    metrics = json.loads((folder / "metrics.json").read_text())
    tried = metrics["transition_prior_valid_ndcg10"]
    assert set(tried) == {"0", "1", "50"}
    art = load_artifact(folder)
    model = art.model
    best = max(tried.values())
    assert tried[f"{model.config.transition_weight:g}"] == best
    # With a prior, the test also scores the network alone, on the same users.
    if model.config.transition_weight:
        alone = metrics["test_network_alone"]
        assert set(alone) == set(metrics["test"]) and alone["full"]["n"] == metrics["test"]["full"]["n"]
        assert alone["full"]["MRR"] != metrics["test"]["full"]["MRR"]
    else:
        assert "test_network_alone" not in metrics
    assert min(w for w in (0.0, 1.0, 50.0) if tried[f"{w:g}"] == best) == model.config.transition_weight
    # The served table counts what test time knows: everything but the test items.
    job = RecommendJob(
        RecommendJob.parse_config(read_raw(None, overrides)), out_root=tmp_path / "x", data_path=synthetic_dir
    )
    job.prepare_data()
    known = job.split.test.histories + short_sequences(job.split)
    succ, logc = transition_table(known, model.config.vocab_size, width=4)
    assert torch.equal(model.successors, succ) and torch.equal(model.successor_log_counts, logc)


def test_the_prior_grid_goes_on_past_its_top_while_validation_rises(synthetic_dir: Path, tmp_path: Path) -> None:
    """The synthetic users walk the items in a cycle: counting is exact, so validation rises with the
    prior's weight until counting decides, and a grid that stops at 0.01 is extended."""
    from training.jobs.recommend import PRIOR_GRID_ROUNDS, PRIOR_GRID_STEP

    overrides = [
        "model.kind='sasrec'",
        "name='grid'",
        "model.n_negatives=8",
        *TINY_REC,
        "train.epochs=1",
        "model.transition_width=4",
        "eval.transition_weights=[0.0, 0.01]",
    ]
    metrics = json.loads((run_job(overrides, tmp_path, synthetic_dir) / "metrics.json").read_text())
    tried = {float(w): v for w, v in metrics["transition_prior_valid_ndcg10"].items()}
    assert tried[0.01] > tried[0.0] and len(tried) > 2
    # Each round is the three next weights up from the best so far, and one ends the grid by not
    # improving on the best (or the rounds run out).
    assert float(f"{0.01 * PRIOR_GRID_STEP:.3g}") in tried
    best = max(tried, key=lambda w: (tried[w], -w))
    assert best < max(tried) or len(tried) == 2 + 3 * PRIOR_GRID_ROUNDS


def test_the_plan_keeps_for_the_artifact_what_writing_its_bytes_takes(synthetic_dir: Path, tmp_path: Path) -> None:
    """A 30-minute budget on a small log keeps seconds for writing the artifact, not 3% of the budget
    (which at 50M rows held back 54 s for a 6-second write and cut the test short)."""
    from training.job import JobClock
    from training.jobs import recommend as rec

    overrides = ["model.kind='sasrec'", "name='plan'", *TINY_REC, "train.max_minutes=30"]
    job = rec.RecommendJob(
        rec.RecommendJob.parse_config(read_raw(None, overrides)), out_root=tmp_path, data_path=synthetic_dir
    )
    job.prepare_data()
    model = job.build_model()
    job.after_reserve(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    written = weights + rec.EXPORT_HISTORY_BYTES * job.data.n_interactions
    assert job.plan["export"] == pytest.approx(2.0 + written / rec.EXPORT_BYTES_PER_S)
    assert job.plan["export"] < rec.EXPORT_SHARE * 30 * 60 / 10
    # Over the cap (a budget of seconds), the evaluations give way, not the artifact's write.
    job.clock = JobClock(6.0)
    job.costs.test_user = 1.0
    job.after_reserve(model)
    assert job.plan["export"] == pytest.approx(rec.EXPORT_SHARE * 6.0)
    assert sum(job.plan.values()) == pytest.approx(rec.MAX_AFTER_SHARE * 6.0)


@pytest.mark.parametrize("loss", ["sampled_softmax", "softmax"])
def test_bf16_autocast_trains_on_the_cpu_as_it_does_on_cuda(loss: str, synthetic_dir: Path, tmp_path: Path) -> None:
    """train.precision='bf16' on the CPU runs the mixed-precision path CUDA training takes by default,
    so a dtype mismatch in a loss shows up where CI runs, not first on a GPU machine."""
    overrides = [*TINY_REC, "model.kind='sasrec'", f"model.loss='{loss}'", "model.n_negatives=8", "train.epochs=2"]
    overrides.append("train.precision='bf16'")
    folder = run_job([*overrides, f"name='bf16-{loss}'"], tmp_path, synthetic_dir)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["device"] == "cpu" and all(math.isfinite(x) for x in metrics["history"]["loss"])


def test_a_job_reads_a_log_by_the_column_mapping_in_its_config(tmp_path: Path) -> None:
    """A purchase log written by another engine (its own names, milliseconds, views among the rows) trains
    through `[data]`'s mapping; the views never reach the artifact."""
    import pandas as pd

    from tests.conftest import synthetic_log

    rows = [(u, i, t * 1000, "purchase") for u, i, t in synthetic_log()]
    rows += [(u, "999", t * 1000 + 1, "view") for u, _, t in synthetic_log(seed=1)[:50]]
    log = tmp_path / "purchases.csv"
    pd.DataFrame(rows, columns=["account", "product", "at_ms", "type"]).to_csv(log, index=False)
    mapping = ["data.user_column='account'", "data.item_column='product'", "data.time_column='at_ms'"]
    mapping += ["data.event_column='type'", "data.events=['purchase']", "data.time_unit='ms'", "data.name='shop'"]
    folder = run_job(["model.kind='sasrec'", "name='shop'", "model.n_negatives=8", *TINY_REC, *mapping], tmp_path, log)
    art = load_rec_artifact(folder)
    assert "999" not in art.items and len(stored_users(art)) == 40
    year = 365 * 24 * 3600
    assert 25 * year <= stored(art, "u0")[0][1] < 30 * year  # synthetic_log's 1995..1999, in seconds
    with pytest.raises(ValueError, match="go together"):
        run_job(["model.kind='sasrec'", "data.event_column='type'"], tmp_path, log)


def test_batch_prediction_obeys_a_filter_and_leaves_hidden_items_out(tmp_path: Path, tiny_artifacts: Path) -> None:
    import csv
    import json

    from training.__main__ import main

    folder = latest_versions(tiny_artifacts)["sasrec-tiny"]
    art = load_rec_artifact(folder)
    plain = tmp_path / "plain"
    assert main(["predict", "--artifact", str(folder), "--k", "5", "--out", str(plain)]) == 0
    shown = [r["item_id"] for r in csv.DictReader(next(plain.glob("*.csv")).open())]
    hidden = max(set(shown), key=shown.count)
    rule = tmp_path / "rule.json"
    rule.write_text(json.dumps({"field": "release_year", "between": [1994, None]}))
    listed = tmp_path / "hidden.json"  # as GET /models/{name}/items/hidden answers
    listed.write_text(json.dumps({"name": "sasrec-tiny", "items": [{"item_id": hidden, "until": None}]}))
    out = tmp_path / "ruled"
    args = ["predict", "--artifact", str(folder), "--k", "5", "--out", str(out), "--filter", str(rule)]
    assert main([*args, "--hidden", str(listed)]) == 0
    rows = list(csv.DictReader(next(out.glob("*.csv")).open()))
    assert rows and hidden not in {r["item_id"] for r in rows}
    assert all(float(art.fields["release_year"][r["item_id"]]) >= 1994 for r in rows)  # type: ignore[arg-type]
    rule.write_text(json.dumps({"field": "colour", "any_of": ["red"]}))
    assert main(args) == 2  # a filter the model cannot apply: said, no file
