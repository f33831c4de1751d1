"""docs/prometheus.md: its name table is the Prometheus translation (promnames.py, written from
the OpenTelemetry specification and otlptranslator's tables) of every metric docs/metrics.md
documents. gpulse's own translation (src/export/prometheus/names.rs) is held to this table by
the integration test tests/prometheus.rs, which looks up every family /metrics serves here."""

import re

import promnames
import reference
from conftest import REPO

KINDS = {"gauge": promnames.GAUGE, "counter": promnames.COUNTER, "updowncounter": promnames.UPDOWN}


def table() -> dict[str, tuple[str, str, str]]:
    text = (REPO / "docs" / "prometheus.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]*)` \| (\w+) \| `([^`]+)` \|$", text, flags=re.M)
    return {name: (unit, kind, prom) for name, unit, kind, prom in rows}


def test_the_table_is_the_translation_of_every_documented_metric():
    _, defs = reference.load_reference()
    rows = table()
    assert set(rows) == {d.name for d in defs}
    for d in defs:
        unit, kind, prom = rows[d.name]
        assert (unit, kind) == (d.unit, d.instrument), d.name
        assert prom == promnames.metric_name(d.name, d.unit, KINDS[d.instrument]), d.name
