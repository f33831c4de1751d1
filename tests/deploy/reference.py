"""The metric reference gpulse documents: docs/metrics.md's reference table (name | instrument |
unit | ...), or, until that file exists, the table in DESIGN.md (shared/DESIGN.md beside the
repository, or the repository's own copy). The tests that use it fail when docs/metrics.md is
missing under CI=true, so the fallback can never pass a release.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import promnames

REPO = Path(__file__).resolve().parents[2]
METRICS_MD = REPO / "docs" / "metrics.md"
DESIGN_CANDIDATES = [REPO / "DESIGN.md", REPO / "shared" / "DESIGN.md", REPO.parent / "shared" / "DESIGN.md"]

_DOTTED = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+")


@dataclass(frozen=True)
class MetricDef:
    name: str
    instrument: str  # one of promnames.GAUGE / COUNTER / UPDOWN / HISTOGRAM
    unit: str

    def prometheus_names(self) -> set[str]:
        return promnames.series_names(self.name, self.unit, self.instrument)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def normalise_instrument(cell: str) -> str | None:
    c = re.sub(r"[\s_\-`]", "", cell.lower())
    if c.startswith("updowncounter") or "nonmonotonic" in c or "updown" in c:
        return promnames.UPDOWN
    if "histogram" in c:
        return promnames.HISTOGRAM
    if "counter" in c or "monotonic" in c:
        return promnames.COUNTER
    if "gauge" in c:
        return promnames.GAUGE
    return None


def _cells(line: str) -> list[str]:
    # `\|` inside a cell is a literal pipe (GitHub tables), not a column break.
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _names_in_cell(cell: str) -> list[str]:
    """`hw.gpu.memory.usage / .limit` -> both names; attributes in parentheses are dropped."""
    text = re.sub(r"\([^)]*\)", " ", cell).replace("`", " ")
    names: list[str] = []
    for part in re.split(r"\s*(?:/|,|\bor\b)\s*", text):
        part = part.strip()
        if not part:
            continue
        if part.startswith(".") and names:
            stem = names[0].rsplit(".", 1)[0]
            names.append(stem + part)
            continue
        m = _DOTTED.match(part)
        if m:
            names.append(m.group(0))
    return names


def parse_reference_table(text: str) -> list[MetricDef]:
    """Every row of every markdown table whose header starts `name | instrument | unit`."""
    out: list[MetricDef] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        header = lines[i]
        if header.lstrip().startswith("|"):
            cols = [c.lower().strip("` *") for c in _cells(header)]
            if len(cols) >= 3 and cols[0] in ("name", "metric") and cols[1].startswith("instrument") and cols[2] == "unit":
                i += 2  # skip the --- line
                while i < len(lines) and lines[i].lstrip().startswith("|"):
                    cells = _cells(lines[i])
                    if len(cells) >= 3:
                        names = _names_in_cell(cells[0])
                        kind = normalise_instrument(cells[1])
                        units = [u.strip().strip("`") for u in cells[2].split(",")]
                        for n, name in enumerate(names):
                            unit = units[n] if len(units) == len(names) else units[0]
                            if kind is not None:
                                out.append(MetricDef(name, kind, unit))
                    i += 1
                continue
        i += 1
    return out


def reference_source() -> Path | None:
    if METRICS_MD.is_file():
        return METRICS_MD
    for p in DESIGN_CANDIDATES:
        if p.is_file():
            return p
    return None


def load_reference() -> tuple[Path, list[MetricDef]]:
    src = reference_source()
    if src is None:
        raise FileNotFoundError("neither docs/metrics.md nor DESIGN.md found")
    defs = parse_reference_table(src.read_text(encoding="utf-8"))
    if src != METRICS_MD:
        # DESIGN.md lists the utilisation companions in prose ("with .max/.min companions").
        extra = []
        for d in defs:
            if d.instrument == promnames.GAUGE and d.name.endswith("utilization"):
                extra += [MetricDef(d.name + ".max", d.instrument, d.unit), MetricDef(d.name + ".min", d.instrument, d.unit)]
        defs += extra
    return src, defs


def documented_attributes(text: str) -> set[str]:
    """Every dotted attribute-like name written in backticks anywhere in the reference."""
    out: set[str] = set()
    for chunk in re.findall(r"`([^`]+)`", text):
        out.update(_DOTTED.findall(chunk))
    return out
