"""``otel_torch_train.status()``: this process's GPU state, from PyTorch and from a running gpulse.

What the familiar ``print_cuda_status()`` recipe prints (PyTorch and CUDA versions, each device's
name, ``allocated`` / ``reserved`` / ``max allocated`` from the caching allocator), followed by
what gpulse sees of *this* process: its GPU utilisation and memory per device as NVML reports
them, and the findings (with their advice) that are about this process, its job, or the devices
it uses. In a notebook the report renders as HTML (``_repr_html_``); elsewhere ``print(status())``
or the REPL shows text.

gpulse is asked through ``GET /status`` on its health address (``gpulse run --health-addr``),
which returns the ``gpulse snapshot --format json`` document from the running pipeline. Where:
the ``url`` argument, else ``GPULSE_STATUS_URL``, else ``GPULSE_HEALTH_ADDR`` (the variable gpulse
itself reads: ``PORT``, ``:PORT`` or ``HOST:PORT``), else ``http://127.0.0.1:8686/status``.

This process is found in gpulse's list the way gpulse names it: by ``container.id`` (or, in a pod
whose container id is hidden, ``k8s.pod.uid``) plus ``process.vpid`` = this process's PID when it
runs in a container, by host PID (``process.pid``) otherwise. The report says which was used.

``status()`` never raises because gpulse is missing or PyTorch is absent: the report says what
was not available and why (connection refused, no answer in time, 503 while gpulse has not
finished its first window, not a gpulse answer...).
"""

from __future__ import annotations

import html
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence

from . import cuda_memory
from .cuda_memory import CudaMemory
from .identity import detect_container

STATUS_URL_ENV = "GPULSE_STATUS_URL"
HEALTH_ADDR_ENV = "GPULSE_HEALTH_ADDR"
#: The port docs/deploy.md gives ``--health-addr``; gpulse opens no port unless told to.
DEFAULT_HEALTH_PORT = 8686
DEFAULT_STATUS_URL = f"http://127.0.0.1:{DEFAULT_HEALTH_PORT}/status"
DEFAULT_TIMEOUT_SECONDS = 2.0
# A /status document is tens of KiB on a busy node; anything far larger is not one.
_MAX_RESPONSE_BYTES = 16 << 20


@dataclass
class DeviceMemory:
    """One CUDA device as this process's caching allocator sees it."""

    ordinal: int
    name: Optional[str]
    uuid: Optional[str]
    allocated: int
    reserved: int
    max_allocated: int


@dataclass
class TorchFacts:
    """What ``print_cuda_status()`` prints: versions, availability, per-device allocator figures."""

    torch_version: Optional[str] = None
    cuda_version: Optional[str] = None
    cuda_available: Optional[bool] = None
    device_count: Optional[int] = None
    devices: List[DeviceMemory] = field(default_factory=list)
    #: Why there are no device figures, when there are none.
    note: Optional[str] = None


@dataclass
class GpuUse:
    """This process on one GPU, as gpulse's last window saw it (NVML's per-process figures)."""

    device_index: Optional[int]
    device_uuid: Optional[str]
    sm_utilization: Optional[float]
    memory_utilization: Optional[float]
    gpu_memory_bytes: Optional[int]


@dataclass
class FindingView:
    """One finding gpulse holds about this process, its job or one of its devices."""

    rule: str
    severity: str
    #: "this process on GPU 0", "this job (pids ...)", "GPU 0, all its processes".
    scope: str
    summary: str
    advice: str
    values: Dict[str, Any] = field(default_factory=dict)


@dataclass
class GpulseView:
    """What a reachable gpulse said about this process."""

    url: str
    #: Unix seconds of the data gpulse served, when it said.
    timestamp: Optional[float]
    #: How this process was found ("host PID 1234", "container 3f2a... + vpid 7"); None: not found.
    matched_by: Optional[str]
    host_pids: List[int] = field(default_factory=list)
    gpus: List[GpuUse] = field(default_factory=list)
    findings: List[FindingView] = field(default_factory=list)
    #: When this process is not in gpulse's list: why that may be.
    note: Optional[str] = None


@dataclass
class StatusReport:
    """The result of :func:`status`: print it, or let a notebook render it."""

    pid: int
    container_id: Optional[str]
    torch: TorchFacts
    url: str
    gpulse: Optional[GpulseView] = None
    #: Why gpulse could not be asked, when ``gpulse`` is None.
    gpulse_problem: Optional[str] = None

    def __str__(self) -> str:
        return render_text(self)

    def __repr__(self) -> str:
        return render_text(self)

    def _repr_html_(self) -> str:
        return render_html(self)


class _Unreachable(Exception):
    """gpulse could not be asked or did not answer usefully; the message says why and what to do."""


# -- where and who --------------------------------------------------------------------------------


def status_url(url: Optional[str] = None, environ: Optional[Dict[str, str]] = None) -> str:
    """The /status URL: the argument, ``GPULSE_STATUS_URL``, ``GPULSE_HEALTH_ADDR``, the default."""
    env = os.environ if environ is None else environ
    if url:
        return _with_status_path(url.strip())
    from_env = env.get(STATUS_URL_ENV, "").strip()
    if from_env:
        return _with_status_path(from_env)
    health = env.get(HEALTH_ADDR_ENV, "").strip()
    if health:
        return _url_from_health_addr(health)
    return DEFAULT_STATUS_URL


def _with_status_path(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme and parsed.netloc and parsed.path in ("", "/"):
        return urllib.parse.urlunsplit(parsed._replace(path="/status"))
    return url


def _url_from_health_addr(addr: str) -> str:
    """gpulse's ``--health-addr`` syntax (``PORT``, ``:PORT``, ``HOST:PORT``) as a loopback URL."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    # A wildcard bind is reachable on loopback; this process asks locally.
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/status"


# -- asking gpulse --------------------------------------------------------------------------------


def fetch_status(url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Dict[str, Any]:
    """The /status document at ``url``; :class:`_Unreachable` saying why when there is none."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise _Unreachable(
            f"{url!r} is not an http:// URL; set {STATUS_URL_ENV}=http://127.0.0.1:PORT/status "
            "with the port gpulse was given in --health-addr"
        )
    # Loopback traffic must not go through an http_proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    hint = (
        f"start gpulse with `gpulse run --health-addr {parsed.port or DEFAULT_HEALTH_PORT}` or "
        f"point {STATUS_URL_ENV} at the address it was given"
    )
    try:
        with opener.open(request, timeout=timeout) as response:
            body = response.read(_MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as error:
        detail = _body_excerpt(error)
        if error.code == 503:
            raise _Unreachable(
                f"gpulse at {url} is running but has no view yet (503: its first window has not "
                f"closed; it answers after one export interval){detail}"
            ) from None
        if error.code == 404:
            raise _Unreachable(
                f"{url} answered 404: this gpulse has no /status endpoint (older than the "
                f"notebook view?) or the path is wrong{detail}"
            ) from None
        raise _Unreachable(f"{url} answered HTTP {error.code} {error.reason}{detail}") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, ConnectionRefusedError):
            raise _Unreachable(
                f"no gpulse at {url}: connection refused (nothing listens on that port); {hint}"
            ) from None
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise _Unreachable(_timeout_message(url, timeout)) from None
        raise _Unreachable(f"could not reach gpulse at {url}: {reason}; {hint}") from None
    except (socket.timeout, TimeoutError):
        raise _Unreachable(_timeout_message(url, timeout)) from None
    except ConnectionError as error:
        raise _Unreachable(f"gpulse at {url} dropped the connection ({error}); {hint}") from None
    except OSError as error:
        raise _Unreachable(f"could not reach gpulse at {url}: {error}; {hint}") from None
    if len(body) > _MAX_RESPONSE_BYTES:
        raise _Unreachable(
            f"{url} answered with more than {_MAX_RESPONSE_BYTES >> 20} MiB: not a gpulse "
            "/status document; check the port"
        )
    try:
        document = json.loads(body)
    except ValueError as error:
        raise _Unreachable(
            f"{url} answered, but not with JSON ({error}): is that port gpulse's --health-addr?"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("processes"), list):
        raise _Unreachable(
            f"{url} answered JSON without a `processes` list: not a gpulse /status document; "
            "check the port"
        )
    return document


def _timeout_message(url: str, timeout: float) -> str:
    return (
        f"gpulse at {url} did not answer within {timeout:g} s (timeout): it may be overloaded "
        "or the address may be wrong; pass status(timeout=...) to wait longer"
    )


def _body_excerpt(error: urllib.error.HTTPError) -> str:
    try:
        text = error.read(400).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - the excerpt is a courtesy
        return ""
    return f": {text}" if text else ""


# -- reading the document -------------------------------------------------------------------------


def view_of_process(
    document: Dict[str, Any],
    url: str,
    pid: int,
    container_id: Optional[str],
    pod_uid: Optional[str] = None,
) -> GpulseView:
    """The part of a /status document about process ``pid`` (in ``container_id``, if any)."""
    entries = [p for p in document.get("processes", []) if isinstance(p, dict)]
    matched_by, mine = _match(entries, pid, container_id, pod_uid)
    timestamp = document.get("timestamp")
    view = GpulseView(
        url=url,
        timestamp=float(timestamp) if isinstance(timestamp, (int, float)) else None,
        matched_by=matched_by if mine else None,
    )
    if not mine:
        listed = len({p.get("pid") for p in entries})
        where = (
            f"container {container_id[:12]} with vpid {pid}"
            if container_id
            else f"pod {pod_uid} with vpid {pid}"
            if pod_uid
            else f"host PID {pid}"
        )
        view.note = (
            f"gpulse lists {listed} GPU process(es), none of them {where}: this process has no "
            "CUDA context yet (nothing allocated on a GPU), or gpulse runs where it cannot see "
            "this process (another node, or without the host PID namespace)"
        )
        return view
    view.host_pids = sorted({int(p["pid"]) for p in mine if isinstance(p.get("pid"), int)})
    view.gpus = [
        GpuUse(
            device_index=p.get("device_index"),
            device_uuid=p.get("device_uuid"),
            sm_utilization=p.get("sm_utilization"),
            memory_utilization=p.get("memory_utilization"),
            gpu_memory_bytes=p.get("gpu_memory_bytes"),
        )
        for p in mine
    ]
    devices = {g.device_uuid for g in view.gpus if g.device_uuid}
    view.findings = _findings_about(document.get("findings") or [], set(view.host_pids), devices)
    return view


def _match(
    entries: Sequence[Dict[str, Any]],
    pid: int,
    container_id: Optional[str],
    pod_uid: Optional[str],
):
    def workload(entry: Dict[str, Any]) -> Dict[str, Any]:
        value = entry.get("workload")
        return value if isinstance(value, dict) else {}

    if container_id:
        mine = [
            e
            for e in entries
            if workload(e).get("container_id") == container_id and workload(e).get("vpid") == pid
        ]
        return f"container {container_id[:12]} + vpid {pid}", mine
    if pod_uid:
        mine = [
            e
            for e in entries
            if workload(e).get("pod_uid") == pod_uid and workload(e).get("vpid") == pid
        ]
        return f"pod {pod_uid} + vpid {pid}", mine
    # On the host this process's PID is the host PID; a vpid that differs would mean the entry
    # is a namespaced process that merely shares the number.
    mine = [
        e for e in entries if e.get("pid") == pid and workload(e).get("vpid") in (None, pid)
    ]
    return f"host PID {pid}", mine


def _findings_about(
    findings: Sequence[Any], host_pids: set, device_uuids: set
) -> List[FindingView]:
    found = []
    for finding in findings:
        if not isinstance(finding, dict):
            continue
        subject = finding.get("subject") if isinstance(finding.get("subject"), dict) else {}
        kind = subject.get("kind")
        scope = None
        if kind == "workload" and subject.get("pid") in host_pids:
            device = subject.get("device") if isinstance(subject.get("device"), dict) else None
            scope = "this process" + (f" on GPU {device.get('index')}" if device else "")
        elif kind == "job" and host_pids & set(subject.get("pids") or []):
            pids = ", ".join(str(p) for p in subject.get("pids") or [])
            scope = f"this job (pids {pids})"
        elif kind == "device" and subject.get("uuid") in device_uuids:
            scope = f"GPU {subject.get('index')}, all its processes"
        if scope is None:
            continue
        found.append(
            FindingView(
                rule=str(finding.get("rule", "?")),
                severity=str(finding.get("severity", "?")),
                scope=scope,
                summary=str(finding.get("summary", "")),
                advice=str(finding.get("advice", "")),
                values=_values(finding.get("values")),
            )
        )
    return found


def _values(raw: Any) -> Dict[str, Any]:
    # gpulse writes values as [name, value] pairs, in the order the rule gave them.
    if isinstance(raw, dict):
        return dict(raw)
    values = {}
    for item in raw or []:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            values[str(item[0])] = item[1]
    return values


# -- this process's PyTorch side ------------------------------------------------------------------


def torch_facts(backend: Optional[CudaMemory] = None) -> TorchFacts:
    """Versions and allocator figures; never initializes CUDA (that would cost a context)."""
    facts = TorchFacts()
    torch = sys.modules.get("torch")
    if torch is None and backend is None:
        try:
            import torch  # noqa: F811 - a notebook may call status() before importing torch
        except ImportError:
            facts.note = "PyTorch is not installed in this Python"
            return facts
    if torch is not None:
        facts.torch_version = str(getattr(torch, "__version__", "")) or None
        facts.cuda_version = getattr(getattr(torch, "version", None), "cuda", None)
        try:
            facts.cuda_available = bool(torch.cuda.is_available())
            facts.device_count = int(torch.cuda.device_count()) if facts.cuda_available else 0
        except Exception as error:  # noqa: BLE001 - a broken driver must not break status()
            facts.note = f"torch.cuda failed: {type(error).__name__}: {error}"
    if backend is None:
        backend = cuda_memory.TorchCuda(torch) if torch is not None else cuda_memory.NoCuda()
    try:
        for device in backend.devices():
            facts.devices.append(
                DeviceMemory(
                    ordinal=device,
                    name=backend.name(device),
                    uuid=backend.uuid(device),
                    allocated=backend.allocated(device),
                    reserved=backend.reserved(device),
                    max_allocated=backend.max_allocated(device),
                )
            )
    except Exception as error:  # noqa: BLE001
        facts.note = f"reading torch.cuda memory statistics failed: {type(error).__name__}: {error}"
        return facts
    if not facts.devices and facts.note is None:
        if facts.cuda_available is False:
            facts.note = (
                "CUDA is not available to PyTorch (torch.cuda.is_available() is False): a "
                "CPU-only build, no driver, or no GPU visible (CUDA_VISIBLE_DEVICES)"
            )
        else:
            facts.note = (
                "no CUDA context in this process yet: nothing has been allocated on a GPU, so "
                "the allocator has no figures"
            )
    return facts


# -- the entry point ------------------------------------------------------------------------------


def status(
    url: Optional[str] = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    cuda: Optional[CudaMemory] = None,
    pid: Optional[int] = None,
    container_id: Optional[str] = None,
) -> StatusReport:
    """This process's GPU state from PyTorch and, when one answers, from gpulse.

    :param url: gpulse's ``/status`` (or just ``http://host:port``); see the module docs for
        the default.
    :param timeout: seconds to wait for gpulse.
    :param cuda: the allocator backend (``torch.cuda`` by default); tests pass a double.
    :param pid: / :param container_id: who this process is, when detection from ``/proc`` is
        wrong (the PID as this process sees it, and its container id).
    """
    own_pid = os.getpid() if pid is None else pid
    pod_uid = None
    if container_id is None and pid is None:
        identity = detect_container()
        container_id, pod_uid = identity.container_id, identity.pod_uid
    where = status_url(url)
    report = StatusReport(
        pid=own_pid, container_id=container_id, torch=torch_facts(cuda), url=where
    )
    try:
        document = fetch_status(where, timeout)
    except _Unreachable as problem:
        report.gpulse_problem = str(problem)
        return report
    report.gpulse = view_of_process(document, where, own_pid, container_id, pod_uid)
    return report


# -- rendering ------------------------------------------------------------------------------------


def human_bytes(value: Optional[float]) -> str:
    """Bytes in binary units, as gpulse writes them in summaries."""
    if value is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _percent(ratio: Optional[float]) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


def _when(timestamp: Optional[float]) -> str:
    if timestamp is None:
        return ""
    moment = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return f" as of {moment:%H:%M:%S} UTC"


def _identity(report: StatusReport) -> str:
    if report.container_id:
        return f"pid {report.pid} in container {report.container_id[:12]}"
    return f"pid {report.pid}"


def _versions(facts: TorchFacts) -> str:
    if facts.torch_version is None:
        return "PyTorch: not imported"
    cuda = facts.cuda_version or "none (CPU build)"
    line = f"PyTorch {facts.torch_version}, CUDA {cuda}"
    if facts.cuda_available:
        line += f", {facts.device_count} device(s) visible"
    return line


def _gpu_line(gpu: GpuUse) -> str:
    return (
        f"GPU {gpu.device_index} ({gpu.device_uuid}): SM {_percent(gpu.sm_utilization)}, "
        f"memory bandwidth {_percent(gpu.memory_utilization)}, "
        f"{human_bytes(gpu.gpu_memory_bytes)} held"
    )


def render_text(report: StatusReport) -> str:
    lines = [f"GPU status of this process ({_identity(report)})", "", _versions(report.torch)]
    for device in report.torch.devices:
        lines.append(
            f"  cuda:{device.ordinal}  {device.name or 'unknown device'}"
            + (f"  {device.uuid}" if device.uuid else "")
        )
        lines.append(
            f"    allocated {human_bytes(device.allocated)}, "
            f"reserved {human_bytes(device.reserved)}, "
            f"max allocated {human_bytes(device.max_allocated)}"
        )
    if report.torch.note:
        lines.append(f"  {report.torch.note}")
    lines.append("")
    view = report.gpulse
    if view is None:
        lines.append(f"gpulse: not reachable. {report.gpulse_problem}")
        return "\n".join(lines)
    lines.append(f"gpulse ({view.url}){_when(view.timestamp)}:")
    if view.matched_by is None:
        lines.append(f"  {view.note}")
        return "\n".join(lines)
    lines.append(f"  this process is {view.matched_by}")
    for gpu in view.gpus:
        lines.append(f"  {_gpu_line(gpu)}")
    if not view.findings:
        lines.append("  no findings about this process, its job or its GPUs")
    for finding in view.findings:
        lines.append(f"  [{finding.severity}] {finding.rule} ({finding.scope}): {finding.summary}")
        if finding.advice:
            lines.append(f"      advice: {finding.advice}")
    return "\n".join(lines)


_SEVERITY_COLOURS = {
    "info": "#2b6cb0",
    "warning": "#b7791f",
    "error": "#c53030",
    "critical": "#9b2c2c",
}


def render_html(report: StatusReport) -> str:
    e = html.escape
    parts = [
        '<div class="otel-torch-train-status">',
        f"<h4>GPU status of this process ({e(_identity(report))})</h4>",
        f"<p>{e(_versions(report.torch))}</p>",
    ]
    if report.torch.devices:
        parts.append(
            "<table><thead><tr><th>device</th><th>name</th><th>hw.id</th><th>allocated</th>"
            "<th>reserved</th><th>max allocated</th></tr></thead><tbody>"
        )
        for device in report.torch.devices:
            parts.append(
                f"<tr><td>cuda:{device.ordinal}</td><td>{e(device.name or 'unknown')}</td>"
                f"<td>{e(device.uuid or '')}</td><td>{e(human_bytes(device.allocated))}</td>"
                f"<td>{e(human_bytes(device.reserved))}</td>"
                f"<td>{e(human_bytes(device.max_allocated))}</td></tr>"
            )
        parts.append("</tbody></table>")
    if report.torch.note:
        parts.append(f"<p><em>{e(report.torch.note)}</em></p>")
    view = report.gpulse
    if view is None:
        parts.append(
            f'<p class="gpulse-unreachable"><strong>gpulse: not reachable.</strong> '
            f"{e(report.gpulse_problem or '')}</p></div>"
        )
        return "".join(parts)
    parts.append(f"<h4>gpulse ({e(view.url)}){e(_when(view.timestamp))}</h4>")
    if view.matched_by is None:
        parts.append(f"<p><em>{e(view.note or '')}</em></p></div>")
        return "".join(parts)
    parts.append(f"<p>This process is {e(view.matched_by)}.</p>")
    parts.append(
        "<table><thead><tr><th>GPU</th><th>hw.id</th><th>SM</th><th>memory bandwidth</th>"
        "<th>GPU memory held</th></tr></thead><tbody>"
    )
    for gpu in view.gpus:
        parts.append(
            f"<tr><td>{e(str(gpu.device_index))}</td><td>{e(str(gpu.device_uuid))}</td>"
            f"<td>{e(_percent(gpu.sm_utilization))}</td>"
            f"<td>{e(_percent(gpu.memory_utilization))}</td>"
            f"<td>{e(human_bytes(gpu.gpu_memory_bytes))}</td></tr>"
        )
    parts.append("</tbody></table>")
    if not view.findings:
        parts.append("<p>No findings about this process, its job or its GPUs.</p>")
    else:
        parts.append("<ul>")
        for finding in view.findings:
            colour = _SEVERITY_COLOURS.get(finding.severity, "inherit")
            parts.append(
                f'<li><strong style="color:{colour}">{e(finding.severity)}</strong> '
                f"<code>{e(finding.rule)}</code> ({e(finding.scope)}): {e(finding.summary)}"
                + (f"<br><em>advice:</em> {e(finding.advice)}" if finding.advice else "")
                + "</li>"
            )
        parts.append("</ul>")
    parts.append("</div>")
    return "".join(parts)
