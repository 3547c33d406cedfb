"""A social model through the real app: /recommend returns users, actions are required, /events conditions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from models.tasks.social import load_artifact
from tests.conftest import stored, stored_users

MODEL = "social-tiny"


@pytest.fixture
def client(tiny_social_artifact: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(artifacts_dir=tiny_social_artifact, device="cpu"))) as c:
        yield c


def _rec(client: TestClient, query: dict) -> dict:
    r = client.post("/recommend", json={"model": MODEL, "queries": [query]})
    assert r.status_code == 200, r.text
    return dict(r.json()["results"][0])


def test_listed_with_its_task(client: TestClient) -> None:
    info = next(m for m in client.get("/models").json()["models"] if m["name"] == MODEL)
    assert info["task"] == "social" and info["kind"] == "social" and info["scoring"] == "traced"
    # What the console needs, declared rather than guessed from the task's name.
    assert info["route"] == "/recommend" and info["ranks"] == "users" and info["exclude_seen_default"] is False
    assert MODEL in client.get("/readyz").json()["models"]


def test_returns_users_never_the_actor_and_keeps_seen_by_default(
    client: TestClient, tiny_social_artifact: Path
) -> None:
    art = load_artifact(latest_versions(tiny_social_artifact)[MODEL])
    users = set(art.users.raws())
    past = {t for t, _, a in stored(art, "s3") if not a.startswith("<-")}  # whom s3 acted on
    assert past != {t for t, _, _ in stored(art, "s3")}  # s3 received from others too: not "seen"
    kept = _rec(client, {"user_id": "s3", "k": 25})
    got = [i["item_id"] for i in kept["items"]]
    assert len(got) == 25 and set(got) <= users and "s3" not in got
    assert kept["excluded"]["seen"] == 0 and past & set(got)
    fresh = _rec(client, {"user_id": "s3", "k": 25, "exclude_seen": True})
    assert not past & {i["item_id"] for i in fresh["items"]} and fresh["excluded"]["seen"] == len(past - {"s3"})


def test_users_not_yet_active_are_future(client: TestClient, tiny_social_artifact: Path) -> None:
    art = load_artifact(latest_versions(tiny_social_artifact)[MODEL])
    cut = sorted(art.first_activity.values())[len(art.first_activity) // 2]
    r = _rec(client, {"user_id": "s3", "k": 30, "as_of": cut})
    late = {u for u, t in art.first_activity.items() if t > cut}
    assert r["excluded"]["future"] > 0 and not late & {i["item_id"] for i in r["items"]}
    assert _rec(client, {"user_id": "s3", "k": 30, "as_of": cut, "exclude_future": False})["excluded"]["future"] == 0


@pytest.mark.parametrize(
    ("step", "msg"), [({"item_id": "s4"}, "required"), ({"item_id": "s4", "action": "likes"}, "unknown action")]
)
def test_history_step_needs_a_known_action(client: TestClient, step: dict, msg: str) -> None:
    r = client.post("/recommend", json={"model": MODEL, "queries": [{"user_id": "s3", "history": [step]}]})
    assert r.status_code == 422
    detail = r.json()["error"]["details"][0]
    assert detail["loc"] == ["body", "queries", 0, "history", 0, "action"] and msg in detail["msg"]


def test_events_carry_the_action_and_condition_the_next_answer(client: TestClient, tiny_social_artifact: Path) -> None:
    art = load_artifact(latest_versions(tiny_social_artifact)[MODEL])
    t = max(t for _, t, _ in stored(art, "s5"))
    r = client.post(
        "/events",
        json={"model": MODEL, "events": [{"event_id": "e0", "user_id": "s5", "item_id": "s20", "timestamp": t + 60}]},
    )
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "events", 0, "action"]
    # One wrong action refuses the request whole: the good event beside it is not stored either.
    r = client.post(
        "/events",
        json={
            "model": MODEL,
            "events": [
                {"event_id": "e1", "user_id": "s5", "item_id": "s20", "action": "c2a", "timestamp": t + 60},
                {"event_id": "e9", "user_id": "s5", "item_id": "s20", "action": "like", "timestamp": t + 60},
            ],
        },
    )
    assert r.status_code == 422 and [d["loc"][2] for d in r.json()["error"]["details"]] == [1]
    before = _rec(client, {"user_id": "s5", "k": 5, "exclude_seen": True})
    events = [
        {"event_id": f"e{n}", "user_id": "s5", "item_id": "s20", "action": "c2a", "timestamp": t + 60 * n}
        for n in range(1, 4)
    ]
    r = client.post("/events", json={"model": MODEL, "events": events})
    assert r.status_code == 200 and r.json()["stored"] == 3
    after = _rec(client, {"user_id": "s5", "k": 5, "exclude_seen": True})
    assert "s20" not in {i["item_id"] for i in after["items"]}
    assert after["excluded"]["seen"] == before["excluded"]["seen"] + (
        "s20" not in {t for t, _, a in stored(art, "s5") if not a.startswith("<-")}
    )
    assert after["items"] != before["items"]


def test_an_event_reaches_its_target_as_a_received_step(client: TestClient, tiny_social_artifact: Path) -> None:
    art = load_artifact(latest_versions(tiny_social_artifact)[MODEL])
    t = max(t for u in stored_users(art) for _, t, _ in stored(art, u))
    before = _rec(client, {"user_id": "s20", "k": 10})
    events = [
        {"event_id": f"m{n}", "user_id": "s7", "item_id": "s20", "action": "a2q", "timestamp": t + n}
        for n in range(1, 9)
    ]
    r = client.post("/events", json={"model": MODEL, "events": events})
    assert r.status_code == 200 and r.json()["stored"] == 8
    # Eight answers received from s7: s20's own next answer changes (the target's timeline grew)...
    after = _rec(client, {"user_id": "s20", "k": 10})
    assert after["items"] != before["items"]
    # ...and is what the same history gives when sent by hand, received steps included.
    given = [{"item_id": "s7", "action": "<-a2q", "timestamp": e["timestamp"]} for e in events]
    base_plus = client.post(
        "/recommend",
        json={
            "model": MODEL,
            "queries": [
                {
                    "k": 10,
                    "history": [{"item_id": x, "action": a, "timestamp": tt} for x, tt, a in stored(art, "s20")[-20:]]
                    + given,
                }
            ],
        },
    )
    assert base_plus.status_code == 200
    assert [i["item_id"] for i in base_plus.json()["results"][0]["items"] if i["item_id"] != "s20"][:5] == [
        i["item_id"] for i in after["items"]
    ][:5]
    # A received step is never "seen": only whom s20 acted on is excluded.
    fresh = _rec(client, {"user_id": "s20", "k": 10, "exclude_seen": True})
    assert fresh["excluded"]["seen"] == len({x for x, _, a in stored(art, "s20") if not a.startswith("<-")} - {"s20"})
    # Replaying the events stores nothing twice, the received steps included.
    again = client.post("/events", json={"model": MODEL, "events": events})
    assert again.status_code == 200 and again.json()["stored"] == 0
    # Reusing an id with another payload is one conflict per event, its received step included.
    clash = client.post("/events", json={"model": MODEL, "events": [{**events[0], "item_id": "s9"}]})
    assert clash.status_code == 409 and len(clash.json()["error"]["details"]) == 1
    assert _rec(client, {"user_id": "s20", "k": 10})["items"] == after["items"]


@pytest.mark.parametrize(
    ("event", "field", "type_"),
    [
        ({"event_id": "<-x", "action": "a2q"}, "event_id", "reserved_event_id"),
        ({"event_id": "r1", "action": "<-a2q"}, "action", "invalid_action"),
    ],
)
def test_received_forms_are_the_service_s_not_the_client_s(
    client: TestClient, event: dict, field: str, type_: str
) -> None:
    body = {"model": MODEL, "events": [{"user_id": "s5", "item_id": "s20", "timestamp": 1e9, **event}]}
    r = client.post("/events", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["error"]["details"][0]
    assert detail["loc"] == ["body", "events", 0, field] and detail["type"] == type_


def test_a_reserved_id_cannot_be_squatted_with_a_self_loop(client: TestClient) -> None:
    """A '<-' id is refused even on an event that writes no received step (actor == target)."""
    loop = {"event_id": "<-E1", "user_id": "s5", "item_id": "s5", "action": "a2q", "timestamp": 1e9}
    r = client.post("/events", json={"model": MODEL, "events": [loop]})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == ["body", "events", 0, "event_id"]
    legit = {"event_id": "E1", "user_id": "s6", "item_id": "s9", "action": "a2q", "timestamp": 1e9}
    r = client.post("/events", json={"model": MODEL, "events": [legit]})
    assert r.status_code == 200 and r.json()["stored"] == 1


def test_what_others_do_to_a_user_never_pushes_out_its_own_events(tiny_social_artifact: Path) -> None:
    settings = Settings(artifacts_dir=tiny_social_artifact, device="cpu", live_events=10)
    t0 = time.time() - 10_000
    with TestClient(create_app(settings)) as c:
        own = [
            {"event_id": f"v{n}", "user_id": "victim", "item_id": f"s{n}", "action": "a2q", "timestamp": t0 + n}
            for n in range(5)
        ]
        assert c.post("/events", json={"model": MODEL, "events": own}).json()["stored"] == 5
        flood = [
            {
                "event_id": f"x{n}",
                "user_id": "attacker",
                "item_id": "victim",
                "action": "c2q",
                "timestamp": t0 + 100 + n,
            }
            for n in range(40)
        ]
        out = c.post("/events", json={"model": MODEL, "events": flood}).json()
        # The attacker keeps its own newest 10 (the rest is reported dropped); the victim receives 40 steps.
        assert (out["stored"], out["dropped_old"]) == (10, 30)
        r = c.post(
            "/recommend", json={"model": MODEL, "queries": [{"user_id": "victim", "k": 30, "exclude_seen": True}]}
        )
        assert r.status_code == 200, r.text
        res = r.json()["results"][0]
        # Whom the victim acted on is still its own history: excluded as seen, all five.
        assert res["excluded"]["seen"] == 5 and not {f"s{n}" for n in range(5)} & {i["item_id"] for i in res["items"]}


def test_everyones_live_events_before_the_query_are_recent_activity(
    client: TestClient, tiny_social_artifact: Path
) -> None:
    art = load_artifact(latest_versions(tiny_social_artifact)[MODEL])
    assert art.model.activity_weight is not None and bool(art.model.activity_weight.abs().sum() > 0)
    end = float(art.events.times[-1]) if art.events is not None else 0.0
    when = end + 10 * 86400.0  # the artifact's log is more than a day older: no activity from it

    def scores() -> dict[str, float]:
        r = _rec(client, {"user_id": "s5", "k": 30, "as_of": when})
        return {i["item_id"]: i["score"] for i in r["items"]}

    def post(events: list[tuple[str, float]]) -> None:
        body = [
            {"event_id": eid, "user_id": "s11", "item_id": "s17", "action": "c2q", "timestamp": t} for eid, t in events
        ]
        r = client.post("/events", json={"model": MODEL, "events": body})
        assert r.status_code == 200 and r.json()["stored"] == len(events)

    before = scores()
    post([("late", when), ("later", when + 60)])  # not before the query: not counted
    assert scores() == pytest.approx(before, abs=1e-5)
    post([(f"a{n}", when - 60.0 * (n + 1)) for n in range(5)])  # s11 -> s17, in the minutes before
    after = scores()

    def gap(s: dict[str, float], a: str, b: str) -> float:
        return s[a] - s[b]

    # Other users' own events changed s17's and s11's standing in s5's answer, and no one else's.
    assert abs(gap(after, "s17", "s2") - gap(before, "s17", "s2")) > 1e-4
    assert abs(gap(after, "s11", "s2") - gap(before, "s11", "s2")) > 1e-4
    assert gap(after, "s3", "s2") == pytest.approx(gap(before, "s3", "s2"), abs=1e-4)


def test_history_pages_own_and_received_steps_apart(client: TestClient, tiny_social_artifact: Path) -> None:
    """Many received steps never hide what the user did: each kind has its own page."""
    art = load_artifact(latest_versions(tiny_social_artifact)[MODEL])
    t = max(t for u in stored_users(art) for _, t, _ in stored(art, u)) + 100
    own = {"event_id": "own-1", "user_id": "s20", "item_id": "s3", "action": "a2q", "timestamp": t}
    received = [
        {"event_id": f"r{n}", "user_id": "s7", "item_id": "s20", "action": "a2q", "timestamp": t + 1 + n}
        for n in range(6)
    ]
    assert client.post("/events", json={"model": MODEL, "events": [own, *received]}).status_code == 200

    def page(steps: str) -> list[dict]:
        r = client.get("/history", params={"user_id": "s20", "model": MODEL, "limit": 3, "steps": steps})
        assert r.status_code == 200, r.text
        return list(r.json()["events"])

    assert all(e["action"].startswith("<-") for e in page("all"))  # the newest three are received
    mine = page("own")
    assert mine[0]["item_id"] == "s3" and mine[0]["source"] == "live"
    assert not any(e["action"].startswith("<-") for e in mine)
    assert [e["item_id"] for e in page("received")] == ["s7"] * 3
    bad = client.get("/history", params={"user_id": "s20", "model": MODEL, "steps": "mine"})
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == ["query", "steps"]
