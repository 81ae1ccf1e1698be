//! The limiter outside HTTP: push notifications, at most 10 a minute per
//! teacher and 3 s apart (ClassDojo's requirement).
//!
//! Run with `cargo run --example push_notifications`.

use std::time::Duration;

use tollgate::{Limiter, MemoryBackend, Quota, QuotaSet};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quotas = QuotaSet::new(
        "push",
        [
            Quota::sliding_log(10, Duration::from_secs(60))
                .name("per-minute")
                .build()?,
            Quota::min_interval(Duration::from_secs(3)).build()?,
        ],
    )?;
    let limiter = Limiter::new(MemoryBackend::new(), quotas);

    for attempt in 1..=4 {
        let decision = limiter.check("teacher:17", 1).await?;
        if decision.allowed() {
            println!(
                "attempt {attempt}: sent ({} left this minute)",
                decision.quotas()[0].remaining()
            );
        } else {
            let wait = decision.retry_after().unwrap_or_default();
            println!("attempt {attempt}: held back, retry in {wait:?}");
            tokio::time::sleep(wait).await;
            let again = limiter.check("teacher:17", 1).await?;
            println!(
                "attempt {attempt}: after waiting, allowed = {}",
                again.allowed()
            );
        }
    }
    Ok(())
}
