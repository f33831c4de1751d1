#!/usr/bin/env python3
"""Join a training job's spans with the GPU metrics gpulse exported for the same process.

Reads OTLP/JSON lines: what ``gpulse run --exporter stdout`` prints, and what the OpenTelemetry
Collector's file exporter writes (``{"resourceMetrics": ...}`` and ``{"resourceSpans": ...}`` lines,
in one file or several; ``-`` is standard input). For each selected span (``epoch`` by default) it
prints the GPU utilisation mean and max and the GPU memory peak of the span's process during it.

Which metric resource is the span's process (first rule that applies to the span's resource):

1. the span has ``container.id``: same ``container.id`` and ``process.vpid`` (the span side's
   ``process.vpid``, else its ``process.pid``: both are the PID inside the container);
2. the span has ``k8s.pod.uid`` but no ``container.id`` (cgroup v2 pod, where the container cannot
   see its own id): same ``k8s.pod.uid`` and ``process.vpid``. Two containers of one pod can both
   have PID 1, so this is right only when one of them uses the GPU;
3. otherwise (a process on the host): same ``host.name`` and ``process.vpid`` (else
   ``process.pid``), and the metric resource has no ``container.id``.
``host.name`` is not compared for containers: inside one it is the container's hostname, while
gpulse reports the node's, and a container id is unique on its own.

Which points count: a metric point covers the window ``[startTimeUnixNano, timeUnixNano]`` (for
gpulse, the first and last sample of the export interval). It counts for a span when the window
overlaps the span, weighted by the length of the overlap: a window lying half outside the span
counts half as much as one lying inside. The mean is ``sum(value * overlap) / sum(overlap)``;
``coverage`` is ``sum(overlap) / span duration`` (1.0 = every moment of the span was sampled;
empty when only windowless points counted).
A point with no window (no start time, or start = time) counts only when no windowed point
overlaps the span, and then every such point inside the span weighs the same. The max is the
largest ``process.gpu.utilization.max`` among overlapping points (the mean's own max when that
companion is absent); the memory peak is the largest ``process.gpu.memory.usage`` among them;
``points`` counts the utilisation points used. ``process.gpu.memory.usage`` is a cumulative Sum
whose start time is when gpulse first saw the process, not a window: each of its points is taken
to cover the window of the gauges exported with it (else the time since the series' previous
point; see ``sum_windows``).
Utilisation points with ``hw.gpu.task`` other than ``general`` (encoder, decoder) are left out.
A process on several GPUs gets a row per GPU (``hw.id``).

Only the Python standard library is needed, plus matplotlib for ``--plot``.
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Dict, Iterable, List, Optional, Sequence, TextIO, Tuple

UTILIZATION = "process.gpu.utilization"
UTILIZATION_MAX = "process.gpu.utilization.max"
MEMORY_USAGE = "process.gpu.memory.usage"
TORCH_PEAK_ATTRIBUTE = "pytorch.cuda.memory.peak_allocated"
TASK_ATTRIBUTE = "hw.gpu.task"
GPU_ATTRIBUTE = "hw.id"
STATUS_ERROR = 2  # OTLP Status.code for ERROR, as protobuf JSON writes the enum (or its name)

_FIELDS = (
    "span",
    "trace_id",
    "span_id",
    "epoch",
    "step",
    "start",
    "duration_s",
    "process",
    "gpu",
    "util_mean",
    "util_max",
    "gpu_mem_peak_bytes",
    "torch_peak_bytes",
    "coverage",
    "points",
    "error",
)


class CorrelateError(Exception):
    """Input that cannot be read; the message names the file and line and says what to check."""


@dataclass(frozen=True)
class SpanRecord:
    name: str
    trace_id: str
    span_id: str
    start_ns: int
    end_ns: int
    attributes: Dict[str, object]
    resource: Dict[str, object]
    error: bool = False


@dataclass(frozen=True)
class PointRecord:
    metric: str
    resource: Dict[str, object]
    attributes: Dict[str, object]
    start_ns: Optional[int]
    time_ns: int
    value: float
    #: From a cumulative Sum: its start time is the series' start, not the sample window's.
    cumulative: bool = False

    @property
    def windowed(self) -> bool:
        return self.start_ns is not None and self.start_ns < self.time_ns


@dataclass
class Telemetry:
    spans: List[SpanRecord] = field(default_factory=list)
    points: List[PointRecord] = field(default_factory=list)


# -- reading OTLP/JSON ------------------------------------------------------------------------


def any_value(value: Optional[dict]) -> object:
    """Decode an OTLP/JSON AnyValue (intValue arrives as a string: int64 in protobuf JSON)."""
    if not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return attributes_of(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None


def attributes_of(key_values: Optional[Iterable[dict]]) -> Dict[str, object]:
    return {kv["key"]: any_value(kv.get("value")) for kv in key_values or () if "key" in kv}


def _nanos(value: object) -> Optional[int]:
    if value is None or value == "":
        return None
    number = int(value)
    return number if number > 0 else None


def _id(value: object) -> str:
    # OTLP/JSON writes trace and span ids as hex; base64 appears in some older writers.
    text = str(value or "")
    if text and not all(c in "0123456789abcdefABCDEF" for c in text):
        try:
            return base64.b64decode(text).hex()
        except ValueError:
            return text
    return text.lower()


def _point_value(point: dict) -> Optional[float]:
    if "asDouble" in point:
        return float(point["asDouble"])
    if "asInt" in point:
        return float(int(point["asInt"]))
    return None


def _status_is_error(status: Optional[dict]) -> bool:
    code = (status or {}).get("code")
    return code == STATUS_ERROR or code == "STATUS_CODE_ERROR"


def add_request(request: dict, into: Telemetry) -> None:
    """Add one ExportMetricsServiceRequest and/or ExportTraceServiceRequest (as JSON)."""
    for resource_metrics in request.get("resourceMetrics", ()) or ():
        resource = attributes_of((resource_metrics.get("resource") or {}).get("attributes"))
        for scope in resource_metrics.get("scopeMetrics", ()) or ():
            for metric in scope.get("metrics", ()) or ():
                name = metric.get("name", "")
                data = metric.get("gauge") or metric.get("sum")
                if not data:
                    continue
                cumulative = "sum" in metric and "gauge" not in metric
                for point in data.get("dataPoints", ()) or ():
                    value = _point_value(point)
                    time_ns = _nanos(point.get("timeUnixNano"))
                    if value is None or time_ns is None or math.isnan(value):
                        continue
                    into.points.append(
                        PointRecord(
                            metric=name,
                            resource=resource,
                            attributes=attributes_of(point.get("attributes")),
                            start_ns=_nanos(point.get("startTimeUnixNano")),
                            time_ns=time_ns,
                            value=value,
                            cumulative=cumulative,
                        )
                    )
    for resource_spans in request.get("resourceSpans", ()) or ():
        resource = attributes_of((resource_spans.get("resource") or {}).get("attributes"))
        for scope in resource_spans.get("scopeSpans", ()) or ():
            for span in scope.get("spans", ()) or ():
                start = _nanos(span.get("startTimeUnixNano"))
                end = _nanos(span.get("endTimeUnixNano"))
                if start is None or end is None:
                    continue
                into.spans.append(
                    SpanRecord(
                        name=span.get("name", ""),
                        trace_id=_id(span.get("traceId")),
                        span_id=_id(span.get("spanId")),
                        start_ns=start,
                        end_ns=end,
                        attributes=attributes_of(span.get("attributes")),
                        resource=resource,
                        error=_status_is_error(span.get("status")),
                    )
                )


def read_stream(stream: TextIO, label: str, into: Telemetry) -> None:
    """One JSON request per line; a file holding a single (pretty-printed) request also works."""
    text = stream.read()
    try:
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line:
                continue
            try:
                request = json.loads(line)
            except json.JSONDecodeError as error:
                raise _LineError(number, error) from error
            if isinstance(request, dict):
                add_request(request, into)
    except _LineError as line_error:
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            raise CorrelateError(
                f"{label}:{line_error.number}: not JSON ({line_error.error.msg}). Expected one "
                "OTLP/JSON request per line, as `gpulse run --exporter stdout` or the collector's "
                "file exporter (format: json) write them"
            ) from None
        if isinstance(whole, dict):
            add_request(whole, into)
    except (KeyError, TypeError, ValueError) as error:
        raise CorrelateError(
            f"{label}: an OTLP/JSON request has an unexpected shape ({error!r}); is this the "
            "collector's file exporter with format: proto? Use format: json"
        ) from error


class _LineError(Exception):
    def __init__(self, number: int, error: json.JSONDecodeError) -> None:
        super().__init__(number)
        self.number = number
        self.error = error


def load(paths: Sequence[str], stdin: TextIO = sys.stdin) -> Telemetry:
    telemetry = Telemetry()
    for path in paths:
        if path == "-":
            read_stream(stdin, "<stdin>", telemetry)
            continue
        try:
            with open(path, encoding="utf-8") as stream:
                read_stream(stream, path, telemetry)
        except OSError as error:
            raise CorrelateError(f"cannot read {path}: {error.strerror}") from error
    return _deduplicated(telemetry)


def _frozen(mapping: Dict[str, object]) -> Tuple:
    return tuple(sorted((k, repr(v)) for k, v in mapping.items()))


def _deduplicated(telemetry: Telemetry) -> Telemetry:
    # The same request can arrive twice: gpulse's stdout and a collector file given together.
    spans: Dict[Tuple[str, str], SpanRecord] = {}
    for span in telemetry.spans:
        spans.setdefault((span.trace_id, span.span_id), span)
    points: Dict[Tuple, PointRecord] = {}
    for point in telemetry.points:
        key = (point.metric, _frozen(point.resource), _frozen(point.attributes))
        points.setdefault(key + (point.start_ns, point.time_ns), point)
    return Telemetry(spans=list(spans.values()), points=sum_windows(list(points.values())))


def sum_windows(points: List[PointRecord]) -> List[PointRecord]:
    """Give each cumulative Sum point the sample window it stands for.

    A Sum's ``startTimeUnixNano`` is where the series began (gpulse: when it first saw the
    process), so ``[start, time]`` would make every point overlap every earlier span. Its value is
    the last sample of the export window that ended at ``time``; that window is, in order: the
    window of a gauge point of the same resource ending at the same time (the same export), else
    the time since the series' previous point; the first point of a series stands for its instant.
    """
    gauge_windows: Dict[Tuple, int] = {}
    for point in points:
        if not point.cumulative and point.windowed and point.start_ns is not None:
            key = (_frozen(point.resource), point.time_ns)
            gauge_windows[key] = min(gauge_windows.get(key, point.start_ns), point.start_ns)
    series: Dict[Tuple, List[PointRecord]] = {}
    out: List[PointRecord] = []
    for point in points:
        if point.cumulative:
            key = (point.metric, _frozen(point.resource), _frozen(point.attributes))
            series.setdefault(key, []).append(point)
        else:
            out.append(point)
    for members in series.values():
        members.sort(key=lambda p: p.time_ns)
        previous: Optional[int] = None
        for point in members:
            start = gauge_windows.get((_frozen(point.resource), point.time_ns), previous)
            out.append(replace(point, start_ns=start))
            previous = point.time_ns
    return out


# -- the join ---------------------------------------------------------------------------------


def _pid(resource: Dict[str, object], *keys: str) -> Optional[int]:
    for key in keys:
        value = resource.get(key)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def same_process(span_resource: Dict[str, object], metric_resource: Dict[str, object]) -> bool:
    """Whether a metric resource is the process of a span resource (rules in the module docs)."""
    span_pid = _pid(span_resource, "process.vpid", "process.pid")
    if span_pid is None:
        return False
    container = span_resource.get("container.id")
    if container:
        return (
            metric_resource.get("container.id") == container
            and _pid(metric_resource, "process.vpid") == span_pid
        )
    pod = span_resource.get("k8s.pod.uid")
    if pod:
        return (
            metric_resource.get("k8s.pod.uid") == pod
            and _pid(metric_resource, "process.vpid") == span_pid
        )
    host = span_resource.get("host.name")
    return (
        host is not None
        and not metric_resource.get("container.id")
        and metric_resource.get("host.name") == host
        and _pid(metric_resource, "process.vpid", "process.pid") == span_pid
    )


def process_label(resource: Dict[str, object]) -> str:
    pid = _pid(resource, "process.vpid", "process.pid")
    container = resource.get("container.id")
    if container:
        return f"{str(container)[:12]}/{pid}"
    pod = resource.get("k8s.pod.uid")
    if pod:
        return f"pod {str(pod)[:8]}/{pid}"
    return f"{resource.get('host.name', '?')}/{pid}"


def overlap_ns(point: PointRecord, start_ns: int, end_ns: int) -> int:
    if not point.windowed:
        return 0
    assert point.start_ns is not None
    return max(0, min(point.time_ns, end_ns) - max(point.start_ns, start_ns))


def instant_inside(point: PointRecord, start_ns: int, end_ns: int) -> bool:
    return not point.windowed and start_ns <= point.time_ns <= end_ns


@dataclass
class Row:
    span: SpanRecord
    process: str
    gpu: Optional[str]
    util_mean: Optional[float]
    util_max: Optional[float]
    gpu_mem_peak_bytes: Optional[int]
    torch_peak_bytes: Optional[int]
    coverage: Optional[float]
    points: int

    def as_dict(self) -> Dict[str, object]:
        span = self.span
        return {
            "span": span.name,
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "epoch": span.attributes.get("training.epoch"),
            "step": span.attributes.get("training.step"),
            "start": iso_time(span.start_ns),
            "duration_s": (span.end_ns - span.start_ns) / 1e9,
            "process": self.process,
            "gpu": self.gpu,
            "util_mean": self.util_mean,
            "util_max": self.util_max,
            "gpu_mem_peak_bytes": self.gpu_mem_peak_bytes,
            "torch_peak_bytes": self.torch_peak_bytes,
            "coverage": self.coverage,
            "points": self.points,
            "error": span.error,
        }


def _is_general(point: PointRecord) -> bool:
    return point.attributes.get(TASK_ATTRIBUTE, "general") == "general"


def weighted_mean(points: Sequence[PointRecord], start_ns: int, end_ns: int):
    """(mean, covered ns, points used) by the overlap rule; mean is None when nothing counts."""
    total = weight = 0.0
    used = 0
    for point in points:
        w = overlap_ns(point, start_ns, end_ns)
        if w > 0:
            total += point.value * w
            weight += w
            used += 1
    if weight > 0:
        return total / weight, weight, used
    instants = [p.value for p in points if instant_inside(p, start_ns, end_ns)]
    if instants:
        return sum(instants) / len(instants), 0.0, len(instants)
    return None, 0.0, 0


def _counts(point: PointRecord, start_ns: int, end_ns: int) -> bool:
    return overlap_ns(point, start_ns, end_ns) > 0 or instant_inside(point, start_ns, end_ns)


def correlate(telemetry: Telemetry, span_names: Optional[Sequence[str]] = ("epoch",)) -> List[Row]:
    """One row per selected span and GPU its process used (one row with no GPU if none)."""
    selected = [s for s in telemetry.spans if not span_names or s.name in span_names]
    selected.sort(key=lambda s: (s.start_ns, s.name))
    wanted = (UTILIZATION, UTILIZATION_MAX, MEMORY_USAGE)
    relevant = [p for p in telemetry.points if p.metric in wanted]
    rows: List[Row] = []
    matches: Dict[Tuple, List[PointRecord]] = {}
    for span in selected:
        key = _frozen(span.resource)
        if key not in matches:
            matches[key] = [p for p in relevant if same_process(span.resource, p.resource)]
        by_gpu: Dict[Optional[str], List[PointRecord]] = {}
        for point in matches[key]:
            if _counts(point, span.start_ns, span.end_ns):
                gpu = point.attributes.get(GPU_ATTRIBUTE)
                by_gpu.setdefault(None if gpu is None else str(gpu), []).append(point)
        torch_peak = span.attributes.get(TORCH_PEAK_ATTRIBUTE)
        torch_peak = int(torch_peak) if isinstance(torch_peak, (int, float)) else None
        label = process_label(span.resource)
        if not by_gpu:
            rows.append(Row(span, label, None, None, None, None, torch_peak, None, 0))
            continue
        for gpu in sorted(by_gpu, key=lambda g: g or ""):
            points = by_gpu[gpu]
            util = [p for p in points if p.metric == UTILIZATION and _is_general(p)]
            util_max_points = [p for p in points if p.metric == UTILIZATION_MAX and _is_general(p)]
            memory = [p for p in points if p.metric == MEMORY_USAGE]
            mean, covered, used = weighted_mean(util, span.start_ns, span.end_ns)
            maxima = [p.value for p in (util_max_points or util)]
            duration = span.end_ns - span.start_ns
            coverage = min(1.0, covered / duration) if duration > 0 and covered > 0 else None
            rows.append(
                Row(
                    span=span,
                    process=label,
                    gpu=gpu,
                    util_mean=mean,
                    util_max=max(maxima) if maxima else None,
                    gpu_mem_peak_bytes=int(max(p.value for p in memory)) if memory else None,
                    torch_peak_bytes=torch_peak,
                    coverage=coverage,
                    points=used,
                )
            )
    return rows


# -- output -----------------------------------------------------------------------------------


def iso_time(ns: int) -> str:
    moment = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _mib(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / 1048576:.1f}"


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def format_table(rows: Sequence[Row]) -> str:
    header = (
        "span",
        "epoch",
        "step",
        "start",
        "dur_s",
        "process",
        "gpu",
        "util_mean",
        "util_max",
        "gpu_mem_MiB",
        "torch_MiB",
        "coverage",
        "points",
    )
    lines = [header]
    for row in rows:
        d = row.as_dict()
        name = row.span.name + (" (error)" if row.span.error else "")
        lines.append(
            (
                name,
                _cell(d["epoch"]),
                _cell(d["step"]),
                str(d["start"]),
                f"{d['duration_s']:.3f}",
                row.process,
                row.gpu or "-",
                _percent(row.util_mean),
                _percent(row.util_max),
                _mib(row.gpu_mem_peak_bytes),
                _mib(row.torch_peak_bytes),
                _percent(row.coverage),
                str(row.points),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = []
    for line in lines:
        cells = [
            cell.ljust(w) if i in (0, 3, 5, 6) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths))
        ]
        text.append("  ".join(cells).rstrip())
    return "\n".join(text) + "\n"


def format_json(rows: Sequence[Row]) -> str:
    return json.dumps([row.as_dict() for row in rows], indent=2) + "\n"


def format_csv(rows: Sequence[Row]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.as_dict().items()})
    return out.getvalue()


def _steps_line(points: List[PointRecord], seconds) -> Tuple[List[float], List[float]]:
    """Each point as a flat segment over its window; the line breaks where sampling stopped."""
    xs: List[float] = []
    ys: List[float] = []
    previous_end: Optional[int] = None
    previous_length = 0
    for point in sorted(points, key=lambda p: p.time_ns):
        begin = point.start_ns if point.windowed and point.start_ns is not None else point.time_ns
        # gpulse windows leave one sample interval between them; a longer gap is missing data.
        if previous_end is not None and begin - previous_end > max(previous_length, 1):
            xs.append(math.nan)
            ys.append(math.nan)
        xs += [seconds(begin), seconds(point.time_ns)]
        ys += [point.value, point.value]
        previous_end, previous_length = point.time_ns, point.time_ns - begin
    return xs, ys


def plot(telemetry: Telemetry, rows: Sequence[Row], path: str) -> None:
    """GPU utilisation over time for the processes in ``rows``, epoch and step spans shaded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise CorrelateError(
            f"--plot needs matplotlib ({error}); pip install matplotlib, or drop --plot"
        ) from error
    if not rows:
        raise CorrelateError("--plot: no span matched, nothing to draw")
    resources = {}
    for row in rows:
        resources.setdefault(_frozen(row.span.resource), row.span.resource)
    origin = min(row.span.start_ns for row in rows)
    end = max(row.span.end_ns for row in rows)

    def seconds(ns: int) -> float:
        return (ns - origin) / 1e9

    figure, axes = plt.subplots(figsize=(11, 4.5))
    related = [
        s
        for s in telemetry.spans
        if s.name in ("epoch", "step") and _frozen(s.resource) in resources
    ]
    steps = [s for s in related if s.name == "step"]
    if len(steps) <= 2000:
        for index, span in enumerate(sorted(steps, key=lambda s: s.start_ns)):
            axes.axvspan(
                seconds(span.start_ns),
                seconds(span.end_ns),
                color="tab:gray",
                alpha=0.08 if index % 2 else 0.16,
                lw=0,
            )
    epochs = sorted((s for s in related if s.name == "epoch"), key=lambda s: s.start_ns)
    for index, span in enumerate(epochs):
        axes.axvspan(
            seconds(span.start_ns),
            seconds(span.end_ns),
            color="tab:blue" if index % 2 else "tab:orange",
            alpha=0.12,
            lw=0,
        )
        label = span.attributes.get("training.epoch", index)
        axes.text(seconds(span.start_ns), 1.04, f"epoch {label}", fontsize=8, va="bottom")
    drawn = 0
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
    for resource in resources.values():
        series: Dict[Optional[str], Dict[str, List[PointRecord]]] = {}
        for point in telemetry.points:
            if point.metric in (UTILIZATION, UTILIZATION_MAX) and _is_general(point):
                if same_process(resource, point.resource):
                    gpu = point.attributes.get(GPU_ATTRIBUTE)
                    by_metric = series.setdefault(None if gpu is None else str(gpu), {})
                    by_metric.setdefault(point.metric, []).append(point)
        for gpu, by_metric in sorted(series.items(), key=lambda kv: kv[0] or ""):
            color = next(colors)
            for metric in (UTILIZATION, UTILIZATION_MAX):
                xs, ys = _steps_line(by_metric.get(metric, []), seconds)
                if not xs:
                    continue
                name = "mean" if metric == UTILIZATION else "max"
                axes.plot(
                    xs,
                    ys,
                    "-" if metric == UTILIZATION else ":",
                    color=color,
                    lw=1.6,
                    label=f"{process_label(resource)} {gpu or ''} {name}",
                )
                drawn += 1
    axes.set_xlim(min(0.0, axes.get_xlim()[0]) if drawn else 0.0, max(seconds(end), 1e-3))
    axes.set_ylim(0, 1.1)
    axes.set_xlabel("seconds since the first span")
    axes.set_ylabel("process.gpu.utilization")
    axes.set_title("GPU utilisation of the training process (epochs and steps shaded)")
    if drawn:
        axes.legend(loc="lower right", fontsize=8)
    else:
        axes.text(
            0.5,
            0.5,
            "no GPU utilisation points matched these spans",
            transform=axes.transAxes,
            ha="center",
        )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Optional[Sequence[str]] = None, stdout: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(
        description="Per span (epoch by default): GPU utilisation and memory of its process.",
        epilog="The join and weighting rules are in this script's docstring and docs/correlate.md.",
    )
    parser.add_argument(
        "paths", nargs="+", help="OTLP/JSON line files (metrics, spans or both); - for stdin"
    )
    parser.add_argument(
        "--span-name",
        action="append",
        default=None,
        help="span name to report (repeatable; default: epoch; 'all' for every span)",
    )
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")
    parser.add_argument(
        "--plot", metavar="PNG", help="also draw utilisation over time to this file"
    )
    args = parser.parse_args(argv)
    names = args.span_name or ["epoch"]
    span_names = None if "all" in names else names
    try:
        telemetry = load(args.paths)
        rows = correlate(telemetry, span_names)
        if args.plot:
            plot(telemetry, rows, args.plot)
    except CorrelateError as error:
        print(f"correlate: {error}", file=sys.stderr)
        return 2
    if not rows:
        print(
            f"correlate: no span named {', '.join(names)} in the input "
            f"({len(telemetry.spans)} spans, {len(telemetry.points)} metric points read)",
            file=sys.stderr,
        )
        return 1
    formatter = {"table": format_table, "json": format_json, "csv": format_csv}[args.format]
    stdout.write(formatter(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
