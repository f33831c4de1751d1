//! The accounting families: GPU time and energy charged to each process on each device
//! (`process.gpu.time`, `process.gpu.energy`) and, on the node resource, each GPU's energy split
//! into what its processes were charged and the unattributed rest (`gpulse.gpu.energy`). The
//! figures are the accountant's (`crate::attribution::accounting`); this module only turns them
//! into cumulative sums, each starting when its account started.

use super::{with, MetricsBuilder, Span, Value};
use crate::attribution::{DeviceAccount, ProcessAccount};
use crate::export::metrics::encoding::{AttributeSetId, PointAttributes};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::schema::MetricId;

use crate::schema::attributes::AttributeId as A;
use MetricId as M;

/// `gpulse.gpu.energy` on a GPU: `attributed` + `unattributed` = the GPU's energy since its
/// account started. One metric with an attribute rather than two, so that summing over the
/// attribute gives the whole, as OpenTelemetry's conventions ask of an attribute.
pub(super) fn push_device_energy(
    b: &mut MetricsBuilder,
    base: AttributeSetId,
    account: &DeviceAccount,
    end: u64,
) {
    let span = Span {
        start: to_nanos(account.since),
        end,
    };
    for (state, joules) in [
        ("attributed", account.attributed_joules),
        ("unattributed", account.unattributed_joules),
    ] {
        let attrs = with(base, A::GpulseEnergyAttribution.key(), state);
        b.push(M::GpuEnergyAttribution, attrs, span, Value::F64(joules));
    }
}

/// `process.gpu.energy` and `process.gpu.time` of one process on one device. Held time is split
/// into `active`, `idle` and `unknown` (which add up to it) rather than reported as `held` and
/// `active`: a sum over `gpulse.gpu.time.state` then means something (the held time), as it does
/// for `process.cpu.time` by `cpu.mode`. Energy has no point while it was never knowable.
pub(super) fn push_process_accounting(
    b: &mut MetricsBuilder,
    base: AttributeSetId,
    account: &ProcessAccount,
    end: u64,
) {
    let span = Span {
        start: to_nanos(account.since),
        end,
    };
    if let Some(joules) = account.energy_joules {
        b.push(
            M::ProcessGpuEnergy,
            PointAttributes::of(base),
            span,
            Value::F64(joules),
        );
    }
    for (state, seconds) in [
        ("active", account.active_seconds),
        ("idle", account.idle_seconds),
        // Zero unknown time is the common case (activity known all along): no series for it.
        (
            "unknown",
            Some(account.unknown_seconds).filter(|s| *s > 0.0),
        ),
    ] {
        if let Some(seconds) = seconds {
            let attrs = with(base, A::GpulseGpuTimeState.key(), state);
            b.push(M::ProcessGpuTime, attrs, span, Value::F64(seconds));
        }
    }
}
