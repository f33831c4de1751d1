"""Every relative link of the project's Markdown resolves: the README, CONTRIBUTING.md,
BENCHMARKS.md, docs/*.md and the component READMEs. A link to a file or folder must name one that
exists; a `#anchor` into a Markdown page (the same page or another) must name one of its headings,
as GitHub turns headings into anchors. So moving a page, renaming a file or rewording a heading
fails here instead of leaving readers a dead link.

Not checked: http(s) and mailto links (the tests run offline), and anchors into files that are
not Markdown (a `#L10` into source), whose file must still exist.

Standard library only; run by scripts/test."""

import re
import tempfile
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The pages a reader moves between. Globbed, so a new page under docs/ is checked without an edit.
PAGES = ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "docs/*.md", "nvml-sim/README.md",
         "backends/README.md", "examples/pytorch/README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the target may carry a "title". Nested brackets in the text
# (a link around an image) are rare here; the inner image is matched on its own.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def pages(root: Path = REPO) -> list[Path]:
    found = []
    for pattern in PAGES:
        matches = sorted(root.glob(pattern))
        assert matches, f"{pattern}: no such page under {root} (PAGES in {__file__} names it)"
        found.extend(matches)
    return found


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with code spans blanked out, since a
    `[x](y)` inside code is an example, not a link."""
    in_fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            if in_fence is None:
                in_fence = fence.group(1)
            elif fence.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is None:
            yield number, line


def heading_text(raw: str) -> str:
    """The text GitHub renders for a heading's Markdown: links become their text, code spans
    their content, emphasis markers and HTML tags go."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    return text


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, every character that is not a letter, a digit, a
    space, `-` or `_` removed, each space a `-`."""
    out = []
    for ch in text.strip().lower():
        if ch in " -_":
            out.append("-" if ch == " " else ch)
        elif unicodedata.category(ch)[0] in "LN":
            out.append(ch)
    return "".join(out)


def anchors(text: str) -> set[str]:
    """The anchors a Markdown page defines: one per heading (a repeated slug gets -1, -2, …, as on
    GitHub), and explicit <a name/id>."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading_text(heading.group(2)))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str):
    """(line number, target) of every link and image in the page's prose."""
    for number, line in prose_lines(text):
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for match in INLINE_LINK.finditer(line):
            yield number, match.group(1)
        ref = REFERENCE_DEF.match(line)
        if ref:
            yield number, ref.group(1)


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """What is wrong with each relative link of `page`, as 'file:line: target: why'."""
    text = page.read_text(encoding="utf-8")
    problems = []
    where = page.relative_to(root)
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
            continue  # http:, https:, mailto: — not checked offline
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if path_part:
            if not resolved.exists():
                problems.append(f"{where}:{number}: {target}: {path_part} does not exist "
                                f"(resolved to {resolved})")
                continue
            if root not in resolved.parents and resolved != root:
                problems.append(f"{where}:{number}: {target}: points outside the repository")
                continue
        if anchor and resolved.is_file() and resolved.suffix == ".md":
            defined = anchors(resolved.read_text(encoding="utf-8"))
            if anchor not in defined:
                near = sorted(a for a in defined if a[:4] == anchor[:4])[:5]
                problems.append(f"{where}:{number}: {target}: no heading with anchor #{anchor} "
                                f"in {resolved.relative_to(root)}"
                                + (f" (similar: {', '.join(near)})" if near else ""))
    return problems


def test_every_relative_link_and_anchor_resolves():
    checked = pages()
    problems = [p for page in checked for p in broken_links(page)]
    assert not problems, "broken links in the documentation:\n" + "\n".join(problems)
    # The check must have had something to check: a regex that stopped matching would pass.
    total = sum(1 for page in checked for _ in links(page.read_text(encoding="utf-8")))
    assert total > 50, f"only {total} links found in {len(checked)} pages: is the link pattern broken?"


def test_the_readme_stays_a_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, (f"README.md is {lines} lines; it is meant to fit on a page (<= 200): move "
                          "the detail to a page under docs/ and link it from the README's map")


# The checker itself, on pages written for the purpose, so a checker that finds nothing fails.

def test_slug_follows_githubs_rules():
    assert slug(heading_text("Live view: `gpulse top`")) == "live-view-gpulse-top"
    assert slug(heading_text("`GET /status`: the running pipeline's view")) == \
        "get-status-the-running-pipelines-view"
    assert slug(heading_text("2b. Against the peers, PIDs that do not exist (before issue 12)")) == \
        "2b-against-the-peers-pids-that-do-not-exist-before-issue-12"
    assert slug(heading_text("`input_bound`: the GPU waits for data")) == "input_bound-the-gpu-waits-for-data"
    assert slug(heading_text("gpulse top, **fast**")) == "gpulse-top-fast"
    assert slug(heading_text("See [the docs](docs/x.md) now")) == "see-the-docs-now"
    assert slug(heading_text("Tests → CI ≤ 3×")) == "tests--ci--3"


def test_repeated_headings_get_numbered_anchors():
    assert anchors("# A\n## Notes\n## Notes\n```\n# not a heading\n```\n") == {"a", "notes", "notes-1"}


def test_broken_files_and_anchors_are_reported_and_good_ones_are_not():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        (root / "docs").mkdir()
        (root / "docs" / "b.md").write_text("# B page\n\n## The section\n", encoding="utf-8")
        page = root / "README.md"
        page.write_text(
            "\n".join([
                "# Top",
                "[ok](docs/b.md) [ok anchor](docs/b.md#the-section) [self](#top) [dir](docs/)",
                "[gone](docs/c.md) [bad anchor](docs/b.md#no-such) [bad self](#nowhere)",
                "![img](docs/img/none.png) [web](https://example.com/x) `[code](nope.md)`",
                "```",
                "[fenced](nope.md)",
                "```",
                "[ref]: docs/missing.md",
            ]) + "\n",
            encoding="utf-8",
        )
        problems = broken_links(page, root)
        assert [p.split(": ")[1] for p in problems] == [
            "docs/c.md", "docs/b.md#no-such", "#nowhere", "docs/img/none.png", "docs/missing.md",
        ], problems
        assert "README.md:3:" in problems[0]
        assert "does not exist" in problems[0]
        assert "no heading with anchor #no-such in docs/b.md" in problems[1]
