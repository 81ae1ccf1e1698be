//! A state of two numbers swapped by a backend as one 64-bit word: the
//! token bucket whose token is not whole microseconds and that `word.rs`
//! does not keep in one number (refilling more than 31 units a
//! microsecond), the fixed window of a million a second or more, the
//! sliding window. Each algorithm owns its numbers' meaning (`to_pair`,
//! `from_pair` in its file); this file owns where they sit, and the
//! checks a backend makes on them as they are.
//!
//! Both numbers do not fit one word as they are: the first is a moment
//! (51 bits of microseconds since the epoch). So a [`Pair`] keeps the
//! moment as steps from an origin in a [`Frame`] beside the word, and the
//! second number in the word's low bits; a token bucket keeps the moment
//! it is full as GCRA does on its own clock (`word.rs`), in ticks of a
//! unit's refill since the origin. A backend keeps the frame still
//! while it swaps the word (it changes it only where it stores a state
//! anew, under a lock): a check then costs a 64-bit compare-and-swap, as an
//! arrival time's does, where swapping both numbers together took a 128-bit
//! one that costs more on every core and more again where many threads
//! check one key. A state whose numbers no longer fit beside its frame (its
//! moment moved past what the word's high bits count) is stored anew, in a
//! frame of its own.

use super::{Params, State, fixed_window, sliding_window, token_bucket};

/// The tags of a [`Frame`]: which algorithm's numbers its word holds.
const TOKEN_BUCKET: u64 = 1;
const FIXED_WINDOW: u64 = 2;
const SLIDING_WINDOW: u64 = 3;
/// Where a frame's head keeps the tag, and the width of the second number.
const TAG: u32 = 62;
const WIDTH: u32 = 56;
/// The origin's bits, below the width and the tag.
const ORIGIN: u64 = (1 << WIDTH) - 1;

/// A state of two numbers: the second in `word`'s low bits, the first as
/// `word`'s high bits counted in `frame`'s steps from its origin (a token
/// bucket's: see [`Frame`]). The first number is always the state's
/// expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pair {
    pub(crate) frame: Frame,
    pub(crate) word: u64,
}

/// What a [`Pair`]'s word means: the algorithm (a tag), how many low bits
/// its second number takes, the origin of its first and what one step of
/// it is worth (a microsecond; a window's period, as windows start on its
/// multiples). A token bucket's word is instead the moment it is full, in
/// ticks since the origin, `step` (its `refill`) ticks a microsecond:
/// `(full_at - origin) * refill - r` for its two numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    /// The tag (top two bits), the second number's width less one (six
    /// bits), the origin (56 bits).
    head: u64,
    /// Microseconds a step, or a token bucket's ticks a microsecond; never
    /// 0.
    step: u64,
}

impl Frame {
    /// A frame for `tag`'s numbers whose first starts at `origin` (step 0)
    /// and whose second takes `width` bits (1 to 64: at 64, the frame holds
    /// its origin's moment alone); `None` where the origin does not fit.
    #[inline]
    fn new(tag: u64, origin: u64, width: u32, step: u64) -> Option<Frame> {
        debug_assert!((1..=64).contains(&width) && step > 0);
        (origin <= ORIGIN).then_some(Frame {
            head: tag << TAG | u64::from(width - 1) << WIDTH | origin,
            step,
        })
    }

    #[inline]
    fn tag(&self) -> u64 {
        self.head >> TAG
    }

    #[inline]
    fn width(&self) -> u32 {
        (self.head >> WIDTH) as u32 % 64 + 1
    }

    #[inline]
    fn origin(&self) -> u64 {
        self.head & ORIGIN
    }

    /// The numbers `word` holds in a token bucket's frame: the moment it
    /// is full and the units refilled past full by then. Every word a
    /// frame's [`word`](Self::word) makes reads back exactly; wrapping
    /// arithmetic keeps any other from panicking.
    #[inline]
    fn bucket_numbers(&self, word: u64) -> (u64, u64) {
        let steps = word.div_ceil(self.step);
        let first = self.origin().wrapping_add(steps);
        (first, steps.wrapping_mul(self.step).wrapping_sub(word))
    }

    /// The numbers `word` holds in a window's frame, as
    /// [`bucket_numbers`](Self::bucket_numbers) reads a bucket's.
    #[inline]
    fn window_numbers(&self, word: u64) -> (u64, u64) {
        let width = self.width();
        let steps = above(word, width);
        let first = self.origin().wrapping_add(steps.wrapping_mul(self.step));
        (first, word & (u64::MAX >> (64 - width)))
    }

    /// The word holding `first` and `second` in this frame; `None` where
    /// `first` is before the origin or past what the high bits count, not
    /// a whole number of steps from it, or `second` wider than the frame
    /// says. A step of a microsecond needs no division.
    #[inline]
    fn word(&self, first: u64, second: u64) -> Option<u64> {
        let from = first.checked_sub(self.origin())?;
        if self.tag() == TOKEN_BUCKET {
            return from.checked_mul(self.step)?.checked_sub(second);
        }
        let width = self.width();
        let steps = if self.step == 1 {
            from
        } else if from % self.step == 0 {
            from / self.step
        } else {
            return None;
        };
        let fits = steps >> (64 - width) == 0 && above(second, width) == 0;
        fits.then(|| (steps << (width - 1)) << 1 | second)
    }
}

/// `n`'s bits above its lowest `width` (1 to 64): a shift by 64 is none in
/// Rust, so it is made in two.
#[inline(always)]
fn above(n: u64, width: u32) -> u64 {
    (n >> (width - 1)) >> 1
}

impl Pair {
    /// The fixed window a window's pair holds (its tag unread), for a
    /// quota of `p`; `None` for an end before the period.
    #[inline(always)]
    fn fixed_window(&self, p: &Params) -> Option<fixed_window::Window> {
        let (end, count) = self.frame.window_numbers(self.word);
        let start = end.checked_sub(p.period.get())?;
        Some(fixed_window::Window { start, count })
    }

    /// The counters a window's pair holds (its tag unread), for a quota of
    /// `p`, with the bits each count takes; `None` for numbers no sliding
    /// window of `p` makes.
    #[inline(always)]
    fn sliding_window(&self, p: &Params) -> Option<(sliding_window::Counters, u32)> {
        let (expiry, counts) = self.frame.window_numbers(self.word);
        let bits = self.frame.width() / 2;
        let c = sliding_window::Counters::from_pair(expiry, counts, bits, p)?;
        Some((c, bits))
    }

    /// The moment after which the pair means no state: its first number.
    #[inline]
    pub(crate) fn expiry(&self) -> u64 {
        let (frame, word) = (self.frame, self.word);
        let (first, _) = if frame.tag() == TOKEN_BUCKET {
            frame.bucket_numbers(word)
        } else {
            frame.window_numbers(word)
        };
        first
    }
}

/// The bits a count up to `n` takes.
#[inline]
fn bits(n: u64) -> u32 {
    64 - n.leading_zeros()
}

/// How `p`'s state of two numbers is laid out: its tag, its numbers, the
/// width of the second, the step of the first.
#[inline(always)]
fn layout(state: &State, p: &Params) -> Option<(u64, u64, u64, u32, u64)> {
    Some(match state {
        // A bucket's word has no field of its own for `r` (see [`Frame`]):
        // its width is never read.
        State::TokenBucket(b) => {
            let (full_at, r) = b.to_pair(p)?;
            (TOKEN_BUCKET, full_at, r, 1, p.refill)
        }
        State::FixedWindow(w) => {
            let end = w.start.checked_add(p.period.get())?;
            // A calendar's windows start where its time zone says, not on
            // multiples of the period.
            let step = if p.calendar.is_some() {
                1
            } else {
                p.period.get()
            };
            (FIXED_WINDOW, end, w.count, bits(p.capacity), step)
        }
        State::SlidingWindow(c) => {
            let (expiry, counts, bits) = c.to_pair(p)?;
            (SLIDING_WINDOW, expiry, counts, 2 * bits, p.period.get())
        }
        State::Word(_) | State::SlidingLog(_) => return None,
    })
}

impl State {
    /// The state as two numbers in a frame of its own (its first number
    /// the frame's origin), if it is one of the states kept so and fits.
    #[inline(always)]
    pub(crate) fn to_pair(&self, p: &Params) -> Option<Pair> {
        let (tag, first, second, width, step) = layout(self, p)?;
        // At the origin a window's word is its second number alone. A
        // bucket's moment is `step - r` ticks past an origin a microsecond
        // before its full moment, so that units refilled past full by then
        // (`r`, under `step`) count.
        let (origin, word) = if tag == TOKEN_BUCKET {
            (first.checked_sub(1)?, step.checked_sub(second)?)
        } else if above(second, width) == 0 {
            (first, second)
        } else {
            return None;
        };
        let frame = Frame::new(tag, origin, width, step)?;
        Some(Pair { frame, word })
    }

    /// The word holding the state in `frame`, where a backend keeps the
    /// frame still: `None` where the state is not laid out as the frame
    /// says (another algorithm's, another quota's) or does not fit it.
    #[inline]
    pub(crate) fn to_word_in(&self, frame: Frame, p: &Params) -> Option<u64> {
        let (tag, first, second, width, step) = layout(self, p)?;
        let same = tag == frame.tag() && width == frame.width() && step == frame.step;
        if same {
            frame.word(first, second)
        } else {
            None
        }
    }

    /// The state a [`Pair`] holds, for a quota of `p`; `None` for numbers
    /// that no state of `p` makes.
    #[inline(always)]
    pub(crate) fn from_pair(pair: Pair, p: &Params) -> Option<State> {
        let (frame, word) = (pair.frame, pair.word);
        Some(match frame.tag() {
            TOKEN_BUCKET => {
                let (full_at, r) = frame.bucket_numbers(word);
                State::TokenBucket(token_bucket::Bucket::from_pair(full_at, r, p)?)
            }
            FIXED_WINDOW => State::FixedWindow(pair.fixed_window(p)?),
            SLIDING_WINDOW => State::SlidingWindow(pair.sliding_window(p)?.0),
            _ => return None,
        })
    }
}

/// A fixed window's pair counting `cost` at `now` ([`fixed_window::count`]),
/// with the word to store in its frame when it admits and `commit`s: in
/// the stored window, the word plus the cost (the count is its low number);
/// a later window made a word of the frame. Neither for a pair that is not
/// such a window's, nor for a window or count the frame does not hold.
#[inline]
pub(crate) fn fixed_window_counted(
    pair: Pair,
    p: &Params,
    cost: u64,
    now: u64,
    commit: bool,
) -> (Option<fixed_window::Counted>, Option<u64>) {
    let frame = pair.frame;
    let stored = match frame.tag() {
        FIXED_WINDOW => pair.fixed_window(p),
        _ => None,
    };
    let Some(stored @ fixed_window::Window { start, .. }) = stored else {
        return (None, None);
    };
    let stored = State::FixedWindow(stored);
    let counted = fixed_window::count(Some(&stored), p, cost, now);
    if !(counted.allowed && commit) {
        return (Some(counted), None);
    }
    let w = counted.window();
    let next = if w.start == start {
        let count = w.count + cost;
        (above(count, frame.width()) == 0).then_some(pair.word + cost)
    } else {
        frame.word(w.start.saturating_add(p.period.get()), w.count + cost)
    };
    match next {
        Some(next) => (Some(counted), Some(next)),
        None => (None, None),
    }
}

mod clock;

pub(crate) use clock::{BucketClock, WindowClock};

#[cfg(test)]
mod tests;
