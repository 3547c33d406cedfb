"""A candidate version beside the live one (canary, shadow), online scoring of what was served against
each user's next event, and promotion or retirement by an admin call or by the rule."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import re
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.production.online import ServedList
from app.production.sequential import signs
from app.production.trials import in_canary, in_holdback
from app.settings import Settings, SettingsError
from app.store import SQLiteStore, Sums, Traffic
from models.warm import FIRST_SEEN_LIVE
from tests.servers import NEWER, wait_until

ADMIN = {"X-API-Key": "admin-key"}
EVENTS = {"X-API-Key": "events-key"}  # stored histories are private once the events key is set
USERS = [f"u{n}" for n in range(40)]


def _first(root: Path) -> str:
    return sorted(p.name for p in (root / "sasrec-tiny").iterdir())[0]


def _settings(root: Path, state: Path, **kw: Any) -> Settings:
    return Settings(
        artifacts_dir=root,
        device="cpu",
        history_path=state / "h.sqlite3",
        state_dir=state,
        **({"admin_api_key": "admin-key", "housekeeping_s": 0.05} | kw),
    )


def _ask(c: TestClient, users: list[str], k: int = 10, headers: dict[str, str] = ADMIN) -> dict[str, Any]:
    body = {"model": "sasrec-tiny", "queries": [{"user_id": u, "k": k} for u in users]}
    r = c.post("/recommend", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _start(c: TestClient, version: str, mode: str, share: float | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"version": version, "mode": mode, **({"share": share} if share else {})}
    r = c.post("/admin/models/sasrec-tiny/candidate", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _promote(c: TestClient, store: SQLiteStore, version: str) -> float:
    """Start `version` as a canary and promote it by the admin call; -> when the promotion happened."""
    _start(c, version, "canary", 0.5)
    assert c.post("/admin/models/sasrec-tiny/promote", headers=ADMIN).status_code == 200
    ended = store.candidates()["sasrec-tiny"].ended
    assert ended is not None
    return ended


def test_canary_split_is_sticky_by_user_and_says_who_answered(root: Path, tmp_path: Path) -> None:
    first = _first(root)
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        moved = _start(c, first, "canary", 0.5)  # the older version on trial; the newest stays live (pinned)
        assert moved["pinned"] == NEWER and moved["candidate"]["version"] == first
        assert moved["reload"]["candidates"] == {"sasrec-tiny": first}
        out = _ask(c, USERS)
        assert out["version"] == NEWER
        answered = {r["user_id"]: r["version"] for r in out["results"]}
        expected = {u: first if in_canary("sasrec-tiny", u, 0.5) else NEWER for u in USERS}
        assert answered == expected and 5 < sum(v == first for v in answered.values()) < 35
        for u in USERS[:6]:  # one at a time, the same split
            assert _ask(c, [u])["results"][0]["version"] == expected[u]
        states = {v["version"]: v["state"] for v in c.get("/models/sasrec-tiny/versions").json()["versions"]}
        assert states == {NEWER: "serving", first: "candidate"}
    # A second worker (here: a restart with the same store) splits the same way.
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        assert {r["user_id"]: r["version"] for r in _ask(c, USERS)["results"]} == expected


def test_only_a_key_holder_learns_which_side_answered_a_user(root: Path, tmp_path: Path) -> None:
    first = _first(root)
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:  # the admin key only: /recommend is open
        _start(c, first, "canary", 0.5)
        keyless = _ask(c, USERS, headers={})
        assert keyless["version"] == NEWER  # the live version is no secret
        assert all("version" not in r for r in keyless["results"])
        assert all("version" not in r for r in _ask(c, USERS, headers={"X-API-Key": "nope"})["results"])
        shown = {r["user_id"]: r["version"] for r in _ask(c, USERS)["results"]}
        assert shown == {u: first if in_canary("sasrec-tiny", u, 0.5) else NEWER for u in USERS}
    with TestClient(create_app(_settings(root, tmp_path / "t", admin_api_key=None))) as c:  # no key at all
        assert all(r["version"] == NEWER for r in _ask(c, USERS[:3], headers={})["results"])


def test_the_rule_refuses_to_start_while_anyone_may_post_events(root: Path, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="SEQSERVE_EVENTS_API_KEY"):
        _settings(root, tmp_path / "s", promote_min_events=20, read_api_key="read-key")
    assert _settings(root, tmp_path / "s", promote_min_events=20, events_api_key="k").promote_min_lists == 20


def test_a_shadow_never_changes_or_holds_up_the_live_answer(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first(root)
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        before = _ask(c, USERS[:8])
        _start(c, first, "shadow")
        services = c.app.state.services  # type: ignore[attr-defined]
        trial = services.loaded.candidate_models["sasrec-tiny"]
        slow = trial.engine.infer
        release, gave_up = threading.Event(), threading.Event()

        def held(batch: list[Any]) -> list[Any]:  # the shadow's model call waits until the test lets it go
            if not release.wait(30):
                gave_up.set()
            return slow(batch)

        monkeypatch.setattr(trial.engine, "infer", held)
        trial.batcher.fn = held
        after = _ask(c, USERS[:8])
        # Answered while the shadow's call was still held: a request that awaited it would come back
        # only after the 30 s wait gave up.
        assert not gave_up.is_set()
        # The same answers, each under its own new recommendation_id.
        assert [r.pop("recommendation_id") for r in after["results"]] != [
            r.pop("recommendation_id") for r in before["results"]
        ]
        assert after["results"] == [{**r, "version": NEWER} for r in before["results"]]
        assert all(r["version"] == NEWER for r in after["results"])
        for _ in range(5):  # while two shadow batches run, more are shed, not queued
            _ask(c, USERS[:2])
        assert not gave_up.is_set()
        release.set()

        def shed() -> float:  # counted in the metrics at each housekeeping tick
            line = next(
                (x for x in c.get("/metrics").text.splitlines() if x.startswith("seqserve_shadow_shed_total{")), ""
            )
            return float(line.split()[-1]) if line else 0.0

        wait_until(lambda: shed() >= 3)
        wait_until(lambda: services.shadows.running == 0, timeout=20)
        kept = [ServedList(*s) for lists in services.lists._lists.values() for s in lists]
        assert {s.version for s in kept if s.variant == "shadow"} == {first}  # what the shadow answered is kept


def _hand(lists: list[list[str]], targets: list[str]) -> tuple[int, float, float]:
    hits, ndcg = 0, 0.0
    for items, t in zip(lists, targets, strict=True):
        if t in items[:10]:
            hits += 1
            ndcg += 1 / math.log2(items.index(t) + 2)
    return hits, ndcg, ndcg / len(lists)


def test_online_scores_equal_a_hand_computation(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        users = USERS[:12]
        served = {r["user_id"]: [i["item_id"] for i in r["items"]] for r in _ask(c, users)["results"]}
        # Half the users take their list's third item, the others an item the list does not hold.
        targets = {u: (served[u][2] if n % 2 == 0 else "no-such-item") for n, u in enumerate(users)}
        _ask(c, ["u30"])  # served, no event follows: never scored
        events = [
            {"event_id": f"e-{u}", "user_id": u, "item_id": targets[u], "timestamp": 1_000_000_000 + n}
            for n, u in enumerate(users)
        ]
        assert c.post("/events", json={"model": "sasrec-tiny", "events": events}).status_code == 200
        # A later event of the same user scores nothing more: its list was scored once.
        again = [{"event_id": "e-again", "user_id": users[0], "item_id": served[users[0]][0], "timestamp": 1e9 + 99}]
        assert c.post("/events", json={"model": "sasrec-tiny", "events": again}).status_code == 200

        def figures() -> dict[str, Any]:
            m = next(m for m in c.get("/models").json()["models"] if m["name"] == "sasrec-tiny")
            return dict(m["online"].get(f"{NEWER}/live", {}))

        wait_until(lambda: figures().get("n") == len(users), timeout=10)
        hits, _, mean_ndcg = _hand([served[u] for u in users], [targets[u] for u in users])
        f = figures()
        assert f["hr10"] == pytest.approx(hits / len(users), abs=1e-5)
        assert f["ndcg10"] == pytest.approx(mean_ndcg, abs=1e-5)
        assert f["mrr"] == pytest.approx(sum(1 / 3 for n in range(12) if n % 2 == 0) / 12, abs=1e-5)
        assert f["ndcg10_ci"][0] < f["ndcg10"] < f["ndcg10_ci"][1]
        metrics = c.get("/metrics").text
        assert f'seqserve_online_scored_total{{model="sasrec-tiny",variant="live",version="{NEWER}"}} 12.0' in metrics
        series = c.get("/models/sasrec-tiny/online").json()["series"][f"{NEWER}/live"]
        assert sum(n for _, n, _ in series) == 12
        # The floor: each list's reference list scored on the same event. By hand: the version's items by how
        # often its users' histories hold them (ties by index), less what each user has seen and the items
        # released after the year of the user's newest step (as the answer excludes them).
        engine = c.app.state.services.loaded.models["sasrec-tiny"].engine  # type: ignore[attr-defined]
        counts: dict[str, int] = {}
        for user in engine.stored_users():
            for item, _, _ in engine.stored_timeline(user):
                counts[item] = counts.get(item, 0) + 1
        order = sorted(counts, key=lambda i: (-counts[i], engine.entity_ids.index(i)))
        reference = {}
        for u in users:
            timeline = engine.stored_timeline(u)
            year = dt.datetime.fromtimestamp(max(t for _, t, _ in timeline), dt.UTC).year
            seen = {i for i, _, _ in timeline}
            released = [i for i in order if i not in seen and engine.art.release.get(i, -math.inf) <= year]
            reference[u] = released[:10]
        _, _, floor_ndcg = _hand([reference[u] for u in users], [targets[u] for u in users])
        totals = c.get("/models/sasrec-tiny/online").json()["totals"]
        assert totals[f"{NEWER}/floor"]["n"] == 12
        assert totals[f"{NEWER}/floor"]["ndcg10"] == pytest.approx(floor_ndcg, abs=1e-5)


def test_figures_by_segment_and_what_the_version_showed(root: Path, tmp_path: Path) -> None:
    """Scored lists by segment (a user the artifact held against one known from live events only; a list
    holding an item first seen live against the others), and each version's exposure: its lists' distinct
    items over the catalog, and the share of their slots held by the popular head."""
    with TestClient(create_app(_settings(root, tmp_path / "first"))) as c:
        fresh = _ask(c, ["u1"])["results"][0]["items"][0]["item_id"]  # as if a warm retrain had met it live
    manifest_path = root / "sasrec-tiny" / NEWER / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["config"]["warm_start"] = {"from": "sasrec-tiny/earlier", FIRST_SEEN_LIVE: [fresh]}
    manifest_path.write_text(json.dumps(manifest))
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:

        def ask(users: list[str]) -> dict[str, list[str]]:
            return {r["user_id"]: [i["item_id"] for i in r["items"]] for r in _ask(c, users)["results"]}

        first = ask(USERS)
        known = next(u for u, items in first.items() if fresh not in items)
        history = [{"event_id": f"h{n}", "user_id": "newcomer", "item_id": fresh, "timestamp": 1e9 + n} for n in (0, 1)]
        assert c.post("/events", json={"model": "sasrec-tiny", "events": history}).status_code == 200
        users = ["u1", known, "newcomer"]
        second = ask(users)
        held = {u: fresh in second[u] for u in users}
        assert held["u1"] and not held[known]
        # Each user takes the second item of its list: NDCG@10 1/log2(3) for every list.
        events = [
            {"event_id": f"e-{u}", "user_id": u, "item_id": second[u][1], "timestamp": 1.5e9 + n}
            for n, u in enumerate(users)
        ]
        assert c.post("/events", json={"model": "sasrec-tiny", "events": events}).status_code == 200

        def online() -> dict[str, Any]:
            return dict(c.get("/models/sasrec-tiny/online").json())

        wait_until(lambda: online()["totals"].get(f"{NEWER}/live", {}).get("n") == 3, timeout=10)
        got = online()
        segments = got["segments"][f"{NEWER}/live"]
        n_fresh = sum(held.values())
        want = {"users_known": 2, "users_new": 1, "lists_fresh": n_fresh, "lists_catalog": 3 - n_fresh}
        assert {group: f["n"] for group, f in segments.items()} == {group: n for group, n in want.items() if n}
        assert all(f["ndcg10"] == pytest.approx(1 / math.log2(3), abs=1e-5) for f in segments.values())
        engine = c.app.state.services.loaded.models["sasrec-tiny"].engine  # type: ignore[attr-defined]
        shown = [items[:10] for items in [*first.values(), *second.values()]]
        items = set().union(*shown)
        head = sum(i in engine.head_items for top in shown for i in top) / sum(len(top) for top in shown)
        assert got["exposure"][f"{NEWER}/live"] == {
            "lists": len(USERS) + 3,
            "items": len(items),
            "coverage": round(len(items) / engine.catalog_size, 5),
            "head_share": round(head, 5),
        }
        assert 0 < head < 1 and len(engine.head_items) == math.ceil(engine.catalog_size / 100)
        metrics = c.get("/metrics").text
        by = f'model="sasrec-tiny",users="new",variant="live",version="{NEWER}"'
        assert f'seqserve_online_segment_scored_total{{items="catalog",{by}}} 1.0' in metrics
        assert f'seqserve_exposure_slots_total{{model="sasrec-tiny",variant="live",version="{NEWER}"}}' in metrics


def _perturbed(folder: Path, seed: int) -> None:
    """Give a version weights of its own (the fixture's versions are copies of one another)."""
    import torch

    ckpt = torch.load(folder / "model.pt", weights_only=True)
    g = torch.Generator().manual_seed(seed)
    ckpt["state_dict"] = {
        k: v + torch.randn(v.shape, generator=g) * v.std() if v.is_floating_point() and v.numel() > 1 else v
        for k, v in ckpt["state_dict"].items()
    }
    torch.save(ckpt, folder / "model.pt")


def test_an_interleaved_candidate_mixes_every_by_user_answer_and_the_users_credits_decide(
    root: Path, tmp_path: Path
) -> None:
    from app.production.interleave import seed_of, team_draft
    from models.tasks.recommend import RecQuery

    first = _first(root)
    _perturbed(root / "sasrec-tiny" / first, seed=1)
    settings = _settings(root, tmp_path / "s", events_api_key="events-key", promote_min_events=30)
    with TestClient(create_app(settings)) as c:
        _start(c, first, "interleave")
        loaded = c.app.state.services.loaded  # type: ignore[attr-defined]
        live, cand = loaded.models["sasrec-tiny"].engine, loaded.candidate_models["sasrec-tiny"].engine
        out = _ask(c, USERS, headers=EVENTS)
        takes, favour_live = [], 0
        for n, r in enumerate(out["results"]):
            user, rid = r["user_id"], r["recommendation_id"]
            mine = live.ranked(live.infer(live.prepare([RecQuery(user)], {}))[0])
            theirs = cand.ranked(cand.infer(cand.prepare([RecQuery(user)], {}))[0])
            picks, teams = team_draft(mine, theirs, 10, seed=seed_of("sasrec-tiny", user, rid))
            assert [i["item_id"] for i in r["items"]] == [(mine, theirs)[side][i] for side, i in picks]
            assert r["version"] == first
            # Each user takes an item only the live version's list held, where there is one; else the top item.
            at = teams.find("L")
            favour_live += at >= 0
            item = r["items"][max(at, 0)]["item_id"]
            takes.append({"event_id": f"e{n}", "user_id": user, "item_id": item, "timestamp": 1e9 + n})
        assert favour_live >= 30  # enough for the rule: MIN_USERS users favouring a side
        history = {"model": "sasrec-tiny", "queries": [{"history": [{"item_id": "1"}], "k": 5}]}
        assert "recommendation_id" not in c.post("/recommend", json=history).json()["results"][0]  # not by user
        r = c.post("/events", json={"model": "sasrec-tiny", "events": takes}, headers=EVENTS)
        assert r.status_code == 200 and r.json()["stored"] == len(USERS)
        # The rule (a sign test over users) retires the candidate; what it read stays in the counters.
        wait_until(lambda: c.get("/models/sasrec-tiny/versions").json()["candidate"] is None, timeout=20)
        assert SQLiteStore(tmp_path / "s" / "h.sqlite3").candidates()["sasrec-tiny"].outcome == "retired"
        metrics = c.get("/metrics").text
        assert f'seqserve_interleave_credits_total{{model="sasrec-tiny",side="live"}} {favour_live}.0' in metrics
        assert 'seqserve_candidate_changes_total{action="retired",model="sasrec-tiny"} 1.0' in metrics


def test_an_interleaved_candidate_that_fails_leaves_the_live_answers_to_go_out_alone(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first(root)
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        before = _ask(c, USERS[:4])  # the live version's own answers
        _start(c, first, "interleave")
        cand = c.app.state.services.loaded.candidate_models["sasrec-tiny"]  # type: ignore[attr-defined]

        def broken(batch: list[Any]) -> list[Any]:
            raise RuntimeError("the candidate's model call failed")

        monkeypatch.setattr(cand.batcher, "fn", broken)
        out = _ask(c, USERS[:4])
        assert [r["items"] for r in out["results"]] == [r["items"] for r in before["results"]]
        assert {r["version"] for r in out["results"]} == {NEWER}
        metrics = c.get("/metrics").text
        assert 'seqserve_candidate_failures_total{mode="interleave",model="sasrec-tiny"} 1.0' in metrics


def test_the_online_figures_show_what_the_rule_reads_of_the_running_trial(root: Path, tmp_path: Path) -> None:
    first = _first(root)
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:  # the rule off: figures, no verdict
        _start(c, first, "interleave")
        since = c.app.state.services.loaded.choices.candidates["sasrec-tiny"].since  # type: ignore[attr-defined]
        store = SQLiteStore(tmp_path / "s" / "h.sqlite3")
        store.add_user_sums(
            {("sasrec-tiny", since, first, "interleave", f"u{n}"): (2, (-1.0, 0.0, 1.0, -1.0)[n % 4]) for n in range(8)}
        )
        store.close()

        def trial() -> dict[str, Any]:
            return dict(c.get("/models/sasrec-tiny/online").json()["trial"] or {})

        wait_until(lambda: trial().get("figures", {}).get("answers") == 16, timeout=10)
        got = trial()
        assert (got["version"], got["mode"], got["verdict"]) == (first, "interleave", None)
        figures = got["figures"]
        assert (figures["favour_candidate"], figures["favour_live"], figures["favour_neither"]) == (2, 4, 2)
        assert figures["e_value"] == pytest.approx(signs(2, 4).e_value)


def test_an_event_naming_its_answer_scores_exactly_that_list(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        first = _ask(c, ["u1"])["results"][0]
        top = first["items"][0]["item_id"]
        body = {"model": "sasrec-tiny", "queries": [{"user_id": "u1", "k": 10, "exclude_items": [top]}]}
        second = c.post("/recommend", json=body).json()["results"][0]  # newer, without the item u1 will take
        assert top not in [i["item_id"] for i in second["items"]]
        assert len({first["recommendation_id"], second["recommendation_id"]}) == 2
        other = _ask(c, ["u2"])["results"][0]
        named = first["recommendation_id"]
        events = [
            # u1 took the top item of the older list, and says so: that list is scored (rank 1), not the newest.
            {"event_id": "e1", "user_id": "u1", "item_id": top, "timestamp": 1e9, "recommendation_id": named},
            # u2 names u1's answer: nothing of u2's, so u2's newest list is scored (its second item: rank 2).
            {"event_id": "e2", "user_id": "u2", "item_id": other["items"][1]["item_id"], "timestamp": 1e9},
        ]
        events[1]["recommendation_id"] = named
        bad = [{**events[0], "event_id": "e3", "recommendation_id": "not an id!"}]
        r = c.post("/events", json={"model": "sasrec-tiny", "events": bad})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == [
            "body",
            "events",
            0,
            "recommendation_id",
        ]
        assert c.post("/events", json={"model": "sasrec-tiny", "events": events}).json()["stored"] == 2

        def figures() -> dict[str, Any]:
            return dict(c.get("/models/sasrec-tiny/online").json()["totals"].get(f"{NEWER}/live", {}))

        wait_until(lambda: figures().get("n") == 2, timeout=10)
        assert figures()["ndcg10"] == pytest.approx((1.0 + 1 / math.log2(3)) / 2, abs=1e-5)
        assert figures()["attributed"] == 1
        metrics = c.get("/metrics").text
        assert (
            f'seqserve_online_attributed_total{{model="sasrec-tiny",variant="live",version="{NEWER}"}} 1.0' in metrics
        )


def test_promotion_and_retirement_by_the_rule(root: Path, tmp_path: Path) -> None:
    first = _first(root)
    state = tmp_path / "s"
    with TestClient(create_app(_settings(root, state, promote_min_events=100, events_api_key="events-key"))) as c:
        _start(c, first, "canary", 0.5)
        since = c.app.state.services.loaded.choices.candidates["sasrec-tiny"].since  # type: ignore[attr-defined]
        store = SQLiteStore(state / "h.sqlite3")
        # 100 users a side, as good as the live version: the anytime interval's lower end within the margin
        # (10% of the live mean; 30 users a side leave it wider than that: waiting), promoted.
        store.add_user_sums(
            {("sasrec-tiny", since, NEWER, "live", f"u{n}"): (5, 1.0 + (n % 4) * 0.2) for n in range(100)}
            | {("sasrec-tiny", since, first, "canary", f"w{n}"): (5, 1.0 + ((n + 1) % 4) * 0.2) for n in range(100)}
        )

        def pinned() -> str | None:
            return c.get("/models/sasrec-tiny/versions").json()["pinned"]  # type: ignore[no-any-return]

        # every worker follows within a tick
        wait_until(lambda: _ask(c, ["u1"], headers=EVENTS)["version"] == first, timeout=10)
        assert pinned() == first
        assert 'seqserve_candidate_changes_total{action="promoted",model="sasrec-tiny"} 1.0' in c.get("/metrics").text
        # The newer version on trial now, far worse: retired, the promoted one keeps serving.
        _start(c, NEWER, "canary", 0.5)
        since = c.app.state.services.loaded.choices.candidates["sasrec-tiny"].since  # type: ignore[attr-defined]
        store.add_user_sums(
            {("sasrec-tiny", since, first, "live", f"u{n}"): (5, 1.5 + (n % 3) * 0.1) for n in range(30)}
            | {("sasrec-tiny", since, NEWER, "canary", f"w{n}"): (5, 0.2 + (n % 3) * 0.1) for n in range(30)}
        )
        wait_until(lambda: all(r["version"] == first for r in _ask(c, USERS, headers=EVENTS)["results"]), timeout=10)
        assert pinned() == first and c.get("/models/sasrec-tiny/versions").json()["candidate"] is None
        assert store.candidates()["sasrec-tiny"].outcome == "retired"
        store.close()


def test_probation_reads_the_floor_rolls_a_version_below_it_back_and_confirms_one_above_it(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a promotion (here by the admin call), with no holdback, the new live version is watched against its
    floor: each of its lists' NDCG@10 less its reference list's (its popularity, the same exclusions) on the
    same event, per user. Proved below it: rolled back at once, counted. Above it, once PROBATION_S has passed
    with the evidence in: confirmed, counted, and no longer on probation."""
    first, third = _first(root), "20991231T235958Z"
    shutil.copytree(root / "sasrec-tiny" / first, root / "sasrec-tiny" / third)
    state = tmp_path / "s"
    settings = _settings(
        root, state, probation_min_lists=200, housekeeping_s=3600, events_api_key="events-key", probation_holdback=0
    )
    with TestClient(create_app(settings)) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]

        def tick() -> None:  # the housekeeping tick, run here: judged on exactly the sums written before
            c.portal.call(production.tick, root, None)  # type: ignore[union-attr]

        def served() -> tuple[str | None, str | None]:
            return c.get("/models/sasrec-tiny/versions").json()["pinned"], store.candidates()["sasrec-tiny"].outcome

        def per_user(version: str, ended: float, variant: str, lists: float, mean: float, users: int = 40) -> None:
            rows = {("sasrec-tiny", ended, version, variant, f"w{n}"): (lists, lists * mean) for n in range(users)}
            store.add_user_sums(rows)

        ended = _promote(c, store, first)  # NEWER was live: `first` replaces it
        # The request path keeps the promoted version's lists per user from its promotion on, and beside each
        # the difference from its reference list on the same event.
        item = _ask(c, ["u1"], headers=EVENTS)["results"][0]["items"][0]["item_id"]
        event = {"event_id": "p1", "user_id": "u1", "item_id": item, "timestamp": 1e9}
        assert c.post("/events", json={"model": "sasrec-tiny", "events": [event]}, headers=EVENTS).status_code == 200

        def kept() -> bool:
            tick()
            got = store.trial_stats("sasrec-tiny", ended)
            live, floor = got.get((first, "live")), got.get((first, "floor"))
            return live is not None and floor is not None and (live.users, live.n, live.s) == (1, 1, 1.0)

        wait_until(kept, timeout=10)
        floor = store.trial_stats("sasrec-tiny", ended)[(first, "floor")]
        assert (floor.users, floor.n) == (1, 1) and 0.0 <= floor.s <= 1.0  # 1 less its reference's NDCG@10
        per_user(first, ended, "floor", 10.0, -0.3)  # 40 users' lists, 0.3 under their reference lists each
        spread = {("sasrec-tiny", ended, first, "floor", f"w{n}"): (1.0, 0.05 * (n % 3)) for n in range(40)}
        store.add_user_sums(spread)
        production.policy = settings.model_copy(update={"events_api_key": None}).loop
        tick()  # /events open: anyone could have posted these figures, so nothing is read
        assert served() == (first, "promoted")
        production.policy = settings.loop
        tick()  # judged: rolled back in the store
        tick()  # followed
        assert served() == (NEWER, "rolled_back")
        metrics = c.get("/metrics").text
        assert 'seqserve_candidate_changes_total{action="rolled_back",model="sasrec-tiny"} 1.0' in metrics
        assert _ask(c, ["u1"], headers=EVENTS)["version"] == NEWER
        # Another version promoted, its lists above their reference lists: watched until its span has passed.
        ended = _promote(c, store, third)
        per_user(third, ended, "live", 10.0, 0.3)
        per_user(third, ended, "floor", 10.0, 0.1)
        store.add_user_sums({("sasrec-tiny", ended, third, "floor", f"w{n}"): (1.0, 0.05 * (n % 3)) for n in range(40)})
        tick()
        assert served() == (third, "promoted") and store.candidates()["sasrec-tiny"].confirmed is None
        online = c.get("/models/sasrec-tiny/online").json()["probation"]
        assert (online["version"], online["replaced"], online["verdict"]) == (third, NEWER, "wait")
        assert "SEQSERVE_PROBATION_S left" in online["reason"]
        production.policy = settings.model_copy(update={"probation_s": 0.001}).loop
        tick()  # its span over with its evidence in: confirmed
        confirmed = store.candidates()["sasrec-tiny"]
        assert (confirmed.version, confirmed.outcome) == (third, "promoted") and confirmed.confirmed is not None
        assert 'seqserve_candidate_changes_total{action="confirmed",model="sasrec-tiny"} 1.0' in c.get("/metrics").text
        # logged with what each test read
        assert re.search(r"confirmed \(probation: nothing worse .*; against floor \+0\.\d+, e-value", caplog.text)
        tick()
        assert c.get("/models/sasrec-tiny/online").json()["probation"] is None
        assert served() == (third, "promoted")
        store.close()


def test_a_promotion_undecided_by_its_bound_is_rolled_back(root: Path, tmp_path: Path) -> None:
    """Probation never ends undecided: a holdback that never gathers its lists (too little traffic, or a few
    users carrying all of it) holds the promotion on probation until PROBATION_MAX_S, which rolls it back."""
    first, state = _first(root), tmp_path / "s"
    settings = _settings(root, state, housekeeping_s=3600, events_api_key="events-key", probation_holdback=0.25)
    with TestClient(create_app(settings)) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]
        ended = _promote(c, store, first)
        store.add_user_sums({("sasrec-tiny", ended, NEWER, "holdback", f"h{n}"): (10.0, 2.0) for n in range(3)})
        c.portal.call(production.tick, root, None)  # type: ignore[union-attr]
        assert store.candidates()["sasrec-tiny"].outcome == "promoted"
        production.policy = settings.model_copy(update={"probation_s": 0.001, "probation_max_s": 0.002}).loop
        c.portal.call(production.tick, root, None)  # type: ignore[union-attr]
        assert store.candidates()["sasrec-tiny"].outcome == "rolled_back"
        c.portal.call(production.tick, root, None)  # type: ignore[union-attr]  # followed
        assert c.get("/models/sasrec-tiny/versions").json()["pinned"] == NEWER
        store.close()


def test_a_promotion_on_probation_holds_a_share_of_the_users_back_on_the_version_it_replaced(
    root: Path, tmp_path: Path
) -> None:
    """While probation watches a promotion, the users at the canary hash's other end keep the replaced version
    (said in each answer to key holders, and in the versions listing), served by its entry as it was, with
    no load; their lists are kept per user beside the new version's; a new version waits for its trial, and
    the holdback ends with the probation."""
    first, state = _first(root), tmp_path / "s"
    settings = _settings(
        root, state, housekeeping_s=3600, events_api_key="events-key", probation_holdback=0.25, new_versions="canary"
    )
    with TestClient(create_app(settings)) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]
        loaded = c.app.state.services.loaded  # type: ignore[attr-defined]
        replaced = loaded.models["sasrec-tiny"]
        _start(c, first, "canary", 0.5)
        promoted = loaded.candidate_models["sasrec-tiny"]
        assert c.post("/admin/models/sasrec-tiny/promote", headers=ADMIN).status_code == 200
        ended = store.candidates()["sasrec-tiny"].ended
        # Both entries go on as they were: the candidate's serves as the live one, the live one's as the holdback.
        assert loaded.models["sasrec-tiny"] is promoted and promoted.role is None
        assert loaded.candidate_models["sasrec-tiny"] is replaced and not replaced.retired
        held = {u for u in USERS if in_holdback("sasrec-tiny", u, 0.25)}
        assert 0 < len(held) < len(USERS) and not any(in_canary("sasrec-tiny", u, 0.5) for u in held)
        answers = _ask(c, USERS, headers=EVENTS)["results"]
        assert {u for u, r in zip(USERS, answers, strict=True) if r["version"] == NEWER} == held
        assert all(r["version"] == first for u, r in zip(USERS, answers, strict=True) if u not in held)
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert listed["pinned"] == first and listed["candidate"] is None
        assert listed["holdback"] == {"version": NEWER, "mode": "holdback", "share": 0.25, "since": ended}
        assert {v["version"]: v["state"] for v in listed["versions"]}[NEWER] == "holdback"
        # A held-back user's event scores the replaced version's list, kept per user under the promotion.
        user = sorted(held)[0]
        top = answers[USERS.index(user)]["items"][0]["item_id"]
        event = {"event_id": "h1", "user_id": user, "item_id": top, "timestamp": 1e9}
        assert c.post("/events", json={"model": "sasrec-tiny", "events": [event]}, headers=EVENTS).status_code == 200

        def kept() -> bool:
            c.portal.call(production.tick, root, None)  # type: ignore[union-attr]
            got = store.trial_stats("sasrec-tiny", ended).get((NEWER, "holdback"))
            return got is not None and (got.users, got.n, got.s) == (1, 1, 1.0)

        wait_until(kept, timeout=10)
        # A version newer than the live one (NEWER, by its name) is not started while the holdback runs.
        assert c.post("/admin/reload", headers=ADMIN).json()["candidates"] == {}
        assert c.get("/models/sasrec-tiny/versions").json()["holdback"]["version"] == NEWER
        # Probation confirms the promotion (its span and evidence: tests/app/production/test_traffic.py): the
        # holdback ends and everyone gets the promoted version.
        assert store.confirm("sasrec-tiny", first) and not store.confirm("sasrec-tiny", first)
        c.portal.call(production.tick, root, None)  # type: ignore[union-attr]
        assert all(r["version"] == first for r in _ask(c, USERS, headers=EVENTS)["results"])
        assert c.get("/models/sasrec-tiny/versions").json()["holdback"] is None and replaced.retired
        assert c.post("/admin/reload", headers=ADMIN).json()["candidates"] == {"sasrec-tiny": NEWER}  # its trial now
        store.close()


def test_probation_rolls_back_a_promotion_its_holdback_beats_and_watches_one_it_does_not(
    root: Path, tmp_path: Path
) -> None:
    first, third = _first(root), "20991231T235958Z"
    shutil.copytree(root / "sasrec-tiny" / first, root / "sasrec-tiny" / third)
    state = tmp_path / "s"
    settings = _settings(root, state, housekeeping_s=3600, events_api_key="events-key", probation_holdback=0.25)
    with TestClient(create_app(settings)) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]

        def sides(ended: float, live: tuple[str, float], holdback: tuple[str, float]) -> None:
            for (version, mean), variant in ((live, "live"), (holdback, "holdback")):
                rows = {  # users apart by up to 0.1 either way: the interval is about 0.04 wide
                    ("sasrec-tiny", ended, version, variant, f"{variant}{n}"): (8.0, 8.0 * (mean + (n % 3 - 1) / 10))
                    for n in range(40)
                }
                store.add_user_sums(rows)

        def tick() -> None:
            c.portal.call(production.tick, root, None)  # type: ignore[union-attr]

        # The span before the promotion looks far better than anything since: not read with a holdback.
        store.add_online({("sasrec-tiny", NEWER, "live", time.time() - 600, "known"): Sums(n=900, ndcg=810.0)})
        ended = _promote(c, store, first)
        sides(ended, live=(first, 0.30), holdback=(NEWER, 0.31))
        tick()
        tick()
        # Level with its holdback: no proof either way, so it stays on probation (its span has not passed).
        assert c.get("/models/sasrec-tiny/versions").json()["pinned"] == first
        assert store.candidates()["sasrec-tiny"].on_probation
        ended = _promote(c, store, third)
        sides(ended, live=(third, 0.10), holdback=(first, 0.30))
        held = c.app.state.services.loaded.candidate_models["sasrec-tiny"]  # type: ignore[attr-defined]
        tick()  # judged: rolled back in the store
        tick()  # followed
        assert c.get("/models/sasrec-tiny/versions").json()["pinned"] == first
        assert c.app.state.services.loaded.models["sasrec-tiny"] is held  # type: ignore[attr-defined]
        assert store.candidates()["sasrec-tiny"].outcome == "rolled_back"
        assert c.get("/models/sasrec-tiny/versions").json()["holdback"] is None  # no promotion on probation
        store.close()


def test_probation_rolls_back_a_promotion_whose_answers_fail_more_than_its_holdbacks(
    root: Path, tmp_path: Path
) -> None:
    """The answers' figures are the service's own: each part of a request a version computed, counted by the
    request path per version, shared through the store, compared with the holdback's over the same time, no
    events key needed. Only requests holding a by-user query count (they need a key wherever one is set):
    keyless requests, and those refused before any model ran, move nothing."""
    first, state = _first(root), tmp_path / "s"
    settings = _settings(root, state, housekeeping_s=3600, read_api_key="read-key", probation_holdback=0.25)
    with TestClient(create_app(settings)) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]

        def tick() -> None:
            c.portal.call(production.tick, root, None)  # type: ignore[union-attr]

        def counted(version: str) -> Traffic:
            got = Traffic()
            for (_, v, _), t in store.traffic("sasrec-tiny", since=0.0).items():
                if v == version:
                    got.add(t)
            return got

        reader = {"X-API-Key": "read-key"}
        _ask(c, ["u1", "u2"], headers=reader)
        _ask(c, ["u3"], headers=reader)
        history_only = {"model": "sasrec-tiny", "queries": [{"history": [{"item_id": "2"}], "k": 5}] * 20}
        for _ in range(5):  # a keyless client's large requests: answered, never counted
            assert c.post("/recommend", json=history_only).status_code == 200
        for _ in range(5):  # by-user without the key: refused before any model ran
            assert c.post("/recommend", json={"queries": [{"user_id": "u1"}]}).status_code == 401
        tick()
        got = counted(NEWER)
        assert (got.n, got.errors) == (2, 0)  # two parts computed, by the requests holding a by-user query
        ended = _promote(c, store, first)
        for _ in range(8):  # the audit's lever: a keyless client's largest requests right after a promotion
            assert c.post("/recommend", json=history_only).status_code == 200
        tick()
        assert counted(first).n == 0  # nothing a keyless client sent is the promoted version's answers
        store.add_traffic(
            {
                ("sasrec-tiny", NEWER, ended - 600): Traffic(5000, 500, {5: 5000.0}),  # before the promotion: not read
                ("sasrec-tiny", NEWER, ended + 60): Traffic(1000, 1, {5: 1000.0}),  # the holdback's, the same time
                ("sasrec-tiny", first, ended + 60): Traffic(1000, 30, {5: 1000.0}),  # 3% failed, from 0.1%
            }
        )
        tick()  # judged: rolled back in the store
        tick()  # followed
        assert c.get("/models/sasrec-tiny/versions").json()["pinned"] == NEWER
        assert store.candidates()["sasrec-tiny"].outcome == "rolled_back"
        store.close()


def test_a_keyless_clients_by_user_answers_never_count_where_histories_are_public(root: Path, tmp_path: Path) -> None:
    """With the admin key alone, by-user queries need no key: a keyless client could pick users on either
    side (the hash is public) and load one. Only a key holder's requests count as a version's answers."""
    state = tmp_path / "s"
    with TestClient(create_app(_settings(root, state, housekeeping_s=3600))) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]
        for _ in range(5):
            assert (
                c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]}).status_code == 200
            )
        _ask(c, ["u1"], headers=ADMIN)
        c.portal.call(production.tick, root, None)  # type: ignore[union-attr]
        rows = store.traffic("sasrec-tiny", since=0.0).values()
        assert sum(t.n for t in rows) == 1  # the admin's request alone
        store.close()


def test_trial_calls_check_what_they_are_given(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        url = "/admin/models/sasrec-tiny/candidate"
        assert c.post(url, json={"version": NEWER, "mode": "canary"}).status_code == 401
        r = c.post(url, json={"version": NEWER, "mode": "canary"}, headers=ADMIN)  # the live one
        assert r.status_code == 409 and r.json()["error"]["details"][0]["loc"] == ["body", "version"]
        r = c.post(url, json={"version": _first(root), "mode": "blue-green"}, headers=ADMIN)
        assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "mode"]
        r = c.post(url, json={"version": _first(root), "mode": "canary", "share": 2}, headers=ADMIN)
        assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "share"]
        r = c.post("/admin/models/sasrec-tiny/promote", headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_trial"
        r = c.post("/admin/models/no-such/retire", headers=ADMIN)
        assert r.status_code == 404


def test_a_new_version_enters_as_a_candidate_when_set(root: Path, tmp_path: Path) -> None:
    first = _first(root)
    shutil.rmtree(root / "sasrec-tiny" / NEWER)
    with TestClient(create_app(_settings(root, tmp_path / "s", new_versions="canary", canary_share=0.25))) as c:
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())  # a version's name is when it was published
        shutil.copytree(root / "sasrec-tiny" / first, root / "sasrec-tiny" / now)  # a retrain published
        r = c.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and r.json()["candidates"] == {"sasrec-tiny": now}
        listed = c.get("/models/sasrec-tiny/versions").json()
        assert listed["pinned"] == first and listed["candidate"]["share"] == 0.25
        assert c.post("/admin/models/sasrec-tiny/retire", headers=ADMIN).status_code == 200
        c.post("/admin/reload", headers=ADMIN)  # a retired version is not tried again
        assert c.get("/models/sasrec-tiny/versions").json()["candidate"] is None


def test_shadow_work_is_drained_at_shutdown() -> None:
    from app.production.trials import ShadowWork

    async def run() -> None:
        work = ShadowWork(1)
        await work.drain()  # nothing in flight: returns at once

    asyncio.run(run())


def test_two_hosts_on_one_redis_share_trials_and_scores(root: Path, tmp_path: Path, redis_server: Any) -> None:
    first = _first(root)

    def host(n: int) -> TestClient:
        return TestClient(
            create_app(_settings(root, tmp_path / f"host{n}", history_store="redis", redis_url=redis_server.url))
        )

    with host(1) as a, host(2) as b:
        _start(a, first, "canary", 0.5)  # on host 1; host 2 follows from the store
        expected = {u: first if in_canary("sasrec-tiny", u, 0.5) else NEWER for u in USERS}
        asked = USERS[:20]
        wait_until(
            lambda: {r["user_id"]: r["version"] for r in _ask(b, asked)["results"]} == {u: expected[u] for u in asked}
        )
        served = _ask(a, ["u30"])["results"][0]  # served by host 1 only
        event = {"event_id": "e1", "user_id": "u30", "item_id": served["items"][0]["item_id"], "timestamp": 1e9}
        assert b.post("/events", json={"model": "sasrec-tiny", "events": [event]}).status_code == 200

        def scored(c: TestClient) -> int:  # the lists served (their reference lists, "/floor", beside them)
            totals = c.get("/models/sasrec-tiny/online").json()["totals"]
            return sum(f["n"] for key, f in totals.items() if not key.endswith("/floor"))

        wait_until(lambda: scored(a) == 1 and scored(b) == 1)  # scored where it was served, seen by both
        variant = "canary" if expected["u30"] == first else "live"
        assert b.get("/models/sasrec-tiny/online").json()["totals"][f"{expected['u30']}/{variant}"]["hr10"] == 1.0


@pytest.mark.slow
def test_canary_is_sticky_across_worker_processes(root: Path, tmp_path: Path) -> None:
    import httpx2 as httpx

    from tests.servers import start_api, stop, workers_env

    state = tmp_path / "state"
    env = workers_env(state)
    first = _first(root)
    proc, url = start_api(root, env)
    try:
        wait_until(lambda: len(list((state / "workers").glob("[0-9]*.json"))) == 2)  # both workers up
        body = {"version": first, "mode": "canary", "share": 0.5}
        r = httpx.post(f"{url}/admin/models/sasrec-tiny/candidate", json=body, headers=ADMIN, timeout=60)
        assert r.status_code == 200 and r.json()["reload"]["all_workers"], r.text
        for user in USERS[:4]:
            ask = {"model": "sasrec-tiny", "queries": [{"user_id": user, "k": 1}]}
            seen = {
                httpx.post(f"{url}/recommend", json=ask, headers=ADMIN).json()["results"][0]["version"]
                for _ in range(20)
            }
            assert seen == {first if in_canary("sasrec-tiny", user, 0.5) else NEWER}, user
        pids = {int(p) for p in r.json()["reload"]["workers"]}
        assert len(pids) == 2
    finally:
        stop(proc)


def test_the_housekeeping_tick_drops_old_arrivals_while_no_event_comes(root: Path, tmp_path: Path) -> None:
    import sqlite3

    from app.store.state import ARRIVALS_KEEP_S

    state = tmp_path / "s"
    with TestClient(create_app(_settings(root, state))) as c:
        assert c.get("/readyz").status_code == 200
        with sqlite3.connect(state / "h.sqlite3") as conn:  # what an hour of events left behind
            conn.executemany(
                "INSERT INTO arrivals (ns, user, item, at) VALUES ('sasrec-tiny', ?, 'x', ?)",
                [(f"u{n}", time.time() - ARRIVALS_KEEP_S - 60) for n in range(50)],
            )

        def left() -> int:
            with sqlite3.connect(state / "h.sqlite3") as conn:
                return int(conn.execute("SELECT COUNT(*) FROM arrivals").fetchone()[0])

        wait_until(lambda: left() == 0, timeout=10)


def test_a_worker_holds_only_the_top_ten_of_a_long_list(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path / "s"))) as c:
        items = [i["item_id"] for i in _ask(c, ["u1"], k=40)["results"][0]["items"]]
        assert len(items) > 10  # every item the tiny catalog has left for u1
        services = c.app.state.services  # type: ignore[attr-defined]
        (kept,) = services.lists._lists[("sasrec-tiny", "u1")]
        assert ServedList(*kept).items == tuple(items[:10])
        event = {"event_id": "far", "user_id": "u1", "item_id": items[10], "timestamp": 1e9}  # rank 11
        assert c.post("/events", json={"model": "sasrec-tiny", "events": [event]}).status_code == 200
        wait_until(lambda: c.get("/models/sasrec-tiny/online").json()["totals"].get(f"{NEWER}/live", {}).get("n") == 1)
        assert c.get("/models/sasrec-tiny/online").json()["totals"][f"{NEWER}/live"]["mrr"] == 0.0  # MRR@10


def test_a_promotion_failing_every_request_is_rolled_back_on_its_first_minute_of_answers(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The promoted version's model fails every by-user request while its holdback (10% of the users) fails none:
    the 5xx shares are counts (no variance to be 0 on either side), so a few dozen answers of one minute prove
    it, long before probation_min_requests or the probation's span."""
    first, state = _first(root), tmp_path / "s"
    settings = _settings(root, state, housekeeping_s=3600, events_api_key="events-key", probation_holdback=0.1)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        store = SQLiteStore(state / "h.sqlite3")
        production = c.app.state.services.production  # type: ignore[attr-defined]
        _promote(c, store, first)
        live = c.app.state.services.loaded.models["sasrec-tiny"]  # type: ignore[attr-defined]
        assert live.version == first

        def broken(batch: object) -> object:
            raise RuntimeError("the model fails")

        monkeypatch.setattr(live.engine, "run", broken)
        statuses = Counter(
            c.post(
                "/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": f"u{n % 40}"}]}, headers=EVENTS
            ).status_code
            for n in range(120)
        )
        assert statuses[500] > 60 and statuses[200] > 0, statuses  # the holdback's users answered
        c.portal.call(production.tick, root, None)  # type: ignore[union-attr]
        cand = store.candidates()["sasrec-tiny"]
        assert cand.outcome == "rolled_back", cand
        store.close()
