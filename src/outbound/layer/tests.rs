use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower::{ServiceBuilder, ServiceExt};

use super::*;
use crate::Quota;
use crate::outbound::{DestinationHost, MemoryPace};

fn pacer(rate: u64) -> Pacer<MemoryPace> {
    let quota = Quota::gcra(rate, Duration::from_secs(1))
        .burst(1)
        .build()
        .unwrap();
    Pacer::new(MemoryPace::new(), &quota).max_wait(Duration::from_millis(150))
}

#[tokio::test(start_paused = true)]
async fn concurrency_caps_requests_at_once() {
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (Arc::clone(&now), Arc::clone(&most));
    let provider = tower::service_fn(move |_: Request<()>| {
        let (n, m) = (Arc::clone(&n), Arc::clone(&m));
        async move {
            let at_once = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(at_once, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(()))
        }
    });
    let client = ServiceBuilder::new()
        .layer(
            OutboundLayer::new(
                pacer(1000).max_wait(Duration::from_secs(5)),
                DestinationHost,
            )
            .concurrency(2),
        )
        .service(provider);
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let request = Request::get("http://p.example/").body(()).unwrap();
            tokio::spawn(client.clone().oneshot(request))
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn unsent_requests_are_errors_not_429s() {
    let sent = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&sent);
    let provider = tower::service_fn(move |_: Request<()>| {
        s.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(())) }
    });
    let client = ServiceBuilder::new()
        .layer(OutboundLayer::new(pacer(5), DestinationHost))
        .service(provider);
    let request = || Request::get("http://p.example/").body(()).unwrap();
    client.clone().oneshot(request()).await.unwrap();
    // The next turn is 200 ms away, over the 150 ms accepted.
    let refused = client.clone().oneshot(request()).await;
    assert!(matches!(
        refused,
        Err(OutboundError::TooLong { would_wait }) if would_wait == Duration::from_millis(200)
    ));
    let no_host = Request::get("/relative").body(()).unwrap();
    assert!(matches!(
        client.clone().oneshot(no_host).await,
        Err(OutboundError::NoKey)
    ));
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_429_pauses_the_key() {
    let provider = tower::service_fn(|r: Request<()>| async move {
        let mut response = Response::new(());
        if r.uri().path() == "/refuse" {
            *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("2"),
            );
        }
        Ok::<_, Infallible>(response)
    });
    let client = ServiceBuilder::new()
        .layer(OutboundLayer::new(
            pacer(100).max_wait(Duration::from_secs(5)),
            DestinationHost,
        ))
        .service(provider);
    let refused = client
        .clone()
        .oneshot(Request::get("http://p.example/refuse").body(()).unwrap())
        .await
        .unwrap();
    // The provider's 429 comes back as it is ...
    assert_eq!(refused.status(), http::StatusCode::TOO_MANY_REQUESTS);
    // ... and the next request waits out its Retry-After.
    let started = tokio::time::Instant::now();
    client
        .clone()
        .oneshot(Request::get("http://p.example/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(2010));
}
