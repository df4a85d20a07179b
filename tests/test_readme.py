"""README.md is a guide: short, its Quickstart the two commands, and every link (of the docs it leads to, too)
resolves."""

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
