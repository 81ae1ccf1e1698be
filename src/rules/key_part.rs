//! Rule keys as written: `client_ip`, `header:x-api-key`, or a list of parts.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::key::{Key, PeerIp};

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

/// What the keys a part builds start with: a header's value (`key:…`), an
/// address (`ip:…`), a user id (`user:…`), a route (`route:…`). A `global`
/// key is `global` itself.
pub(crate) const BUILT: [&str; 4] = ["key:", "ip:", "user:", "route:"];

impl KeyPart {
    /// What this part's keys start with ([`BUILT`]), or are (`global`).
    pub(crate) fn prefix(&self) -> &'static str {
        match self {
            KeyPart::Header(_) => BUILT[0],
            KeyPart::PeerIp | KeyPart::ClientIp => BUILT[1],
            KeyPart::User => BUILT[2],
            KeyPart::Route => BUILT[3],
            KeyPart::Global => "global",
        }
    }

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

impl KeyConfig {
    /// Whether `key`, written as keys are built, could be one of these:
    /// as many parts (joined by unescaped `|`), each of its part's kind
    /// (`key:` for a header, `ip:` for an address, `user:`, `route:`, or
    /// `global` itself).
    pub(crate) fn could_build(&self, key: &str) -> bool {
        let mut given = key_parts(key);
        let fits = self.0.iter().all(|part| {
            given.next().is_some_and(|g| match part {
                KeyPart::Global => g == part.prefix(),
                _ => g.starts_with(part.prefix()),
            })
        });
        fits && given.next().is_none()
    }

    /// How this key's values are written: `key:…|route:…`.
    pub(crate) fn written(&self) -> String {
        let parts: Vec<String> = (self.0.iter())
            .map(|part| match part {
                KeyPart::Global => part.prefix().to_owned(),
                _ => format!("{}…", part.prefix()),
            })
            .collect();
        parts.join("|")
    }
}

/// An `ip:` or `route:` part of a key as an operator wrote it, read as a
/// request's key writes it (`ip:::ffff:192.0.2.1` is `ip:192.0.2.1`, an
/// IPv6 address its network under `peer_ip`'s prefix, `route:get /x` is
/// `route:GET /x`): `None` for a part of another kind, which is taken as
/// written; an error saying how to write it for text no request's key
/// holds.
pub(crate) fn part_as_built(part: &str, peer_ip: PeerIp) -> Option<Result<Key, &'static str>> {
    if let Some(address) = part.strip_prefix(KeyPart::PeerIp.prefix()) {
        let how = "write an address after ip: (or an IPv6 network of the file's ipv6_prefix)";
        return Some(peer_ip.key_of_text(address).ok_or(how));
    }
    let route = part.strip_prefix(KeyPart::Route.prefix())?;
    let how = "write route:<METHOD> <route>, such as \"route:GET /login\"";
    Some(Key::route_of_text(route).ok_or(how))
}

/// The parts of a key joined by `|` (`Key::join`), whose own `|` are
/// escaped by a backslash.
pub(crate) fn key_parts(key: &str) -> impl Iterator<Item = &str> {
    let mut escaped = false;
    key.split(move |c: char| {
        let split = c == '|' && !escaped;
        escaped = c == '\\' && !escaped;
        split
    })
}

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
