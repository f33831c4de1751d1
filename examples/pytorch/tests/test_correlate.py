"""correlate.py on hand-made OTLP/JSON files whose overlaps give known numbers.

tests/fixtures/ (times in seconds after T0):
* gpulse_metrics.jsonl, as ``gpulse run --exporter stdout`` prints it: the job's process
  (container c0ffee..., vpid 42) on GPU-aaaa with windows [-2,4] 0.2, [4,8] 0.5, [8,14] 0.8,
  [14,20] 0.6, [20,26] 0.9, [36,42] 0.3 (``.max`` 0.3/0.7/0.95/0.65/1.0/0.35, memory
  1000/1500/1200/1800/3000/900 MiB, a cumulative Sum whose start is gpulse's first sight of the
  process, -2 s), encoder points at 1.0, and on GPU-bbbb one window [10,20] at 0.1 with
  500 MiB. Decoys that must not join: another container's vpid 42 at 0.99, a host process with
  pid 42 at 0.77, the node's hw.gpu.utilization at 0.99.
* collector_spans.jsonl, as the collector's file exporter writes it: epochs [0,10], [10,20],
  [30,40] (the last failed) and a step [1,2]; the resource's host.name is the container's own.
* host_process_mixed.jsonl: spans and metrics in one file for a process on the host (pid 77),
  sampled at instants (no start time), plus a container's vpid 77 that must not join.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

import correlate
from conftest import FIXTURES, require_module

MiB = 1 << 20
METRICS = str(FIXTURES / "gpulse_metrics.jsonl")
SPANS = str(FIXTURES / "collector_spans.jsonl")
MIXED = str(FIXTURES / "host_process_mixed.jsonl")
GA = "GPU-aaaaaaaa-0000-1111-2222-333333333333"
GB = "GPU-bbbbbbbb-0000-1111-2222-333333333333"


def rows_for(paths, names=("epoch",)):
    return correlate.correlate(correlate.load(paths), names)


def summary(rows):
    return [
        (
            row.span.attributes.get("training.epoch"),
            row.gpu,
            None if row.util_mean is None else round(row.util_mean, 9),
            row.util_max,
            row.gpu_mem_peak_bytes,
            row.torch_peak_bytes,
            None if row.coverage is None else round(row.coverage, 9),
            row.points,
            row.span.error,
        )
        for row in rows
    ]


def test_epochs_join_by_container_and_vpid_with_overlap_weights():
    rows = rows_for([METRICS, SPANS])
    assert summary(rows) == [
        # (0.2*4 + 0.5*4 + 0.8*2) / 10
        (0, GA, 0.44, 0.95, 1500 * MiB, 700 * MiB, 1.0, 3, False),
        # (0.8*4 + 0.6*6) / 10; [20,26] only touches the epoch's end and does not count
        (1, GA, 0.68, 0.95, 1800 * MiB, 900 * MiB, 1.0, 2, False),
        # no .max companion on GPU-bbbb: the max is the mean's own
        (1, GB, 0.1, 0.1, 500 * MiB, 900 * MiB, 1.0, 1, False),
        # [36,42] covers 4 s of [30,40]
        (2, GA, 0.3, 0.35, 900 * MiB, None, 0.4, 1, True),
    ]
    assert all(row.process == "c0ffee000000/42" for row in rows)


def test_step_spans_can_be_selected():
    (row,) = rows_for([METRICS, SPANS], names=("step",))
    assert row.span.name == "step"
    assert (row.util_mean, row.util_max, row.coverage) == (0.2, 0.3, 1.0)


def test_all_spans_when_no_name_filter():
    names = sorted({row.span.name for row in rows_for([METRICS, SPANS], names=None)})
    assert names == ["epoch", "step", "training run"]


def test_host_process_with_instant_points_in_one_mixed_file():
    (row,) = rows_for([MIXED])
    assert row.process == "node-a/77"
    assert row.util_mean == pytest.approx(0.5)  # instants at 1 s and 2 s; 9 s is outside
    assert row.util_max == 0.6
    assert row.coverage is None
    assert row.points == 2


def test_the_same_requests_read_twice_count_once():
    assert summary(rows_for([METRICS, SPANS, METRICS, SPANS])) == summary(
        rows_for([METRICS, SPANS])
    )


def test_a_span_without_metrics_still_gets_a_row():
    (row,) = rows_for([SPANS, MIXED], names=("step",))
    assert row.gpu is None and row.util_mean is None and row.points == 0


SPAN_SIDE = {"container.id": "c1", "process.pid": 42, "host.name": "pod-xyz"}


@pytest.mark.parametrize(
    "span_resource, metric_resource, expected",
    [
        (SPAN_SIDE, {"container.id": "c1", "process.vpid": 42, "process.pid": 9042}, True),
        (SPAN_SIDE, {"container.id": "c1", "process.vpid": 43, "process.pid": 42}, False),
        (SPAN_SIDE, {"container.id": "c2", "process.vpid": 42}, False),
        (SPAN_SIDE, {"process.pid": 42, "host.name": "pod-xyz"}, False),
        ({"k8s.pod.uid": "u1", "process.pid": 1}, {"k8s.pod.uid": "u1", "process.vpid": 1}, True),
        ({"k8s.pod.uid": "u1", "process.pid": 1}, {"k8s.pod.uid": "u2", "process.vpid": 1}, False),
        ({"host.name": "n", "process.pid": 7}, {"host.name": "n", "process.pid": 7}, True),
        ({"host.name": "n", "process.pid": 7}, {"host.name": "m", "process.pid": 7}, False),
        (
            {"host.name": "n", "process.pid": 7},
            {"host.name": "n", "process.vpid": 7, "container.id": "c9"},
            False,
        ),
        ({"host.name": "n"}, {"host.name": "n", "process.pid": 7}, False),
    ],
)
def test_same_process(span_resource, metric_resource, expected):
    assert correlate.same_process(span_resource, metric_resource) is expected


def test_json_output():
    out = io.StringIO()
    assert correlate.main([METRICS, SPANS, "--format", "json"], stdout=out) == 0
    rows = json.loads(out.getvalue())
    assert [r["epoch"] for r in rows] == [0, 1, 1, 2]
    assert rows[0]["util_mean"] == pytest.approx(0.44)
    assert rows[0]["gpu_mem_peak_bytes"] == 1500 * MiB
    assert rows[0]["duration_s"] == 10.0
    assert rows[0]["start"] == "2023-11-14T22:13:20.000Z"
    assert rows[0]["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert rows[3]["error"] is True


def test_csv_output():
    out = io.StringIO()
    assert correlate.main([METRICS, SPANS, "--format", "csv"], stdout=out) == 0
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == 4
    assert float(rows[1]["util_mean"]) == pytest.approx(0.68)
    assert rows[3]["torch_peak_bytes"] == ""


def test_table_output_is_aligned():
    out = io.StringIO()
    assert correlate.main([METRICS, SPANS], stdout=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:3] == ["span", "epoch", "step"]
    assert "44.0%" in lines[1] and "95.0%" in lines[1] and "1500.0" in lines[1]
    assert "epoch (error)" in lines[4] and "40.0%" in lines[4]
    # Right-aligned numeric columns end at the same place on every line.
    ends = {line.index("%", line.index("c0ffee")) for line in lines[1:]}
    assert len(ends) == 1


def test_missing_file_is_exit_2_with_the_path(capsys):
    assert correlate.main(["/nonexistent/otlp.jsonl"]) == 2
    assert "cannot read /nonexistent/otlp.jsonl" in capsys.readouterr().err


def test_garbage_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"resourceSpans": []}\nnot json at all\n')
    assert correlate.main([str(bad)]) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err


def test_pretty_printed_single_request_is_accepted(tmp_path):
    pretty = tmp_path / "pretty.json"
    first = (FIXTURES / "collector_spans.jsonl").read_text().splitlines()[0]
    pretty.write_text(json.dumps(json.loads(first), indent=2))
    rows = rows_for([METRICS, str(pretty)])
    assert [round(r.util_mean, 9) for r in rows] == [0.44, 0.68, 0.1]


def test_no_matching_span_is_exit_1(capsys):
    assert correlate.main([METRICS, SPANS, "--span-name", "validate"]) == 1
    assert "no span named validate" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path):
    require_module("matplotlib", "correlate.py --plot")
    target = tmp_path / "util.png"
    out = io.StringIO()
    assert correlate.main([METRICS, SPANS, "--plot", str(target)], stdout=out) == 0
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_memory_sum_without_gauges_covers_the_time_since_its_previous_point(tmp_path):
    def point(t, mib):
        return {"startTimeUnixNano": "1000000000", "timeUnixNano": str(t * 10**9),
                "asInt": str(mib * MiB)}  # fmt: skip

    resource = {"attributes": [
        {"key": "container.id", "value": {"stringValue": "c1"}},
        {"key": "process.vpid", "value": {"intValue": "7"}},
    ]}  # fmt: skip
    metrics = {"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": [
        {"name": "process.gpu.memory.usage", "unit": "By",
         "sum": {"dataPoints": [point(4, 100), point(8, 200), point(14, 300)]}}]}]}]}  # fmt: skip
    spans = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "container.id", "value": {"stringValue": "c1"}},
        {"key": "process.pid", "value": {"intValue": "7"}},
    ]}, "scopeSpans": [{"spans": [{"traceId": "01" * 16, "spanId": "02" * 8, "name": "epoch",
        "startTimeUnixNano": str(5 * 10**9), "endTimeUnixNano": str(7 * 10**9)}]}]}]}  # fmt: skip
    path = tmp_path / "otlp.jsonl"
    path.write_text(json.dumps(metrics) + "\n" + json.dumps(spans) + "\n")
    (row,) = rows_for([str(path)])
    # Only the point at 8 s stands for [4 s, 8 s]; the series' start (1 s) would take in 14 s too.
    assert row.gpu_mem_peak_bytes == 200 * MiB
