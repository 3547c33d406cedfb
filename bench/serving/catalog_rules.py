"""What each catalog feature costs a by-user /recommend, against the same queries without it, on one server:

    .venv/bin/python -m bench.serving.catalog_rules --artifacts artifacts --model sasrec-ml100k \\
        --concurrency 16 --rounds 6 --seconds 8

Variants, taking turns in --rounds windows (the order flipped every round) on the one running service:
  plain      by user_id, k 10 (the load bench's bodies)
  filter     the same, each with a filter over a field of the artifact (one of a few, so compiled once)
  hidden     the same while 100 of the catalog's most shown items are hidden
  fallback   users the model does not know (ranked by the fallback, no model call)
  max_per    the same as plain, with at most 2 items per value of the field
Then, in this process, what a filter costs at 100k and 1M items: the fields' kinds and indexes built at load,
the time to parse and to compile one of each operator and field type, and its bytes in the cache
(models/catalog.py: one byte per catalog entry per filter, and its entry's key and slot).
`--compile-only` runs that part alone.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import torch

from bench.servers import ROOT, free_port, start_server, stop
from bench.serving.loadgen import bodies_for, drive

ADMIN = "bench-admin-key"


def variants(bodies: list[dict[str, Any]], field: str, values: list[str]) -> dict[str, list[dict[str, Any]]]:
    def each(change: Any) -> list[dict[str, Any]]:
        return [{**b, "queries": [change(b["queries"][0], n)]} for n, b in enumerate(bodies)]

    rule = lambda q, n: {**q, "filter": {"field": field, "none_of": [values[n % 3]]}}  # noqa: E731
    return {
        "plain": bodies,
        "filter": each(rule),
        "hidden": bodies,
        "fallback": each(lambda q, n: {**q, "user_id": f"bench-visitor-{n}"}),
        "max_per": each(lambda q, n: {**q, "max_per": {field: 2}}),
    }


def _filters(rng: np.random.Generator, n_items: int) -> dict[str, Any]:
    """One filter per operator and field type, its values drawn anew each call (so none is cached)."""
    y = int(rng.integers(1930, 1990))
    g = [f"g{v}" for v in rng.choice(20, size=20, replace=False).tolist()]
    return {
        "text list any_of 1": {"field": "genres", "any_of": g[:1]},
        "text list any_of 20": {"field": "genres", "any_of": g},
        "text list none_of 2": {"field": "genres", "none_of": g[:2]},
        "text any_of 100": {"field": "brand", "any_of": [f"b{v}" for v in rng.choice(1000, 100).tolist()]},
        "number between": {"field": "year", "between": [y, y + 5]},
        "number any_of 1": {"field": "year", "any_of": [y]},
        "number any_of 63": {"field": "year", "any_of": list(range(y - 40, y + 23))},
        "item_id any_of 1000": {"field": "item_id", "any_of": [str(v) for v in rng.choice(n_items, 1000).tolist()]},
        "any of 63 between": {"any": [{"field": "year", "between": [y + n, y + n + 1]} for n in range(63)]},
        "any of 63 number any_of": {"any": [{"field": "year", "any_of": [y + n]} for n in range(63)]},
    }


def compile_cost(n_items: int, repeats: int = 5) -> dict[str, Any]:
    """Parsing (the request's thread: the event loop for up to 64 queries) and compiling (the model's
    thread) one filter of each operator and field type over a catalog of n_items: a text list field of 20
    values (two per item), a text field of 1,000 values and a number field (years), each item holding one."""
    from models.catalog import CatalogRules
    from models.ids import IdMap

    ids = IdMap(str(i) for i in range(n_items))
    rng = np.random.default_rng(0)
    picks = rng.integers(0, 20, size=(n_items, 2)).tolist()
    brands = rng.integers(0, 1000, size=n_items).tolist()
    years = rng.integers(1920, 2000, size=n_items).tolist()
    fields = {
        "genres": {str(i): [f"g{a}", f"g{b}"] for i, (a, b) in enumerate(picks)},
        "brand": {str(i): f"b{b}" for i, b in enumerate(brands)},
        "year": {str(i): float(y) for i, y in enumerate(years)},
    }
    t0 = time.perf_counter()
    rules = CatalogRules(ids, fields, torch.device("cpu"))  # type: ignore[arg-type]
    rules.index_fields()  # what a version's load does (RecEngine.warm_up)
    index = time.perf_counter() - t0
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for name, raw in _filters(rng, n_items).items():
            t0 = time.perf_counter()
            node = rules.parse(raw)
            t1 = time.perf_counter()
            rules.mask(node)
            t2 = time.perf_counter()
            row = rows.setdefault(name, {"parse_ms": [], "compile_ms": []})
            row["parse_ms"].append((t1 - t0) * 1000)
            row["compile_ms"].append((t2 - t1) * 1000)
    out: dict[str, Any] = {}
    for name, row in rows.items():
        out[name] = {
            k: {"median": round(float(np.median(v)), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
            for k, v in row.items()
        }
    entries = len(rules._masks)
    return {
        "items": n_items,
        "kinds_and_index_at_load_ms": round(index * 1000, 1),
        "filters": out,
        "bytes_per_filter": rules.cached_bytes // max(1, entries),
        "filters_in_64_mib": (64 << 20) // max(1, rules.cached_bytes // max(1, entries)),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    p.add_argument("--model", default="sasrec-ml100k")
    p.add_argument("--field", default="genres")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per variant and concurrency")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "catalog_rules.json")
    p.add_argument("--compile-only", action="store_true")
    args = p.parse_args()
    if args.compile_only:
        for n in (100_000, 1_000_000):
            print(json.dumps(compile_cost(n)), flush=True)
        return
    from models.artifact import latest_versions
    from models.tasks.recommend import load_artifact

    art = load_artifact(latest_versions(args.artifacts)[args.model])
    counts: dict[str, int] = {}
    for value in art.fields[args.field].values():
        for v in value if isinstance(value, list) else [value]:
            counts[str(v)] = counts.get(str(v), 0) + 1
    values = sorted(counts, key=lambda v: -counts[v])[:3]
    bodies = bodies_for(args.artifacts, args.model)
    sets = variants(bodies, args.field, values)
    port = free_port()
    env = {
        "SEQSERVE_ADMIN_API_KEY": ADMIN,
        "SEQSERVE_TORCH_THREADS": "1",
        "SEQSERVE_HISTORY_PATH": f"{tempfile.mkdtemp(prefix='seqserve-rules-')}/h.sqlite3",
    }
    proc = start_server(args.artifacts, port, env)
    url = f"http://127.0.0.1:{port}"
    top = art.histories.by_count(len(art.items), 100)
    hide = [art.items.raw(i) for i in top]
    results: dict[str, Any] = {"rows": [], "compile": {}}
    try:
        for c in args.concurrency:
            got: dict[str, list[dict[str, Any]]] = {name: [] for name in sets}
            order = list(sets)
            for r in range(args.rounds):
                for name in order if r % 2 == 0 else order[::-1]:
                    hidden = name == "hidden"
                    path = "hide" if hidden else "unhide"
                    httpx.post(
                        f"{url}/admin/models/{args.model}/items/{path}",
                        json={"item_ids": hide},
                        headers={"X-API-Key": ADMIN},
                    ).raise_for_status()
                    got[name].append(drive(f"{url}/recommend", sets[name], c, args.seconds / args.rounds, 0.5))
            plain = sum(w["rps"] for w in got["plain"]) / args.rounds
            for name, windows in got.items():
                rps = sum(w["rps"] for w in windows) / args.rounds
                row = {
                    "variant": name,
                    "concurrency": c,
                    "rps": round(rps),
                    "vs_plain": round(rps / plain, 3),
                    "window_ratios": [
                        round(w["rps"] / p["rps"], 3) for w, p in zip(windows, got["plain"], strict=True)
                    ],
                    "p99_ms": round(max(w["p99_ms"] for w in windows), 1),
                    "errors": sum(w.get("errors", 0) for w in windows),
                }
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        stop(proc)
    for n in (100_000, 1_000_000):
        results["compile"][str(n)] = compile_cost(n)
        print(json.dumps(results["compile"][str(n)]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
