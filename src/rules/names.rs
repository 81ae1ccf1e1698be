//! Settings chosen by name (`headers: ietf`, `matching: all`): each name
//! type reads one word and says which words are valid when it is wrong.

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::key::ForwardedHeader;
use crate::layer::{HeaderStyle, OnBackendError, OnMissingKey, Priority};

macro_rules! name_enum {
    ($name:ident => $target:ty { $($text:literal => $value:expr),+ $(,)? } default $default:literal) => {
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub(crate) struct $name(pub $target);

        impl Default for $name {
            fn default() -> Self {
                $name(Self::parse($default).unwrap_or_else(|_| unreachable!()))
            }
        }

        impl $name {
            fn parse(s: &str) -> Result<$target, String> {
                match s {
                    $($text => Ok($value),)+
                    _ => Err(format!(
                        "unknown value {s:?}; valid values are {}",
                        [$($text),+].join(", ")
                    )),
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map($name).map_err(de::Error::custom)
            }
        }
    };
}

name_enum!(HeaderStyleName => HeaderStyle {
    "ietf" => HeaderStyle::Ietf,
    "draft6" => HeaderStyle::Draft6,
    "legacy" => HeaderStyle::Legacy,
    "none" => HeaderStyle::None,
} default "ietf");

name_enum!(BackendErrorName => OnBackendError {
    "allow" => OnBackendError::Allow,
    "reject" => OnBackendError::Reject,
} default "allow");

name_enum!(MissingKeyName => OnMissingKey {
    "reject" => OnMissingKey::Reject,
    "allow" => OnMissingKey::Allow,
} default "reject");

/// What the Redis backend does when Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum RedisFailure {
    #[default]
    Error,
    Memory,
}

name_enum!(RedisFailureName => RedisFailure {
    "error" => RedisFailure::Error,
    "memory" => RedisFailure::Memory,
} default "error");

/// Which rules a request is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum MatchMode {
    /// The first rule that matches, in file order.
    #[default]
    First,
    /// Every rule that matches; the request must pass them all.
    All,
}

name_enum!(Matching => MatchMode {
    "first" => MatchMode::First,
    "all" => MatchMode::All,
} default "first");

name_enum!(ForwardedHeaderName => ForwardedHeader {
    "x-forwarded-for" => ForwardedHeader::XForwardedFor,
    "forwarded" => ForwardedHeader::Forwarded,
    "x-real-ip" => ForwardedHeader::XRealIp,
} default "x-forwarded-for");

/// Whether `/users/1/` is the same path as `/users/1` for a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum TrailingSlash {
    /// The same (the default): a client cannot dodge a rule by adding one.
    #[default]
    Ignore,
    /// Different.
    Strict,
}

name_enum!(TrailingSlashName => TrailingSlash {
    "ignore" => TrailingSlash::Ignore,
    "strict" => TrailingSlash::Strict,
} default "ignore");

/// Whether `/Login` is the same path as `/login` for a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Case {
    /// The same (the default): a client cannot dodge a rule in front of a
    /// case-insensitive server by changing the case.
    #[default]
    Insensitive,
    /// Different.
    Sensitive,
}

name_enum!(CaseName => Case {
    "insensitive" => Case::Insensitive,
    "sensitive" => Case::Sensitive,
} default "insensitive");

/// `backend.redis.lease` as written: `off`, `auto` or a number, checked
/// when the backend is built (the Redis backend owns what they mean).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaseText(pub String);

impl Default for LeaseText {
    fn default() -> Self {
        LeaseText("off".into())
    }
}

impl<'de> Deserialize<'de> for LeaseText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl de::Visitor<'_> for Text {
            type Value = LeaseText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("off, auto or a number of units")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LeaseText, E> {
                Ok(LeaseText(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LeaseText, E> {
                Ok(LeaseText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LeaseText, E> {
                Ok(LeaseText(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<LeaseText, E> {
                Err(E::custom(format!(
                    "lease: {v} is not a lease mode; write off, auto or a number of units"
                )))
            }
        }
        // As text: YAML 1.1 reads a bare `off` as false.
        d.deserialize_str(Text)
    }
}

name_enum!(PriorityName => Priority {
    "background" => Priority::Background,
    "normal" => Priority::Normal,
    "critical" => Priority::Critical,
} default "normal");
