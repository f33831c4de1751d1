"""docs/prometheus.md tells Prometheus 3 users which resource attributes to promote; the real
Prometheus of tests/backends runs with the list tests/backends/backend_stack.py sets. They are
one list: a user who copies the page gets what was tested."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def documented_list() -> list[str]:
    text = (REPO / "docs" / "prometheus.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n# prometheus.yml\notlp:\n  promote_resource_attributes:\n((?:    - \S+\n)+)```",
                      text)
    assert block, "docs/prometheus.md has no prometheus.yml block with otlp.promote_resource_attributes"
    return re.findall(r"^    - (\S+)$", block.group(1), flags=re.M)


def backend_test_list() -> list[str]:
    source = (REPO / "tests" / "backends" / "backend_stack.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PROMETHEUS_OTLP"
                                                for t in node.targets):
            return ast.literal_eval(node.value)["promote_resource_attributes"]
    raise AssertionError("tests/backends/backend_stack.py no longer defines PROMETHEUS_OTLP")


def test_the_documented_promotion_list_is_the_tested_one():
    docs, test = documented_list(), backend_test_list()
    assert len(docs) >= 10, docs
    assert docs == test, (f"docs/prometheus.md promotes {docs}, the backend test {test}: "
                          "change both, or the page tells users something that was not tested")
