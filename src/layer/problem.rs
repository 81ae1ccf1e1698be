//! RFC 9457 problem details: the body of every response the layer makes.

use std::fmt::Write;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use super::reason::Reason;

/// The problem type for an exceeded quota (IANA HTTP problem types).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// An `application/problem+json` response (RFC 9457) of `status`, with the
/// problem type `problem_type` (`"about:blank"` when there is none more
/// specific) and a human-readable `detail`: what the layer sends when it
/// answers a request itself, for a custom
/// [`rejection_response`](super::RateLimitLayerBuilder::rejection_response)
/// or a proxy's own errors to look the same.
///
/// ```
/// use http::StatusCode;
/// use tollgate::layer::problem_response;
///
/// let response = problem_response(StatusCode::BAD_GATEWAY, "about:blank", "No answer.");
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
pub fn problem_response(status: StatusCode, problem_type: &str, detail: &str) -> Response<Bytes> {
    problem_body(status, problem_type, detail, &[], None)
}

/// [`problem_response`] with the names of the policies that refused and
/// the decision's [`Reason`] (a `reason` member).
pub(crate) fn problem(
    status: StatusCode,
    problem_type: &str,
    detail: &str,
    violated: &[&str],
    reason: Reason,
) -> Response<Bytes> {
    problem_body(status, problem_type, detail, violated, Some(reason))
}

fn problem_body(
    status: StatusCode,
    problem_type: &str,
    detail: &str,
    violated: &[&str],
    reason: Option<Reason>,
) -> Response<Bytes> {
    let mut body = String::with_capacity(160);
    body.push_str("{\"type\":");
    json_string(&mut body, problem_type);
    body.push_str(",\"title\":");
    json_string(&mut body, status.canonical_reason().unwrap_or("Error"));
    let _ = write!(body, ",\"status\":{}", status.as_u16());
    body.push_str(",\"detail\":");
    json_string(&mut body, detail);
    if let Some(reason) = reason {
        // A fixed snake-case name: nothing to escape.
        let _ = write!(body, ",\"reason\":\"{}\"", reason.as_str());
    }
    if !violated.is_empty() {
        body.push_str(",\"violated-policies\":[");
        for (i, name) in violated.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            json_string(&mut body, name);
        }
        body.push(']');
    }
    body.push('}');
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// Appends `s` as a JSON string.
pub(crate) fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_bodies_escape_strings() {
        let r = problem(
            StatusCode::TOO_MANY_REQUESTS,
            QUOTA_EXCEEDED,
            "a \"b\"\n",
            &["x\\y"],
            Reason::Quota,
        );
        let body = std::str::from_utf8(r.body()).unwrap();
        assert!(body.contains(r#""detail":"a \"b\"\u000a""#), "{body}");
        assert!(body.contains(r#""violated-policies":["x\\y"]"#), "{body}");
        assert!(body.contains(r#""reason":"quota""#), "{body}");
    }
}
