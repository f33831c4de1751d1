//! The companion's spans while recording: `gpulse record` can be the job's OTLP endpoint (its
//! `--otlp-receiver-*` flags, as `gpulse run` has them). The receiver's intake hands every trace
//! request to [`collector`]'s observer, which keeps the `epoch`, `step` and `data_wait` spans for
//! the report; the request itself goes on through the exporter's queue, upstream when an
//! endpoint was set (`commands::record`).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::recording::SpanKind;
use crate::enrich::SpanObserver;

/// One span of the training loop, in Unix time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReceivedSpan {
    pub kind: SpanKind,
    pub name: String,
    pub start: SystemTime,
    pub end: SystemTime,
}

/// The spans of `request` the report shows.
pub(crate) fn training_spans(request: &ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    request
        .resource_spans
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .filter_map(|span| {
            let kind = match span.name.as_str() {
                "epoch" => SpanKind::Epoch,
                "step" => SpanKind::Step,
                "data_wait" => SpanKind::DataWait,
                _ => return None,
            };
            let (start, end) = (span.start_time_unix_nano, span.end_time_unix_nano);
            (start > 0 && end >= start).then(|| ReceivedSpan {
                kind,
                name: span.name.clone(),
                start: UNIX_EPOCH + Duration::from_nanos(start),
                end: UNIX_EPOCH + Duration::from_nanos(end),
            })
        })
        .collect()
}

/// An observer for the intake and the channel its spans arrive on.
pub(crate) fn collector() -> (SpanObserver, mpsc::Receiver<ReceivedSpan>) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let observer = SpanObserver(Arc::new(move |request: &ExportTraceServiceRequest| {
        let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
        for span in training_spans(request) {
            let _ = tx.send(span);
        }
    }));
    (observer, rx)
}
