"""Request bodies from raw bytes, at a cost bounded by what the request limits admit.

Framework-free. A body of up to INLINE_BYTES (the request path's bodies are a few hundred bytes) is
validated by pydantic in one pass, as before. A larger body runs `parse_large`, in a worker thread,
in steps whose cost is bounded before each starts (docs/decisions/hostile-bodies.md):
  1. a byte count bounds the JSON values the body can hold; more than a request within the limits can
     hold is refused before anything is parsed (a million unknown keys, a million history steps);
  2. orjson parses it, and every object's keys are checked against its schema with set operations,
     so pydantic never builds one error per unknown key;
  3. pydantic validates one list item (a query, an event) at a time, each bounded by the per-item
     limits, and the GIL is handed back between items, so the event loop keeps answering.
Both paths give the same answers and the same error locations (tests/app/test_bodies.py).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeVar, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
INLINE_BYTES = 64 * 1024
MAX_DETAILS = 50  # error details in one answer; the message counts the rest


class BodyError(ValueError):
    """A body that does not validate: the first MAX_DETAILS problems and how many there were."""

    def __init__(self, details: list[dict[str, Any]], total: int) -> None:
        super().__init__(details[0]["msg"] if details else "invalid body")
        self.details, self.total = details[:MAX_DETAILS], max(total, len(details))


def is_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON: application/json or application/*+json, in any case,
    parameters ignored (RFC 9110 media types are case-insensitive)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, sub = media.partition("/")
    return kind == "application" and (sub == "json" or sub.endswith("+json"))


def details_of(exc: ValidationError, prefix: tuple[str | int, ...] = ("body",)) -> Iterator[dict[str, Any]]:
    for e in exc.errors(include_url=False, include_context=False, include_input=False):
        yield {"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]}


def parse(raw: bytes, model: type[M]) -> M:
    """`raw` validated by `model` in one pass (small bodies)."""
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        details = []
        for n, d in enumerate(details_of(exc)):
            if n == MAX_DETAILS:
                break
            details.append(d)
        raise BodyError(details, exc.error_count()) from None


@dataclass(frozen=True)
class Shape:
    """The keys an object may have, and the shapes of its fields that are lists of objects."""

    keys: frozenset[str]
    lists: dict[str, Shape]


def _item_model(annotation: Any) -> type[BaseModel] | None:
    """M for a field annotated list[M] or list[M] | None."""
    if get_origin(annotation) in (Union, types.UnionType):
        return next((m for a in get_args(annotation) if (m := _item_model(a)) is not None), None)
    if get_origin(annotation) is list:
        (inner,) = get_args(annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return None


def shape_of(model: type[BaseModel]) -> Shape:
    lists = {name: shape_of(m) for name, f in model.model_fields.items() if (m := _item_model(f.annotation))}
    return Shape(frozenset(model.model_fields), lists)


def token_budget(model: type[BaseModel], counts: dict[str, int]) -> int:
    """An upper bound on ',' + '{' + '[' in any body `model` accepts, given the most items each list
    field can hold over the whole request (`counts`, by field name at any depth)."""
    total = _own_tokens(model)
    for name, f in model.model_fields.items():
        inner = _item_model(f.annotation)
        if inner is not None:  # each item's own tokens, plus what its lists hold over the whole request
            total += counts.get(name, 0) * _own_tokens(inner) + token_budget(inner, counts) - _own_tokens(inner)
        elif name in counts:  # a list of scalars: one comma each
            total += counts[name]
    return total


def _own_tokens(model: type[BaseModel]) -> int:
    """'{', a comma per field and after the object, a '[' per list field."""
    fields = model.model_fields.values()
    return 1 + len(fields) + sum(1 for f in fields if _is_list(f.annotation))


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_list(a) for a in get_args(annotation))
    return get_origin(annotation) is list


class _Problems:
    def __init__(self) -> None:
        self.details: list[dict[str, Any]] = []
        self.total = 0

    def add(self, loc: list[str | int], msg: str, type_: str) -> None:
        self.total += 1
        if len(self.details) < MAX_DETAILS:
            self.details.append({"loc": loc, "msg": msg, "type": type_})


def _unknown_keys(obj: object, shape: Shape, loc: list[str | int], out: _Problems) -> None:
    if not isinstance(obj, dict):
        return  # pydantic names the wrong type
    extra = len(obj) - sum(1 for k in shape.keys if k in obj)  # a dict's keys are distinct: no pass over them
    if extra:
        room = max(0, MAX_DETAILS - len(out.details))
        for key in islice((k for k in obj if k not in shape.keys), room):  # the first ones, in body order
            out.add([*loc, key], "Extra inputs are not permitted", "extra_forbidden")
        out.total += extra - min(extra, room)
    for name, inner in shape.lists.items():
        items = obj.get(name)
        if isinstance(items, list):
            for n, item in enumerate(items):
                _unknown_keys(item, inner, [*loc, name, n], out)


def parse_large(raw: bytes, model: type[M], *, budget: int) -> M:
    """`raw` validated by `model`, refusing early what no body within the limits can be (see module)."""
    values = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
    if values > budget:
        raise BodyError(
            [
                {
                    "loc": ["body"],
                    "type": "too_many_values",
                    "msg": f"holds up to {values} JSON values; a request within this service's limits "
                    f"holds at most {budget}",
                }
            ],
            1,
        )
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return parse(raw, model)  # pydantic names the syntax error and where
    shape = shape_of(model)
    problems = _Problems()
    _unknown_keys(obj, shape, ["body"], problems)
    if problems.total > MAX_DETAILS:  # hostile: stop here. Fewer, and pydantic names them with the rest
        raise BodyError(problems.details, problems.total)
    problems = _Problems()
    items_field = next(iter(shape.lists), None)
    items = obj.get(items_field) if isinstance(obj, dict) and items_field else None
    limit = _max_length(model, items_field) if items_field else None
    if not isinstance(items, list) or (limit is not None and len(items) > limit):
        return parse(raw, model)  # a wrong shape or too many items: pydantic stops at the first excess item
    item_model = _item_model(model.model_fields[items_field].annotation) if items_field else None
    assert item_model is not None and items_field is not None
    validated = []
    for n, item in enumerate(items):  # one bounded validation per item; the GIL is free between them
        try:
            validated.append(item_model.model_validate_json(orjson.dumps(item)))
        except ValidationError as exc:
            for d in details_of(exc, ("body", items_field, n)):
                if len(problems.details) >= MAX_DETAILS:
                    break
                problems.details.append(d)
            problems.total += exc.error_count()
    if problems.total:
        raise BodyError(problems.details, problems.total)
    try:
        return model.model_validate({**obj, items_field: validated})
    except ValidationError as exc:
        raise BodyError(list(details_of(exc))[:MAX_DETAILS], exc.error_count()) from None


def _max_length(model: type[BaseModel], name: str) -> int | None:
    for meta in model.model_fields[name].metadata:
        if (n := getattr(meta, "max_length", None)) is not None:
            return int(n)
    return None
