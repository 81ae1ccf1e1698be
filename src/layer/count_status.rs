//! Which responses a response-aware limit counts (see
//! [`RateLimitLayerBuilder::count_status`](super::RateLimitLayerBuilder::count_status)).

use std::fmt;
use std::str::FromStr;

use http::StatusCode;

/// A set of response statuses: single codes (`401`) and classes (`5xx`).
/// A limit that counts only these reserves each request's cost before it
/// is served, and keeps it only when the response's status is in the set
/// (else gives it back): "5 failed logins per 15 minutes, successes free"
/// is `"401, 403".parse::<CountStatus>()`.
///
/// ```
/// use tollgate::CountStatus;
/// use http::StatusCode;
///
/// let failures: CountStatus = "401, 403, 5xx".parse().unwrap();
/// assert!(failures.contains(StatusCode::FORBIDDEN));
/// assert!(failures.contains(StatusCode::BAD_GATEWAY));
/// assert!(!failures.contains(StatusCode::OK));
/// ```
#[derive(Clone, PartialEq, Eq, Default)]
pub struct CountStatus {
    /// One bit per code from 100 to 999 (what `StatusCode` allows).
    bits: [u64; 15],
}

impl CountStatus {
    /// The empty set (counts nothing).
    pub fn new() -> Self {
        CountStatus::default()
    }

    /// Adds one status.
    pub fn status(mut self, status: StatusCode) -> Self {
        let i = usize::from(status.as_u16() - 100);
        self.bits[i / 64] |= 1 << (i % 64);
        self
    }

    /// Adds a class: `class(5)` is every 5xx status. Classes beyond 1 to 9
    /// are ignored.
    pub fn class(mut self, class: u8) -> Self {
        if (1..=9).contains(&class) {
            let first = u16::from(class) * 100;
            for code in first..first + 100 {
                if let Ok(status) = StatusCode::from_u16(code) {
                    self = self.status(status);
                }
            }
        }
        self
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: StatusCode) -> bool {
        let i = usize::from(status.as_u16().saturating_sub(100));
        self.bits
            .get(i / 64)
            .is_some_and(|word| word & (1 << (i % 64)) != 0)
    }

    /// Adds one item: a code (`"401"`) or a class (`"5xx"`, any case).
    pub fn item(self, item: &str) -> Result<Self, CountStatusError> {
        let item = item.trim();
        let bad = || CountStatusError(item.to_owned());
        match item.as_bytes() {
            [c @ b'1'..=b'9', x, y]
                if x.eq_ignore_ascii_case(&b'x') && y.eq_ignore_ascii_case(&b'x') =>
            {
                Ok(self.class(c - b'0'))
            }
            _ => {
                let code: u16 = item.parse().map_err(|_| bad())?;
                let status = StatusCode::from_u16(code).map_err(|_| bad())?;
                Ok(self.status(status))
            }
        }
    }
}

/// A comma-separated list of codes and classes: `"401, 403, 5xx"`.
impl FromStr for CountStatus {
    type Err = CountStatusError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split(',').try_fold(CountStatus::new(), CountStatus::item)
    }
}

impl fmt::Debug for CountStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let codes = (100..1000u16)
            .filter_map(|c| StatusCode::from_u16(c).ok())
            .filter(|s| self.contains(*s))
            .map(|s| s.as_u16());
        f.debug_set().entries(codes).finish()
    }
}

/// An item of a [`CountStatus`] that is neither a status code (100 to 999)
/// nor a class (`1xx` to `9xx`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountStatusError(pub String);

impl fmt::Display for CountStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is neither a status code (100-999) nor a class such as 5xx",
            self.0
        )
    }
}

impl std::error::Error for CountStatusError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_classes_parse_and_nothing_else_does() {
        let set: CountStatus = "401,403 , 5XX".parse().unwrap();
        for code in [401, 403, 500, 503, 599] {
            assert!(set.contains(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [200, 400, 402, 404, 499, 600] {
            assert!(!set.contains(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for bad in ["", "abc", "99", "1000", "0xx", "5x", "5xxx", "-1"] {
            assert!(bad.parse::<CountStatus>().is_err(), "{bad:?}");
        }
        assert!(
            CountStatus::new()
                .class(9)
                .contains(StatusCode::from_u16(999).unwrap())
        );
    }
}
