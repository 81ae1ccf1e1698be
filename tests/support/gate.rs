//! Handlers that block on a gate until a test lets them through, counting
//! who is inside, so that the number of requests under way is known.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tokio::sync::Semaphore;

/// How long anything in the tests of a gate may wait.
pub const BOUND: Duration = Duration::from_secs(5);

/// Handlers wait on it until let through, counting who is inside.
#[derive(Clone)]
pub struct Gate {
    pub permits: Arc<Semaphore>,
    pub inside: Arc<AtomicUsize>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            permits: Arc::new(Semaphore::new(0)),
            inside: Arc::default(),
        }
    }
}

impl Gate {
    /// A handler's body: waits until let through (or `BOUND`), then
    /// answers "done".
    pub async fn wait(&self) -> &'static str {
        self.inside.fetch_add(1, Ordering::SeqCst);
        // Bounded: a test that forgets to open the gate fails, not hangs.
        let permit = tokio::time::timeout(BOUND, self.permits.acquire()).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        if let Ok(Ok(permit)) = permit {
            permit.forget();
        }
        "done"
    }

    /// Lets `n` handlers through.
    pub fn open(&self, n: usize) {
        self.permits.add_permits(n);
    }

    /// Waits until `n` handlers are inside.
    pub async fn until_inside(&self, n: usize) {
        let start = Instant::now();
        while self.inside.load(Ordering::SeqCst) != n {
            assert!(
                start.elapsed() < BOUND,
                "{} inside, not {n}",
                self.inside.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A server whose handlers under `/gate/` wait on the gate; every other
    /// path answers "quick" at once.
    pub async fn upstream(&self) -> SocketAddr {
        let g = self.clone();
        let app = Router::new()
            .route(
                "/gate/{name}",
                get(move || {
                    let g = g.clone();
                    async move { g.wait().await }
                }),
            )
            .fallback(|| async { "quick" });
        super::serve(app).await
    }
}
