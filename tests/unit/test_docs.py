"""The README and docs/ as a reader finds them.

A short README that names every rule file and library package in its layout, links every page of docs/ and
holds the two set-up commands CI runs; every relative link of the README and docs/ leads to a file that
exists. Text only: nothing of the library is imported.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 180

FENCE = re.compile(r"^ *```.*?^ *```", re.M | re.S)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?!\n))*`")  # a code span may wrap, never across a paragraph
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.I)
HTML_TAG = re.compile(r"<[A-Za-z/!?][^>\n]*>")
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section, up to the next ``## `` heading."""
    assert f"\n## {heading}\n" in text, f"README.md has no '## {heading}' section"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def prose(path: Path) -> str:
    """``path`` without its code blocks and inline code."""
    return INLINE_CODE.sub("", FENCE.sub("", read(path)))


def links(path: Path) -> list[str]:
    """The targets of every markdown link and image in ``path``, outside code blocks and inline code."""
    prose_text = prose(path)
    return INLINE_LINK.findall(prose_text) + REFERENCE_LINK.findall(prose_text)


def local_targets(path: Path) -> dict[str, Path]:
    """Relative link target -> the file it names (fragment dropped), for every relative link in ``path``."""
    return {
        target: (path.parent / target.split("#", 1)[0]).resolve()
        for target in links(path)
        if not EXTERNAL.match(target)
    }


def layout() -> dict[str, str]:
    """README's layout block: each top-level entry (a line that starts in column 0) -> its text, continuation
    lines (indented) included."""
    blocks = re.findall(r"^```\n(.*?)^```", section(read(README), "Layout"), re.M | re.S)
    assert len(blocks) == 1, "README's Layout section must hold one code block"
    entries: dict[str, str] = {}
    name = ""
    for line in blocks[0].splitlines():
        if line and not line[0].isspace():
            name, _, rest = line.partition(" ")
            entries[name] = rest
        elif line.strip():
            assert name, f"layout line before any entry: {line!r}"
            entries[name] += "\n" + line
    return entries


def ci_test_command() -> str:
    lines = read(ROOT / ".ci" / "run").splitlines()
    marker = lines.index("# The README's test command, verbatim.")
    return next(line for line in lines[marker + 1 :] if line.strip())


def test_the_readme_is_short() -> None:
    count = len(read(README).splitlines())
    assert count <= MAX_README_LINES, f"README.md has {count} lines; move detail to a page of docs/"


def test_the_readme_holds_the_two_setup_commands_that_ci_runs() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", section(read(README), "Set up"), re.S)
    commands = [line for block in blocks for line in block.splitlines() if line and not line.startswith("#")]
    tests = ci_test_command()
    install = tests.split(" && python -m pytest", 1)[0]
    assert install.startswith("pip install torch=="), tests
    assert commands == [f"{install} && python -m snakemake", tests]


def test_the_layout_names_every_rule_file() -> None:
    rules = layout()["rules/"]
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        assert re.search(rf"\b{smk.stem}\b", rules), f"README's layout does not name rules/{smk.name}"


def test_the_layout_names_every_package_and_module_of_the_library() -> None:
    text = layout()["tiny_llm/"]
    library = ROOT / "tiny_llm"
    folders = {p.name for p in library.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    modules = {p.stem for p in library.glob("*.py") if not p.name.startswith("_")}
    assert {p.parent.name for p in library.glob("*/__init__.py")} <= folders
    for folder in sorted(folders):
        assert re.search(rf"(?<![\w./]){folder}/", text), f"README's layout does not name tiny_llm/{folder}/"
    for module in sorted(modules):
        found = re.search(rf"(?<![\w./]){module}\.py\b", text)
        assert found, f"README's layout does not name tiny_llm/{module}.py"
    named_folders = set(re.findall(r"(?<![\w./])(\w+)/(?![\w.])", text))
    named_modules = set(re.findall(r"(?<![\w./])(\w+)\.py\b", text))
    assert named_folders <= folders, f"README's layout names what tiny_llm/ lacks: {named_folders - folders}"
    assert named_modules <= modules, f"README's layout names what tiny_llm/ lacks: {named_modules - modules}"


def test_every_layout_entry_exists() -> None:
    for name in layout():
        assert (ROOT / name).exists(), f"README's layout names {name}, which the repository lacks"


def test_the_readme_links_every_page_of_docs() -> None:
    linked = set(local_targets(README).values())
    for page in DOCS:
        assert page.resolve() in linked, f"README.md does not link docs/{page.name}"


def test_every_relative_link_leads_to_a_file_in_the_repository() -> None:
    for path in [README, *DOCS]:
        for target, file in local_targets(path).items():
            where = f"{path.relative_to(ROOT)}: link {target!r}"
            assert file.is_relative_to(ROOT), f"{where} leaves the repository"
            assert file.exists(), f"{where} names a file that does not exist"


def test_the_docs_are_plain_markdown() -> None:
    """GitHub hides what reads as an HTML tag (``<run>`` outside code); fences come in pairs."""
    for path in [README, *DOCS]:
        where = path.relative_to(ROOT)
        assert len(re.findall(r"^ *```", read(path), re.M)) % 2 == 0, f"{where}: a code fence is not closed"
        tags = HTML_TAG.findall(prose(path))
        assert not tags, f"{where}: {tags} outside code would be read as HTML; put them in backticks"


def test_the_docs_name_no_commit_ids() -> None:
    for path in [README, *DOCS]:
        found = COMMIT_ID.findall(read(path))
        assert not found, f"{path.relative_to(ROOT)} names commit ids {found}: say what changed instead"


REPO_FILE = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.\w+|Snakefile|README\.md)`")


def test_extending_names_files_that_exist_for_every_change() -> None:
    """docs/extending.md: each "Adding ..." section names the files its change touches, and every file named
    exists (a placeholder such as ``rules/<stage>.smk`` is no file)."""
    text = read(ROOT / "docs" / "extending.md")
    changes = re.split(r"^## ", text, flags=re.M)[1:]
    assert [c.split("\n", 1)[0] for c in changes] == [
        "Adding an optimizer",
        "Adding a model size",
        "Adding a metric to the train rows",
        "Adding a workflow stage",
        "Adding a campaign axis",
    ]
    for change in changes:
        named = REPO_FILE.findall(change)
        assert named, change.split("\n", 1)[0]
        missing = [path for path in named if not (ROOT / path).is_file()]
        assert not missing, f"{change.splitlines()[0]}: {missing}"


def test_the_link_reader_finds_inline_and_reference_links_outside_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        'See [a](a.md#part), ![img](pics/b.png "title") and [web](https://example.org).\n'
        "`[not](code.md)`, `a wrapped\n[span](span.md)`\n"
        "```\n[nor](block.md)\n```\n"
        "[ref]: ../c.md\n",
        encoding="utf-8",
    )
    assert links(page) == ["a.md#part", "pics/b.png", "https://example.org", "../c.md"]
    assert local_targets(page) == {
        "a.md#part": (tmp_path / "a.md").resolve(),
        "pics/b.png": (tmp_path / "pics" / "b.png").resolve(),
        "../c.md": (tmp_path.parent / "c.md").resolve(),
    }
