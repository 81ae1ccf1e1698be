//! `RateLimit-Policy` values kept for the life of the process, so that
//! putting one on a response copies a pointer. A value made from shared
//! bytes counts its copies with an atomic add and subtract on one cache
//! line, which every response on every core would otherwise write.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use http::HeaderValue;

/// At most this many distinct values are kept, and at most [`MOST_BYTES`]
/// of them: rules reloaded with new quota names make new values, so what is
/// kept is bounded. Past the bound a value stays shared, as made.
const MOST: usize = 1024;
const MOST_BYTES: usize = 256 * 1024;

struct Kept {
    values: HashSet<&'static [u8]>,
    bytes: usize,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

/// `value`, backed by bytes kept for the life of the process (the same
/// bytes for equal values), or `value` itself once the bound is reached.
/// Called when a policy is made, never per request.
pub(super) fn kept(value: HeaderValue) -> HeaderValue {
    let mut guard = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    let kept = guard.get_or_insert_with(|| Kept {
        values: HashSet::new(),
        bytes: 0,
    });
    let bytes = match kept.values.get(value.as_bytes()) {
        Some(&bytes) => bytes,
        None if kept.values.len() < MOST && kept.bytes + value.len() <= MOST_BYTES => {
            let bytes: &'static [u8] = Box::leak(value.as_bytes().into());
            kept.values.insert(bytes);
            kept.bytes += bytes.len();
            bytes
        }
        None => return value,
    };
    HeaderValue::from_maybe_shared(Bytes::from_static(bytes)).unwrap_or(value)
}

#[cfg(test)]
mod tests {
    use super::kept;
    use http::HeaderValue;

    #[test]
    fn equal_values_are_kept_once_and_read_the_same() {
        let a = kept(HeaderValue::from_str("\"kept-test\";q=10;w=60").unwrap());
        let b = kept(HeaderValue::from_str("\"kept-test\";q=10;w=60").unwrap());
        assert_eq!(a, "\"kept-test\";q=10;w=60");
        assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr());
        let c = kept(HeaderValue::from_str("\"kept-test\";q=11;w=60").unwrap());
        assert_eq!(c, "\"kept-test\";q=11;w=60");
        assert_ne!(a.as_bytes().as_ptr(), c.as_bytes().as_ptr());
    }
}
