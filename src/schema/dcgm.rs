//! dcgm-exporter's series (`DCGM_FI_*`): the conversion of a field to dcgm-exporter's unit
//! ([`DcgmScale`]), its Prometheus type as dcgm-exporter's counters CSV types it
//! ([`DcgmType`]: its `counter` rows are counters here too), which reading of the window it
//! shows ([`DcgmReading`]), and the series that come from a family of values rather than from
//! one field row ([`DCGM_FAMILY_SERIES`]: XIDs, the row remapper, NVLink). A device field's or
//! GPM field's series is part of its row (`DEVICE_FIELDS`, `GPM_FIELDS`); [`dcgm_series`] walks
//! all of them, which is what `--dcgm-counters` checks a counters file against and what the
//! docs' table lists.

/// How dcgm-exporter scales a field it also exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcgmScale {
    /// A 0–1 ratio as a whole percent.
    Percent,
    /// Bytes as whole MiB.
    Mebibytes,
    /// Rounded to a whole number.
    Whole,
    /// As it is.
    Float,
    /// Joules as whole millijoules.
    Millijoules,
}

/// A value in dcgm-exporter's unit: a whole number (exposed as an integer) or as it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DcgmValue {
    Int(i64),
    Float(f64),
}

impl DcgmScale {
    /// `value`, in its field's unit (ratio, bytes, °C, W, MHz, J), in dcgm-exporter's.
    pub(crate) fn convert(self, value: f64) -> DcgmValue {
        const MIB: u64 = 1 << 20;
        match self {
            DcgmScale::Percent => DcgmValue::Int((value * 100.0).round() as i64),
            DcgmScale::Mebibytes => DcgmValue::Int((value.max(0.0) as u64 / MIB) as i64),
            DcgmScale::Whole => DcgmValue::Int(value.round() as i64),
            DcgmScale::Float => DcgmValue::Float(value),
            DcgmScale::Millijoules => DcgmValue::Int((value * 1000.0).round() as i64),
        }
    }

    /// dcgm-exporter's unit of a series in this scale, for a field whose metric is in the UCUM
    /// `unit`, as the docs write it.
    pub(crate) fn unit(self, unit: &str) -> String {
        match (self, unit) {
            (DcgmScale::Percent, _) => "%".into(),
            (DcgmScale::Mebibytes, _) => "MiB".into(),
            (DcgmScale::Millijoules, _) => "mJ".into(),
            (_, "Cel") => "°C".into(),
            (_, "1") => "0–1".into(),
            (_, "By/s") => "B/s".into(),
            (_, "{error}") => "errors".into(),
            (_, other) => other.trim_start_matches('{').trim_end_matches('}').into(),
        }
    }

    /// The name docs and the exported schema use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DcgmScale::Percent => "percent",
            DcgmScale::Mebibytes => "mebibytes",
            DcgmScale::Whole => "whole",
            DcgmScale::Float => "float",
            DcgmScale::Millijoules => "millijoules",
        }
    }
}

/// A series' Prometheus type, as dcgm-exporter's counters CSV (`etc/default-counters.csv`)
/// types it: `# TYPE … counter` for its `counter` rows, with the sample named as the family
/// (dcgm-exporter writes no `_total`), so `rate()` and the metadata API see what they saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcgmType {
    Gauge,
    Counter,
}

impl DcgmType {
    /// The word of the CSV's second column and of the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            DcgmType::Gauge => "gauge",
            DcgmType::Counter => "counter",
        }
    }
}

/// Which reading of a field's window a series shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcgmReading {
    /// The window's last sample, as dcgm-exporter shows DCGM's latest value.
    Last,
    /// The window's mean: the profiling (`DCGM_FI_PROF_*`) rates and ratios, which DCGM itself
    /// averages over its sampling period.
    Mean,
    /// The total since gpulse first saw the GPU (a counter gpulse keeps, immune to driver
    /// reloads).
    Total,
}

impl DcgmReading {
    /// How the docs say it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DcgmReading::Last => "last sample",
            DcgmReading::Mean => "mean over the window",
            DcgmReading::Total => "total since gpulse first saw the GPU",
        }
    }
}

/// The dcgm-exporter series a field feeds (`DCGM_FI_*`): its name, help text, the conversion
/// to dcgm-exporter's unit ([`DcgmScale::convert`]) and its type. No series has labels of its
/// own: all carry the per-device (or per-MIG-instance) label set of every DCGM series, declared
/// once in `export::prometheus::dcgm` (`DEVICE_LABELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcgmSeries {
    pub name: &'static str,
    pub help: &'static str,
    pub scale: DcgmScale,
    pub kind: DcgmType,
}

/// A row's gauge series.
pub(super) const fn gauge(
    name: &'static str,
    help: &'static str,
    scale: DcgmScale,
) -> Option<DcgmSeries> {
    Some(DcgmSeries::new(name, help, scale, DcgmType::Gauge))
}

/// A row's counter series.
pub(super) const fn counter(
    name: &'static str,
    help: &'static str,
    scale: DcgmScale,
) -> Option<DcgmSeries> {
    Some(DcgmSeries::new(name, help, scale, DcgmType::Counter))
}

impl DcgmSeries {
    const fn new(name: &'static str, help: &'static str, scale: DcgmScale, kind: DcgmType) -> Self {
        Self {
            name,
            help,
            scale,
            kind,
        }
    }
}

/// The label dcgm-exporter's counters CSV selects with its `label` row of that name: the
/// driver version on every series.
pub const DRIVER_VERSION_LABEL: &str = "DCGM_FI_DRIVER_VERSION";

/// A series built from a family of values rather than one field row. The exporter matches on
/// it (exhaustively) to compute the value; the docs say where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcgmFamily {
    /// The last XID code since gpulse started.
    XidErrors,
    /// `nvmlDeviceGetRemappedRows`: rows remapped for uncorrectable errors.
    UncorrectableRemappedRows,
    /// The same, for correctable errors.
    CorrectableRemappedRows,
    /// The same call's `isFailureOccurred`, 0 or 1.
    RowRemapFailure,
    /// NVLink data bytes sent and received, over all links.
    NvLinkBandwidthTotal,
    /// NVLink data bytes sent per second, over all links, mean over the window.
    NvLinkTxBytes,
    /// The same, received.
    NvLinkRxBytes,
}

impl DcgmFamily {
    /// Where its value comes from, for the docs.
    pub fn source(self) -> &'static str {
        match self {
            DcgmFamily::XidErrors => "the last XID event since gpulse started, 0 if none",
            DcgmFamily::UncorrectableRemappedRows => {
                "`nvmlDeviceGetRemappedRows` `uncorrRows`, last sample"
            }
            DcgmFamily::CorrectableRemappedRows => {
                "`nvmlDeviceGetRemappedRows` `corrRows`, last sample"
            }
            DcgmFamily::RowRemapFailure => {
                "`nvmlDeviceGetRemappedRows` `isFailureOccurred`, last sample"
            }
            DcgmFamily::NvLinkBandwidthTotal => {
                "`nvidia.gpu.nvlink.io`, both directions of every link summed: the driver's \
                 `NVLINK_THROUGHPUT_DATA_TX/RX` counters, last sample"
            }
            DcgmFamily::NvLinkTxBytes => {
                "`nvidia.gpu.nvlink.io{network.io.direction=transmit}` per second, every link \
                 summed, mean over the window"
            }
            DcgmFamily::NvLinkRxBytes => {
                "`nvidia.gpu.nvlink.io{network.io.direction=receive}` per second, every link \
                 summed, mean over the window"
            }
        }
    }

    /// Its unit, as the docs write it.
    pub fn unit(self) -> &'static str {
        match self {
            DcgmFamily::XidErrors => "XID code",
            DcgmFamily::UncorrectableRemappedRows | DcgmFamily::CorrectableRemappedRows => "rows",
            DcgmFamily::RowRemapFailure => "0 or 1",
            DcgmFamily::NvLinkBandwidthTotal => "B",
            DcgmFamily::NvLinkTxBytes | DcgmFamily::NvLinkRxBytes => "B/s",
        }
    }
}

const fn family(
    family: DcgmFamily,
    name: &'static str,
    help: &'static str,
    kind: DcgmType,
) -> (DcgmFamily, DcgmSeries) {
    (family, DcgmSeries::new(name, help, DcgmScale::Whole, kind))
}

/// The series of families, with dcgm-exporter's names and types (`etc/default-counters.csv`:
/// the remapped rows are `counter`s, the remap failure a `gauge`, the NVLink total a `counter`;
/// the profiling NVLink rates are gauges as its DCP rows are).
pub static DCGM_FAMILY_SERIES: [(DcgmFamily, DcgmSeries); 7] = [
    family(
        DcgmFamily::XidErrors,
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered (0: none since gpulse started).",
        DcgmType::Gauge,
    ),
    family(
        DcgmFamily::UncorrectableRemappedRows,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Rows of device memory remapped because of uncorrectable errors.",
        DcgmType::Counter,
    ),
    family(
        DcgmFamily::CorrectableRemappedRows,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Rows of device memory remapped because of correctable errors.",
        DcgmType::Counter,
    ),
    family(
        DcgmFamily::RowRemapFailure,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "1 when a row remapping has failed (the memory can no longer be repaired), else 0.",
        DcgmType::Gauge,
    ),
    family(
        DcgmFamily::NvLinkBandwidthTotal,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "NVLink data bytes sent and received over all links (the driver's counters).",
        DcgmType::Counter,
    ),
    family(
        DcgmFamily::NvLinkTxBytes,
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "NVLink data sent per second over all links (in B/s).",
        DcgmType::Gauge,
    ),
    family(
        DcgmFamily::NvLinkRxBytes,
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "NVLink data received per second over all links (in B/s).",
        DcgmType::Gauge,
    ),
];

/// A family's series.
pub fn family_series(family: DcgmFamily) -> &'static DcgmSeries {
    DCGM_FAMILY_SERIES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{family:?} has no row in DCGM_FAMILY_SERIES"))
}

/// Every series gpulse can serve under dcgm-exporter's names: the device fields' (in table
/// order), the families', then the GPM fields'.
pub fn dcgm_series() -> impl Iterator<Item = &'static DcgmSeries> {
    super::DEVICE_FIELDS
        .iter()
        .filter_map(|s| s.dcgm.as_ref())
        .chain(DCGM_FAMILY_SERIES.iter().map(|(_, s)| s))
        .chain(super::GPM_FIELDS.iter().filter_map(|s| s.dcgm.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dcgm_scales_convert_to_dcgm_exporters_units() {
        use DcgmValue::{Float, Int};
        assert_eq!(DcgmScale::Percent.convert(0.425), Int(43));
        assert_eq!(DcgmScale::Mebibytes.convert(3.5 * 1048576.0), Int(3));
        assert_eq!(DcgmScale::Mebibytes.convert(-1.0), Int(0));
        assert_eq!(DcgmScale::Whole.convert(64.6), Int(65));
        assert_eq!(DcgmScale::Float.convert(412.5), Float(412.5));
        assert_eq!(DcgmScale::Millijoules.convert(1.2345), Int(1235));
        assert_eq!(DcgmScale::Whole.unit("Cel"), "°C");
        assert_eq!(DcgmScale::Whole.unit("{lane}"), "lane");
        assert_eq!(DcgmScale::Float.unit("1"), "0–1");
        assert_eq!(DcgmScale::Whole.unit("By/s"), "B/s");
    }

    /// A name is served once: a counters file's row selects exactly one series.
    #[test]
    fn every_series_name_is_unique_and_dcgm_exporters() {
        let mut names: Vec<&str> = dcgm_series().map(|s| s.name).collect();
        assert!(names.iter().all(|n| n.starts_with("DCGM_FI_")), "{names:?}");
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a DCGM_FI_* name is declared twice");
        for (family, series) in &DCGM_FAMILY_SERIES {
            assert_eq!(family_series(*family), series);
        }
    }
}
