//! Rule keys as written: `client_ip`, `header:x-api-key`, or a list of parts.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer};

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyPart {
    PeerIp,
    ClientIp,
    Header(http::HeaderName),
    User,
    Global,
    Route,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::PeerIp => f.write_str("peer_ip"),
            KeyPart::ClientIp => f.write_str("client_ip"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
            KeyPart::User => f.write_str("user"),
            KeyPart::Global => f.write_str("global"),
            KeyPart::Route => f.write_str("route"),
        }
    }
}

impl KeyPart {
    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "peer_ip" => KeyPart::PeerIp,
            "client_ip" => KeyPart::ClientIp,
            "user" => KeyPart::User,
            "global" => KeyPart::Global,
            "route" => KeyPart::Route,
            _ => match s.strip_prefix("header:") {
                Some(h) => KeyPart::Header(
                    http::HeaderName::try_from(h)
                        .map_err(|_| format!("{h:?} is not a valid header name"))?,
                ),
                None => {
                    return Err(format!(
                        "unknown key {s:?}; valid keys are peer_ip, client_ip, header:<name>, user, global, route, or a list of them"
                    ));
                }
            },
        })
    }
}

/// A key: one part, or a list of parts combined.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyConfig(pub Vec<KeyPart>);

impl<'de> Deserialize<'de> for KeyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        let parts = match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        };
        if parts.is_empty() {
            return Err(de::Error::custom("a key needs at least one part"));
        }
        parts
            .iter()
            .map(|p| KeyPart::parse(p))
            .collect::<Result<_, _>>()
            .map(KeyConfig)
            .map_err(de::Error::custom)
    }
}
