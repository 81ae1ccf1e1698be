//! The pipeline's key step: a key extracted is checked against the length
//! limit and the missing-key policy before any limit is asked.

use super::super::headers::Headers;
use super::super::policy::OnMissingKey;
use super::super::problem::problem;
use super::super::reason::Reason;
use super::super::verdict::Verdict;
use crate::key::{Key, KeyError};

/// The longest key accepted by default, in bytes.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 256;

/// What a request's key means for it. The verdict is large because its
/// headers are kept inline, which saves an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum KeyOutcome {
    /// Limit it under this key.
    Limit(Key),
    /// Let it through unlimited, or answer it, without asking the limiter.
    Settled(Verdict),
}

/// Checks an extracted key against the length limit and the missing-key
/// policy.
pub(crate) fn admit_key(
    key: Result<Key, KeyError>,
    max_len: usize,
    policy: OnMissingKey,
) -> KeyOutcome {
    let error = match key {
        Ok(key) if key.as_str().len() <= max_len => return KeyOutcome::Limit(key),
        Ok(key) => KeyError::TooLong {
            len: key.as_str().len(),
            max: max_len,
        },
        Err(e) => e,
    };
    let reason = Reason::NoKey;
    match policy {
        OnMissingKey::Allow => {
            tracing::debug!(%error, reason = reason.as_str(), "no rate-limit key; request passes unlimited");
            KeyOutcome::Settled(Verdict::pass(Headers::new(), reason))
        }
        OnMissingKey::Reject => {
            if error.status().is_server_error() {
                tracing::error!(%error, reason = reason.as_str(), "no rate-limit key");
            } else {
                tracing::debug!(%error, reason = reason.as_str(), "no rate-limit key");
            }
            let detail = format!("No rate-limit key: {error}.");
            let response = problem(error.status(), "about:blank", &detail, &[], reason);
            KeyOutcome::Settled(Verdict::respond(response, reason))
        }
    }
}
