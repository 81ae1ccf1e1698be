//! The upstream: requests the limits let through, forwarded with their
//! hop-by-hop headers dropped and `X-Forwarded-For` extended, answered
//! 502 or 504 with a problem body when it fails; or, without one, an echo.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{HOST, HeaderName};
use http::{HeaderValue, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tollgate::layer::problem_response;
use tollgate::rules::normalize_path;

use super::args::UpstreamLimits;
use super::intermediary;

#[derive(Clone)]
pub(crate) struct Upstream {
    pub(crate) base: Uri,
    pub(crate) client: Client<HttpConnector, Body>,
    pub(crate) limits: UpstreamLimits,
}

/// Without an upstream: say what was decided, for trying rules out.
pub(crate) async fn echo(request: Request) -> Response {
    // A method is a token and a parsed path holds no control characters, so
    // the only JSON escapes needed are for `"` and `\`, which a lenient URI
    // parser may let through; percent-encoding them keeps the path a path.
    let path = request
        .uri()
        .path()
        .replace('"', "%22")
        .replace('\\', "%5C");
    let body = format!(
        "{{\"admitted\":true,\"method\":\"{}\",\"path\":\"{path}\"}}\n",
        request.method()
    );
    ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Hop-by-hop headers, which belong to one connection and are not forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(crate) async fn proxy(State(up): State<Upstream>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    intermediary::forward_request(&mut parts);
    // Forward the path the rules matched, so that the upstream cannot be
    // reached by a spelling the rules did not see.
    let path = match normalize_path(parts.uri.path()) {
        Ok(path) => path,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("{e}")),
    };
    let path_and_query = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.into_owned(),
    };
    let mut target = up.base.clone().into_parts();
    target.path_and_query = match path_and_query.parse() {
        Ok(pq) => Some(pq),
        Err(_) => return bad_gateway("the request path cannot be forwarded"),
    };
    parts.uri = match Uri::from_parts(target) {
        Ok(uri) => uri,
        Err(_) => return bad_gateway("the upstream URL cannot be formed"),
    };
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>().copied() {
        let xff = HeaderName::from_static("x-forwarded-for");
        let chain = forwarded_for(parts.headers.get_all(&xff), peer.ip());
        parts.headers.insert(xff, chain);
    }
    if !parts.headers.contains_key(HOST) {
        if let Some(host) = up
            .base
            .authority()
            .and_then(|a| HeaderValue::try_from(a.as_str()).ok())
        {
            parts.headers.insert(HOST, host);
        }
    }
    parts.version = http::Version::HTTP_11;
    let upstream_request = http::Request::from_parts(parts, body);
    let answer = tokio::time::timeout(up.limits.response, up.client.request(upstream_request));
    match answer.await {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            intermediary::strip_connection_fields(&mut parts.headers);
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(error)) if timed_out(&error) => {
            tracing::warn!(
                error = error.to_string().as_str(),
                "upstream connection timed out"
            );
            gateway_timeout("the upstream service did not accept a connection in time")
        }
        Ok(Err(error)) => {
            tracing::warn!(
                error = error.to_string().as_str(),
                "upstream request failed"
            );
            bad_gateway("the upstream service did not answer")
        }
        Err(_) => {
            tracing::warn!(timeout = ?up.limits.response, "upstream answer timed out");
            gateway_timeout("the upstream service did not answer in time")
        }
    }
}

/// The `X-Forwarded-For` sent upstream: every line's entries, joined in
/// order, then the peer. Bytes are kept as they came (not ASCII included), so
/// the upstream reads the same chain the limiter read.
fn forwarded_for(lines: http::header::GetAll<'_, HeaderValue>, peer: IpAddr) -> HeaderValue {
    let peer = peer.to_string();
    let mut chain = Vec::new();
    for line in lines {
        chain.extend_from_slice(line.as_bytes());
        chain.extend_from_slice(b", ");
    }
    chain.extend_from_slice(peer.as_bytes());
    // Header values never hold the bytes from_bytes refuses, nor does `, ` or an address.
    HeaderValue::from_bytes(&chain).unwrap_or_else(|_| {
        HeaderValue::from_str(&peer).unwrap_or(HeaderValue::from_static("unknown"))
    })
}

/// Whether a client error is a timeout (connecting, with the connect timeout).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = e.source();
    }
    false
}

fn bad_gateway(detail: &str) -> Response {
    problem(StatusCode::BAD_GATEWAY, detail)
}

fn gateway_timeout(detail: &str) -> Response {
    problem(StatusCode::GATEWAY_TIMEOUT, detail)
}

/// An RFC 9457 problem-details answer, as the layer writes its own.
fn problem(status: StatusCode, detail: &str) -> Response {
    problem_response(status, "about:blank", detail).map(Body::from)
}
