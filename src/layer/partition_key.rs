//! Draft-11's `pk` parameter: which partition of a quota a response speaks
//! for, as a keyed hash of the client key, so that a client can tell its
//! partitions apart without anyone learning the key (often an IP address)
//! from a header.

use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::OnceLock;

use siphasher::sip128::{Hasher128, SipHasher24};

/// How the layer makes the `pk` parameter of the IETF `RateLimit` field:
/// SipHash-2-4 (128 bits) of the client key, keyed with a 16-byte secret,
/// sent as an RFC 9651 Byte Sequence (`pk=:base64:`). Never the raw key.
///
/// With [`random`](PartitionKey::random) the secret is drawn once per
/// process: the same client sees the same `pk` until a restart, and two
/// instances behind a load balancer send different ones. With
/// [`with_secret`](PartitionKey::with_secret) every process that shares the
/// secret sends the same `pk` for a client; keep the secret as secret as the
/// keys it hides, or anyone holding it can test guessed keys (IP addresses
/// are few enough to guess).
#[derive(Clone)]
pub struct PartitionKey {
    secret: [u8; 16],
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionKey").finish_non_exhaustive()
    }
}

impl PartitionKey {
    /// The secret drawn at random for this process (from the operating
    /// system's randomness, through `std`'s `RandomState`), once: every call
    /// in one process, and every reload of a rules file, gives the same.
    pub fn random() -> Self {
        static SECRET: OnceLock<[u8; 16]> = OnceLock::new();
        let secret = *SECRET.get_or_init(|| {
            let a = RandomState::new().hash_one(0u8).to_le_bytes();
            let b = RandomState::new().hash_one(1u8).to_le_bytes();
            let mut secret = [0; 16];
            secret[..8].copy_from_slice(&a);
            secret[8..].copy_from_slice(&b);
            secret
        });
        PartitionKey { secret }
    }

    /// A secret of the caller's, the same in every process that uses it.
    pub fn with_secret(secret: [u8; 16]) -> Self {
        PartitionKey { secret }
    }

    /// `key` as log lines show it: the partition key `pk` would send (with
    /// `pk`'s secret when one is set, else the process's random one), so
    /// that a line can be matched with what a client was sent, and never
    /// the key itself.
    pub(crate) fn logged(pk: Option<&PartitionKey>, key: &str) -> String {
        match pk {
            Some(pk) => pk.of(key),
            None => PartitionKey::random().of(key),
        }
    }

    /// `key`'s partition key as an RFC 9651 Byte Sequence: `:<base64>:`.
    pub(crate) fn of(&self, key: &str) -> String {
        let mut hasher = SipHasher24::new_with_key(&self.secret);
        hasher.write(key.as_bytes());
        let digest = hasher.finish128().as_bytes();
        let mut out = String::with_capacity(26);
        out.push(':');
        base64(&digest, &mut out);
        out.push(':');
        out
    }
}

/// Standard base64 with padding, as RFC 9651 Byte Sequences use.
fn base64(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = String::new();
            base64(input.as_bytes(), &mut out);
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn partition_keys_depend_on_the_secret_and_hide_the_key() {
        let a = PartitionKey::with_secret([1; 16]);
        let b = PartitionKey::with_secret([2; 16]);
        assert_eq!(a.of("10.0.0.1"), a.of("10.0.0.1"));
        assert_ne!(a.of("10.0.0.1"), a.of("10.0.0.2"));
        assert_ne!(a.of("10.0.0.1"), b.of("10.0.0.1"));
        assert!(!a.of("10.0.0.1").contains("10.0.0.1"));
        assert_eq!(a.of("x").len(), 26);
        // One secret per process.
        assert_eq!(
            PartitionKey::random().of("x"),
            PartitionKey::random().of("x")
        );
        assert_ne!(PartitionKey::random().of("x"), a.of("x"));
    }
}
