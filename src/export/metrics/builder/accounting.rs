//! The accounting families: GPU time and energy charged to each process on each device
//! (`process.gpu.time`, `process.gpu.energy`) and, on the node resource, each GPU's energy split
//! into what its processes were charged and the unattributed rest (`gpulse.gpu.energy`). The
//! figures are the accountant's (`crate::attribution::accounting`) and, by cause, the ledger's
//! (`crate::attribution::ledger`); this module only turns them into cumulative sums, each
//! starting when its account started.

use opentelemetry_proto::tonic::common::v1::KeyValue;

use super::{with, MetricsBuilder, Span, Value};
use crate::attribution::ledger::ProcessLedger;
use crate::attribution::{Cause, DeviceAccount, ProcessAccount};
use crate::export::metrics::encoding::{AttributeSetId, ExtraValue, MetricsBatch, PointAttributes};
use crate::export::resource::{kv_int, kv_str};
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
/// for `process.cpu.time` by `cpu.mode`. Where the ledger charged the window (`ledger`), each
/// state is further split by `gpulse.gpu.cause`, and the energy too, so that summing over the
/// cause gives the series by state and the energy as before; a `straggler_wait` point names the
/// rank waited for (`gpulse.straggler.rank`). Energy has no point while it was never knowable.
pub(super) fn push_process_accounting(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    base: AttributeSetId,
    account: &ProcessAccount,
    ledger: Option<&ProcessLedger>,
    end: u64,
) {
    let span = Span {
        start: to_nanos(account.since),
        end,
    };
    if let Some(ledger) = ledger {
        push_by_cause(b, batch, base, account, ledger, span);
        return;
    }
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

/// The ledger's shape of [`push_process_accounting`]: a point per (state, cause, straggler rank)
/// that ever had time, and per (cause, straggler rank) that ever had energy (`compute` always,
/// so a process whose energy is known has a point even at zero).
fn push_by_cause(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    base: AttributeSetId,
    account: &ProcessAccount,
    ledger: &ProcessLedger,
    span: Span,
) {
    let rank_set = |batch: &mut MetricsBatch, rank: Option<u32>, more: Option<KeyValue>| {
        let extra = rank.map(|r| kv_int(A::GpulseStragglerRank.key(), i64::from(r)));
        match (extra, more) {
            (None, None) => base,
            (a, b) => batch.extend_attribute_set(base, a.into_iter().chain(b)),
        }
    };
    if account.energy_joules.is_some() {
        for share in &ledger.total {
            let Some(joules) = share.joules else {
                continue;
            };
            if joules <= 0.0 && share.cause != Cause::Compute {
                continue;
            }
            let set = rank_set(batch, share.straggler_rank, None);
            let attrs = PointAttributes::with(
                Some(set),
                A::GpulseGpuCause.key(),
                ExtraValue::Static(share.cause.as_str()),
            );
            b.push(M::ProcessGpuEnergy, attrs, span, Value::F64(joules));
        }
    }
    for (state, cause, rank, seconds) in &ledger.time_by_state {
        let state_kv = kv_str(A::GpulseGpuTimeState.key(), state.as_str());
        let set = rank_set(batch, *rank, Some(state_kv));
        let attrs = PointAttributes::with(
            Some(set),
            A::GpulseGpuCause.key(),
            ExtraValue::Static(cause.as_str()),
        );
        b.push(M::ProcessGpuTime, attrs, span, Value::F64(*seconds));
    }
}
