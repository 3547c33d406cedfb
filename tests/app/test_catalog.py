"""What a real catalog needs, through the real app: a visitor the model does not know is answered (the
fallback, its source and its online segment), recent takes rank that fallback, hidden items leave every
answer on every worker and host sharing the store (live, canary, interleaved, the lists kept for online
evaluation), and a query's filter."""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from models.catalog import MAX_REQUEST_FILTER_NODES
from models.ids import N_SPECIAL
from models.tasks.recommend import load_artifact
from tests.servers import wait_until

ADMIN = {"X-API-Key": "admin-key"}
MODEL = "sasrec-tiny"
LOADS = 60.0  # a wait that includes loading a candidate version (a busy 2-core box takes more than the default)


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
        wait_until(lambda: len({x["version"] for x in _ask(b, [{"user_id": u} for u in users])}) == 2, timeout=LOADS)
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
        wait_until(lambda: {x["version"] for x in _ask(b, [{"user_id": u} for u in users])} == {first}, timeout=LOADS)
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
        blank = c.post(url, json={"item_ids": ["10", "   "]}, headers=ADMIN)
        assert blank.status_code == 422 and blank.json()["error"]["details"][0]["loc"] == ["body", "item_ids", 1]
        assert c.get(f"/models/{MODEL}/items/hidden").json()["items"] == []  # nothing of the refused call
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


def test_a_request_s_filter_work_is_bounded_over_its_distinct_filters(root: Path, tmp_path: Path) -> None:
    """Each condition of a distinct filter is a pass over the catalog to compile: a request holds at most
    MAX_REQUEST_FILTER_NODES of them (the same filter in many queries counts once); past it a 422 names
    the query that crossed it, before anything compiles."""
    one = {"any": [{"field": "release_year", "any_of": [1990 + n]} for n in range(63)]}  # 64 nodes
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        same = [{"user_id": "u1", "filter": one} for _ in range(20)]
        assert len(_ask(c, same)) == 20
        years = [[{"field": "release_year", "any_of": [1900 + q + n]} for n in range(63)] for q in range(5)]
        assert len(years) == MAX_REQUEST_FILTER_NODES // 64 + 1
        distinct = [{"user_id": "u1", "filter": {"any": conditions}} for conditions in years]
        assert len(_ask(c, distinct[:-1])) == len(distinct) - 1  # exactly at the bound
        r = c.post("/recommend", json={"model": MODEL, "queries": distinct}, headers=ADMIN)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["details"][0]["loc"] == ["body", "queries", len(distinct) - 1, "filter"]


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


def test_similar_items_are_the_nearest_of_a_hand_built_embedding_table(root: Path, tmp_path: Path) -> None:
    """Item vectors set on a circle, 10 degrees apart: an item's neighbours by cosine are the items next to it on
    the circle, nearest first; exclusions, filters and hidden items come out as for /recommend."""
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        served = c.app.state.services.loaded.models[MODEL]  # type: ignore[attr-defined]
        engine = served.engine
        engine.art.similar = None  # the embedding's neighbours, whatever the job chose for this artifact
        table = engine.model.dot_form().table
        with torch.no_grad():
            angles = torch.arange(table.size(0), dtype=torch.float) * math.radians(10)
            table.zero_()
            table[:, 0], table[:, 1] = torch.cos(angles), torch.sin(angles)
        ids = engine.art.items
        at = {ids.raw(i): i for i in range(N_SPECIAL, len(ids))}
        middle = ids.raw(N_SPECIAL + 10) or ""

        def similar(**body: Any) -> dict[str, Any]:
            r = c.post("/similar-items", json={"model": MODEL, "item_id": middle, **body})
            assert r.status_code == 200, r.text
            return dict(r.json())

        got = similar(k=4)
        assert got["source"] == "embedding" and got["complete"] is True
        offsets = [abs(at[i["item_id"]] - at[middle]) for i in got["items"]]
        assert offsets == [1, 1, 2, 2]  # either side, nearest first
        assert got["items"][0]["score"] == pytest.approx(math.cos(math.radians(10)), abs=1e-5)
        left = ids.raw(at[middle] - 1) or ""
        assert left not in {i["item_id"] for i in similar(k=4, exclude_items=[left])["items"]}
        kept = similar(k=3, filter={"field": "item_id", "any_of": [ids.raw(at[middle] + 5), ids.raw(at[middle] + 9)]})
        assert [i["item_id"] for i in kept["items"]] == [ids.raw(at[middle] + 5), ids.raw(at[middle] + 9)]
        assert kept["complete"] is False  # two items left for k = 3, and it says so
        _hide(c, [left])
        assert left not in {i["item_id"] for i in similar(k=4)["items"]}
        missing = c.post("/similar-items", json={"item_id": "no-such-item"})
        assert missing.status_code == 404 and missing.json()["error"]["details"][0]["loc"] == ["body", "item_id"]
        bad = c.post("/similar-items", json={"item_id": middle, "filter": {"field": "nope", "any_of": ["x"]}})
        assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == ["body", "filter", "field"]


def test_similar_items_from_a_counting_source_are_the_artifact_s_pair_counts(root: Path, tmp_path: Path) -> None:
    """The tiny log's job chose a counting source on validation: the neighbours it serves are the items that most
    often directly followed (transitions) the item in its users' histories, counted here by hand."""
    art = load_artifact(latest_versions(root)[MODEL])
    chosen = art.manifest.metrics["similar_items"]
    assert set(chosen["valid_hit_rate"]) == {"embedding", "transitions", "cooccurrence"}
    assert chosen["source"] == max(chosen["valid_hit_rate"], key=chosen["valid_hit_rate"].get)
    assert set(chosen["test_hit_rate"]) == set(chosen["valid_hit_rate"]) and chosen["pairs"]["test"] > 0
    if chosen["source"] != "transitions":
        pytest.skip(f"the job chose {chosen['source']} on this log")
    follows: Counter[tuple[str, str]] = Counter()
    for user in art.histories.users():
        steps = [i for i, _, _ in art.histories.timeline(user, art.items) if i in art.items]
        follows.update((a, b) for a, b in itertools.pairwise(steps) if a != b)
    item = max({a for a, _ in follows}, key=lambda a: (sum(n for (x, _), n in follows.items() if x == a), a))
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        r = c.post("/similar-items", json={"model": MODEL, "item_id": item, "k": 5})
        assert r.status_code == 200, r.text
        got = r.json()
    assert got["source"] == "transitions"
    counts = sorted((n for (a, _), n in follows.items() if a == item), reverse=True)
    assert [i["score"] for i in got["items"]] == counts[:5]
    assert all(i["score"] == follows[(item, i["item_id"])] for i in got["items"])


def test_a_named_filter_is_stored_once_and_used_by_name_with_its_parameters(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path))) as c, TestClient(create_app(_settings(root, tmp_path))) as d:
        expression = {"all": [{"field": "release_year", "between": [{"param": "after"}, None]}]}
        r = c.put(f"/admin/models/{MODEL}/filters/recent", json={"expression": expression}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["filters"] == {"recent": expression}
        assert c.put(f"/admin/models/{MODEL}/filters/recent", json={"expression": expression}).status_code == 401
        for literal in ("NaN", "Infinity", "-Infinity"):  # not JSON, though parsers take them: refused on write
            raw = '{"expression": {"field": "release_year", "between": [' + literal + ", null]}}"
            put = c.put(
                f"/admin/models/{MODEL}/filters/odd", content=raw, headers={**ADMIN, "Content-Type": "application/json"}
            )
            assert put.status_code == 422 and put.json()["error"]["details"][0]["loc"] == ["body", "expression"], (
                put.text
            )
        assert set(c.get(f"/models/{MODEL}/filters").json()["filters"]) == {"recent"}
        named = {"name": "recent", "params": {"after": 1995}}
        inline = {"field": "release_year", "between": [1995, None]}
        base = {"user_id": "u2", "k": 10, "exclude_future": False}
        by_name = _ask(c, [{**base, "filter": named}])[0]
        assert _items(by_name) == _items(_ask(c, [{**base, "filter": inline}])[0]) and _items(by_name)
        wait_until(
            lambda: (
                d.post("/recommend", json={"model": MODEL, "queries": [{**base, "filter": named}]}).status_code == 200
            )
        )
        assert d.get(f"/models/{MODEL}/filters").json()["filters"] == {"recent": expression}  # the other worker too

        def error(f: object) -> tuple[int, list[Any]]:
            r = c.post("/recommend", json={"model": MODEL, "queries": [{**base, "filter": f}]})
            return r.status_code, r.json()["error"]["details"][0]["loc"]

        assert error({"name": "recent"}) == (422, ["body", "queries", 0, "filter", "params", "after"])
        assert error({"name": "recent", "params": {"after": 1995, "x": 1}}) == (
            422,
            ["body", "queries", 0, "filter", "params", "x"],
        )
        assert error({"name": "nope", "params": {}}) == (422, ["body", "queries", 0, "filter", "name"])
        gone = c.delete(f"/admin/models/{MODEL}/filters/recent", headers=ADMIN)
        assert gone.status_code == 200 and gone.json()["filters"] == {}
        assert error(named)[0] == 422


def test_max_per_spreads_a_list_as_a_hand_computation_over_the_plain_ranking(root: Path, tmp_path: Path) -> None:
    with TestClient(create_app(_settings(root, tmp_path))) as c:
        base = {"user_id": "u3", "exclude_future": False, "fields": ["genres"]}
        plain, spread = _ask(c, [{**base, "k": 25}, {**base, "k": 4, "max_per": {"genres": 3}}])
        held: Counter[str] = Counter()
        want = []
        for item in plain["items"]:  # kept while fewer than 3 better candidates hold each of its genres
            genres = item["fields"]["genres"]
            if all(held[g] < 3 for g in genres) and len(want) < 4:
                want.append(item["item_id"])
            held.update(genres)
        assert _items(spread) == want and len(want) >= 3
        assert max(Counter(g for i in spread["items"] for g in i["fields"]["genres"]).values()) <= 3
        bad = c.post("/recommend", json={"model": MODEL, "queries": [{**base, "max_per": {"colour": 1}}]})
        assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == [
            "body",
            "queries",
            0,
            "max_per",
            "colour",
        ]


def test_a_worker_that_starts_later_knows_what_was_just_taken(root: Path, tmp_path: Path) -> None:
    """Recent takes are read from the store's arrivals over the window before a worker starts: a restarted
    or added worker answers visitors from them at once, not from popularity until new takes come in."""
    with TestClient(create_app(_settings(root, tmp_path, fallback_min_takes=5))) as a:
        events = [{"event_id": f"w{n}", "user_id": f"u{n}", "item_id": "20", "timestamp": 1e9 + n} for n in range(6)]
        assert a.post("/events", json={"model": MODEL, "events": events}).status_code == 200
    with TestClient(create_app(_settings(root, tmp_path, fallback_min_takes=5))) as b:  # started after the takes
        wait_until(lambda: _ask(b, [{"user_id": "visitor", "k": 1}])[0]["source"] == "popular_recent")
        assert _items(_ask(b, [{"user_id": "visitor", "k": 1}])[0]) == ["20"]
