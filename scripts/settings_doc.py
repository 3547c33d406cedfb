"""docs/settings.md, written from the settings classes: each field's variable, default and the comments
the code keeps beside it (one fact in one place: the code). `python scripts/settings_doc.py` rewrites the
page; tests/test_docs.py fails when the page is not what this writes."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.settings import SECRETS, DeploymentSettings, Settings  # noqa: E402
from retrainer.settings import RetrainerSettings  # noqa: E402

PAGE = ROOT / "docs" / "settings.md"
CLASSES: list[tuple[type[BaseSettings], Path, str]] = [
    (DeploymentSettings, ROOT / "app/settings.py", "Every process of a deployment (the api, the retrainer, a retrain)"),
    (Settings, ROOT / "app/settings.py", "The api (`python -m app.server` and its workers)"),
    (
        RetrainerSettings,
        ROOT / "retrainer/settings.py",
        "The retrainer and a retrain (`python -m retrainer`, `retrainer.retrain`)",
    ),
]


def field_comments(path: Path, cls: str) -> dict[str, str]:
    """Field name -> the comment lines just above its line and on it, joined."""
    source = path.read_text()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, row = [], node.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments[row])
            row -= 1
        inline = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        out[node.target.id] = " ".join(above + inline)
    return out


def default_of(cls: type[BaseSettings], name: str) -> str:
    value = cls.model_fields[name].default
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    return f"`{value}`"


def render() -> str:
    out = [
        "# Settings",
        "",
        "Every setting is an environment variable (`SEQSERVE_<NAME>`); `ops/seqserve.env` lists them for a",
        "deployment. A secret may also come from a file named by `SEQSERVE_<NAME>_FILE`: "
        + ", ".join(f"`{n.upper()}`" for n in SECRETS)
        + ". An empty variable is unset. `python -m app.settings` checks the api's and names what is wrong.",
        "",
        "This page is written from the settings classes (`python scripts/settings_doc.py`); the text of each",
        "row is the comment the code keeps beside the field.",
    ]
    seen: set[str] = set()
    for cls, path, title in CLASSES:
        notes = field_comments(path, cls.__name__)
        own = [n for n in cls.model_fields if n not in seen]
        seen |= set(own)
        out += ["", f"## {title}", "", "| variable | default | what |", "|---|---|---|"]
        for name in own:
            text = notes.get(name, "").replace("|", "\\|")
            out.append(f"| `SEQSERVE_{name.upper()}` | {default_of(cls, name)} | {text} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)}")
