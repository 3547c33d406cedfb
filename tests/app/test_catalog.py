"""What a real catalog needs, through the real app: a visitor the model does not know is answered (the
fallback, its source and its online segment), recent takes rank that fallback, hidden items leave every
answer on every worker and host sharing the store (live, canary, interleaved, the lists kept for online
evaluation), and a query's filter."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from models.tasks.recommend import load_artifact
from tests.servers import wait_until

ADMIN = {"X-API-Key": "admin-key"}
MODEL = "sasrec-tiny"


def _settings(root: Path, state: Path, **kw: Any) -> Settings:
    return Settings(
        artifacts_dir=root,
        device="cpu",
        history_path=state / "h.sqlite3",
        state_dir=state,
        **({"admin_api_key": "admin-key", "housekeeping_s": 0.05, "online_score_s": 0.05} | kw),
    )


def _ask(c: TestClient, queries: list[dict[str, Any]], headers: dict[str, str] = ADMIN) -> list[dict[str, Any]]:
    r = c.post("/recommend", json={"model": MODEL, "queries": queries}, headers=headers)
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


def _items(result: dict[str, Any]) -> list[str]:
    return [i["item_id"] for i in result["items"]]


def _hide(c: TestClient, items: list[str], **body: Any) -> dict[str, Any]:
    r = c.post(f"/admin/models/{MODEL}/items/hide", json={"item_ids": items, **body}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_hide_reaches_a_second_worker_on_the_store_and_every_list_it_serves(root: Path, tmp_path: Path) -> None:
    """Two workers of one host (two apps on one SQLite store): hidden through one, gone from the other's
    answers within its housekeeping, from a canary's users as from the live version's, from the lists kept
    for online evaluation, and listed; unhidden, back."""
    state = tmp_path / "state"
    users = [f"u{n}" for n in range(12)]
    with TestClient(create_app(_settings(root, state))) as a, TestClient(create_app(_settings(root, state))) as b:
        first = sorted(p.name for p in (root / MODEL).iterdir())[0]
        r = a.post(
            f"/admin/models/{MODEL}/candidate", json={"version": first, "mode": "canary", "share": 0.5}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        wait_until(lambda: len({x["version"] for x in _ask(b, [{"user_id": u} for u in users])}) == 2)
        before = _ask(b, [{"user_id": u, "k": 5} for u in users])
        shown = Counter(i for res in before for i in _items(res))
        gone = [i for i, _ in shown.most_common(2)]
        assert _hide(a, gone, reason="withdrawn")["hidden"] == 2
        wait_until(
            lambda: not set(gone) & {i for res in _ask(b, [{"user_id": u, "k": 5} for u in users]) for i in _items(res)}
        )
        t0 = time.time()
        after = _ask(b, [{"user_id": u, "k": 5} for u in users])
        assert {x["version"] for x in after} == {
            x["version"] for x in before
        }  # both sides answered, neither shows them
        assert all(
            len(_items(res)) == 5 and res["excluded"]["filtered"] >= 1
            for res in after
            if set(gone) & set(_items(before[users.index(res["user_id"])]))
        )
        kept = b.app.state.services.lists  # type: ignore[attr-defined]
        recent = [s for lists in kept._lists.values() for s in lists if s[4] >= t0]  # (..., items, at, ...)
        assert len(recent) == len(users) and not set(gone) & {i for s in recent for i in s[3]}
        listed = b.get(f"/models/{MODEL}/items/hidden").json()["items"]
        assert {h["item_id"] for h in listed} == set(gone) and {h["reason"] for h in listed} == {"withdrawn"}
        r = a.post(f"/admin/models/{MODEL}/items/unhide", json={"item_ids": gone}, headers=ADMIN)
        assert r.json() == {"name": MODEL, "changed": 2, "hidden": 0}
        wait_until(
            lambda: (
                _ask(b, [{"user_id": u, "k": 5} for u in users])
                and b.get(f"/models/{MODEL}/items/hidden").json()["items"] == []
            )
        )
        wait_until(
            lambda: set(gone) <= {i for res in _ask(b, [{"user_id": u, "k": 5} for u in users]) for i in _items(res)}
        )


def test_a_hide_reaches_another_host_on_one_redis_and_an_interleaved_answer(
    root: Path, tmp_path: Path, redis_server: Any
) -> None:
    def host(n: int) -> TestClient:
        settings = _settings(root, tmp_path / f"host{n}", history_store="redis", redis_url=redis_server.url)
        return TestClient(create_app(settings))

    with host(1) as a, host(2) as b:
        first = sorted(p.name for p in (root / MODEL).iterdir())[0]
        r = a.post(f"/admin/models/{MODEL}/candidate", json={"version": first, "mode": "interleave"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        users = [f"u{n}" for n in range(6)]
        wait_until(lambda: {x["version"] for x in _ask(b, [{"user_id": u} for u in users])} == {first})
        top = Counter(i for res in _ask(b, [{"user_id": u, "k": 3} for u in users]) for i in _items(res))
        gone = top.most_common(1)[0][0]
        _hide(a, [gone], until=4102444800)
        wait_until(lambda: all(gone not in _items(res) for res in _ask(b, [{"user_id": u, "k": 3} for u in users])))
        assert [h["item_id"] for h in b.get(f"/models/{MODEL}/items/hidden").json()["items"]] == [gone]


def test_an_item_hidden_until_a_time_past_is_served_again(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        top = _items(_ask(c, [{"user_id": "u1", "k": 1}])[0])
        _hide(c, top, until=1.0)  # already past
        assert _items(_ask(c, [{"user_id": "u1", "k": 1}])[0]) == top
        assert c.get(f"/models/{MODEL}/items/hidden").json()["items"] == []


def test_hide_is_an_admin_call_bounded_and_named(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        url = f"/admin/models/{MODEL}/items/hide"
        assert c.post(url, json={"item_ids": ["10"]}).status_code == 401
        assert c.post(url, json={"item_ids": ["10"]}, headers={"X-API-Key": "nope"}).status_code == 403
        bad = c.post(url, json={"item_ids": []}, headers=ADMIN)
        assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"][:2] == ["body", "item_ids"]
        assert c.post(url, json={"item_ids": [str(i) for i in range(1001)]}, headers=ADMIN).status_code == 422
        missing = c.post("/admin/models/nope/items/hide", json={"item_ids": ["10"]}, headers=ADMIN)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_model"


def test_the_fallback_ranks_by_recent_takes_and_is_scored_as_its_own_segment(root: Path, tmp_path: Path) -> None:
    """Users take item X now: a visitor is offered X first, from `popular_recent`; the visitor then takes an item
    of that list and online evaluation counts it in users_fallback."""
    with TestClient(create_app(_settings(root, tmp_path, fallback_min_takes=5))) as c:
        art = load_artifact(latest_versions(root)[MODEL])
        counts = Counter(i for u in art.histories.users() for i, _, _ in art.histories.timeline(u, art.items))
        # The least popular item the model knows: only recent takes put it first.
        rare = min((i for i in counts if i in art.items), key=lambda i: (counts[i], i))
        assert _ask(c, [{"user_id": "visitor-0", "k": 3}])[0]["source"] == "popular"
        events = [
            {"event_id": f"t{n}", "user_id": f"u{n}", "item_id": rare, "timestamp": 1_000_000_000 + n} for n in range(6)
        ]
        assert c.post("/events", json={"model": MODEL, "events": events}).status_code == 200
        wait_until(lambda: _ask(c, [{"user_id": "visitor-1", "k": 3}])[0]["source"] == "popular_recent")
        answer = _ask(c, [{"user_id": "visitor-1", "k": 3}])[0]
        assert _items(answer)[0] == rare and answer["items"][0]["score"] == 6.0
        took = {"event_id": "v1", "user_id": "visitor-1", "item_id": rare, "timestamp": 1_100_000_000}
        assert c.post("/events", json={"model": MODEL, "events": [took]}).status_code == 200

        def fallback_lists() -> float:
            seg = c.get(f"/models/{MODEL}/online").json()["segments"]
            return sum(s.get("users_fallback", {}).get("n", 0) for k, s in seg.items() if k.endswith("/live"))

        wait_until(lambda: fallback_lists() == 1)
        segments = c.get(f"/models/{MODEL}/online").json()["segments"]
        live = next(v for k, v in segments.items() if k.endswith("/live"))
        assert live["users_fallback"]["hr10"] == 1.0


def test_a_filter_keeps_what_it_names_and_a_bad_one_is_a_422_naming_the_field(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        art = load_artifact(latest_versions(root)[MODEL])
        years = art.fields["release_year"]
        queries = [
            {
                "user_id": "u1",
                "k": 30,
                "filter": {"field": "release_year", "between": [1993, 1995]},
                "exclude_future": False,
            },
            {
                "user_id": "ghost",
                "k": 30,
                "filter": {"not": {"field": "release_year", "between": [1993, 1995]}},
                "exclude_future": False,
            },
        ]
        inside, outside = _ask(c, queries)
        assert _items(inside) and all(1993 <= float(years[i]) <= 1995 for i in _items(inside))  # type: ignore[arg-type]
        assert outside["source"] == "popular" and not any(1993 <= float(years[i]) <= 1995 for i in _items(outside))  # type: ignore[arg-type]
        assert inside["excluded"]["filtered"] > 0 and outside["excluded"]["filtered"] > 0
        bad = c.post(
            "/recommend",
            json={
                "model": MODEL,
                "queries": [
                    {"user_id": "u1"},
                    {"user_id": "u1", "filter": {"all": [{"field": "release_year", "any_of": ["x"]}]}},
                ],
            },
            headers=ADMIN,
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["details"][0]["loc"] == ["body", "queries", 1, "filter", "all", 0, "any_of", 0]


def test_a_visitor_of_the_social_model_gets_the_most_contacted_users(
    tiny_social_artifact: Path, tmp_path: Path
) -> None:
    from models.tasks.social import load_artifact as load_social

    name = next(iter(latest_versions(tiny_social_artifact)))
    art = load_social(latest_versions(tiny_social_artifact)[name])
    counts = Counter(t for u in art.histories.users() for t, _, _ in art.histories.timeline(u, art.users, art.actions))
    with TestClient(
        create_app(Settings(artifacts_dir=tiny_social_artifact, device="cpu", history_path=tmp_path / "h.sqlite3"))
    ) as c:
        r = c.post(
            "/recommend", json={"model": name, "queries": [{"user_id": "stranger", "k": 3, "exclude_future": False}]}
        )
        assert r.status_code == 200, r.text
        got = r.json()["results"][0]
        assert (
            got["source"] == "popular"
            and [i["score"] for i in got["items"]] == sorted(counts.values(), reverse=True)[:3]
        )
