//! What every admin handler shares: JSON and problem+json replies, the
//! path's and the body's reading, the change log.

// A refusal is the response itself, made once per operator's call: boxing
// it would buy nothing.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{Extensions, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::Value;

use super::AdminCaller;
use crate::rules::operate::OpError;
use crate::rules::{Rules, parse_duration};

/// The largest request body read: an override's quota list is small.
const MAX_BODY: usize = 64 * 1024;

pub(super) type KeyPath = Result<Path<(String, String)>, PathRejection>;
pub(super) type RulePath = Result<Path<String>, PathRejection>;

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) fn no_content() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

pub(super) fn problem(status: StatusCode, detail: &str) -> Response {
    crate::layer::problem_response(status, "about:blank", detail).map(Body::from)
}

pub(super) fn op_error(e: &OpError) -> Response {
    let status = match e {
        OpError::NoRule(_) | OpError::NotFound => StatusCode::NOT_FOUND,
        OpError::Invalid(_) => StatusCode::BAD_REQUEST,
        OpError::Full => StatusCode::CONFLICT,
        OpError::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    problem(status, &e.to_string())
}

pub(super) fn path_error(e: &PathRejection) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        &format!("The path cannot be read: {e}."),
    )
}

fn caller(ext: &Extensions) -> String {
    ext.get::<AdminCaller>()
        .map_or_else(|| "-".to_owned(), |c| c.0.clone())
}

/// Logs a change: what, which rule, the key as logs show keys, who.
pub(super) fn logged(rules: &Rules, ext: &Extensions, action: &str, rule: &str, key: &str) {
    let key = rules.logged_key(key);
    tracing::info!(
        target: "tollgate::admin",
        action,
        rule,
        key = key.as_str(),
        by = caller(ext).as_str(),
        "admin change"
    );
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The body as a JSON object.
pub(super) fn object(body: &Bytes) -> Result<serde_json::Map<String, Value>, Response> {
    if body.len() > MAX_BODY {
        return Err(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("The body is over {MAX_BODY} bytes."),
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(problem(
            StatusCode::BAD_REQUEST,
            "The body must be a JSON object.",
        )),
        Err(e) => Err(problem(
            StatusCode::BAD_REQUEST,
            &format!("The body is not JSON: {e}."),
        )),
    }
}

/// A duration field (`"15m"`), if present.
pub(super) fn duration_field(
    m: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<Duration>, Response> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match parse_duration(s) {
            Ok(d) if !d.is_zero() => Ok(Some(d)),
            Ok(_) => Err(problem(
                StatusCode::BAD_REQUEST,
                &format!("{name} must be longer than 0."),
            )),
            Err(e) => Err(problem(StatusCode::BAD_REQUEST, &format!("{name}: {e}."))),
        },
        Some(_) => Err(problem(
            StatusCode::BAD_REQUEST,
            &format!("{name} is a duration such as \"15m\"."),
        )),
    }
}

pub(super) async fn openapi() -> Response {
    let mut r = Response::new(Body::from(super::OPENAPI));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/yaml"),
    );
    r
}

pub(super) async fn not_found() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "No such admin endpoint; see /v1/openapi.yaml.",
    )
}

pub(super) async fn method_not_allowed() -> Response {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "This endpoint does not take that method; see /v1/openapi.yaml.",
    )
}
