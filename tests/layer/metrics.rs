//! What the metrics report, read back from a Prometheus recorder that is
//! local to each test (so tests do not share counters): the memory gauge
//! follows insertions and drops, and a check the layer gives up on is still
//! counted as errored.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tollgate::backend::CheckRequest;
use tollgate::key::GlobalKey;
use tollgate::{
    Backend, BackendError, Decision, Limiter, MemoryBackend, OnBackendError, Quota, QuotaSet,
    RateLimitLayer,
};
use tower::{Layer, ServiceExt, service_fn};

fn samples(recorder: &PrometheusRecorder) -> BTreeMap<String, f64> {
    recorder
        .handle()
        .render()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn the_memory_gauge_follows_insertions_and_dropped_backends() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let (a, b) = metrics::with_local_recorder(&recorder, || {
        let quotas = || {
            QuotaSet::new(
                "two",
                [
                    Quota::fixed_window(3, Duration::from_secs(60))
                        .build()
                        .unwrap(),
                    Quota::gcra(3, Duration::from_secs(60))
                        .name("rate")
                        .build()
                        .unwrap(),
                ],
            )
            .unwrap()
        };
        (
            Limiter::new(MemoryBackend::new(), quotas()),
            Limiter::new(MemoryBackend::new(), quotas()),
        )
    });
    for key in ["k1", "k2", "k3"] {
        a.check(key, 1).await.unwrap();
    }
    a.check("k1", 1).await.unwrap();
    b.check("k1", 1).await.unwrap();
    // Two quotas each: six states in one backend, two in the other.
    assert_eq!(samples(&recorder)["tollgate_memory_states"], 8.0);
    assert_eq!(a.backend().len() + b.backend().len(), 8);
    drop(a);
    assert_eq!(samples(&recorder)["tollgate_memory_states"], 2.0);
    let got = samples(&recorder);
    assert_eq!(
        got[r#"tollgate_decisions_total{policy="two",outcome="allowed"}"#],
        5.0
    );
    assert_eq!(
        got[r#"tollgate_decision_duration_seconds_count{backend="memory"}"#],
        5.0
    );
}

/// A backend that never answers.
struct Silent;

impl Backend for Silent {
    fn check<'a>(
        &'a self,
        _: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        std::future::pending()
    }

    fn name(&self) -> &'static str {
        "silent"
    }
}

#[tokio::test]
async fn a_check_the_layer_gives_up_on_counts_as_errored() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let quota = Quota::gcra(3, Duration::from_secs(60)).build().unwrap();
        Limiter::new(Silent, QuotaSet::new("slow", [quota]).unwrap())
    });
    let layer = RateLimitLayer::builder(limiter, GlobalKey)
        .timeout(Duration::from_millis(20))
        .on_backend_error(OnBackendError::Reject)
        .build();
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    }));
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let got = samples(&recorder);
    assert_eq!(
        got[r#"tollgate_decisions_total{policy="slow",outcome="errored"}"#],
        1.0
    );
    assert_eq!(
        got[r#"tollgate_decision_duration_seconds_count{backend="silent"}"#],
        1.0
    );
}

/// The direct API's synchronous check counts each outcome once: admitted,
/// refused, and a cost no quota could admit (an error before the backend).
#[test]
fn check_now_counts_each_outcome_once() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let quota = Quota::gcra(2, Duration::from_secs(60)).build().unwrap();
        Limiter::new(
            MemoryBackend::new(),
            QuotaSet::new("direct", [quota]).unwrap(),
        )
    });
    let allowed: Vec<bool> = (0..3)
        .map(|_| limiter.check_now("k", 1).unwrap().unwrap().allowed())
        .collect();
    assert_eq!(allowed, [true, true, false]);
    let too_costly = limiter.check_now("k", 3).unwrap();
    assert!(matches!(
        too_costly,
        Err(tollgate::Error::CostTooHigh { .. })
    ));
    let got = samples(&recorder);
    let count = |outcome: &str| {
        got[&format!(r#"tollgate_decisions_total{{policy="direct",outcome="{outcome}"}}"#)]
    };
    assert_eq!(count("allowed"), 2.0);
    assert_eq!(count("refused"), 1.0);
    assert_eq!(count("errored"), 1.0);
    assert_eq!(
        got[r#"tollgate_decision_duration_seconds_count{backend="memory"}"#],
        4.0
    );
}

/// Admissions beyond a quota's nominal limit say so: within a soft quota's
/// margin `soft`, within an elastic quota's extra (with room) `elastic`,
/// in the request's extensions and the `reason` metric label, for each
/// form a quota's answer takes (an arrival time, counters, a sliding
/// window). The request that spends the last nominal unit is `admitted`.
#[tokio::test]
async fn soft_and_elastic_admissions_carry_their_reason_to_handlers_and_the_metric() {
    let algorithms = [
        tollgate::Algorithm::Gcra,
        tollgate::Algorithm::FixedWindow,
        tollgate::Algorithm::SlidingWindow,
        tollgate::Algorithm::TokenBucket,
    ];
    for algorithm in algorithms {
        for (mode, beyond) in [
            (tollgate::Mode::Soft { percent: 100 }, "soft"),
            (tollgate::Mode::Elastic { percent: 100 }, "elastic"),
        ] {
            let recorder = PrometheusBuilder::new().build_recorder();
            let svc = metrics::with_local_recorder(&recorder, || {
                // 2 an hour, 4 with the margin: nothing returns during the test.
                let quota = Quota::builder(algorithm, 2, Duration::from_secs(3_600))
                    .mode(mode)
                    .build()
                    .unwrap();
                let limiter = Limiter::new(MemoryBackend::new(), quota);
                let layer = RateLimitLayer::builder(limiter, GlobalKey)
                    .decision_in_extensions(true)
                    // Idle: an elastic quota has room.
                    .load_signal(|| 0.0)
                    .build();
                layer.layer(service_fn(|request: Request<()>| async move {
                    let reason = request.extensions().get::<tollgate::layer::Reason>();
                    let said = reason.map_or("none", |r| r.as_str());
                    let response = Response::builder().header("x-reason", said);
                    Ok::<_, std::convert::Infallible>(response.body(String::new()).unwrap())
                }))
            });
            let mut said = Vec::new();
            for _ in 0..5 {
                let response = svc.clone().oneshot(Request::new(())).await.unwrap();
                said.push(match response.status() {
                    StatusCode::OK => response.headers()["x-reason"].to_str().unwrap().to_owned(),
                    other => other.as_str().to_owned(),
                });
            }
            let case = format!("{algorithm:?} {mode:?}");
            assert_eq!(
                said,
                ["admitted", "admitted", beyond, beyond, "429"],
                "{case}"
            );
            let got = samples(&recorder);
            let reason =
                |r: &str| got[&format!(r#"tollgate_decision_reasons_total{{reason="{r}"}}"#)];
            assert_eq!(reason("admitted"), 2.0, "{case}");
            assert_eq!(reason(beyond), 2.0, "{case}");
            assert_eq!(reason("quota"), 1.0, "{case}");
        }
    }
}
