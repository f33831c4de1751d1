//! The stdout exporter: one line of OTLP JSON per request, the format of the OpenTelemetry
//! Collector's file exporter, so `gpulse run --exporter stdout | otelcol --config file-receiver`
//! or a plain `jq` works. The line is rendered by a pluggable function; the default decodes the
//! request and renders it with the export model's OTLP/JSON writers
//! (`json::to_otlp_json_line`, `logs::logs_to_otlp_json_line`, and the same writer for
//! forwarded traces), which prune proto3 defaults
//! the collector's file receiver refuses.
//!
//! Rendering and writing run on tokio's blocking pool: a reader that stops reading the pipe
//! (a paused `less`, a full disk) blocks that thread, never the runtime that samples and serves.

use std::io::Write;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use super::{EncodedRequest, SendError, SendOutcome, Signal, Transport};
use crate::export::json::{otlp_json_line, to_otlp_json_line};
use crate::export::logs::logs_to_otlp_json_line;

/// Turns an encoded request into one line of OTLP JSON (no trailing newline).
pub type RenderFn = fn(Signal, &[u8]) -> Result<String, String>;

/// Writes each request as one line. Cloning shares the writer, so lines never interleave.
#[derive(Clone)]
pub struct StdoutTransport {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    render: RenderFn,
}

impl std::fmt::Debug for StdoutTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdoutTransport").finish_non_exhaustive()
    }
}

impl StdoutTransport {
    /// Process standard output, rendered with [`render_otlp_json`].
    pub fn stdout() -> Self {
        Self::with_writer(std::io::stdout(), render_otlp_json)
    }

    /// Any writer (a file, a test buffer) and renderer.
    pub fn with_writer(out: impl Write + Send + 'static, render: RenderFn) -> Self {
        Self {
            out: Arc::new(Mutex::new(Box::new(out))),
            render,
        }
    }

    /// Writes `line` and a newline, then flushes, so a reader sees whole requests.
    ///
    /// # Errors
    /// The writer's error (a closed pipe).
    pub fn write_line(&self, line: &str) -> std::io::Result<()> {
        // One request's line is small; a poisoned lock only means another writer panicked
        // between lines, and the writer itself is still whole.
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
        out.flush()
    }
}

impl Transport for StdoutTransport {
    async fn send(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> Result<SendOutcome, SendError> {
        let this = self.clone();
        let body = request.body().clone();
        let written = tokio::task::spawn_blocking(move || {
            let line = (this.render)(signal, &body)
                .map_err(|detail| SendError::Render { signal, detail })?;
            this.write_line(&line)
                .map_err(|source| SendError::Stdout { signal, source })
        })
        .await;
        match written {
            Ok(result) => result.map(|()| SendOutcome::default()),
            Err(join) => Err(SendError::Stdout {
                signal,
                source: std::io::Error::other(format!(
                    "the writer thread stopped before finishing the line: {join}"
                )),
            }),
        }
    }
}

/// The default renderer: decode the request (the queue holds only protobuf) and write it as
/// OTLP/JSON with the export model's writer.
pub fn render_otlp_json(signal: Signal, body: &[u8]) -> Result<String, String> {
    match signal {
        Signal::Metrics => ExportMetricsServiceRequest::decode(body)
            .map(|r| to_otlp_json_line(&r))
            .map_err(|e| format!("not an ExportMetricsServiceRequest: {e}")),
        Signal::Logs => ExportLogsServiceRequest::decode(body)
            .map(|r| logs_to_otlp_json_line(&r))
            .map_err(|e| format!("not an ExportLogsServiceRequest: {e}")),
        Signal::Traces => ExportTraceServiceRequest::decode(body)
            .map(|r| otlp_json_line(&r))
            .map_err(|e| format!("not an ExportTraceServiceRequest: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn each_request_is_one_json_line() {
        let buffer = Buffer::default();
        let out = StdoutTransport::with_writer(buffer.clone(), render_otlp_json);
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics::default()],
                schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
                ..Default::default()
            }],
        };
        let encoded = EncodedRequest::from_message(&request, 0);
        out.send(Signal::Metrics, &encoded).await.unwrap();
        out.send(Signal::Metrics, &encoded).await.unwrap();
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let value: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(
            value["resourceMetrics"][0]["schemaUrl"],
            "https://opentelemetry.io/schemas/1.37.0"
        );
    }

    #[tokio::test]
    async fn forwarded_traces_render_as_otlp_json_with_hex_ids() {
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
        let buffer = Buffer::default();
        let out = StdoutTransport::with_writer(buffer.clone(), render_otlp_json);
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![0xab; 16],
                        span_id: vec![0xcd; 8],
                        name: "train_step".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        out.send(Signal::Traces, &EncodedRequest::from_message(&request, 1))
            .await
            .unwrap();
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let value: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let span = &value["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["name"], "train_step");
        assert_eq!(span["traceId"], "ab".repeat(16));
    }

    /// A writer that blocks until released, like a pipe nobody reads.
    struct Blocked(Arc<(Mutex<bool>, std::sync::Condvar)>);

    impl Write for Blocked {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (released, cv) = &*self.0;
            let mut released = released.lock().unwrap();
            while !*released {
                released = cv.wait(released).unwrap();
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_writer_does_not_block_the_runtime() {
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let out = StdoutTransport::with_writer(Blocked(Arc::clone(&gate)), render_otlp_json);
        let request = EncodedRequest::from_message(&ExportMetricsServiceRequest::default(), 0);
        let send = tokio::spawn(async move { out.send(Signal::Metrics, &request).await });
        // On a single-threaded runtime this timer fires only if the write is off the runtime.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!send.is_finished(), "the write is still blocked");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        send.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn garbage_is_a_permanent_render_error() {
        let out = StdoutTransport::with_writer(Buffer::default(), render_otlp_json);
        let err = out
            .send(
                Signal::Logs,
                &EncodedRequest::new(vec![0xff, 0xff, 0xff], 1),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::Render { .. }), "{err}");
        assert_eq!(err.retryability(), super::super::Retryability::Permanent);
    }
}
