//! A custom key extractor: requests are limited per account, found from the
//! API key by an (asynchronous) lookup, and each account's tier sets what a
//! request costs. A request without an API key is limited by IP instead.
//!
//! Run with `cargo run --example api_key_tiers`, then:
//!   curl -si -H 'x-api-key: gold-123' http://127.0.0.1:3001/
//!   curl -si -H 'x-api-key: free-456' http://127.0.0.1:3001/

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::{Router, routing::get};
use http::request::Parts;
use tollgate::key::{Key, KeyError, KeyExtractor, KeyExtractorExt, KeyFuture, PeerIp};
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};

#[derive(Clone, Copy, Debug)]
enum Tier {
    Free,
    Gold,
}

struct Account {
    id: u32,
    tier: Tier,
}

/// Stands in for a database of API keys.
#[derive(Clone)]
struct Accounts(Arc<HashMap<&'static str, Account>>);

impl Accounts {
    fn new() -> Self {
        Accounts(Arc::new(HashMap::from([
            (
                "gold-123",
                Account {
                    id: 1,
                    tier: Tier::Gold,
                },
            ),
            (
                "free-456",
                Account {
                    id: 2,
                    tier: Tier::Free,
                },
            ),
        ])))
    }

    async fn find(&self, api_key: &str) -> Option<&Account> {
        // A real lookup would await a database or a cache here.
        tokio::task::yield_now().await;
        self.0.get(api_key)
    }

    fn tier(&self, parts: &Parts) -> Tier {
        api_key(parts)
            .and_then(|k| self.0.get(k))
            .map_or(Tier::Free, |a| a.tier)
    }
}

fn api_key(parts: &Parts) -> Option<&str> {
    parts.headers.get("x-api-key")?.to_str().ok()
}

/// Keys requests by the account that owns their API key.
struct ByAccount(Accounts);

impl KeyExtractor for ByAccount {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        let Some(key) = api_key(parts).map(str::to_owned) else {
            return KeyFuture::ready(Err(KeyError::Missing("x-api-key header")));
        };
        let accounts = self.0.clone();
        KeyFuture::new(async move {
            match accounts.find(&key).await {
                Some(account) => Ok(Key::from(format!("account:{}", account.id))),
                None => Err(KeyError::Malformed("x-api-key (unknown key)".into())),
            }
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let accounts = Accounts::new();
    // 100 units a minute: a gold request costs 1, a free one 10.
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::token_bucket(100, Duration::from_secs(60)).build()?,
    );
    let tiers = accounts.clone();
    let layer = RateLimitLayer::builder(limiter, ByAccount(accounts).or(PeerIp::new()))
        .cost(move |parts| match tiers.tier(parts) {
            Tier::Gold => 1,
            Tier::Free => 10,
        })
        .build();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3001);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("  gold-123: 100 requests a minute; free-456 and no key: 10 a minute");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
