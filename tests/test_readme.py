"""README.md is a guide: short, its Quickstart the two commands, every link (of the docs it leads to, too)
resolves, and its map names every module that has no test module of its own."""

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAX_LINES = 300


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_the_readme_is_short_and_starts_with_make_demo_and_make_test():
    text = _read(os.path.join(ROOT, "README.md"))
    assert len(text.splitlines()) <= MAX_LINES
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = quickstart.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make demo", "make test"]


def test_every_link_of_the_readme_and_the_docs_resolves():
    pages = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    broken = []
    for page in pages:
        for target in LINK.findall(_read(page)):
            path = target.split("#", 1)[0]
            if path and not re.match(r"[a-z]+:", path) and not os.path.exists(os.path.join(os.path.dirname(page), path)):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert not broken, broken


def _test_module(module: str) -> str | None:
    """The test module of a module of the package (`model/sharding.py` -> `test_model_sharding.py`, a package's
    `data/__init__.py` -> `test_data.py`); None for an `__init__.py` that holds only its docstring."""
    path = os.path.join(ROOT, "celerity_jax", module)
    parts = module[:-len(".py")].split("/")
    if parts[-1] == "__init__":
        body = ast.parse(_read(path)).body
        if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            return None
        parts = parts[:-1]
    return "test_" + "_".join(parts) + ".py"


def test_the_modules_without_a_test_module_are_those_the_map_names():
    row = next(line for line in _read(os.path.join(ROOT, "README.md")).splitlines() if line.startswith("| `tests/` |"))
    named = {name for name in re.findall(r"`([\w/]+\.py)`", row.split("except", 1)[1])
             if os.path.isfile(os.path.join(ROOT, "celerity_jax", name))}
    package = os.path.join(ROOT, "celerity_jax")
    modules = [os.path.relpath(p, package).replace(os.sep, "/")
               for p in glob.glob(os.path.join(package, "**", "*.py"), recursive=True)]
    without = {m for m in modules
               if (test := _test_module(m)) is not None and not os.path.isfile(os.path.join(ROOT, "tests", test))}
    assert without - named == set(), "modules without a test module that the README's tests row does not name"
    assert named - without == set(), "modules the README's tests row names that have a test module now"
