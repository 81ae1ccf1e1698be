//! Log lines a client can cause, rate-limited: a failure that repeats on
//! every request (Redis down) or every reload tick (an invalid rules file)
//! is written once per interval, with the count of the repeats left out.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often one repeated line is written at most.
pub(crate) const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// One log line's budget: the first occurrence is written, later ones only
/// once `REPEAT_EVERY` has passed since the last written.
#[derive(Debug)]
pub(crate) struct LogLimit {
    every_ms: u64,
    /// When the next line may be written, in ms since the process's first check.
    next_ms: AtomicU64,
    skipped: AtomicU64,
}

impl LogLimit {
    /// A budget of one line per `REPEAT_EVERY`; `const`, for a `static`.
    pub(crate) const fn new() -> Self {
        LogLimit {
            every_ms: REPEAT_EVERY.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// Whether to write the line now: `Some` with the count of the lines
    /// left out since the last one written (shown by its `Display`).
    pub(crate) fn admit(&self) -> Option<Skipped> {
        static START: OnceLock<Instant> = OnceLock::new();
        let now = START.get_or_init(Instant::now).elapsed().as_millis();
        self.admit_at(u64::try_from(now).unwrap_or(u64::MAX))
    }

    fn admit_at(&self, now_ms: u64) -> Option<Skipped> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let due = now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(self.every_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if due {
            Some(Skipped(self.skipped.swap(0, Ordering::Relaxed)))
        } else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Lines left out since the last written: displays as
/// ` (N more since last report)`, or nothing when there were none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skipped(pub(crate) u64);

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} more since last report)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_written_and_repeats_are_counted_into_the_next() {
        let limit = LogLimit::new();
        let every = REPEAT_EVERY.as_millis() as u64;
        assert_eq!(limit.admit_at(5), Some(Skipped(0)));
        for t in 6..1240 {
            assert_eq!(limit.admit_at(t), None);
        }
        assert_eq!(limit.admit_at(5 + every - 1), None);
        assert_eq!(limit.admit_at(5 + every), Some(Skipped(1235)));
        assert_eq!(limit.admit_at(5 + 3 * every), Some(Skipped(0)));
    }

    #[test]
    fn the_count_reads_as_a_suffix() {
        assert_eq!(Skipped(0).to_string(), "");
        assert_eq!(Skipped(1234).to_string(), " (1234 more since last report)");
    }

    #[test]
    fn threads_racing_write_one_line_between_them() {
        let limit = LogLimit::new();
        let written = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if limit.admit_at(7).is_some() {
                            written.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(written.load(Ordering::Relaxed), 1);
        assert_eq!(
            limit.admit_at(7 + REPEAT_EVERY.as_millis() as u64),
            Some(Skipped(3999))
        );
    }
}
