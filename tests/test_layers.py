"""The arrows of the README's map, checked over every import of the packages: `models/` (the contract)
imports neither the service nor the jobs, and `app/` and `training/` never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package -> the project's packages it must never import
FORBIDDEN = {
    "models": {"app", "training", "retrainer", "bench", "tests"},
    "app": {"training", "retrainer", "bench", "tests"},
    "training": {"app", "retrainer", "bench", "tests"},
    # between the two: it reads the service's store and artifacts and runs training jobs as processes
    "retrainer": {"training", "bench", "tests"},
}


def imported_packages(source: str) -> set[str]:
    """The top-level package of every absolute import in `source`, at any depth (a function's local import too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_checker_sees_every_kind_of_import() -> None:
    source = "import app.x\nfrom training import y\ndef f():\n    from bench.servers import z\nfrom . import sibling\n"
    assert imported_packages(source) == {"app", "training", "bench"}


def test_no_import_runs_against_the_layers() -> None:
    wrong = []
    for package, never in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            if bad := imported_packages(path.read_text()) & never:
                wrong.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(bad))}")
    assert wrong == []


def test_the_service_s_processes_read_their_environment_through_the_settings_alone() -> None:
    """Every SEQSERVE_* name of the api and the retrainer is a field of app/settings.py (which also reads
    the *_FILE forms of secrets): none is read from the environment anywhere else."""
    import re

    read = re.compile(r"(environ\b[^\n]*|getenv\([^\n]*)[\"']SEQSERVE_")
    wrong = [
        str(path.relative_to(ROOT))
        for package in ("app", "retrainer")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "app" / "settings.py" and read.search(path.read_text())
    ]
    assert wrong == []
    assert read.search('name = os.environ.get("SEQSERVE_RETRAIN_MODEL")')  # what it looks for


def module_paths_named(source: str) -> set[str]:
    """Every string constant in `source` that names a module of the project's upper packages."""
    upper = ("app.", "training.", "retrainer.", "bench.")
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(upper)
    }


def test_the_contract_names_no_module_above_it() -> None:
    """The task table's rows name their route by name; each side registers its own piece (training.jobs,
    app.routers.tasks), so models/ holds no path to import from above either."""
    assert module_paths_named('x = "app.routers.recommend"\ny = "a model"') == {"app.routers.recommend"}
    named = {
        f"{path.relative_to(ROOT)}: {sorted(found)}"
        for path in sorted((ROOT / "models").rglob("*.py"))
        if (found := module_paths_named(path.read_text()))
    }
    assert named == set()


# Who may import the production loop's wing: the app's composition root and typed dependencies, the HTTP
# edge that calls it, and the retrainer (which applies its promotion rules); the floors beneath never do.
WING_READERS = ("app/main.py", "app/deps.py", "app/routers/", "app/production/", "retrainer/")


def test_only_the_roots_and_the_edge_import_the_production_wing() -> None:
    wrong = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        rel = str(path.relative_to(ROOT))
        if rel.split("/")[0] not in FORBIDDEN or rel.startswith(WING_READERS):
            continue
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        names |= {
            f"app.{a.name}"
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "app"
            for a in n.names
        }
        if any(m == "app.production" or m.startswith("app.production.") for m in names):
            wrong.append(rel)
    assert wrong == []
