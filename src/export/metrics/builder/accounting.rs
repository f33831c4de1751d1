//! The accounting families: GPU time and energy charged to each process on each device
//! (`process.gpu.time`, `process.gpu.energy`) and, on the node resource, each GPU's energy split
//! into what its processes were charged and the unattributed rest (`gpulse.gpu.energy`). The
//! figures are the accountant's (`crate::attribution::accounting`) and, by cause, the ledger's
//! (`crate::attribution::ledger`); this module only turns them into cumulative sums, each
//! starting when its account started.

use super::{with, MetricsBuilder, Span, Value};
use crate::attribution::ledger::{ProcessLedger, TimeState};
use crate::attribution::{Cause, DeviceAccount, ProcessAccount};
use crate::export::metrics::encoding::{AttributeSetId, ExtraValue, MetricsBatch, PointAttributes};
use crate::export::resource::{kv_int, kv_str};
use crate::fast_map::FastMap;
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
    cause_sets: &mut CauseSets,
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
        push_by_cause(b, batch, cause_sets, base, account, ledger, span);
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

/// The attribute sets of the ledger's points: a process's device set extended by the state
/// and the straggler rank, registered once per batch and shared by the points of every process
/// on that device (64 processes on a GPU: a handful of sets, not hundreds).
#[derive(Default)]
pub(super) struct CauseSets {
    extended: FastMap<(AttributeSetId, Option<TimeState>, Option<u32>), AttributeSetId>,
}

impl CauseSets {
    fn of(
        &mut self,
        batch: &mut MetricsBatch,
        base: AttributeSetId,
        state: Option<TimeState>,
        rank: Option<u32>,
    ) -> AttributeSetId {
        if state.is_none() && rank.is_none() {
            return base;
        }
        *self.extended.entry((base, state, rank)).or_insert_with(|| {
            let state = state.map(|s| kv_str(A::GpulseGpuTimeState.key(), s.as_str()));
            let rank = rank.map(|r| kv_int(A::GpulseStragglerRank.key(), i64::from(r)));
            batch.extend_attribute_set(base, state.into_iter().chain(rank))
        })
    }
}

/// The ledger's shape of [`push_process_accounting`]: a point per (state, cause, straggler rank)
/// that ever had time, and per (cause, straggler rank) that ever had energy (`compute` always,
/// so a process whose energy is known has a point even at zero).
fn push_by_cause(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    sets: &mut CauseSets,
    base: AttributeSetId,
    account: &ProcessAccount,
    ledger: &ProcessLedger,
    span: Span,
) {
    if account.energy_joules.is_some() {
        for share in &ledger.total {
            let Some(joules) = share.joules else {
                continue;
            };
            if joules <= 0.0 && share.cause != Cause::Compute {
                continue;
            }
            let set = sets.of(batch, base, None, share.straggler_rank);
            let attrs = PointAttributes::with(
                Some(set),
                A::GpulseGpuCause.key(),
                ExtraValue::Static(share.cause.as_str()),
            );
            b.push(M::ProcessGpuEnergy, attrs, span, Value::F64(joules));
        }
    }
    for (state, cause, rank, seconds) in &ledger.time_by_state {
        let set = sets.of(batch, base, Some(*state), *rank);
        let attrs = PointAttributes::with(
            Some(set),
            A::GpulseGpuCause.key(),
            ExtraValue::Static(cause.as_str()),
        );
        b.push(M::ProcessGpuTime, attrs, span, Value::F64(*seconds));
    }
}
