//! How loaded the server is: the signal that elastic quotas and load
//! shedding act on, measured by the layer or supplied by the user.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How loaded the server is, as a fraction of its capacity: 0 idle, 1 at
/// capacity, more when overloaded. The layer asks once per request, so it
/// must be cheap (read an atomic, not the kernel).
///
/// [`MeasuredLoad`] is the layer's own; implement this for anything else
/// (CPU, a queue's depth, a downstream's health). A closure returning `f64`
/// is one. A signal that cannot tell should say 1 or more: elastic quotas
/// then stay at their limit, and only critical traffic is served.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tollgate::layer::LoadSignal;
///
/// let queued = Arc::new(AtomicU64::new(0));
/// let depth = Arc::clone(&queued);
/// // Full at 500 queued jobs.
/// let signal = move || depth.load(Ordering::Relaxed) as f64 / 500.0;
/// queued.store(250, Ordering::Relaxed);
/// assert_eq!(signal.load(), 0.5);
/// ```
pub trait LoadSignal: Send + Sync + 'static {
    /// The load now: 0 idle, 1 at capacity.
    fn load(&self) -> f64;
}

impl<F: Fn() -> f64 + Send + Sync + 'static> LoadSignal for F {
    fn load(&self) -> f64 {
        self()
    }
}

/// Latency samples older than this no longer count: with no requests
/// completing (all shed, say), the signal must not stay stuck at overload.
const LATENCY_WINDOW: Duration = Duration::from_secs(1);

/// Weight of a new latency sample in the moving average.
const ALPHA: f64 = 0.2;

/// The load the layer measures itself: requests in flight in the wrapped
/// service (from the decision until the response body is over) against
/// `max_in_flight`, and their latency (an exponentially weighted moving
/// average over the last second) against `target_latency`. The load is the
/// larger of the two ratios.
///
/// Clones share the measurements; give one to several layers to measure
/// their services together.
#[derive(Clone)]
pub struct MeasuredLoad {
    gauge: Arc<Gauge>,
}

struct Gauge {
    max_in_flight: f64,
    target_micros: f64,
    in_flight: AtomicU64,
    /// The moving average in microseconds, as `f64` bits.
    average: AtomicU64,
    /// When the last sample was taken, in microseconds since `started`.
    last_sample: AtomicU64,
    started: Instant,
}

impl fmt::Debug for MeasuredLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeasuredLoad")
            .field("in_flight", &self.in_flight())
            .field("latency", &self.latency())
            .finish_non_exhaustive()
    }
}

impl MeasuredLoad {
    /// Full at `max_in_flight` requests under way (at least 1) or at an
    /// average latency of `target_latency` (at least 1 µs).
    pub fn new(max_in_flight: u64, target_latency: Duration) -> Self {
        MeasuredLoad {
            gauge: Arc::new(Gauge {
                max_in_flight: max_in_flight.max(1) as f64,
                target_micros: (target_latency.as_micros() as f64).max(1.0),
                in_flight: AtomicU64::new(0),
                average: AtomicU64::new(0f64.to_bits()),
                last_sample: AtomicU64::new(0),
                started: Instant::now(),
            }),
        }
    }

    /// Requests under way.
    pub fn in_flight(&self) -> u64 {
        self.gauge.in_flight.load(Ordering::Relaxed)
    }

    /// The moving average of recent latencies; zero when no request
    /// completed in the last second.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.gauge.recent_average() as u64)
    }

    /// Counts a request until the returned guard is dropped.
    pub(crate) fn start(&self) -> InFlight {
        self.gauge.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            gauge: Arc::clone(&self.gauge),
            since: Instant::now(),
        }
    }
}

impl Gauge {
    fn now_micros(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn recent_average(&self) -> f64 {
        let last = self.last_sample.load(Ordering::Relaxed);
        if last == 0 || self.now_micros().saturating_sub(last) > LATENCY_WINDOW.as_micros() as u64 {
            return 0.0;
        }
        f64::from_bits(self.average.load(Ordering::Relaxed))
    }

    fn record(&self, latency: Duration) {
        let sample = latency.as_micros() as f64;
        let previous = self.recent_average();
        let average = if previous == 0.0 {
            sample
        } else {
            previous + ALPHA * (sample - previous)
        };
        // Two samples racing may lose one: harmless for a moving average,
        // and cheaper than a compare-and-swap loop.
        self.average.store(average.to_bits(), Ordering::Relaxed);
        self.last_sample
            .store(self.now_micros().max(1), Ordering::Relaxed);
    }
}

impl LoadSignal for MeasuredLoad {
    fn load(&self) -> f64 {
        let g = &self.gauge;
        let in_flight = g.in_flight.load(Ordering::Relaxed) as f64 / g.max_in_flight;
        in_flight.max(g.recent_average() / g.target_micros)
    }
}

/// A request counted by a [`MeasuredLoad`]; dropping it records its latency.
pub(crate) struct InFlight {
    gauge: Arc<Gauge>,
    since: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.record(self.since.elapsed());
        self.gauge.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_is_the_larger_of_in_flight_and_latency_ratios() {
        let m = MeasuredLoad::new(4, Duration::from_secs(10));
        assert_eq!(m.load(), 0.0);
        let a = m.start();
        let b = m.start();
        assert_eq!(m.in_flight(), 2);
        assert_eq!(m.load(), 0.5);
        drop((a, b));
        assert_eq!(m.in_flight(), 0);
        assert!(
            m.load() < 0.01,
            "quick requests, far under the target latency"
        );

        let slow = MeasuredLoad::new(100, Duration::from_micros(1));
        let request = slow.start();
        std::thread::sleep(Duration::from_millis(2));
        drop(request);
        assert!(slow.load() > 1.0, "latency over target: {}", slow.load());
    }
}
