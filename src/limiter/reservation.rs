//! [`Reservation`]: units spent ahead of a request's outcome, and how it
//! is settled.

use std::fmt;

use super::{Error, Limiter};
use crate::backend::{Backend, Reserved};
use crate::decision::Decision;

/// Units spent ahead of a request's outcome, made by
/// [`Limiter::reserve`]: kept or given back once the outcome is known.
/// Dropped unsettled, it is kept: a request whose outcome never came (the
/// caller gave up, a task panicked) counts.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, MemoryBackend, Quota, Settle};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(
///     MemoryBackend::new(),
///     Quota::gcra(3, Duration::from_secs(60)).build()?,
/// );
/// // Held while in flight: the second sees the first.
/// let a = limiter.reserve("k", 1).await?;
/// let b = limiter.reserve("k", 1).await?;
/// assert_eq!(b.decision().remaining(), 1);
/// drop(a); // never settled: kept
/// let left = b.settle(Settle::GiveBack).await?.expect("given back");
/// assert_eq!(left.remaining(), 2);
/// # Ok(())
/// # }
/// ```
#[must_use = "a reservation dropped unsettled is kept; settle it to give it back"]
pub struct Reservation<'a, B> {
    pub(super) limiter: &'a Limiter<B>,
    pub(super) key: Box<str>,
    pub(super) cost: u64,
    pub(super) reserved: Reserved,
}

/// How a [`Reservation`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settle {
    /// The outcome counts: the units stay spent.
    Keep,
    /// The outcome does not count: the units go back, as if the
    /// reservation had not happened (as far as that is still known: a
    /// window that has rolled over since gives nothing back).
    GiveBack,
    /// The request's real cost, known once it was served (the tokens an
    /// LLM answer took): what was reserved beyond it goes back (as
    /// [`GiveBack`](Settle::GiveBack) gives back), and what it took beyond
    /// the reservation is charged even past the limit, putting the key in
    /// debt: it is refused until the debt has returned, with a
    /// `Retry-After` that covers it ([`Backend::charge`]).
    Actual(u64),
}

impl<B> fmt::Debug for Reservation<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("cost", &self.cost)
            .field("allowed", &self.reserved.decision().allowed())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Reservation<'_, B> {
    /// The decision made when reserving: whether the request may proceed,
    /// and what each quota reported.
    pub fn decision(&self) -> &Decision {
        self.reserved.decision()
    }

    /// Keeps the units spent (what dropping the reservation does too).
    pub fn keep(self) {}

    /// Gives the units back; returns what is left then, as a peek at cost
    /// 0 reports it (for a refused reservation, which spent nothing, its
    /// own decision).
    pub async fn give_back(self) -> Result<Decision, Error> {
        let Reservation {
            limiter,
            key,
            cost,
            reserved,
        } = self;
        limiter.give_back_reserved(&key, cost, 1, &reserved).await
    }

    /// Ends the reservation as `how` says: `None` when the units stay as
    /// they are (kept, or an actual cost equal to the reservation's), else
    /// what is left once given back or charged. A refused reservation
    /// spent nothing and was not served: settling it changes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryBackend, Quota, Settle};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 1 000 tokens a minute; 500 reserved for an answer not yet written.
    /// let tokens = Limiter::new(
    ///     MemoryBackend::new(),
    ///     Quota::fixed_window(1_000, Duration::from_secs(60)).build()?,
    /// );
    /// let answer = tokens.reserve("key", 500).await?;
    /// assert!(answer.decision().allowed());
    /// // It took 1 200: the 700 beyond are charged, past the limit.
    /// let left = answer.settle(Settle::Actual(1_200)).await?.expect("charged");
    /// assert_eq!(left.remaining(), 0);
    /// assert!(!tokens.check("key", 1).await?.allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn settle(self, how: Settle) -> Result<Option<Decision>, Error> {
        match how {
            Settle::Keep => Ok(None),
            Settle::GiveBack => self.give_back().await.map(Some),
            Settle::Actual(actual) => {
                let Reservation {
                    limiter,
                    key,
                    cost,
                    reserved,
                } = self;
                limiter.settle_reserved(&key, cost, &reserved, actual).await
            }
        }
    }
}
