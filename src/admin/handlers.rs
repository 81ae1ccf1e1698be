//! The admin API's handlers of rules, keys, blocks and overrides: JSON in
//! and out, problem+json errors (see `reply.rs`).

// A refusal is the response itself, made once per operator's call: boxing
// it would buy nothing.
#![allow(clippy::result_large_err)]

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Extensions, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::reply::{
    KeyPath, RulePath, duration_field, json_response, logged, millis, no_content, object, op_error,
    path_error, problem,
};
use crate::rules::Rules;
use crate::rules::operate::{Inspection, OverrideView};

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
