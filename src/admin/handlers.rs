//! The admin API's handlers: JSON in and out, problem+json errors.

// A refusal is the response itself, made once per operator's call: boxing
// it would buy nothing.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{Extensions, HeaderValue, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::AdminCaller;
use crate::rules::operate::{Inspection, OpError, OverrideView};
use crate::rules::{Rules, parse_duration};

/// The largest request body read: an override's quota list is small.
const MAX_BODY: usize = 64 * 1024;
/// The most keys `top` lists.
const MAX_TOP: usize = crate::rules::top::COUNTERS;

type KeyPath = Result<Path<(String, String)>, PathRejection>;
type RulePath = Result<Path<String>, PathRejection>;

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn no_content() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

fn problem(status: StatusCode, detail: &str) -> Response {
    crate::layer::problem_response(status, "about:blank", detail).map(Body::from)
}

fn op_error(e: &OpError) -> Response {
    let status = match e {
        OpError::NoRule(_) | OpError::NotFound => StatusCode::NOT_FOUND,
        OpError::Invalid(_) => StatusCode::BAD_REQUEST,
        OpError::Full => StatusCode::CONFLICT,
        OpError::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    problem(status, &e.to_string())
}

fn path_error(e: &PathRejection) -> Response {
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
fn logged(rules: &Rules, ext: &Extensions, action: &str, rule: &str, key: &str) {
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The body as a JSON object.
fn object(body: &Bytes) -> Result<serde_json::Map<String, Value>, Response> {
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
fn duration_field(
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

pub(super) async fn list_rules(State(rules): State<Rules>) -> Response {
    let list: Vec<Value> = (rules.summaries().into_iter())
        .map(|r| {
            json!({
                "name": r.name,
                "key": r.key,
                "cost": r.cost,
                "quotas": r.quotas.iter().map(|(name, algorithm, limit, period)| json!({
                    "name": name, "algorithm": algorithm, "limit": limit, "period_ms": millis(*period),
                })).collect::<Vec<_>>(),
                "penalty": r.penalty.map(|(refusals, within, block)| json!({
                    "refusals": refusals, "within_ms": millis(within), "block_ms": millis(block),
                })),
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "rules": list }))
}

fn inspection(rule: &str, i: Inspection) -> Value {
    let quotas: Vec<Value> = (i.decision.iter())
        .flat_map(|(left, next)| left.quotas().iter().zip(next.quotas()))
        .zip(&i.names)
        .map(|((left, next), name)| {
            json!({
                "name": name,
                "limit": left.limit(),
                "remaining": left.remaining(),
                "reset_ms": millis(left.reset()),
                "retry_after_ms": next.retry_after().map(millis),
            })
        })
        .collect();
    let now = crate::rules::runtime::now_ms();
    json!({
        "rule": rule,
        "key": i.key,
        "allowed": i.block.is_none() && i.decision.as_ref().is_none_or(|(_, next)| next.allowed()),
        "overridden": i.overridden,
        "blocked": i.block.map(|b| json!({
            "until_ms": b.until_ms,
            "retry_after_ms": b.until_ms.saturating_sub(now),
            "penalty": b.penalty,
        })),
        "quotas": quotas,
    })
}

pub(super) async fn inspect(State(rules): State<Rules>, path: KeyPath) -> Response {
    let Path((rule, key)) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    match rules.inspect(&rule, &key).await {
        Ok(i) => json_response(StatusCode::OK, &inspection(&rule, i)),
        Err(e) => op_error(&e),
    }
}

pub(super) async fn reset(State(rules): State<Rules>, ext: Extensions, path: KeyPath) -> Response {
    let Path((rule, key)) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    match rules.reset(&rule, &key).await {
        Ok(key) => {
            logged(&rules, &ext, "reset", &rule, &key);
            no_content()
        }
        Err(e) => op_error(&e),
    }
}

pub(super) async fn put_block(
    State(rules): State<Rules>,
    ext: Extensions,
    path: KeyPath,
    body: Bytes,
) -> Response {
    let Path((rule, key)) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if let Some(unknown) = m.keys().find(|k| k.as_str() != "for") {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("Unknown field {unknown:?}; give \"for\"."),
        );
    }
    let span = match duration_field(&m, "for") {
        Ok(Some(d)) => d,
        Ok(None) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Give \"for\": how long, such as \"15m\".",
            );
        }
        Err(r) => return r,
    };
    match rules.block(&rule, &key, span, false).await {
        Ok((key, until_ms)) => {
            logged(&rules, &ext, "block", &rule, &key);
            json_response(
                StatusCode::OK,
                &json!({ "rule": rule, "key": key, "until_ms": until_ms }),
            )
        }
        Err(e) => op_error(&e),
    }
}

pub(super) async fn delete_block(
    State(rules): State<Rules>,
    ext: Extensions,
    path: KeyPath,
) -> Response {
    delete_entry(rules, ext, path, 'b', "unblock").await
}

pub(super) async fn delete_override(
    State(rules): State<Rules>,
    ext: Extensions,
    path: KeyPath,
) -> Response {
    delete_entry(rules, ext, path, 'o', "delete override").await
}

async fn delete_entry(
    rules: Rules,
    ext: Extensions,
    path: KeyPath,
    kind: char,
    action: &str,
) -> Response {
    let Path((rule, key)) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    match rules.delete_entry(kind, &rule, &key).await {
        Ok(key) => {
            logged(&rules, &ext, action, &rule, &key);
            no_content()
        }
        Err(e) => op_error(&e),
    }
}

fn override_json(rule: &str, o: &OverrideView) -> Value {
    let quotas: Value = serde_json::from_str(&o.quotas_json).unwrap_or(Value::Null);
    json!({ "rule": rule, "key": o.key, "quotas": quotas, "expires_at_ms": o.expires_at_ms })
}

pub(super) async fn put_override(
    State(rules): State<Rules>,
    ext: Extensions,
    path: KeyPath,
    body: Bytes,
) -> Response {
    let Path((rule, key)) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if let Some(unknown) = m
        .keys()
        .find(|k| !matches!(k.as_str(), "quotas" | "expires_in"))
    {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("Unknown field {unknown:?}; give \"quotas\" and optionally \"expires_in\"."),
        );
    }
    let Some(quotas @ Value::Array(_)) = m.get("quotas") else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Give \"quotas\": a list of quotas as in the rules file.",
        );
    };
    let expires_in = match duration_field(&m, "expires_in") {
        Ok(d) => d,
        Err(r) => return r,
    };
    let quotas_json = quotas.to_string();
    match rules
        .set_override(&rule, &key, &quotas_json, expires_in)
        .await
    {
        Ok(key) => {
            logged(&rules, &ext, "set override", &rule, &key);
            match rules.get_override(&rule, &key) {
                Ok(o) => json_response(StatusCode::OK, &override_json(&rule, &o)),
                Err(e) => op_error(&e),
            }
        }
        Err(e) => op_error(&e),
    }
}

pub(super) async fn get_override(State(rules): State<Rules>, path: KeyPath) -> Response {
    let Path((rule, key)) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    match rules.get_override(&rule, &key) {
        Ok(o) => json_response(StatusCode::OK, &override_json(&rule, &o)),
        Err(e) => op_error(&e),
    }
}

pub(super) async fn list_overrides(State(rules): State<Rules>, path: RulePath) -> Response {
    let Path(rule) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    match rules.list_overrides(&rule) {
        Ok(list) => {
            let list: Vec<Value> = list.iter().map(|o| override_json(&rule, o)).collect();
            json_response(StatusCode::OK, &json!({ "rule": rule, "overrides": list }))
        }
        Err(e) => op_error(&e),
    }
}

/// `n` from the query (10 when absent).
fn top_n(uri: &Uri) -> Result<usize, Response> {
    let mut n = 10;
    for pair in uri.query().unwrap_or_default().split('&') {
        if let Some(v) = pair.strip_prefix("n=") {
            n = match v.parse::<usize>() {
                Ok(n) if (1..=MAX_TOP).contains(&n) => n,
                _ => {
                    return Err(problem(
                        StatusCode::BAD_REQUEST,
                        &format!("n is a number from 1 to {MAX_TOP}."),
                    ));
                }
            };
        }
    }
    Ok(n)
}

pub(super) async fn top(State(rules): State<Rules>, uri: Uri, path: RulePath) -> Response {
    let Path(rule) = match path {
        Ok(p) => p,
        Err(e) => return path_error(&e),
    };
    let n = match top_n(&uri) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let mut out = serde_json::Map::new();
    for (name, refused) in [("refused", true), ("admitted", false)] {
        match rules.top(&rule, n, refused) {
            Ok((keys, counted)) => {
                let keys: Vec<Value> = (keys.iter())
                    .map(|h| json!({ "key": h.key, "count": h.count, "error": h.error }))
                    .collect();
                out.insert(name.into(), json!({ "counted": counted, "keys": keys }));
            }
            Err(e) => return op_error(&e),
        }
    }
    publish_top_metrics(&rules, 10);
    out.insert("rule".into(), json!(rule));
    out.insert(
        "keys_shown".into(),
        json!(if rules.raw_keys_shown() {
            "raw"
        } else {
            "hashed"
        }),
    );
    json_response(StatusCode::OK, &Value::Object(out))
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

/// Sets the gauge `tollgate_top_key_decisions{rule, of, rank}` (`of`:
/// `refused` or `admitted`, `rank` 1 to `n`) to the count of each rule's
/// `n` heaviest keys: how much of a rule's traffic its heaviest keys
/// make, with a bounded set of labels (the keys themselves are in the
/// admin API). The gateway calls it every few seconds.
pub fn publish_top_metrics(rules: &Rules, n: usize) {
    for r in rules.summaries() {
        for (of, refused) in [("refused", true), ("admitted", false)] {
            let Ok((keys, _)) = rules.top(&r.name, n.min(MAX_TOP), refused) else {
                continue;
            };
            for rank in 1..=n.min(MAX_TOP) {
                let count = keys.get(rank - 1).map_or(0, |h| h.count);
                metrics::gauge!(
                    "tollgate_top_key_decisions",
                    "rule" => r.name.clone(),
                    "of" => of,
                    "rank" => rank.to_string(),
                )
                .set(count as f64);
            }
        }
    }
}
