//! gRPC calls: a gRPC client reads the outcome of a call from `grpc-status`,
//! and reports an HTTP error status (a 429) as a transport failure. So the
//! layer's own answers to gRPC requests are "trailers-only" gRPC responses:
//! HTTP 200, `grpc-status` and `grpc-message`, the rate-limit fields and
//! `Retry-After` kept as metadata, no body.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// gRPC status codes the layer answers with.
const INVALID_ARGUMENT: u16 = 3;
const PERMISSION_DENIED: u16 = 7;
const RESOURCE_EXHAUSTED: u16 = 8;
const INTERNAL: u16 = 13;
const UNAVAILABLE: u16 = 14;
const UNAUTHENTICATED: u16 = 16;
const UNKNOWN: u16 = 2;

/// Whether a request is a gRPC call: `content-type: application/grpc`, or
/// `application/grpc+proto`, `application/grpc;...` and the like.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes) else {
        return false;
    };
    ct.get(..16)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"application/grpc"))
        && matches!(ct.get(16), None | Some(b'+' | b';'))
}

/// The gRPC status for an answer the layer made with HTTP `status`: a
/// refusal is RESOURCE_EXHAUSTED, a limiter that could not decide is
/// UNAVAILABLE, a request without a usable key INVALID_ARGUMENT, a server
/// that cannot find keys INTERNAL.
fn code(status: StatusCode) -> (u16, &'static str) {
    match status {
        StatusCode::TOO_MANY_REQUESTS => (RESOURCE_EXHAUSTED, "rate limit exceeded"),
        StatusCode::SERVICE_UNAVAILABLE => (UNAVAILABLE, "the rate limiter is unavailable"),
        StatusCode::BAD_REQUEST => (INVALID_ARGUMENT, "no rate-limit key in the request"),
        StatusCode::UNAUTHORIZED => (UNAUTHENTICATED, "unauthenticated"),
        StatusCode::FORBIDDEN => (PERMISSION_DENIED, "permission denied"),
        StatusCode::PAYLOAD_TOO_LARGE => (RESOURCE_EXHAUSTED, "the call costs more than its quota"),
        // Only a server that records no peer address answers 500 itself.
        s if s.is_server_error() => (
            INTERNAL,
            "the rate limiter cannot find keys: the server records no peer address \
             (build tollgate with its `tonic` feature for PeerIp and ClientIp)",
        ),
        _ => (UNKNOWN, "refused by the rate limiter"),
    }
}

/// `response`, an answer of the layer's own, as a gRPC response. One that
/// already carries a `grpc-status` (a custom rejection made for gRPC) is
/// left as it is.
pub(crate) fn to_grpc(response: Response<Bytes>) -> Response<Bytes> {
    if response.headers().contains_key(&GRPC_STATUS) {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let (code, message) = code(parts.status);
    let message = match parts
        .headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
    {
        Some(secs) if code == RESOURCE_EXHAUSTED => format!("{message}; retry in {secs} seconds"),
        _ => message.to_owned(),
    };
    parts.status = StatusCode::OK;
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let headers = &mut parts.headers;
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(code));
    // The messages are printable ASCII without '%', which gRPC's
    // percent-encoding leaves as they are.
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert(GRPC_MESSAGE.clone(), message);
    }
    Response::from_parts(parts, Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_recognised_and_others_not() {
        let is = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            is_grpc(&h)
        };
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "application/GRPC+json",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is(ct), "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "application/grpcx",
            "text/plain",
            "application/json",
        ] {
            assert!(!is(ct), "{ct}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn a_refusal_becomes_resource_exhausted_with_its_headers_kept() {
        let mut response = Response::new(Bytes::from_static(b"{}"));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let h = response.headers_mut();
        h.insert(http::header::RETRY_AFTER, HeaderValue::from(3));
        h.insert("ratelimit", HeaderValue::from_static("\"a\";r=0;t=3"));
        let grpc = to_grpc(response);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert!(grpc.body().is_empty());
        let h = grpc.headers();
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h["grpc-message"], "rate limit exceeded; retry in 3 seconds");
        assert_eq!(h["retry-after"], "3");
        assert_eq!(h["ratelimit"], "\"a\";r=0;t=3");
        assert_eq!(h["content-type"], "application/grpc");
    }
}
