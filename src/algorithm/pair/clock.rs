//! The clocks a swap's loop reads once, before its tries, so that each try
//! holds only the word's arithmetic: a token bucket's `now` in ticks of its
//! frame, a sliding window's window and bounds as its first word holds them.

use super::{Frame, Pair, SLIDING_WINDOW, TOKEN_BUCKET, above};
use crate::algorithm::{Params, sliding_window, token_bucket};

/// `now` on a token bucket's frame, in ticks of its refill from the
/// origin: read from the frame alone, before the word, so that the swap's
/// loop holds only the word's arithmetic ([`spent`](Self::spent); on one
/// key from two threads here, 0.96x GCRA's checks a second against 0.93x
/// with the frame read in the loop, medians of eight alternated runs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketClock {
    /// Ticks past the origin (0 behind it).
    ahead: u64,
    /// Ticks behind the origin (0 past it).
    behind: u64,
}

impl BucketClock {
    /// The clock of `frame` at `now`; `None` for a frame that is not a
    /// bucket of `p`'s, or a moment it does not count.
    #[inline]
    pub(crate) fn at(frame: Frame, p: &Params, now: u64) -> Option<BucketClock> {
        if frame.tag() != TOKEN_BUCKET || frame.step != p.refill {
            return None;
        }
        Some(match now.checked_sub(frame.origin()) {
            Some(since) => BucketClock {
                ahead: since.checked_mul(p.refill)?,
                behind: 0,
            },
            None => BucketClock {
                ahead: 0,
                behind: (frame.origin() - now).checked_mul(p.refill)?,
            },
        })
    }

    /// The bucket whose word is `full` (the moment it is full, in this
    /// clock's ticks) checked for `units` (`cost * unit`): the check in
    /// plain numbers, and the word to store in its frame when it admits and
    /// `commit`s; neither for an admission past what the word holds.
    /// GCRA's arithmetic on the bucket's clock, as
    /// `word::token_bucket_spent`'s, from the origin.
    #[inline]
    pub(crate) fn spent(
        self,
        full: u64,
        p: &Params,
        units: u64,
        commit: bool,
    ) -> (Option<token_bucket::Taken>, Option<u64>) {
        // What the bucket lacks now, in units, and the moment it is full
        // from which a spend counts: a clock behind the origin finds the
        // bucket lacking the more.
        let deficit = full.saturating_add(self.behind).saturating_sub(self.ahead);
        let start = full.max(self.ahead);
        let taken = token_bucket::Taken::of(deficit, units);
        if !taken.admits(p) {
            return (Some(taken), None);
        }
        match start.checked_add(units) {
            Some(next) => (Some(taken), commit.then_some(next)),
            None => (None, None),
        }
    }
}

/// `now`'s window on a sliding window's frame, as a word read once holds
/// it, for a check of `cost`: the word's bits above its current count
/// (the window's steps and its previous count, which stay while the
/// window does), and how far that count may go for the cost to fit. A
/// swap's loop reads it once, from the word it loads first (a decode: a
/// multiplication and three more operations). Each try is then a
/// subtraction and a comparison, as short as GCRA's, the retries after a
/// swap that failed on a word of the same window included (where many
/// threads check one key, most swaps fail): a thread holds the line it
/// won about as briefly as GCRA's does. On 16 cores, at 8 and 16 threads
/// on one key, comparing the window's steps alone on a retry took the
/// window from 0.64-0.82x GCRA's checks a second to 0.86-0.91x (medians of
/// four alternated runs); a clock divided out of `now` before the load did
/// less there (0.81-0.89x) and cost a thread alone ~7%.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowClock {
    /// The word of this window and previous count whose current count is 0.
    base: u64,
    /// The current counts, from 0, that the cost fits beside whole: below
    /// [`sliding_window::unweighed_room`] with the previous count, and
    /// within the count's bits after the cost.
    fits: u64,
    /// The window's start.
    start: u64,
    /// Its previous count.
    prev: u64,
    /// Microseconds from its start to `now`.
    elapsed: u64,
    /// The bits each count takes.
    bits: u32,
    /// The check's cost.
    cost: u64,
}

impl WindowClock {
    /// The clock of `pair`'s frame at `now` for a check of `cost`, if
    /// `pair` stores `now`'s window; `None` for a pair that is not a
    /// sliding window of `p`'s, or stores another window.
    #[inline(always)]
    pub(crate) fn of(pair: Pair, p: &Params, now: u64, cost: u64) -> Option<WindowClock> {
        if pair.frame.tag() != SLIDING_WINDOW {
            return None;
        }
        let (c, bits) = pair.sliding_window(p)?;
        let elapsed = now.checked_sub(c.start)?;
        // `from_pair` holds `bits` to 1..=32.
        let counted = (1u64 << bits).saturating_sub(cost);
        let room = sliding_window::unweighed_room(p, cost).saturating_sub(c.prev);
        (elapsed < p.period.get()).then_some(WindowClock {
            base: pair.word - c.curr,
            fits: room.min(counted),
            start: c.start,
            prev: c.prev,
            elapsed,
            bits,
            cost,
        })
    }

    /// The counters `word` holds, if it stores the clock's window and
    /// previous count: its current count read, the rest compared, not
    /// decoded.
    #[inline(always)]
    pub(crate) fn counters(&self, word: u64) -> Option<sliding_window::Counters> {
        let curr = word.wrapping_sub(self.base);
        (above(curr, self.bits) == 0).then(|| self.with(curr))
    }

    /// The counters of the clock's window with `curr` its current count.
    #[inline(always)]
    fn with(&self, curr: u64) -> sliding_window::Counters {
        sliding_window::Counters {
            start: self.start,
            prev: self.prev,
            curr,
        }
    }

    /// The word with the cost added to its current count, and the
    /// admission it is, when the word stores the clock's window and
    /// previous count and the cost fits beside both counts whole
    /// ([`sliding_window::admitted_unweighed`], what
    /// [`sliding_window::admit_or_check`] admits without weighing), the
    /// count after it within its bits: the word plus the cost (the current
    /// count is its lowest number). `None` otherwise (another window, a
    /// count near the limit), for the full check.
    #[inline(always)]
    pub(crate) fn added(&self, word: u64) -> Option<(u64, sliding_window::Admitted)> {
        let curr = word.wrapping_sub(self.base);
        if curr >= self.fits {
            return None;
        }
        Some((
            word + self.cost,
            sliding_window::Admitted::of(&self.with(curr), self.cost, self.elapsed),
        ))
    }
}
