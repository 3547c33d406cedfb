"""The HTTP contract through the real app and its lifespan, on tiny trained artifacts."""

from __future__ import annotations

import datetime as dt
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.artifact import latest_versions
from models.tasks.recommend import load_artifact as load_rec_artifact
from tests.conftest import stored


@pytest.fixture(scope="module")
def client(tiny_artifacts: Path) -> Iterator[TestClient]:
    app = create_app(
        Settings(artifacts_dir=tiny_artifacts, device="cpu", default_model="sasrec-tiny", max_queries=8, max_history=50)
    )
    with TestClient(app) as c:
        yield c


def _post(client: TestClient, body: object) -> tuple[int, dict]:
    r = client.post("/recommend", json=body)
    return r.status_code, r.json()


def test_health_ready_models(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == ["bert4rec-tiny", "sasrec-tiny"]
    models = client.get("/models").json()
    assert models["defaults"] == {"/recommend": "sasrec-tiny", "/next-location": None}
    assert {m["kind"] for m in models["models"]} == {"sasrec", "bert4rec"}
    assert all(m["catalog_size"] == 30 and m["device"] == "cpu" for m in models["models"])
    assert all(
        m["route"] == "/recommend" and m["ranks"] == "items" and m["exclude_seen_default"] for m in models["models"]
    )
    assert all(m["scoring"] == "traced" for m in models["models"])  # models/traced.py, checked at load
    # Operators see whether each model beats the best simple baseline of its own training run.
    assert all(
        m["metrics"]["full_ndcg10_vs_best_baseline"]["baseline"] in {"popularity", "transitions", "item_knn"}
        for m in models["models"]
    )


def test_a_version_under_its_best_baseline_serves_and_says_so(tiny_artifacts: Path, tmp_path: Path) -> None:
    """A first training on too little (nothing else to serve) serves, warned in readiness and on the gauge the
    SeqserveUnderBaseline alert reads; a version above its baseline raises neither."""
    import json

    from tests.servers import wait_until

    arts = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, arts)
    manifest = latest_versions(arts)["sasrec-tiny"] / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["metrics"]["full_ndcg10_vs_best_baseline"] = {"baseline": "popularity", "ratio": 0.79}
    manifest.write_text(json.dumps(doc))
    bert = json.loads((latest_versions(arts)["bert4rec-tiny"] / "manifest.json").read_text())
    bert_ratio = bert["metrics"]["full_ndcg10_vs_best_baseline"]["ratio"]
    settings = Settings(artifacts_dir=arts, device="cpu", housekeeping_s=0.05, history_path=tmp_path / "h.sqlite3")
    with TestClient(create_app(settings)) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200
        warned = ready.json()["warnings"]
        assert set(warned) == ({"sasrec-tiny", "bert4rec-tiny"} if bert_ratio < 1 else {"sasrec-tiny"})
        assert "offline test NDCG@10 0.79x its run's best simple baseline" in warned["sasrec-tiny"]

        def gauge() -> str:
            return c.get("/metrics").text

        wait_until(lambda: 'seqserve_model_vs_best_baseline{model="sasrec-tiny"} 0.79' in gauge())


@pytest.mark.parametrize("model", ["sasrec-tiny", "bert4rec-tiny"])
def test_known_user_gets_unseen_released_items(client: TestClient, tiny_artifacts: Path, model: str) -> None:
    art = load_rec_artifact(latest_versions(tiny_artifacts)[model])
    status, body = _post(client, {"model": model, "queries": [{"user_id": "u3", "k": 5}]})
    assert status == 200 and body["model"] == model and body["version"]
    res = body["results"][0]
    items = [i["item_id"] for i in res["items"]]
    seen = {i for i, _, _ in stored(art, "u3")}
    last_year = dt.datetime.fromtimestamp(max(t for _, t, _ in stored(art, "u3")), dt.UTC).year
    assert len(items) == 5 and not seen & set(items)
    assert all(art.release[i] <= last_year for i in items)
    scores = [i["score"] for i in res["items"]]
    assert scores == sorted(scores, reverse=True)
    assert res["excluded"]["seen"] == len(seen)
    assert res["excluded"]["future"] == sum(1 for i, y in art.release.items() if y > last_year and i not in seen)


def test_flags_history_requested_and_unknown_items(client: TestClient) -> None:
    q = {
        "history": [{"item_id": "12"}, {"item_id": "nope"}, {"item_id": "13"}],
        "k": 30,
        "exclude_future": False,
        "exclude_items": ["14", "15", "also-unknown"],
    }
    status, body = _post(client, {"queries": [q]})
    assert status == 200
    res = body["results"][0]
    items = {i["item_id"] for i in res["items"]}
    assert res["user_id"] is None and res["unknown_items"] == ["nope"]
    assert items == {str(i) for i in range(10, 40)} - {"12", "13", "14", "15"}  # k beyond candidates
    assert res["excluded"] == {"seen": 2, "future": 0, "requested": 2, "filtered": 0}
    assert res["complete"] is False  # 26 of the 30 asked for were left, and the result says so
    q2 = {**q, "exclude_seen": False, "exclude_items": []}
    res2 = _post(client, {"queries": [q2]})[1]["results"][0]
    assert {"12", "13"} <= {i["item_id"] for i in res2["items"]}


def test_as_of_and_appended_history(client: TestClient) -> None:
    early = dt.datetime(1993, 6, 1, tzinfo=dt.UTC).timestamp()
    status, body = _post(client, {"queries": [{"user_id": "u1", "as_of": early, "k": 30}]})
    assert status == 200
    items = [i["item_id"] for i in body["results"][0]["items"]]
    assert items and all(1990 + int(i) % 10 <= 1993 for i in items)
    # Items given after the stored history count as seen too.
    status, body = _post(
        client, {"queries": [{"user_id": "u1", "history": [{"item_id": "39"}], "k": 30, "exclude_future": False}]}
    )
    assert "39" not in {i["item_id"] for i in body["results"][0]["items"]}


def test_many_queries_one_request_keep_order(client: TestClient) -> None:
    qs = [{"user_id": f"u{i}", "k": 3} for i in range(5)]
    status, body = _post(client, {"queries": qs})
    assert status == 200 and [r["user_id"] for r in body["results"]] == [f"u{i}" for i in range(5)]
    single = _post(client, {"queries": [qs[2]]})[1]["results"][0]
    batched = body["results"][2]  # batching other users does not change an answer
    assert [i["item_id"] for i in single["items"]] == [i["item_id"] for i in batched["items"]]
    assert [i["score"] for i in single["items"]] == pytest.approx([i["score"] for i in batched["items"]], abs=1e-5)


def test_a_visitor_in_a_batch_of_known_users_gets_the_popular_items(client: TestClient, tiny_artifacts: Path) -> None:
    """The fallback: the artifact's most frequent items (counted here from its users' timelines), with the
    visitor's own exclusions, while the known user beside it is answered by the model."""
    art = load_rec_artifact(latest_versions(tiny_artifacts)["sasrec-tiny"])
    counts = Counter(i for u in art.histories.users() for i, _, _ in art.histories.timeline(u, art.items))
    top = max(counts, key=lambda i: counts[i])
    queries = [{"user_id": "u1", "k": 3}, {"user_id": "ghost", "k": 5, "exclude_future": False, "exclude_items": [top]}]
    status, body = _post(client, {"queries": queries})
    assert status == 200, body
    known, ghost = body["results"]
    assert known["source"] == "model" and ghost["source"] == "popular" and ghost["user_id"] == "ghost"
    assert known["complete"] and ghost["complete"]
    assert top not in {i["item_id"] for i in ghost["items"]} and ghost["excluded"]["requested"] == 1
    assert all(i["score"] == counts[i["item_id"]] for i in ghost["items"])
    rest = sorted((n for i, n in counts.items() if i != top), reverse=True)
    assert [i["score"] for i in ghost["items"]] == rest[:5]
    # A future item is not offered to a visitor either: they are "as of now" unless as_of says otherwise.
    then = _post(client, {"queries": [{"user_id": "ghost", "k": 30, "as_of": 631152000}]})[1]["results"][0]
    assert then["excluded"]["future"] > 0 and then["source"] == "popular"


def test_a_query_may_ask_for_the_404_of_an_unknown_user(client: TestClient) -> None:
    status, body = _post(client, {"queries": [{"user_id": "u1"}, {"user_id": "ghost", "on_unknown": "error"}]})
    assert status == 404
    assert body["error"]["code"] == "unknown_user" and "ghost" in body["error"]["message"]
    assert body["error"]["details"][0]["loc"] == ["body", "queries", 1, "user_id"]


def test_unknown_and_broken_model(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    (latest_versions(root)["bert4rec-tiny"] / "items.json").write_text("[]")
    with TestClient(create_app(Settings(artifacts_dir=root, device="cpu"))) as c:
        status, body = _post(c, {"model": "nope", "queries": [{"user_id": "u1"}]})
        assert status == 404 and body["error"]["code"] == "unknown_model"
        assert body["error"]["details"][0]["loc"] == ["body", "model"]
        status, body = _post(c, {"model": "bert4rec-tiny", "queries": [{"user_id": "u1"}]})
        assert status == 503 and body["error"]["code"] == "model_unavailable"
        assert "items.json" in body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, ["body", "queries"]),
        ({"queries": []}, ["body", "queries"]),
        ({"queries": [{}]}, ["body", "queries", 0]),
        ({"queries": [{"user_id": "u1", "k": 0}]}, ["body", "queries", 0, "k"]),
        ({"queries": [{"user_id": "u1", "k": "ten"}]}, ["body", "queries", 0, "k"]),
        ({"queries": [{"user_id": ""}]}, ["body", "queries", 0, "user_id"]),
        ({"queries": [{"user_id": "u1", "bogus": 1}]}, ["body", "queries", 0, "bogus"]),
        (
            {"queries": [{"history": [{"item_id": "1", "timestamp": -5}]}]},
            ["body", "queries", 0, "history", 0, "timestamp"],
        ),
        ({"queries": [{"user_id": "u1"}] * 9}, ["body", "queries"]),
        ({"queries": [{"user_id": "u1", "k": 5000}]}, ["body", "queries", 0, "k"]),
        ({"queries": [{"history": [{"item_id": "12"}] * 51}]}, ["body", "queries", 0, "history"]),
        ([1, 2], ["body"]),
    ],
)
def test_malformed_bodies_are_422_naming_the_field(client: TestClient, body: object, loc: list) -> None:
    status, out = _post(client, body)
    assert status == 422
    assert out["error"]["details"][0]["loc"][: len(loc)] == loc
    assert out["error"]["message"]


def test_form_content_type_gets_a_hint(client: TestClient) -> None:
    r = client.post(
        "/recommend",
        content=b'{"queries":[{"user_id":"u1"}]}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 422 and "Content-Type: application/json" in r.json()["error"]["message"]


def test_not_json_and_unknown_route(client: TestClient) -> None:
    r = client.post("/recommend", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = client.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.get("/recommend")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"


def test_a_405_allows_every_method_of_its_path(client: TestClient) -> None:
    """A resource answered by several routes (a named filter's PUT and DELETE) lists them all in Allow."""
    r = client.options("/admin/models/sasrec-tiny/filters/genre")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert set(r.headers["allow"].split(", ")) == {"PUT", "DELETE"}
    r = client.post("/models/sasrec-tiny/versions")
    assert r.status_code == 405 and "GET" in r.headers["allow"].split(", ")


def test_broken_artifact_does_not_stop_the_others(tiny_artifacts: Path, tmp_path: Path) -> None:
    root = tmp_path / "arts"
    shutil.copytree(tiny_artifacts, root)
    bert = latest_versions(root)["bert4rec-tiny"]
    (bert / "model.pt").write_bytes(b"garbage")
    empty = root / "half" / "20200101T000000Z"
    empty.mkdir(parents=True)
    app = create_app(Settings(artifacts_dir=root, device="cpu"))
    with TestClient(app) as c:
        ready = c.get("/readyz").json()
        assert ready["ready"] and ready["models"] == ["sasrec-tiny"]
        assert ready["broken"][f"bert4rec-tiny/{bert.name}"] == "model.pt: unreadable checkpoint"
        assert ready["broken"]["half/20200101T000000Z"] == "manifest.json: missing"
        assert str(root) not in c.get("/readyz").text + c.get("/models").text  # no paths for clients
        r = c.post("/recommend", json={"model": "bert4rec-tiny", "queries": [{"user_id": "u1"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
        assert c.post("/recommend", json={"queries": [{"user_id": "u1"}]}).status_code == 200


def test_no_models_is_not_ready(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(artifacts_dir=tmp_path, device="cpu"))) as c:
        assert c.get("/readyz").status_code == 503
        r = c.post("/recommend", json={"queries": [{"user_id": "u1"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"


def test_request_totals_are_bounded_naming_the_field(tiny_location_artifact: Path) -> None:
    """Per-field caps alone let 1,024 queries x k = 1,000 ask for a million results: the sums are capped."""
    settings = Settings(artifacts_dir=tiny_location_artifact, device="cpu", max_total_k=30, max_total_items=10)
    with TestClient(create_app(settings)) as c:
        ok = {"queries": [{"user_id": "u1", "k": 15}, {"user_id": "u2", "k": 15}]}
        assert c.post("/recommend", json=ok).status_code == 200
        cases = [
            ("/recommend", {"queries": [{"user_id": "u1", "k": 20}, {"user_id": "u2", "k": 11}]}, "k add up"),
            (
                "/recommend",
                {"queries": [{"user_id": "u1", "history": [{"item_id": "12"}] * 6, "exclude_items": ["13"] * 5}]},
                "excluded items add up",
            ),
            (
                "/next-location",
                {
                    "queries": [
                        {"history": [{"location_id": "a", "start_min": 1, "weekday": 1, "duration_min": 5}] * 11}
                    ]
                },
                "steps add up",
            ),
        ]
        for path, body, msg in cases:
            r = c.post(path, json=body)
            assert r.status_code == 422, r.text
            detail = r.json()["error"]["details"][0]
            assert detail["loc"] == ["body", "queries"] and msg in detail["msg"]


def test_request_path_routes_are_documented(client: TestClient) -> None:
    """/recommend and /next-location are served by plain Starlette routes (app/routers/plain.py): the
    document still names their body, their answer and their errors, from the app's bounded models."""
    doc = client.get("/openapi.json").json()
    for path, body, answer in (
        ("/recommend", "RecommendRequest", "RecommendResponse"),
        ("/next-location", "NextLocationRequest", "NextLocationResponse"),
    ):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"] == f"#/components/schemas/{body}"
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(answer)
        assert {"404", "422", "503"} <= set(op["responses"])
        assert set(doc["paths"][path]) == {"post"}
    # The bounds are the app's settings (max_queries=8 in this client).
    assert doc["components"]["schemas"]["RecommendRequest"]["properties"]["queries"]["maxItems"] == 8
    assert "/bench/noop" not in doc["paths"]
    assert client.post("/bench/noop", json={"queries": [{"user_id": "u1"}]}).status_code == 404


def test_traced_and_eager_models_answer_alike(client: TestClient, tiny_artifacts: Path) -> None:
    settings = Settings(artifacts_dir=tiny_artifacts, device="cpu", trace_models=False)
    queries = [{"user_id": f"u{n}", "k": 8} for n in range(6)] + [{"history": [{"item_id": "i3"}], "k": 8}]
    with TestClient(create_app(settings)) as eager:
        assert {m["scoring"] for m in eager.get("/models").json()["models"]} == {"eager (tracing off)"}
        for model in ("sasrec-tiny", "bert4rec-tiny"):
            body = {"model": model, "queries": queries}
            want, got = eager.post("/recommend", json=body).json(), client.post("/recommend", json=body).json()
            for w, g in zip(want["results"], got["results"], strict=True):
                assert [i["item_id"] for i in g["items"]] == [i["item_id"] for i in w["items"]]
                assert [i["score"] for i in g["items"]] == pytest.approx([i["score"] for i in w["items"]], abs=1e-5)
                assert g["excluded"] == w["excluded"]


def test_models_on_the_cpu_batch_up_to_32_queries(client: TestClient) -> None:
    batchers = {name: served.batcher for name, served in client.app.state.services.loaded.models.items()}
    assert batchers and all(b.max_batch_size == 32 for b in batchers.values())


@pytest.mark.parametrize(
    ("ctype", "status"),
    [
        ("APPLICATION/JSON", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/Json ; charset=UTF-8", 200),
        ("application/vnd.api+json", 200),
        ("application/jsonx", 422),
        ("text/plain; charset=json", 422),
        ("text/json-ish", 422),
    ],
)
def test_media_type_is_parsed_not_matched_as_a_substring(client: TestClient, ctype: str, status: int) -> None:
    r = client.post("/recommend", content=b'{"queries":[{"user_id":"u1"}]}', headers={"content-type": ctype})
    assert r.status_code == status, r.text
    if status == 422:
        assert r.json()["error"]["details"][0]["type"] == "content_type"


def test_api_paths_never_redirect(client: TestClient) -> None:
    """A trailing slash is a 404 on the same host, never a redirect a client would follow elsewhere."""
    for path in ("/events/", "/recommend/", "/healthz/"):
        r = client.post(path, json={}, headers={"host": "evil.example"}, follow_redirects=False)
        assert r.status_code in (404, 405) and "location" not in r.headers, (path, r.status_code)
        assert r.json()["error"]["code"] in ("not_found", "method_not_allowed")


def test_error_details_are_capped_with_the_count_of_the_rest(client: TestClient) -> None:
    query: dict[str, object] = {"user_id": "u1", **{f"x{n}": 0 for n in range(5000)}}
    r = client.post("/recommend", json={"queries": [query]})
    assert r.status_code == 422
    err = r.json()["error"]
    assert len(err["details"]) == 50 and err["details"][0]["loc"][:3] == ["body", "queries", 0]
    assert "4950 more" in err["message"] and len(r.content) < 20_000


def test_work_for_a_client_that_has_gone_never_reaches_the_model(tiny_artifacts: Path) -> None:
    """A request queued behind a busy model whose client hangs up is dropped: 499, no model call."""
    import asyncio
    import json
    import threading

    from app.middleware import CONNECTION_CLOSED
    from tests.app.test_observability import _blocked_model

    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", max_batch_size=1))
    with TestClient(app) as c:
        gate, entered, sizes = _blocked_model(app, "sasrec-tiny")
        first = threading.Thread(
            target=c.post,
            args=("/recommend",),
            kwargs={"json": {"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]}},
        )
        first.start()
        assert entered.wait(10)
        body = json.dumps({"model": "sasrec-tiny", "queries": [{"user_id": "u2"}]}).encode()
        sent: list[dict] = []
        hung_up = threading.Event()

        async def queued_then_gone() -> None:
            hang_up = asyncio.Event()
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict:
                if messages:
                    return messages.pop()
                await hang_up.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict) -> None:
                sent.append(message)

            async def later() -> None:
                batcher = app.state.services.loaded.models["sasrec-tiny"].batcher
                while batcher.depth == 0:  # queued behind the busy model
                    await asyncio.sleep(0.01)
                hang_up.set()
                hung_up.set()

            # As the service's server gives it: true once the connection is closed (app/server.py).
            scope = {
                "type": "http",
                "method": "POST",
                "path": "/recommend",
                "raw_path": b"/recommend",
                "query_string": b"",
                "root_path": "",
                "scheme": "http",
                "http_version": "1.1",
                "server": ("test", 80),
                "client": ("c", 1),
                "state": {},
                "extensions": {CONNECTION_CLOSED: hang_up.is_set},
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
            waiter = asyncio.ensure_future(later())
            await asyncio.wait_for(app(scope, receive, send), 10)
            await waiter

        assert c.portal is not None
        answered = c.portal.start_task_soon(queued_then_gone)
        assert hung_up.wait(10)  # queued behind the busy model, then gone
        gate.set()  # the busy model finishes; the next turn is the gone client's
        answered.result(timeout=10)
        first.join()
        assert sent[0]["status"] == 499
        assert sizes == [1]  # the first request alone: the second never reached the model


def test_a_large_request_answers_what_its_queries_answer_alone(tiny_artifacts: Path) -> None:
    """Above serving.PREPARE_INLINE_QUERIES the queries are prepared in a thread: same answers, same order."""
    from app.answering import PREPARE_INLINE_QUERIES

    queries = [
        {"user_id": f"u{n % 40}", "k": 3 + n % 4, **({"history": [{"item_id": str(10 + n % 30)}]} if n % 3 else {})}
        for n in range(PREPARE_INLINE_QUERIES + 36)
    ]
    with TestClient(create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu"))) as c:
        together = c.post("/recommend", json={"model": "sasrec-tiny", "queries": queries})
        assert together.status_code == 200, together.text
        alone = [
            c.post("/recommend", json={"model": "sasrec-tiny", "queries": [q]}).json()["results"][0]
            for q in queries[::7]
        ]
    got = together.json()["results"][::7]
    assert [[i["item_id"] for i in r["items"]] for r in got] == [[i["item_id"] for i in r["items"]] for r in alone]
    assert [r["user_id"] for r in together.json()["results"]] == [q["user_id"] for q in queries]


def test_the_request_timeout_counts_the_time_spent_preparing(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading and preparing count against request_timeout_s: a request whose preparation used it all gets its
    504 without waiting a whole timeout again in the model's queue (nor reaching the model)."""
    import types

    import app.answering as answering

    clock = [1000.0]
    monkeypatch.setattr(answering, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    app = create_app(Settings(artifacts_dir=tiny_artifacts, device="cpu", request_timeout_s=5.0))
    with TestClient(app) as c:
        served = app.state.services.loaded.models["sasrec-tiny"]
        prepare = served.engine.prepare

        def slow(*args: object, **kwargs: object) -> object:
            clock[0] += 5.0  # as long as the whole timeout
            return prepare(*args, **kwargs)

        monkeypatch.setattr(served.engine, "prepare", slow)
        r = c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]})
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "timeout"
        clock[0] -= 5.0
        monkeypatch.setattr(served.engine, "prepare", prepare)
        assert c.post("/recommend", json={"model": "sasrec-tiny", "queries": [{"user_id": "u1"}]}).status_code == 200
