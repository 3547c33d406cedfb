from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import item_lists, time_lists
from training.data import DataFormatError, load_interactions


def test_recbole_files_sorted_per_user_with_release_years(synthetic_dir: Path) -> None:
    data = load_interactions(synthetic_dir)
    assert len(data.users) == 40
    for times in time_lists(data):
        assert times == sorted(times)
    assert data.release_unit == "year" and data.release["10"] == 1990.0
    assert len(data.sha256) == 64
    assert data.item_fields["title"]["10"] == "Item 10"
    assert data.item_fields["genres"]["10"] == ["Genre1", "Genre3"]  # token_seq: split on spaces


def test_grouplens_100k(tmp_path: Path) -> None:
    (tmp_path / "u.data").write_text("1\t10\t5\t300\n1\t11\t3\t100\n2\t10\t4\t200\n")
    (tmp_path / "u.item").write_text("10|A (1995)|01-Jan-1995|x\n11|B|unknown-date|x\n", encoding="latin-1")
    with pytest.raises(DataFormatError, match=r"u.item:2: bad release date"):
        load_interactions(tmp_path)
    (tmp_path / "u.item").write_text("10|A (1995)|01-Jan-1995|x\n11|B||x\n", encoding="latin-1")
    data = load_interactions(tmp_path)
    assert data.users == ["1", "2"] and item_lists(data)[0] == ["11", "10"]
    assert data.release == {"10": 1995.0}
    assert data.item_fields == {"title": {"10": "A (1995)", "11": "B"}}
    # With u.genre, the 0/1 genre flags from column 5 on become each movie's genre names.
    (tmp_path / "u.genre").write_text("unknown|0\nAction|1\nComedy|2\n\n")
    (tmp_path / "u.item").write_text("10|A (1995)|01-Jan-1995||url|0|1|1\n11|B||||0|0|0\n", encoding="latin-1")
    assert load_interactions(tmp_path).item_fields == {
        "title": {"10": "A (1995)", "11": "B"},
        "genres": {"10": ["Action", "Comedy"]},
    }


def test_grouplens_dat_and_csv(tmp_path: Path) -> None:
    (tmp_path / "ratings.dat").write_text("1::10::5::300\n1::11::3::100\n")
    (tmp_path / "movies.dat").write_text("10::Heat (1995)::Action\n11::Odd::Drama\n", encoding="latin-1")
    data = load_interactions(tmp_path)
    assert item_lists(data) == [["11", "10"]] and data.release == {"10": 1995.0}
    assert data.item_fields["genres"] == {"10": ["Action"], "11": ["Drama"]}
    d2 = tmp_path / "csv"
    d2.mkdir()
    (d2 / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,10,5,300\n1,11,3,100\n")
    (d2 / "movies.csv").write_text('movieId,title,genres\n10,"Heat (1995)",Action|Crime\n')
    data = load_interactions(d2)
    assert item_lists(data) == [["11", "10"]] and data.release == {"10": 1995.0}
    assert data.item_fields == {"title": {"10": "Heat (1995)"}, "genres": {"10": ["Action", "Crime"]}}


def test_user_item_lines_keep_file_order(tmp_path: Path) -> None:
    p = tmp_path / "beauty.txt"
    p.write_text("1 5\n1 3\n2 3\n1 9\n")
    data = load_interactions(p)
    assert data.users == ["1", "2"] and item_lists(data) == [["5", "3", "9"], ["3"]]
    assert data.release_unit is None
    p.write_text("1 5\n1 3 7\n")
    with pytest.raises(DataFormatError, match=r"beauty.txt:2: expected 'user item'"):
        load_interactions(p)


def test_generic_csv_with_item_table_and_iso_times(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    log.write_text("user_id,item_id,timestamp\na,x,2020-01-02T00:00:00\na,y,2020-01-01T00:00:00Z\n")
    items = tmp_path / "items.csv"
    items.write_text("item_id,release_time,title,categories\nx,2019-12-31T00:00:00,Ex,a|b\ny,,Why,\n")
    data = load_interactions(log, items)
    assert item_lists(data) == [["y", "x"]]
    assert data.release_unit == "second" and set(data.release) == {"x"}
    # An item without a release time keeps its title; an empty list column is left out.
    assert data.item_fields == {"title": {"x": "Ex", "y": "Why"}, "categories": {"x": ["a", "b"]}}
    log.write_text("user_id,item_id,timestamp\na,x,yesterday\n")
    with pytest.raises(DataFormatError, match=r"log.csv:2: timestamp 'yesterday'"):
        load_interactions(log)
    log.write_text("who,item_id,timestamp\na,x,1\n")
    with pytest.raises(DataFormatError, match="no column among"):
        load_interactions(log)


def test_parquet_table(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"user": ["a", "a"], "item": ["x", "y"], "timestamp": [2, 1]}), tmp_path / "l.parquet")
    assert item_lists(load_interactions(tmp_path / "l.parquet")) == [["y", "x"]]


def test_a_folder_of_parquet_parts_loads_as_one_table(tmp_path: Path) -> None:
    """As Spark writes one: part files, partition folders, a _SUCCESS marker and hidden checksum files."""
    import pandas as pd

    rows = pd.DataFrame(
        {
            "user_id": ["a", "b", "a", "c", "b", "a"],
            "item_id": ["x", "y", "z", "x", "x", "y"],
            "timestamp": [5, 1, 2, 9, 3, 7],
        }
    )
    rows.to_csv(tmp_path / "log.csv", index=False)
    folder = tmp_path / "log"
    (folder / "day=1").mkdir(parents=True)
    (folder / "day=2").mkdir()
    rows.iloc[:2].to_parquet(folder / "day=1" / "part-00000.parquet", index=False)
    rows.iloc[2:].to_parquet(folder / "day=2" / "part-00001.parquet", index=False)
    (folder / "_SUCCESS").write_text("")
    (folder / "day=1" / ".part-00000.parquet.crc").write_bytes(b"not parquet")
    got, want = load_interactions(folder), load_interactions(tmp_path / "log.csv")
    assert (got.users, item_lists(got), time_lists(got)) == (want.users, item_lists(want), time_lists(want))
    assert item_lists(got) == [["z", "x", "y"], ["y", "x"], ["x"]]
    assert got.sha256 and got.sha256 != want.sha256
    (folder / "day=2" / "part-00001.parquet").write_bytes(b"truncated")
    with pytest.raises(DataFormatError, match="not a readable Parquet file"):
        load_interactions(folder)


def test_malformed_recbole_line(tmp_path: Path) -> None:
    p = tmp_path / "x.inter"
    p.write_text("user_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n1\t2\n")
    with pytest.raises(DataFormatError, match=r"x.inter:3: expected 3 tab-separated fields, got 2"):
        load_interactions(p)
    p.write_text("user_id:token\titem_id:token\ttimestamp:float\n1\t2\tnoon\n")
    with pytest.raises(DataFormatError, match=r"x.inter:2: timestamp 'noon' is not a number"):
        load_interactions(p)


def test_missing_path() -> None:
    with pytest.raises(DataFormatError, match="no such file"):
        load_interactions(Path("/nonexistent/file.csv"))


def test_parquet_columns_read_as_the_strings_a_csv_would_hold(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.data.tables import read_table

    pq.write_table(
        pa.table(
            {
                "int_ids": pa.array([7, 12345678901, -3], pa.int64()),
                "str_ids": ["a b", "ü", ""],
                "nullable": pa.array([1, None, 3], pa.int64()),
                "floats": [2.0, 2.5, None],
                "text_or_null": ["x", None, "z"],
                "when": pa.array([0, 1_600_000_000_000_000, 1], pa.timestamp("us", tz="UTC")),
            }
        ),
        tmp_path / "t.parquet",
    )
    df = read_table(tmp_path / "t.parquet")
    assert df["int_ids"].tolist() == ["7", "12345678901", "-3"]
    assert df["str_ids"].tolist() == ["a b", "ü", ""]
    assert df["nullable"].tolist() == ["1", "", "3"]
    assert df["floats"].tolist() == ["2", "2.5", ""]
    assert df["text_or_null"].tolist() == ["x", "", "z"]
    assert df["when"].tolist()[1] == "2020-09-13T12:26:40+00:00"
    assert df["_line"].tolist() == [2, 3, 4]
    assert all(type(v) is str for c in df.columns if c != "_line" for v in df[c])


def _log_rows(n: int, seed: int = 0) -> pd.DataFrame:

    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "user_id": [f"u{u}" for u in rng.integers(0, 30, n)],
            "item_id": [f"i {i}" for i in rng.zipf(1.5, n) % 50],
            "timestamp": rng.integers(0, 20, n),
        }
    )  # many ties: file order must decide them


def _written_log(tmp_path: Path) -> tuple[pd.DataFrame, Path]:
    """_log_rows(500) as tmp_path/log.csv and as a folder of two Parquet parts. -> (the rows, the folder)"""
    rows = _log_rows(500)
    rows.to_csv(tmp_path / "log.csv", index=False)
    folder = tmp_path / "parts"
    folder.mkdir()
    rows.iloc[:230].to_parquet(folder / "part-0.parquet", index=False)
    rows.iloc[230:].to_parquet(folder / "part-1.parquet", index=False)
    return rows, folder


def test_a_table_read_in_chunks_loads_as_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids met again in a later chunk keep their code; users and items keep their order of first
    appearance; ties keep file order; CSV and Parquet parts alike."""
    from training.data import tables

    rows, folder = _written_log(tmp_path)
    whole = load_interactions(tmp_path / "log.csv")
    # What the loader must give, computed here without it: a stable sort by user (first appearance), then time.
    first = {u: k for k, u in reversed(list(enumerate(rows["user_id"])))}
    order = sorted(range(len(rows)), key=lambda r: (first[rows["user_id"][r]], rows["timestamp"][r], r))
    want: dict[str, list[str]] = {}
    for r in order:
        want.setdefault(rows["user_id"][r], []).append(rows["item_id"][r])
    assert whole.users == list(want) and item_lists(whole) == list(want.values())
    assert whole.item_ids == list(dict.fromkeys(i for seq in want.values() for i in seq))
    for chunk in (1, 7, 64):
        monkeypatch.setattr(tables, "CHUNK_ROWS", chunk)
        for path in (tmp_path / "log.csv", folder):
            got = load_interactions(path)
            assert (got.users, got.item_ids, item_lists(got), time_lists(got)) == (
                whole.users,
                whole.item_ids,
                item_lists(whole),
                time_lists(whole),
            ), (chunk, path.name)


def test_a_defect_in_a_later_chunk_names_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from training.data import tables

    monkeypatch.setattr(tables, "CHUNK_ROWS", 4)
    log = tmp_path / "log.csv"
    lines = [f"u{k % 3},i{k},{k}" for k in range(12)]
    lines[9] = "u0,i9,"  # file line 11, in the third chunk
    log.write_text("user_id,item_id,timestamp\n" + "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"log.csv:11: timestamp missing where other rows have one"):
        load_interactions(log)
    lines[9] = "u0,,9"
    log.write_text("user_id,item_id,timestamp\n" + "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"log.csv:11: empty item_id"):
        load_interactions(log)
    lines[9] = "u0,i9,9,extra"
    log.write_text("user_id,item_id,timestamp\n" + "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"log.csv:11: expected 3 fields, got 4"):
        load_interactions(log)
    log.write_text("user_id,item_id,timestamp\n" + "\n".join(f"u{k},i{k}," for k in range(9)) + "\n")
    assert load_interactions(log).n_interactions == 9  # no timestamp at all: file order, in every chunk


def test_a_log_named_its_own_way_is_read_by_its_column_mapping(tmp_path: Path) -> None:
    """Another engine's event log: its own column names, an event type to filter on, times in milliseconds
    and ISO 8601 alike; a mapping for a log in a known layout, or half a filter, is refused."""
    from training.data import Columns

    rows = pd.DataFrame(
        {
            "visitor": ["a", "a", "b", "a", "b", "a"],
            "sku": ["x", "y", "z", "w", "x", "v"],
            "kind": ["purchase", "view", "purchase", "purchase", "cart", "purchase"],
            "event_ms": ["3000", "1000", "2000", "1970-01-01T00:00:01.5Z", "500", "2500"],
        }
    )
    rows.to_csv(tmp_path / "events.csv", index=False)
    rows.to_parquet(tmp_path / "events.parquet", index=False)
    mapping = Columns(user="visitor", item="sku", time="event_ms", event="kind", keep=("purchase",), time_unit="ms")
    for path in (tmp_path / "events.csv", tmp_path / "events.parquet"):
        got = load_interactions(path, columns=mapping)
        assert got.users == ["a", "b"] and item_lists(got) == [["w", "v", "x"], ["z"]]  # views and carts dropped
        assert time_lists(got) == [[1.5, 2.5, 3.0], [2.0]]  # ms / 1000; the ISO time as it says
    # Read without the filter, the same file is other data.
    unfiltered = Columns("visitor", "sku", "event_ms", time_unit="ms")
    everything = load_interactions(tmp_path / "events.csv", columns=unfiltered)
    assert len(everything.items) == 6 and everything.sha256 != got.sha256
    with pytest.raises(DataFormatError, match="no column among \\['user_id'\\]"):
        load_interactions(tmp_path / "events.csv", columns=Columns(user="user_id", item="sku", time="event_ms"))
    (tmp_path / "u.inter").write_text("user_id:token\titem_id:token\ttimestamp:float\na\tx\t1\n")
    with pytest.raises(DataFormatError, match="apply to a CSV or Parquet log"):
        load_interactions(tmp_path / "u.inter", columns=mapping)
    with pytest.raises(ValueError, match="go together"):
        Columns(event="kind")
    with pytest.raises(ValueError, match="time unit"):
        Columns(time_unit="minutes")


def test_ranks_read_disjoint_shares_that_together_are_the_log(tmp_path: Path) -> None:
    """Each of three ranks keeps only its users' rows of a Parquet folder (CSV alike), every user on exactly
    one rank with all its rows in order; aligned to the sorted union of their items, every rank indexes an
    item the same way. A log in a known layout cannot be shared."""
    from training.data import Share, with_items

    _, folder = _written_log(tmp_path)
    whole = load_interactions(tmp_path / "log.csv")
    by_user = dict(zip(whole.users, zip(item_lists(whole), time_lists(whole), strict=True), strict=True))
    for path in (folder, tmp_path / "log.csv"):
        shares = [load_interactions(path, share=Share(r, 3)) for r in range(3)]
        users = [u for s in shares for u in s.users]
        assert sorted(users) == sorted(whole.users) and len(set(users)) == len(users)
        assert all(len(s.users) < len(whole.users) for s in shares)  # three real shares, not one rank with all
        items = sorted(set().union(*(s.item_ids for s in shares)))
        assert items == sorted(whole.item_ids)
        for s in shares:
            own = dict(zip(s.users, zip(item_lists(s), time_lists(s), strict=True), strict=True))
            with_items(s, items)
            assert s.item_ids == items and item_lists(s) == [own[u][0] for u in s.users]  # same raw ids, new codes
            assert all(own[u] == by_user[u] for u in s.users)
    # The same rank for a user on every host, run and version: pinned, so a change of hash shows here.
    ranks = [next(r for r in range(3) if Share(r, 3).keeps(pd.Series([f"u{k}"]))[0]) for k in range(10)]
    assert ranks == [2, 0, 2, 0, 0, 2, 2, 1, 2, 2]
    with pytest.raises(ValueError, match="not in the shared item list"):
        with_items(load_interactions(folder, share=Share(0, 3)), ["nothing"])
    (tmp_path / "u.inter").write_text("user_id:token\titem_id:token\ttimestamp:float\na\tx\t1\n")
    with pytest.raises(DataFormatError, match="share of a CSV or Parquet log"):
        load_interactions(tmp_path / "u.inter", share=Share(0, 2))
    with pytest.raises(ValueError, match="rank 3 of 3"):
        Share(3, 3)
