"""The documentation stays a guide: links resolve, the README keeps its shape, and neither docs nor
product code carry a lab notebook (issue numbers, dates of measurements, diary words)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_PACKAGES = ("rhymerl", "storage", "tasks", "flows", "workers", "cli", "infra")
README_SECTIONS = ("The two commands", "What a run gives you", "Your own model, data and reward",
                   "What speed to expect", "Architecture", "Documentation")
README_MAX_LINES = 150
FIRST_SCREEN = 40  # lines a reader sees before scrolling
# Words of a diary, not a guide. Inline code and code blocks are exempt (pytest's scope="session").
DIARY = re.compile(r"\b(sessions?|evenings?|tonight|yesterday|this morning|colleagues?|this VM|"
                   r"other (?:engineers|developers)(?:'s?)?)\b", re.IGNORECASE)
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
ISO_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def doc_files(root: Path) -> list[Path]:
    """The guide's pages: README.md, CONTRIBUTING.md and every page under docs/."""
    top = [root / name for name in ("README.md", "CONTRIBUTING.md") if (root / name).is_file()]
    return top + sorted((root / "docs").rglob("*.md"))


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code: what a reader reads as sentences."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", md.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(files: list[Path]) -> list[str]:
    """'file: target (why)' for each relative link whose file, or heading anchor, does not exist."""
    bad = []
    for md in files:
        for target in LINK.findall(FENCE.sub("", md.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{md}: {target} (no such heading)")
    return bad


def matches(files: list[Path], pattern: re.Pattern, in_prose: bool = False) -> list[str]:
    """'file:line: match' for every match of `pattern` (in prose only, when asked)."""
    out = []
    for f in files:
        text = f.read_text(errors="replace")
        for m in pattern.finditer(prose(text) if in_prose else text):
            line = (prose(text) if in_prose else text).count("\n", 0, m.start()) + 1
            out.append(f"{f}:{line}: {m.group(0)}")
    return out


def readme_problems(text: str) -> list[str]:
    """What keeps a README from being the guide's front page: length, sections, commands' place."""
    problems = []
    lines = text.splitlines()
    if len(lines) > README_MAX_LINES:
        problems.append(f"{len(lines)} lines (at most {README_MAX_LINES})")
    headings = [line[3:].strip() for line in prose(text).splitlines() if line.startswith("## ")]
    if [h for h in headings if h in README_SECTIONS] != list(README_SECTIONS):
        problems.append(f"sections {headings}, expected in order {list(README_SECTIONS)}")
    screen = "\n".join(lines[:FIRST_SCREEN])
    if "make run" not in screen or "make test" not in screen:
        problems.append(f"`make run` and `make test` not within the first {FIRST_SCREEN} lines")
    return problems


def product_code(root: Path) -> list[Path]:
    return sorted(p for pkg in PRODUCT_PACKAGES for p in (root / pkg).rglob("*.py"))


# --- the repository ---------------------------------------------------------------------------

def test_every_relative_link_resolves():
    assert broken_links(doc_files(ROOT)) == []


def test_readme_is_short_and_in_order():
    assert readme_problems((ROOT / "README.md").read_text()) == []


def test_docs_name_no_issue_numbers():
    assert matches(doc_files(ROOT), ISSUE) == []


def test_product_code_names_no_issue_numbers():
    assert matches(product_code(ROOT), ISSUE) == []


def test_docs_keep_no_diary():
    assert matches(doc_files(ROOT), DIARY, in_prose=True) == []


def test_dates_only_in_benchmarks():
    # Rule: a dated measurement lives in docs/benchmarks.md's tables, nowhere else.
    files = [f for f in doc_files(ROOT) if f.name != "benchmarks.md"]
    assert matches(files, ISO_DATE) == []


# --- each rule has power: a small tree that breaks it -----------------------------------------

def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_missing_file_or_heading_is_a_broken_link(tmp_path):
    # Rule: a link to a file that is not there, or to a heading the file lacks, is reported.
    write(tmp_path, "docs/a.md", "# A\n\n## Two words `code`\n")
    write(tmp_path, "README.md", "[ok](docs/a.md#two-words-code) [web](https://x.y/z) [gone](docs/b.md) "
                                 "[bad anchor](docs/a.md#nope)\n```\n[in code](nowhere.md)\n```\n")
    bad = broken_links(doc_files(tmp_path))
    assert len(bad) == 2 and "docs/b.md (no such file)" in bad[0] and "#nope (no such heading)" in bad[1]


def test_repeated_headings_get_numbered_anchors(tmp_path):
    # Rule: GitHub names a heading's second occurrence '<slug>-1'.
    md = write(tmp_path, "docs/a.md", "# T\n## Run\n## Run\n")
    assert anchors(md) == {"t", "run", "run-1"}


def test_an_issue_number_is_found(tmp_path):
    # Rule: 'issue 17' (any case, with or without '#') is found in docs and in code.
    doc = write(tmp_path, "docs/a.md", "As Issue 17 asks.\nSee issues #3.\nNo issue here.\n")
    code = write(tmp_path, "rhymerl/x.py", "# the fix of issue 20\n")
    assert len(matches([doc], ISSUE)) == 2
    assert len(matches(product_code(tmp_path), ISSUE)) == 1 and code.exists()


def test_diary_words_are_found_in_prose_only(tmp_path):
    # Rule: sessions, evenings, colleagues are diary words; inside code they are names.
    doc = write(tmp_path, "docs/a.md", "This evening a colleague ran it.\n`scope=\"session\"`\n"
                                       "```\nsession = 1\n```\n")
    assert [m.split(": ")[1] for m in matches([doc], DIARY, in_prose=True)] == ["evening", "colleague"]


def test_a_date_outside_benchmarks_is_found(tmp_path):
    # Rule: an ISO date in a guide page is a dated measurement.
    doc = write(tmp_path, "docs/a.md", "Measured 2026-12-03 on a CPU.\n")
    assert len(matches([doc], ISO_DATE)) == 1


def test_a_long_or_reordered_readme_fails():
    # Rule: at most 150 lines, the sections in order, the two commands on the first screen.
    good = ("# R\n\n```\nmake run\nmake test\n```\n"
            + "".join(f"## {s}\n\ntext\n\n" for s in README_SECTIONS))
    assert readme_problems(good) == []
    assert "lines" in readme_problems(good + "x\n" * 200)[0]
    swapped = good.replace("## Architecture", "## X").replace("## Documentation", "## Architecture")
    assert "sections" in readme_problems(swapped)[0]
    late = "# R\n" + "\n" * 50 + good[4:]
    assert "first 40 lines" in readme_problems(late)[0]
