//! What follows the measured load: elastic concurrency and rate quotas,
//! and shedding by priority.

use super::*;

#[tokio::test]
async fn an_elastic_quota_admits_over_its_limit_while_idle_and_not_while_saturated() {
    let gate = Gate::default();
    let load = MeasuredLoad::new(4, Duration::from_secs(60));
    let quota = ConcurrencyQuota::new(1).unwrap().elastic(2).unwrap();
    let layer = builder()
        .concurrency(quota)
        .measure_load(load.clone())
        .build();
    let addr = server(&gate, layer).await;
    let c = client();

    // Idle: a second request of one key passes its limit of 1, up to 2.
    let a1 = hold(&c, addr, &gate, "/held", "a").await;
    let a2 = hold(&c, addr, &gate, "/held", "a").await;
    let r = send(&c, addr, "/", "a").await;
    assert_concurrency_refusal(&r, "concurrent");
    let policy = r.list("ratelimit-policy");
    let p = policy.iter().find(|m| m.name() == "concurrent").unwrap();
    assert_eq!(p.int("q"), 1, "the headers show the limit, not the ceiling");
    gate.open(2);
    assert_eq!(finish(vec![a1, a2]).await, [StatusCode::OK; 2]);

    // Saturated (4 of 4 in flight): back to the limit.
    let mut held = Vec::new();
    for key in ["b", "c", "d"] {
        held.push(hold(&c, addr, &gate, "/held", key).await);
    }
    held.push(hold(&c, addr, &gate, "/held", "a").await);
    assert_eq!(load.in_flight(), 4);
    assert_concurrency_refusal(&send(&c, addr, "/held", "a").await, "concurrent");
    gate.open(4);
    assert_eq!(finish(held).await, [StatusCode::OK; 4]);
    assert_eq!(load.in_flight(), 0);
}

/// A layer of one elastic rate quota on `backend`: 2 per minute (GCRA,
/// one unit back every 30 s, so none returns during a test), up to 4 with
/// room.
pub(super) fn elastic_rate<B: tollgate::Backend>(
    backend: B,
) -> RateLimitLayerBuilder<B, HeaderKey> {
    let quota = Quota::gcra(2, Duration::from_secs(60))
        .name("per-minute")
        .mode(Mode::Elastic { percent: 100 })
        .build()
        .unwrap();
    RateLimitLayer::builder(
        // Named: Redis refuses a set without a name.
        Limiter::new(
            backend,
            tollgate::QuotaSet::new("per-minute", [quota]).unwrap(),
        ),
        HeaderKey::new(http::HeaderName::from_static("x-key")),
    )
    .timeout(BOUND)
    .on_backend_error(tollgate::OnBackendError::Reject)
}

/// The rate quota's `q` and `r` on a response.
fn rate_numbers(r: &Reply) -> (i64, i64) {
    let policy = r.list("ratelimit-policy");
    let state = r.list("ratelimit");
    let p = policy.iter().find(|m| m.name() == "per-minute").unwrap();
    let s = state.iter().find(|m| m.name() == "per-minute").unwrap();
    (p.int("q"), s.int("r"))
}

/// Idle: a key passes its limit of 2, up to the ceiling of 4, the headers
/// showing the limit. Saturated (4 of 4 in flight): another key gets its
/// limit only.
pub(super) async fn elastic_rate_trace(gate: &Gate, addr: SocketAddr, load: &MeasuredLoad) {
    let c = client();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = send(&c, addr, "/", "a").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        seen.push(rate_numbers(&r));
    }
    assert_eq!(seen, [(2, 1), (2, 0), (2, 0), (2, 0)]);
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "over the ceiling");
    assert_eq!(rate_numbers(&r), (2, 0));

    let mut held = Vec::new();
    for i in 0..4 {
        held.push(hold(&c, addr, gate, "/held", &format!("h{i}")).await);
    }
    assert_eq!(load.in_flight(), 4);
    for _ in 0..2 {
        assert_eq!(send(&c, addr, "/", "b").await.status, StatusCode::OK);
    }
    let r = send(&c, addr, "/", "b").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "saturated: the limit"
    );
    assert_eq!(r.json()["violated-policies"][0], "per-minute");
    gate.open(4);
    assert_eq!(finish(held).await, [StatusCode::OK; 4]);
}

#[tokio::test]
async fn an_elastic_rate_quota_admits_over_its_limit_while_idle_and_not_while_saturated() {
    let gate = Gate::default();
    let load = MeasuredLoad::new(4, Duration::from_secs(60));
    let layer = elastic_rate(MemoryBackend::new())
        .measure_load(load.clone())
        .build();
    let addr = server(&gate, layer).await;
    elastic_rate_trace(&gate, addr, &load).await;
}

#[tokio::test]
async fn an_elastic_rate_quota_without_a_load_signal_keeps_its_limit() {
    let gate = Gate::default();
    let addr = server(&gate, elastic_rate(MemoryBackend::new()).build()).await;
    let c = client();
    for _ in 0..2 {
        assert_eq!(send(&c, addr, "/", "a").await.status, StatusCode::OK);
    }
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "no signal, no room"
    );
}

#[tokio::test]
async fn under_overload_lower_priorities_are_shed_first_and_critical_is_served() {
    let gate = Gate::default();
    let load = MeasuredLoad::new(10, Duration::from_secs(60));
    let shedding = Shedding::new().priority(|parts| match parts.uri.path() {
        p if p.starts_with("/critical") => Priority::Critical,
        p if p.starts_with("/background") => Priority::Background,
        _ => Priority::Normal,
    });
    let layer = builder().measure_load(load.clone()).shed(shedding).build();
    let addr = server(&gate, layer).await;
    let c = client();
    let shed = |r: &Reply| {
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(
            r.json()["type"],
            tollgate::layer::TEMPORARY_REDUCED_CAPACITY
        );
    };

    let mut held = Vec::new();
    for i in 0..6 {
        held.push(hold(&c, addr, &gate, "/background/held", &format!("k{i}")).await);
    }
    // 6 of 10 in flight: background is shed, the rest served.
    shed(&send(&c, addr, "/background/held", "x").await);
    for i in 6..8 {
        held.push(hold(&c, addr, &gate, "/normal/held", &format!("k{i}")).await);
    }
    // 8 of 10: normal is shed too; the reserved 20% is for critical.
    shed(&send(&c, addr, "/normal/held", "x").await);
    shed(&send(&c, addr, "/background/held", "x").await);
    for i in 8..10 {
        held.push(hold(&c, addr, &gate, "/critical/held", &format!("k{i}")).await);
    }
    // Full: even critical waits.
    shed(&send(&c, addr, "/critical/held", "x").await);
    assert_eq!(load.in_flight(), 10);

    gate.open(10);
    assert_eq!(finish(held).await, [StatusCode::OK; 10]);
    // Load gone: every priority is served again.
    for path in ["/background/held", "/normal/held", "/critical/held"] {
        gate.open(1);
        assert_eq!(send(&c, addr, path, "x").await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn shedding_without_a_load_signal_refuses() {
    let gate = Gate::default();
    let layer = builder().shed(Shedding::new()).build();
    let addr = server(&gate, layer).await;
    let r = send(&client(), addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
}
