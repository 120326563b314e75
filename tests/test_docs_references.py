"""Every reference to a docs page resolves: `docs/<page>.md` names a file, `docs/<page>.md, "Section"` a heading
of that page (its text starts with "Section"), and a Markdown link in docs/ a file beside it. Pages move when
docs are split or renamed; this keeps README, the docs and the code's docstrings pointing at pages that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md")),
           *sorted((ROOT / "jaxpaged").rglob("*.py")), *sorted((ROOT / "pallas_kernels").rglob("*.py"))]
PAGE = re.compile(r"docs/[\w./-]*\w\.md")
SECTION = re.compile(r"(docs/[\w./-]*\w\.md),\s+\"([^\"]+)\"")
LINK = re.compile(r"\]\(([^)#:\s]+\.(?:md|png))(?:#[^)]*)?\)")


def headings(page: Path) -> list[str]:
    fence, out = False, []
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.append(line.lstrip("#").strip())
    return out


def test_every_docs_page_and_section_named_exists():
    broken = []
    for source in SOURCES:
        text = source.read_text()
        for page in set(PAGE.findall(text)):
            if not (ROOT / page).is_file():
                broken.append(f"{source.relative_to(ROOT)}: {page} does not exist")
        for page, section in SECTION.findall(text):
            section = " ".join(section.split())
            if (ROOT / page).is_file() and not any(h.startswith(section) for h in headings(ROOT / page)):
                broken.append(f"{source.relative_to(ROOT)}: {page} has no section {section!r}")
    assert not broken, "\n".join(broken)


def test_every_markdown_link_in_the_docs_resolves():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in sorted((ROOT / "docs").rglob("*.md"))
              for target in LINK.findall(page.read_text()) if not (page.parent / target).is_file()]
    assert not broken, "\n".join(broken)
