//! The admin API (the `admin` feature): inspect and reset keys, set
//! overrides and blocks, read the top offenders of running [`Rules`], as an
//! axum [`Router`] to mount behind your own authentication.
//!
//! ```
//! use tollgate::rules::Rules;
//!
//! let rules = Rules::parse(r#"
//! rules:
//!   - name: api
//!     key: header:x-api-key
//!     quotas: [{ algorithm: gcra, limit: 100, period: 1m }]
//! "#)?;
//! // Mounted on a port of its own, behind your authentication layer.
//! let admin: axum::Router = tollgate::admin::router(rules.clone());
//! # let _ = admin;
//! # Ok::<(), tollgate::rules::RulesError>(())
//! ```
//!
//! The endpoints, documented in [`OPENAPI`] (`src/admin/openapi.yaml`):
//! `GET /v1/rules`; `GET` (inspect) and `DELETE` (reset)
//! `/v1/rules/{rule}/keys/{key}`; `PUT` and `DELETE`
//! `/v1/rules/{rule}/blocks/{key}`; `PUT`, `GET` and `DELETE`
//! `/v1/rules/{rule}/overrides/{key}`; `GET /v1/rules/{rule}/overrides`;
//! `GET /v1/rules/{rule}/top?n=10`. `{key}` is the key as the client sent
//! it for a rule keyed by one part (the API key, the address, the user id)
//! or as the rule builds it (`key:…`, `ip:…`, parts joined by `|`),
//! percent-encoded. Errors are `application/problem+json`. Every change is
//! logged (target `tollgate::admin`) with the caller's [`AdminCaller`] name
//! when the request carries one, and the key as the logs show keys.

mod handlers;
mod reply;
mod top;

use axum::Router;
use axum::routing::get;

use crate::rules::Rules;

pub use top::publish_top_metrics;

/// The OpenAPI 3 description of the admin API.
pub const OPENAPI: &str = include_str!("openapi.yaml");

/// Who made an admin call, as an authentication layer in front of the
/// [`router`] names it (a request extension): the name is logged with
/// every change. The `tollgate` gateway sets the token's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminCaller(pub String);

/// The admin API over `rules` (see the [module](self)). It has no
/// authentication of its own: mount it where only operators reach it.
pub fn router(rules: Rules) -> Router {
    Router::new()
        .route("/v1/rules", get(handlers::list_rules))
        .route(
            "/v1/rules/{rule}/keys/{key}",
            get(handlers::inspect).delete(handlers::reset),
        )
        .route(
            "/v1/rules/{rule}/blocks/{key}",
            axum::routing::put(handlers::put_block).delete(handlers::delete_block),
        )
        .route("/v1/rules/{rule}/overrides", get(handlers::list_overrides))
        .route(
            "/v1/rules/{rule}/overrides/{key}",
            get(handlers::get_override)
                .put(handlers::put_override)
                .delete(handlers::delete_override),
        )
        .route("/v1/rules/{rule}/top", get(top::top))
        .route("/v1/openapi.yaml", get(reply::openapi))
        .fallback(reply::not_found)
        .method_not_allowed_fallback(reply::method_not_allowed)
        .with_state(rules)
}
