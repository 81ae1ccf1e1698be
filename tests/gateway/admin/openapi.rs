//! The OpenAPI file walked against a running gateway.

use http::{Method, StatusCode};
use serde_json::Value;
use support::gateway::RulesFile;

use super::{Answer, RULES, TOKEN, call, start};
use crate::support;

/// Every path and method of the OpenAPI file, called on a running gateway:
/// the status is one the file lists, with the content type it names, and a
/// JSON body has the fields its schema requires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_file_matches_what_the_server_answers() {
    let rules = RulesFile::new("admin-openapi", RULES);
    let a = start(&rules, "openapi", &[]);
    let spec: Value = serde_saphyr::from_str(tollgate::admin::OPENAPI).unwrap();
    let served = call(Method::GET, &a.url("/v1/openapi.yaml"), Some(TOKEN), None).await;
    assert_eq!(served.body, tollgate::admin::OPENAPI);
    // An order that leaves something to read or delete: PUT before GET
    // before DELETE.
    let order = ["put", "get", "delete"];
    let mut walked = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in order {
            let Some(op) = item.get(method) else { continue };
            let url = a.url(&path.replace("{rule}", "api").replace("{key}", "walker%2F1"));
            let body = op["requestBody"]["content"]["application/json"]["example"].clone();
            let body = (!body.is_null()).then(|| body.to_string());
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let answer = call(m, &url, Some(TOKEN), body.as_deref()).await;
            check(&spec, op, &answer, &format!("{method} {path}"));
            walked += 1;
        }
        // A rule that does not exist: a documented 404 where one is listed.
        for method in order {
            let Some(op) = item.get(method) else { continue };
            if op["responses"].get("404").is_none() {
                continue;
            }
            let url = a.url(&path.replace("{rule}", "nope").replace("{key}", "x"));
            let body = op["requestBody"]["content"]["application/json"]["example"].clone();
            let body = (!body.is_null()).then(|| body.to_string());
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let answer = call(m, &url, Some(TOKEN), body.as_deref()).await;
            assert_eq!(
                answer.status,
                StatusCode::NOT_FOUND,
                "{method} {path}: {}",
                answer.body
            );
            check(&spec, op, &answer, &format!("{method} {path} (no rule)"));
        }
    }
    assert_eq!(walked, 11, "every operation walked");
}

/// `answer` is one of `op`'s documented responses.
fn check(spec: &Value, op: &Value, answer: &Answer, what: &str) {
    let code = answer.status.as_u16().to_string();
    let mut documented = op["responses"]
        .get(&code)
        .unwrap_or_else(|| panic!("{what}: {code} is not documented: {}", answer.body))
        .clone();
    if let Some(r) = documented.get("$ref").and_then(Value::as_str) {
        documented = resolve(spec, r);
    }
    let Some(content) = documented.get("content").and_then(Value::as_object) else {
        assert!(
            answer.body.is_empty(),
            "{what}: no body documented: {}",
            answer.body
        );
        return;
    };
    let ct = answer.headers["content-type"].to_str().unwrap();
    let (media, entry) = content.iter().next().unwrap();
    assert_eq!(ct, media, "{what}");
    if !media.ends_with("json") {
        return;
    }
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    let mut schema = entry["schema"].clone();
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        schema = resolve(spec, r);
    }
    for field in schema["required"].as_array().into_iter().flatten() {
        let field = field.as_str().unwrap();
        assert!(body.get(field).is_some(), "{what}: no {field:?} in {body}");
    }
}

fn resolve(spec: &Value, reference: &str) -> Value {
    let mut at = spec;
    for part in reference.trim_start_matches("#/").split('/') {
        at = &at[part];
    }
    at.clone()
}
