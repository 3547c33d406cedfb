"""Request bodies: the large-body path answers what the one-pass path answers, and refuses what no
request within the limits can be before building it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from app.bodies import MAX_DETAILS, BodyError, is_json, parse, parse_large
from app.limits import Limits
from app.routers.next_location import next_location_body
from app.routers.recommend import recommend_body
from app.schemas import bounded

LIMITS = Limits(
    max_queries=8, max_k=50, max_history=20, max_exclude_items=5, max_total_k=100, max_total_items=60, max_events=10
)
MODELS = bounded(LIMITS, {"recommend": recommend_body(LIMITS), "next_location": next_location_body(LIMITS)})
RECOMMEND = MODELS.requests["recommend"].model
STEP = {"item_id": "12", "timestamp": 1.5e9}
BODIES: list[tuple[str, Any]] = [
    ("recommend", {"queries": [{"user_id": "u1", "k": 5, "history": [STEP] * 3, "exclude_items": ["9"]}]}),
    ("recommend", {"model": "m", "queries": [{"user_id": "u1"}, {"history": [{"item_id": "1", "action": "a"}]}]}),
    ("recommend", {"queries": [{"user_id": "u1", "k": 5.0}]}),
    ("recommend", {"queries": [{"user_id": "u1", "k": "5"}]}),
    ("recommend", {"queries": [{"user_id": 7}, {"user_id": "u2", "k": 500}, {"history": []}]}),
    ("recommend", {"queries": [{"user_id": "u1", "bogus": 1, "history": [{"item_id": "1", "x": 2}]}]}),
    ("recommend", {"queries": [{"user_id": "u1"}] * 9}),
    ("recommend", {"queries": [{"history": [STEP] * 21}]}),
    ("recommend", {"queries": [{"history": [STEP] * 20}] * 4}),  # 80 steps > max_total_items
    ("recommend", {"queries": [{"user_id": "u", "k": 50}] * 3}),  # k adds up to 150 > 100
    ("recommend", {"queries": "u1"}),
    ("recommend", {"model": 3, "queries": [{"user_id": "u1"}]}),
    ("recommend", [1, 2]),
    ("recommend", {}),
    (
        "next_location",
        {"queries": [{"history": [{"location_id": "a", "start_min": 5, "weekday": 1, "duration_min": 3}], "k": 2}]},
    ),
    (
        "next_location",
        {
            "queries": [
                {
                    "history": [
                        {
                            "location_id": "a",
                            "started_at": "2024-01-01T10:00:00+01:00",
                            "finished_at": "2024-01-01T09:00:00+01:00",
                        }
                    ]
                }
            ]
        },
    ),
    ("events", {"events": [{"event_id": "e", "user_id": "u", "item_id": "i", "timestamp": 1}]}),
    ("events", {"events": [{"event_id": "e", "user_id": "u", "item_id": "i", "timestamp": -1, "z": 0}]}),
]


def outcome(fn: Any, raw: bytes, model: type[BaseModel]) -> Any:
    try:
        return fn(raw, model).model_dump()
    except BodyError as exc:
        return [(d["loc"], d["type"]) for d in exc.details], exc.total


@pytest.mark.parametrize(("route", "body"), BODIES)
def test_large_path_answers_what_the_one_pass_path_answers(route: str, body: Any) -> None:
    model = MODELS.events if route == "events" else MODELS.requests[route].model
    raw = orjson.dumps(body)
    assert outcome(lambda r, m: parse_large(r, m, budget=MODELS.budget(m)), raw, model) == outcome(parse, raw, model)


def test_bad_json_is_named_on_both_paths() -> None:
    raw = b'{"queries": [{"user_id": "u1"'
    assert outcome(lambda r, m: parse_large(r, m, budget=10**6), raw, RECOMMEND) == outcome(parse, raw, RECOMMEND)


def test_the_budget_admits_the_largest_body_within_the_limits() -> None:
    step = {"item_id": "1", "timestamp": 1.0, "action": "a"}
    full = {
        "queries": [
            {
                "user_id": "u",
                "k": 1,
                "exclude_seen": True,
                "exclude_future": False,
                "as_of": 1.0,
                "exclude_items": ["a", "b"],
                "history": [step] * 10,
            }
            for _ in range(4)
        ]
        + [{"user_id": "u", "history": [STEP] * 4}] * 3
    }  # 60 items
    raw = orjson.dumps(full)
    assert parse_large(raw, RECOMMEND, budget=MODELS.budget(RECOMMEND)) == parse(raw, RECOMMEND)


def test_more_values_than_the_limits_allow_are_refused_unparsed() -> None:
    raw = orjson.dumps({"queries": [{"history": [{"item_id": "1", "action": "a", "timestamp": 1}] * 20}] * 8})
    assert len(raw) > 5000  # 160 steps where 60 are allowed
    with pytest.raises(BodyError) as err:
        parse_large(raw, RECOMMEND, budget=MODELS.budget(RECOMMEND))
    assert err.value.details[0]["loc"] == ["body"] and err.value.details[0]["type"] == "too_many_values"


def test_unknown_keys_are_counted_not_each_described() -> None:
    query: dict[str, object] = {"user_id": "u1", **{str(n): 0 for n in range(200_000)}}
    with pytest.raises(BodyError) as err:
        parse_large(orjson.dumps({"queries": [query]}), RECOMMEND, budget=10**7)
    assert len(err.value.details) == MAX_DETAILS and err.value.total == 200_000
    assert err.value.details[0] == {
        "loc": ["body", "queries", 0, "0"],
        "msg": "Extra inputs are not permitted",
        "type": "extra_forbidden",
    }


def test_one_pass_errors_are_capped_too() -> None:
    with pytest.raises(BodyError) as err:
        parse(orjson.dumps({"queries": [{"user_id": "u1", **{str(n): 0 for n in range(300)}}]}), RECOMMEND)
    assert len(err.value.details) == MAX_DETAILS and err.value.total == 300


@pytest.mark.parametrize(
    ("ctype", "ok"),
    [
        ("application/json", True),
        ("APPLICATION/JSON", True),
        ("application/json ; charset=utf-8", True),
        ("application/problem+json", True),
        ("application/jsonx", False),
        ("text/plain; charset=json", False),
        ("json", False),
        ("", False),
    ],
)
def test_media_types(ctype: str, ok: bool) -> None:
    assert is_json(ctype) is ok
