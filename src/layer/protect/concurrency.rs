//! Concurrency quotas: at most so many requests of one key under way.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;

use crate::backend::{MemorySlots, SlotStore};
use crate::layer::headers::{HeaderStyle, Headers, Name, number, sf_string, single_value_names};
use crate::quota::QuotaError;

/// Below this load, an elastic quota admits up to its ceiling.
pub(crate) const ELASTIC_ROOM: f64 = 0.8;

/// `RateLimit` values made once per quota, for this many free slots at
/// most: formatting one per request was a tenth of a request's cost.
const MADE_STATES: u64 = 256;

/// At most `limit` requests of one key under way at once: an admitted
/// request holds a slot until its response body has been sent or dropped
/// (a client gone mid-body, a cancelled call and a panic in the handler
/// give it back too). Over the limit the layer answers 429, and every
/// response carries `RateLimit-Policy: "concurrent";q=<limit>;qu="concurrent-requests"`
/// (no window: the unit is requests at once) and `RateLimit: "concurrent";r=<free>`.
///
/// Added to a layer with
/// [`RateLimitLayerBuilder::concurrency`](crate::layer::RateLimitLayerBuilder::concurrency),
/// beside its rate quotas: a request must pass both, and one refused by a
/// rate quota gives its slot back at once.
///
/// Slots are counted in this process ([`MemorySlots`], the default) or in
/// any [`SlotStore`], such as `RedisSlots` for a fleet.
///
/// ```
/// use tollgate::layer::ConcurrencyQuota;
///
/// // 4 at once per key; up to 8 while the server has room.
/// let quota = ConcurrencyQuota::new(4)?.elastic(8)?;
/// assert_eq!((quota.limit(), quota.ceiling()), (4, 8));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyQuota {
    name: Arc<str>,
    limit: u64,
    ceiling: u64,
    store: Arc<dyn SlotStore>,
    policy_header: HeaderValue,
    /// `RateLimit` for 0, 1, ... free slots (up to [`MADE_STATES`]).
    states: Arc<[HeaderValue]>,
}

impl fmt::Debug for ConcurrencyQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyQuota")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("ceiling", &self.ceiling)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyQuota {
    /// At most `limit` (at least 1) requests of a key at once, named
    /// `concurrent`, counted in memory.
    pub fn new(limit: u64) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        Ok(ConcurrencyQuota {
            name: Arc::from("concurrent"),
            limit,
            ceiling: limit,
            store: Arc::new(MemorySlots::new()),
            policy_header: policy_header("concurrent", limit),
            states: states("concurrent", limit),
        })
    }

    /// The name clients see in the headers and problem bodies (1 to 64
    /// printable ASCII characters).
    pub fn name(mut self, name: &str) -> Result<Self, QuotaError> {
        let printable = name.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
        if name.is_empty() || name.len() > 64 || !printable {
            return Err(QuotaError::InvalidName(name.to_owned()));
        }
        self.policy_header = policy_header(name, self.limit);
        self.states = states(name, self.limit);
        self.name = Arc::from(name);
        Ok(self)
    }

    /// Elastic mode: while the layer's [load signal](crate::layer::LoadSignal) is
    /// under 0.8, admit up to `ceiling` requests at once (2 × the limit,
    /// say); at or over it (or with no signal), only the limit. The headers
    /// always show the limit.
    pub fn elastic(mut self, ceiling: u64) -> Result<Self, QuotaError> {
        if ceiling < self.limit {
            return Err(QuotaError::CeilingBelowLimit {
                limit: self.limit,
                ceiling,
            });
        }
        self.ceiling = ceiling;
        Ok(self)
    }

    /// Where the slots are counted ([`MemorySlots`] by default).
    pub fn store(mut self, store: impl SlotStore) -> Self {
        self.store = Arc::new(store);
        self
    }

    /// The quota's name.
    pub fn quota_name(&self) -> &str {
        &self.name
    }

    /// Requests of one key at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Requests of one key at once while the server has room (the limit
    /// unless elastic).
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    pub(crate) fn slots(&self) -> &dyn SlotStore {
        &*self.store
    }

    /// The limit enforced at `load` (`None`: no signal).
    pub(crate) fn enforced(&self, load: Option<f64>) -> u64 {
        match load {
            Some(load) if load < ELASTIC_ROOM => self.ceiling,
            _ => self.limit,
        }
    }

    /// The headers of `style` with `in_use` slots taken: the limit and the
    /// free slots (of the limit, even while an elastic quota admits more).
    /// No window and no reset: the unit is requests at once, and when one
    /// ends is not known.
    pub(crate) fn headers(&self, in_use: u64, style: HeaderStyle) -> Headers {
        let free = self.limit.saturating_sub(in_use);
        let mut out = Headers::new();
        let names = match style {
            HeaderStyle::Ietf => {
                let state = usize::try_from(free)
                    .ok()
                    .and_then(|i| self.states.get(i))
                    .cloned()
                    .unwrap_or_else(|| state(&self.name, free));
                out.push((Name::RateLimitPolicy, self.policy_header.clone()));
                out.push((Name::RateLimit, state));
                return out;
            }
            style => match single_value_names(style) {
                Some([limit, remaining, _]) => [limit, remaining],
                None => return out,
            },
        };
        for (name, n) in names.into_iter().zip([self.limit, free]) {
            out.push((name, number(n)));
        }
        out
    }
}

/// `RateLimit` with `free` slots.
fn state(name: &str, free: u64) -> HeaderValue {
    let mut out = String::with_capacity(name.len() + 16);
    sf_string(&mut out, name);
    out.push_str(";r=");
    out.push_str(&free.to_string());
    // Printable ASCII only (the name is checked), so this cannot fail.
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn states(name: &str, limit: u64) -> Arc<[HeaderValue]> {
    (0..=limit.min(MADE_STATES))
        .map(|free| state(name, free))
        .collect()
}

fn policy_header(name: &str, limit: u64) -> HeaderValue {
    let mut out = String::with_capacity(name.len() + 48);
    sf_string(&mut out, name);
    out.push_str(";q=");
    out.push_str(&limit.to_string());
    out.push_str(";qu=\"concurrent-requests\"");
    // Printable ASCII only (the name is checked), so this cannot fail.
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_carry_the_unit_and_no_window() {
        let q = ConcurrencyQuota::new(3).unwrap().name("a \"b\"").unwrap();
        let h = q.headers(1, HeaderStyle::Ietf);
        assert_eq!(h[0].1, "\"a \\\"b\\\"\";q=3;qu=\"concurrent-requests\"");
        assert_eq!(h[1].1, "\"a \\\"b\\\"\";r=2");
        let h = q.headers(1, HeaderStyle::Draft6);
        assert_eq!(
            (h[0].0, h[0].1.to_str().unwrap()),
            (Name::RateLimitLimit, "3")
        );
        assert_eq!(
            (h[1].0, h[1].1.to_str().unwrap()),
            (Name::RateLimitRemaining, "2")
        );
        assert_eq!(h.len(), 2, "no reset");
        let h = q.headers(5, HeaderStyle::Legacy);
        assert_eq!((h[0].0, h[0].1.to_str().unwrap()), (Name::XLimit, "3"));
        assert_eq!((h[1].0, h[1].1.to_str().unwrap()), (Name::XRemaining, "0"));
        assert!(q.headers(1, HeaderStyle::None).is_empty());
        assert!(ConcurrencyQuota::new(0).is_err());
        assert!(ConcurrencyQuota::new(3).unwrap().elastic(2).is_err());
        assert!(ConcurrencyQuota::new(3).unwrap().name("é").is_err());
    }

    #[test]
    fn elastic_quotas_use_their_ceiling_only_with_room() {
        let q = ConcurrencyQuota::new(2).unwrap().elastic(4).unwrap();
        assert_eq!(q.enforced(Some(0.1)), 4);
        assert_eq!(q.enforced(Some(0.8)), 2);
        assert_eq!(q.enforced(Some(f64::NAN)), 2);
        assert_eq!(q.enforced(None), 2);
    }
}
