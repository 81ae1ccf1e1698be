//! The top offenders' endpoint and metric.

// A refusal is the response itself, made once per operator's call: boxing
// it would buy nothing.
#![allow(clippy::result_large_err)]

use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

use super::reply::{RulePath, json_response, op_error, path_error, problem};
use crate::rules::Rules;

/// The most keys `top` lists.
const MAX_TOP: usize = crate::rules::top::COUNTERS;

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
