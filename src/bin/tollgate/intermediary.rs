//! What the proxy owes the messages it relays as an HTTP intermediary
//! (RFC 9110 section 7.6): connection-specific fields stay on their
//! connection, and the upstream learns how the client reached the gateway.
//!
//! The upstream's own `RateLimit` and `RateLimit-Policy` fields need nothing
//! here: the layer appends the gateway's policies to them and never removes
//! or replaces an origin's (draft-ietf-httpapi-ratelimit-headers-11 section
//! 7.2).

use http::header::{CONNECTION, HOST, HeaderName};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};

const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Prepares a client's request head for the upstream: drops the fields its
/// `Connection` header names, and says (in `X-Forwarded-Proto` and
/// `X-Forwarded-Host`) which scheme and host the client asked for. Call
/// before the target URI and `Host` are rewritten.
///
/// Both are set, never appended: the gateway accepts only plain HTTP, and a
/// client-sent value is a claim nobody has checked.
pub fn forward_request(parts: &mut Parts) {
    strip_connection_fields(&mut parts.headers);
    // An absolute target's authority is the host asked for, whatever
    // `Host` says (RFC 9112 section 3.2.2): the rules matched it, so the
    // upstream gets it too.
    let authority = parts
        .uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
    if let Some(authority) = &authority {
        parts.headers.insert(HOST, authority.clone());
    }
    let host = authority.or_else(|| parts.headers.get(HOST).cloned());
    match host {
        Some(host) => parts.headers.insert(X_FORWARDED_HOST, host),
        None => parts.headers.remove(X_FORWARDED_HOST),
    };
    parts
        .headers
        .insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
}

/// Removes the fields that `Connection` names (RFC 9110 section 7.6.1): they
/// are meant for this hop only, in either direction. `Connection` itself
/// and the standard hop-by-hop fields are left to the caller. `Host` and
/// the forwarding fields (`Forwarded`, `X-Forwarded-*`, `X-Real-IP`) are
/// never removed: the rules read them, and a client naming them would have
/// the upstream read a different client, or site, than the limiter did.
pub fn strip_connection_fields(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        // A token that is not a field name cannot name a field to remove.
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .filter(|name| !end_to_end(name))
        .collect();
    for name in named {
        headers.remove(name);
    }
}

/// Fields a `Connection` header may not name away.
fn end_to_end(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(name, "host" | "forwarded" | "x-real-ip") || name.starts_with("x-forwarded-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fields_named_by_connection_go() {
        let mut h = HeaderMap::new();
        h.append(CONNECTION, HeaderValue::from_static("keep-alive, X-Secret"));
        h.append(
            CONNECTION,
            HeaderValue::from_static(" x-other ,, bad token"),
        );
        for name in ["x-secret", "x-other", "x-kept", "keep-alive"] {
            h.insert(name, HeaderValue::from_static("1"));
        }
        strip_connection_fields(&mut h);
        assert!(h.get("x-secret").is_none() && h.get("x-other").is_none());
        assert!(h.get("keep-alive").is_none());
        assert_eq!(h.get("x-kept").unwrap(), "1");
        assert_eq!(
            h.get_all(CONNECTION).iter().count(),
            2,
            "left to the caller"
        );
    }

    #[test]
    fn forwarding_fields_and_host_outlive_a_connection_header_naming_them() {
        let mut h = HeaderMap::new();
        h.append(
            CONNECTION,
            HeaderValue::from_static(
                "X-Forwarded-For, forwarded, x-real-ip, host, x-forwarded-host, x-gone",
            ),
        );
        let kept = [
            "x-forwarded-for",
            "forwarded",
            "x-real-ip",
            "host",
            "x-forwarded-host",
        ];
        for name in kept.iter().chain(&["x-gone"]) {
            h.insert(*name, HeaderValue::from_static("1"));
        }
        strip_connection_fields(&mut h);
        for name in kept {
            assert_eq!(h.get(name).map(|v| v.as_bytes()), Some(&b"1"[..]), "{name}");
        }
        assert!(h.get("x-gone").is_none());
    }

    #[test]
    fn an_absolute_targets_authority_is_the_host_forwarded() {
        let request = http::Request::get("http://admin.example/p")
            .header(HOST, "public.example")
            .body(())
            .unwrap();
        let (mut parts, ()) = request.into_parts();
        forward_request(&mut parts);
        assert_eq!(parts.headers[HOST], "admin.example");
        assert_eq!(parts.headers["x-forwarded-host"], "admin.example");
    }

    #[test]
    fn forwarded_proto_and_host_replace_what_the_client_claimed() {
        let request = http::Request::get("/p")
            .header(HOST, "shop.example:8080")
            .header("x-forwarded-proto", "https")
            .header("x-forwarded-host", "evil.example")
            .body(())
            .unwrap();
        let (mut parts, ()) = request.into_parts();
        forward_request(&mut parts);
        assert_eq!(parts.headers["x-forwarded-proto"], "http");
        assert_eq!(parts.headers["x-forwarded-host"], "shop.example:8080");
        assert_eq!(parts.headers.get_all("x-forwarded-host").iter().count(), 1);
    }
}
