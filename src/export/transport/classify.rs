//! The OTLP specification's answer to "should this export be retried?": which gRPC codes and
//! HTTP statuses are transient, and the server's hint for when to try again (`google.rpc.RetryInfo`
//! in a gRPC status's details, `Retry-After` on HTTP). Also reads the `google.rpc.Status` an
//! OTLP/HTTP server puts in an error body. Pure functions, the clock passed in.

use std::time::{Duration, SystemTime};

use tonic::Code;

/// Whether sending the same request again may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retryability {
    /// Transient: retry with backoff, waiting at least `after` when the server said so.
    Retryable { after: Option<Duration> },
    /// The server will refuse these bytes every time: drop them.
    Permanent,
}

/// Classifies a gRPC status per the OTLP/gRPC specification's table: RESOURCE_EXHAUSTED is
/// retryable only when the server sent `RetryInfo` (otherwise the server says it can never take
/// this much), the other transient codes always.
pub fn classify_grpc(code: Code, retry_info: Option<Duration>) -> Retryability {
    match code {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Retryability::Retryable { after: retry_info },
        Code::ResourceExhausted => match retry_info {
            Some(after) => Retryability::Retryable { after: Some(after) },
            None => Retryability::Permanent,
        },
        _ => Retryability::Permanent,
    }
}

/// Classifies an HTTP status per the OTLP/HTTP specification: 429, 502, 503 and 504 are
/// retryable, any other non-2xx status is not.
pub fn classify_http(status: u16, retry_after: Option<Duration>) -> Retryability {
    match status {
        429 | 502 | 503 | 504 => Retryability::Retryable { after: retry_after },
        _ => Retryability::Permanent,
    }
}

/// Reads a `Retry-After` value: delay-seconds or an HTTP-date (RFC 9110 §10.2.3). A date in the
/// past means "now" (zero); anything unreadable is ignored (`None`).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The `retry_delay` of a `google.rpc.RetryInfo` among the details of a gRPC status
/// (`tonic::Status::details()`, the `grpc-status-details-bin` trailer: a `google.rpc.Status`).
pub fn retry_info_delay(details: &[u8]) -> Option<Duration> {
    use prost::Message as _;
    if details.is_empty() {
        return None;
    }
    let status = RpcStatus::decode(details).ok()?;
    status
        .details
        .iter()
        .filter(|any| any.type_url.ends_with("/google.rpc.RetryInfo"))
        .find_map(|any| {
            let info = RetryInfo::decode(any.value.as_slice()).ok()?;
            let delay = info.retry_delay?;
            let seconds = u64::try_from(delay.seconds).ok()?;
            let nanos = u32::try_from(delay.nanos).ok()?;
            Some(Duration::new(seconds, nanos))
        })
}

/// The message of the `google.rpc.Status` an OTLP/HTTP server sends with an error status, or
/// `None` when the body is not one.
pub fn rpc_status_message(body: &[u8]) -> Option<String> {
    use prost::Message as _;
    let status = RpcStatus::decode(body).ok()?;
    (!status.message.is_empty()).then_some(status.message)
}

/// Snake-case gRPC code names, as the specification spells them, for logs and labels.
pub(crate) fn grpc_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

// The three `google.rpc`/`google.protobuf` messages needed, written out by hand: pulling
// tonic-types (or protoc) in for them would cost more build time than these few lines.

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<ProtoAny>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProtoAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn retryable(after: Option<Duration>) -> Retryability {
        Retryability::Retryable { after }
    }

    #[test]
    fn grpc_codes_follow_the_otlp_table() {
        let hint = Some(Duration::from_secs(3));
        let table = [
            (Code::Unavailable, None, retryable(None)),
            (Code::Unavailable, hint, retryable(hint)),
            (Code::Cancelled, None, retryable(None)),
            (Code::DeadlineExceeded, None, retryable(None)),
            (Code::Aborted, None, retryable(None)),
            (Code::OutOfRange, None, retryable(None)),
            (Code::DataLoss, None, retryable(None)),
            (Code::ResourceExhausted, None, Retryability::Permanent),
            (Code::ResourceExhausted, hint, retryable(hint)),
            (Code::InvalidArgument, None, Retryability::Permanent),
            (Code::InvalidArgument, hint, Retryability::Permanent),
            (Code::Unauthenticated, None, Retryability::Permanent),
            (Code::PermissionDenied, None, Retryability::Permanent),
            (Code::Unimplemented, None, Retryability::Permanent),
            (Code::Internal, None, Retryability::Permanent),
            (Code::Unknown, None, Retryability::Permanent),
        ];
        for (code, info, want) in table {
            assert_eq!(classify_grpc(code, info), want, "{code:?} with {info:?}");
        }
    }

    #[test]
    fn http_statuses_follow_the_otlp_table() {
        let hint = Some(Duration::from_secs(7));
        for status in [429, 502, 503, 504] {
            assert_eq!(classify_http(status, hint), retryable(hint), "{status}");
        }
        for status in [400, 401, 403, 404, 405, 413, 415, 500, 501, 505] {
            assert_eq!(
                classify_http(status, hint),
                Retryability::Permanent,
                "{status}"
            );
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    fn status_with(details: Vec<ProtoAny>) -> Vec<u8> {
        RpcStatus {
            code: Code::ResourceExhausted as i32,
            message: "slow down".into(),
            details,
        }
        .encode_to_vec()
    }

    #[test]
    fn retry_info_is_found_among_other_details() {
        let info = RetryInfo {
            retry_delay: Some(ProtoDuration {
                seconds: 2,
                nanos: 500_000_000,
            }),
        };
        let bytes = status_with(vec![
            ProtoAny {
                type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
                value: vec![1, 2, 3],
            },
            ProtoAny {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: info.encode_to_vec(),
            },
        ]);
        assert_eq!(retry_info_delay(&bytes), Some(Duration::from_millis(2500)));
    }

    #[test]
    fn retry_info_absent_or_garbled_gives_none() {
        assert_eq!(retry_info_delay(&[]), None);
        assert_eq!(retry_info_delay(&status_with(vec![])), None);
        assert_eq!(retry_info_delay(&[0xff, 0xff, 0xff]), None);
        let negative = RetryInfo {
            retry_delay: Some(ProtoDuration {
                seconds: -1,
                nanos: 0,
            }),
        };
        let bytes = status_with(vec![ProtoAny {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
            value: negative.encode_to_vec(),
        }]);
        assert_eq!(retry_info_delay(&bytes), None);
    }

    #[test]
    fn rpc_status_message_reads_the_http_error_body() {
        let body = RpcStatus {
            code: 3,
            message: "metric name is empty".into(),
            details: vec![],
        }
        .encode_to_vec();
        assert_eq!(
            rpc_status_message(&body).as_deref(),
            Some("metric name is empty")
        );
        assert_eq!(rpc_status_message(b"\xff\xff"), None);
    }
}
