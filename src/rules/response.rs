//! Settings of how responses are told and counted: the `pk` partition key
//! and response-aware counting (`count_status`).

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::layer::{CountStatus, PartitionKey};

/// `partition_key`: `random`, or a 16-byte secret as 32 hex digits.
#[derive(Debug, Clone)]
pub(crate) struct PartitionKeyConfig(pub PartitionKey);

impl PartialEq for PartitionKeyConfig {
    fn eq(&self, other: &Self) -> bool {
        self.0.of("") == other.0.of("")
    }
}

impl<'de> Deserialize<'de> for PartitionKeyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "random" {
            return Ok(PartitionKeyConfig(PartitionKey::random()));
        }
        let bad = || de::Error::custom("partition_key is `random` or a secret of 32 hex digits");
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut secret = [0u8; 16];
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(PartitionKeyConfig(PartitionKey::with_secret(secret)))
    }
}

/// `count_status`: a code or class (`401`, `"5xx"`), or a list of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CountStatusConfig(pub CountStatus);

impl<'de> Deserialize<'de> for CountStatusConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Item {
            Code(u16),
            Text(String),
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(Item),
            Many(Vec<Item>),
        }
        let items = match OneOrMany::deserialize(d)? {
            OneOrMany::One(item) => vec![item],
            OneOrMany::Many(items) => items,
        };
        if items.is_empty() {
            return Err(de::Error::custom("count_status needs at least one status"));
        }
        items
            .iter()
            .try_fold(CountStatus::new(), |set, item| match item {
                Item::Code(code) => set.item(&code.to_string()),
                Item::Text(text) => set.item(text),
            })
            .map(CountStatusConfig)
            .map_err(de::Error::custom)
    }
}
