"""Every figure in the README's cost table ("## What it costs") appears in BENCHMARKS.md with the
same value, so the README never quotes a figure that the reference does not hold, with its
conditions and command. A figure is a number or a range of numbers with its unit (`%`, `MiB`,
`×`); it must appear in BENCHMARKS.md as a whole figure (`0.50–0.56 %` is not found inside
`10.50–0.56 %`).

Standard library and pytest only; run by scripts/test."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

NUMBER = r"\d+(?:[.,]\d+)?"
# 0.50–0.56 %, 14.3 MiB, 7.3–9.6×; the unit after an optional (non-breaking) space.
FIGURE = re.compile(rf"(?<![\d.,])({NUMBER}(?:\s*[–-]\s*{NUMBER})?)\s?(%|MiB|KiB|KB|×)")


def cost_table(readme: str) -> list[str]:
    """The rows of the first table under the README's "## What it costs" heading."""
    match = re.search(r"^## What it costs\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, "README.md has no '## What it costs' section"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    assert len(rows) > 2, "README.md's 'What it costs' has no table"
    return rows[2:]  # past the header and its --- line


def figures(text: str) -> list[str]:
    return [f"{value} {unit}" if unit != "×" else f"{value}×" for value, unit in FIGURE.findall(text)]


def normalised(text: str) -> str:
    return re.sub(r"[ \u00a0\u202f]+", " ", text.replace("**", ""))


def missing_figures(readme: str, benchmarks: str) -> list[str]:
    reference = normalised(benchmarks)
    missing = []
    for row in cost_table(readme):
        found = figures(normalised(row))
        assert found, f"a row of README.md's cost table quotes no figure: {row}"
        for figure in found:
            pattern = re.escape(figure).replace(r"\ ", r"\s?")
            if not re.search(rf"(?<![\d.,]){pattern}", reference):
                missing.append(f"{figure} (README row: {row.split('|')[1].strip()})")
    return missing


def test_every_readme_cost_figure_is_in_benchmarks():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    benchmarks = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    missing = missing_figures(readme, benchmarks)
    assert not missing, ("README.md quotes figures that BENCHMARKS.md does not hold with the same "
                         "value; update one or the other:\n  " + "\n  ".join(missing))


README = """## What it costs

| configuration | CPU | peak RSS | against what |
| --- | --- | --- | --- |
| run | 0.50–0.56 % | 14.3 MiB | 7.3–9.6× less CPU |
## Documentation
"""


def test_a_changed_digit_is_caught():
    benchmarks = "| 100 ms | **0.50–0.56 %** | 14.3 MiB | **7.3–9.6× less CPU** |"
    assert missing_figures(README, benchmarks) == []
    assert missing_figures(README.replace("0.56 %", "0.57 %"), benchmarks) == [
        "0.50–0.57 % (README row: run)"]
    assert missing_figures(README.replace("14.3", "14.2"), benchmarks) == [
        "14.2 MiB (README row: run)"]
    # a figure found only inside a longer number does not count
    assert missing_figures(README, benchmarks.replace("| 14.3", "| 114.3")) == [
        "14.3 MiB (README row: run)"]


def test_a_missing_table_fails():
    try:
        cost_table("## What it costs\n\nno table here\n## Next\n")
    except AssertionError as e:
        assert "no table" in str(e)
    else:
        raise AssertionError("a cost section without a table was accepted")
