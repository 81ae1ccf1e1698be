//! A real Redis Cluster of three masters: a decision's keys share one hash
//! tag, so every script runs on one node; keys spread over all nodes; counts
//! stay exact. On every server of the matrix: Redis 7.0, Redis 8.2 and
//! Valkey 9.1 (see `support/redis.rs`).

#![cfg(feature = "redis")]

use crate::support::redis as redis_support;

use std::time::Duration;

use redis_support::{RedisCluster, Server};
use tollgate::{Limiter, Quota, QuotaSet, RedisBackend};

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_across_slots_are_exact_on_redis_7_0() {
    decisions_across_slots_are_exact(Server::Redis7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_across_slots_are_exact_on_redis_8_2() {
    decisions_across_slots_are_exact(Server::Redis8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_across_slots_are_exact_on_valkey_9_1() {
    decisions_across_slots_are_exact(Server::Valkey9).await;
}

async fn decisions_across_slots_are_exact(server: Server) {
    server.check_version();
    let cluster = RedisCluster::of(server);
    let quotas = QuotaSet::new(
        "cluster",
        [
            Quota::sliding_log(5, HOUR).name("log").build().unwrap(),
            Quota::gcra(8, HOUR).name("gcra").build().unwrap(),
            Quota::fixed_window(100, HOUR)
                .name("window")
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    // Two servers of a fleet, each with its own cluster connection.
    let fleet: Vec<RedisBackend> = (0..2)
        .map(|_| {
            RedisBackend::from_cluster_urls(cluster.urls())
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap()
        })
        .collect();
    let keys: Vec<String> = (0..150)
        .map(|i| format!("user:{i}"))
        .chain(["{braces}".to_owned(), "}".to_owned(), String::new()])
        .collect();

    let mut tasks = Vec::new();
    for backend in &fleet {
        for _ in 0..4 {
            let limiter = Limiter::new(backend.clone(), quotas.clone());
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = vec![0u64; keys.len()];
                for (i, key) in keys.iter().enumerate() {
                    // Eight attempts per key in all: 2 servers x 4 tasks.
                    let d = limiter.check(key, 1).await.expect("a decision");
                    admitted[i] += u64::from(d.allowed());
                }
                admitted
            }));
        }
    }
    let mut admitted = vec![0u64; keys.len()];
    for t in tasks {
        for (total, n) in admitted.iter_mut().zip(t.await.unwrap()) {
            *total += n;
        }
    }
    for (key, n) in keys.iter().zip(&admitted) {
        assert_eq!(*n, 5, "key {key:?}");
    }
    // The keys are spread over every master.
    for node in &cluster.nodes {
        let size: u64 = node.cli(&["DBSIZE"]).parse().unwrap();
        assert!(size > 0, "node {} holds nothing", node.port());
    }
    // Each master loaded the script when first asked.
    let loads: u64 = fleet.iter().map(|b| b.stats().script_loads).sum();
    assert!(loads >= 3, "{loads}");
    assert_eq!(fleet.iter().map(|b| b.stats().failures).sum::<u64>(), 0);
}
