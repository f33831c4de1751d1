"""OpenTelemetry -> Prometheus name translation, as the Collector's prometheus and
prometheusremotewrite exporters do it with their default strategy (UnderscoreEscapingWithSuffixes,
i.e. add_metric_suffixes left at true), written from the rules in the OpenTelemetry specification
("Prometheus and OpenMetrics Compatibility", OTLP metric points to Prometheus) and the
prometheus/otlptranslator unit tables.

The dashboard test maps every metric in docs/metrics.md through metric_name() and requires each
name a panel queries to be one of the results, so a renamed metric or a changed unit breaks the
build instead of leaving an empty panel.
"""

import re

GAUGE = "gauge"
COUNTER = "counter"  # monotonic sum: `_total`
UPDOWN = "updowncounter"  # non-monotonic sum: a Prometheus gauge, but never `_ratio`
HISTOGRAM = "histogram"

# UCUM unit -> the word Prometheus appends. A unit not in the table is appended as written
# (after escaping), which is why `MHz` stays `MHz`.
UNIT_WORDS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}

_INVALID = re.compile(r"[^a-zA-Z0-9:]")


def _clean_unit(word: str) -> str:
    return re.sub(r"_+", "_", _INVALID.sub("_", word)).lstrip("_")


def _unit_suffixes(unit: str) -> tuple[str, str]:
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_word = "" if not main or "{" in main or "}" in main else UNIT_WORDS.get(main, main)
    per_word = ""
    if per and "{" not in per and "}" not in per:
        per_word = "per_" + PER_UNIT_WORDS.get(per, per)
    return _clean_unit(main_word), _clean_unit(per_word)


def metric_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus series name for an OTLP metric `name` with `unit` and instrument `kind`."""
    tokens = [t for t in _INVALID.split(name) if t]
    main, per = _unit_suffixes(unit)
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.rstrip("_")
        if per in tokens:
            per = ""
    if per:
        main = main.rstrip("_")
    if main:
        tokens.append(main)
    if per:
        tokens.append(per)
    if kind == COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    # Only gauges: the translator does not trust unit "1" on sums (receivers misuse it for counts).
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    if out and out[0].isdigit():
        out = "_" + out
    return out


def series_names(name: str, unit: str, kind: str) -> set[str]:
    """Every series name a metric produces (a histogram has three)."""
    base = metric_name(name, unit, kind)
    if kind == HISTOGRAM:
        return {base + "_bucket", base + "_sum", base + "_count"}
    return {base}


def label_name(attribute: str) -> str:
    """The Prometheus label an OTLP attribute (data point, or resource with
    resource_to_telemetry_conversion) becomes."""
    out = re.sub(r"[^a-zA-Z0-9_]", "_", attribute)
    if out and out[0].isdigit():
        out = "key_" + out
    return out
