//! One quota's stored state, as a store outside the crate keeps it.

use std::collections::VecDeque;
use std::fmt;

use crate::algorithm::State;
use crate::algorithm::fixed_window::Window;
use crate::algorithm::sliding_window::Counters;
use crate::algorithm::token_bucket::Bucket;
use crate::clock::Timestamp;
use crate::quota::{EXACT_MAX, Quota};

/// What a store keeps for one key and one quota: opaque, and serialisable
/// with [`to_bytes`](QuotaState::to_bytes) so that any store (a SQL row, a
/// DynamoDB item, a file) can hold it.
///
/// A store outside the crate implements [`Backend`](crate::Backend) by
/// loading one state per quota of the request's set (keyed by the client key
/// and [`QuotaSet::state_ids`](crate::QuotaSet::state_ids)), calling
/// [`QuotaSet::decide`](crate::QuotaSet::decide), and saving what it changed,
/// all in one transaction. `tests/engine/custom_backend.rs` is a complete example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaState(pub(crate) State);

/// Bytes that are not a state written by [`QuotaState::to_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateError;

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a rate-limit state written by QuotaState::to_bytes")
    }
}

impl std::error::Error for StateError {}

// The first byte says which algorithm's state follows; then its numbers as
// little-endian u64s. Stable: stores keep these bytes across versions.
const TOKEN_BUCKET: u8 = 1;
// One number (an arrival time, or a window's end plus its count).
const WORD: u8 = 2;
const FIXED_WINDOW: u8 = 3;
const SLIDING_WINDOW: u8 = 4;
const SLIDING_LOG: u8 = 5;

impl QuotaState {
    /// The state as bytes, for a store to keep.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (tag, numbers): (u8, Vec<u64>) = match &self.0 {
            State::TokenBucket(b) => (TOKEN_BUCKET, vec![b.level, b.at]),
            State::Word(n) => (WORD, vec![*n]),
            State::FixedWindow(w) => (FIXED_WINDOW, vec![w.start, w.count]),
            State::SlidingWindow(c) => (SLIDING_WINDOW, vec![c.start, c.prev, c.curr]),
            State::SlidingLog(log) => (SLIDING_LOG, log.iter().copied().collect()),
        };
        let mut bytes = Vec::with_capacity(1 + 8 * numbers.len());
        bytes.push(tag);
        for n in numbers {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        bytes
    }

    /// A state from bytes written by [`to_bytes`](QuotaState::to_bytes).
    /// Bytes from anywhere else are refused, never trusted: every number must
    /// be in the range the algorithms keep (below 2^53) and a log in order.
    pub fn from_bytes(bytes: &[u8]) -> Result<QuotaState, StateError> {
        let (&tag, rest) = bytes.split_first().ok_or(StateError)?;
        if rest.len() % 8 != 0 {
            return Err(StateError);
        }
        let numbers: Vec<u64> = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        if numbers.iter().any(|&n| n >= EXACT_MAX) {
            return Err(StateError);
        }
        let state = match (tag, numbers.as_slice()) {
            (TOKEN_BUCKET, &[level, at]) => State::TokenBucket(Bucket { level, at }),
            (WORD, &[n]) => State::Word(n),
            (FIXED_WINDOW, &[start, count]) => State::FixedWindow(Window { start, count }),
            (SLIDING_WINDOW, &[start, prev, curr]) => {
                State::SlidingWindow(Counters { start, prev, curr })
            }
            (SLIDING_LOG, log) if log.is_sorted() => {
                State::SlidingLog(Box::new(VecDeque::from(log.to_vec())))
            }
            _ => return Err(StateError),
        };
        Ok(QuotaState(state))
    }

    /// When this state comes to mean the same as no state at all for
    /// `quota`: a store may delete it then (a Redis TTL, a sweep).
    pub fn expires_at(&self, quota: &Quota) -> Timestamp {
        Timestamp::from_micros(self.0.expires_at(&quota.params))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_and_garbage_is_refused() {
        let states = [
            State::TokenBucket(Bucket { level: 7, at: 9 }),
            State::Word(1_760_000_000_000_000),
            State::FixedWindow(Window {
                start: 60,
                count: 3,
            }),
            State::SlidingWindow(Counters {
                start: 5,
                prev: 2,
                curr: 1,
            }),
            State::SlidingLog(Box::new(VecDeque::from(vec![1, 2, 2, 9]))),
        ];
        for state in states {
            let state = QuotaState(state);
            assert_eq!(QuotaState::from_bytes(&state.to_bytes()), Ok(state));
        }
        for garbage in [
            &[][..],
            &[9, 0, 0, 0, 0, 0, 0, 0, 0],
            &[WORD, 1, 2],
            &[WORD, 0, 0, 0, 0, 0, 0, 0, 0x80],
            &[SLIDING_LOG, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert_eq!(QuotaState::from_bytes(garbage), Err(StateError));
        }
    }
}
