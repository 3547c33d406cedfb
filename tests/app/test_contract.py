"""The OpenAPI document is the contract: schemathesis generates requests from it (schema-valid and
schema-invalid) against the real app and runs every check on each answer. Zero failures means no
5xx, every schema-valid request accepted, every schema-invalid one refused with a 4xx, and every
response (errors included) documented with its status, headers and shape."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis import GenerationMode

from app.main import create_app
from app.settings import Settings

LOADED = ["sasrec-tiny", "bert4rec-tiny", "mhsa-tiny", "social-tiny"]


@pytest.fixture(scope="module")
def api_schema(
    tiny_location_artifact: Path, tiny_social_artifact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    root = tmp_path_factory.mktemp("artifacts-contract")
    for src in (tiny_location_artifact, tiny_social_artifact):
        shutil.copytree(src, root, dirs_exist_ok=True)
    # Small bounds keep the run short. The sums over a request (max_total_k, max_total_items) are the
    # one kind of limit JSON Schema cannot state: these bounds keep them out of reach, and
    # tests/app/test_api.py checks their 422 on its own.
    app = create_app(
        Settings(
            artifacts_dir=root,
            device="cpu",
            max_queries=4,
            max_k=50,
            max_history=20,
            max_exclude_items=5,
            max_events=5,
            history_path=tmp_path_factory.mktemp("state") / "history.sqlite3",
            admin_api_key=SecretStr("contract-admin"),
            events_api_key=SecretStr("contract-writer"),
        )
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _inexpressible(case: Any) -> bool:
    """A staypoint that ends before it starts: schema-valid, refused with a 422 (a comparison of two
    fields, which JSON Schema cannot state; the StayStep description says it)."""
    body = case.body if isinstance(case.body, dict) else {}
    for q in body.get("queries") or ():
        for step in (q.get("history") or ()) if isinstance(q, dict) else ():
            try:
                start, end = (dt.datetime.fromisoformat(step[k].upper()) for k in ("started_at", "finished_at"))
                if end < start:
                    return True
            except (KeyError, TypeError, ValueError, AttributeError):  # not a time pair: the server judges
                continue
    return False


DEFAULT = "bert4rec-tiny"  # what /recommend and /history answer with when a request names no model
FIELDS = {"sasrec-tiny": {"title", "genres", "release_year"}, "bert4rec-tiny": {"title", "genres", "release_year"}}


def _aim(case: Any, model: str | None) -> Any:
    """Point a generated body at a loaded model (random names would mostly meet the 404). A social
    model also needs each history step's action from its own vocabulary, and asked item fields must
    be the model's own (GET /models lists them): per-model rules the shared document states in words
    (a 422 naming the step or field otherwise, tested in tests/app/test_social.py and
    tests/app/test_fields_history.py). So are a filter's and max_per's fields (tests/app/test_catalog.py), and
    similar items exist for the item recommenders only."""
    if case.operation.path == "/history" and isinstance(case.query, dict):
        known = FIELDS.get(case.query.get("model") or DEFAULT, set())
        case.query["fields"] = [f for f in case.query.get("fields") or () if f in known]
    if not isinstance(case.body, dict):
        return case
    if case.operation.path == "/similar-items":
        model = model if model in FIELDS else None
        case.body.pop("filter", None)
        if isinstance(case.body.get("fields"), list):
            case.body["fields"] = [f for f in case.body["fields"] if f in FIELDS.get(model or DEFAULT, set())]
    if case.operation.path == "/recommend":
        for q in case.body.get("queries") or ():
            if isinstance(q, dict):
                q.pop("filter", None)
                q.pop("max_per", None)
            if isinstance(q, dict) and isinstance(q.get("fields"), list):
                q["fields"] = [f for f in q["fields"] if f in FIELDS.get(model or DEFAULT, set())]
    if model is None:
        return case
    case.body["model"] = model
    if model == "social-tiny" and case.operation.path == "/recommend":
        for q in case.body.get("queries") or ():
            for step in (q.get("history") or ()) if isinstance(q, dict) else ():
                if isinstance(step, dict):
                    step["action"] = "a2q"
    return case


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_nothing(api_schema: Any, mode: GenerationMode) -> None:
    cases = api_schema.as_strategy(mode)
    if mode is GenerationMode.POSITIVE:
        cases = st.tuples(cases, st.sampled_from([None, *LOADED])).map(lambda cm: _aim(*cm))
        cases = cases.filter(lambda c: not _inexpressible(c))

    @given(case=cases)
    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    def run(case: Any) -> None:
        case.call_and_validate()  # raises with the failed checks and a curl line to reproduce

    run()
