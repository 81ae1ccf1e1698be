//! Periods as written in rules files: `500ms`, `10s`, `1m30s`.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

/// A period: `500ms`, `10s`, `1m`, `1h`, `1d`, or a combination (`1m30s`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Period(pub Duration);

impl Period {
    pub(crate) fn parse(s: &str) -> Result<Duration, String> {
        let bad =
            || format!("{s:?} is not a period; write a number and a unit: 500ms, 10s, 1m, 1h, 1d");
        let mut total = Duration::ZERO;
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(bad());
        }
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "us" => Duration::from_micros(n),
                "ms" => Duration::from_millis(n),
                "s" => Duration::from_secs(n),
                "m" => Duration::from_secs(n.saturating_mul(60)),
                "h" => Duration::from_secs(n.saturating_mul(3_600)),
                "d" => Duration::from_secs(n.saturating_mul(86_400)),
                _ => return Err(bad()),
            };
            total = total.saturating_add(unit);
            rest = &rest[unit_len..];
        }
        Ok(total)
    }
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let period = Period::parse(&s).map_err(de::Error::custom)?;
        if period.is_zero() {
            return Err(de::Error::custom(format!(
                "the period {s:?} is zero; a quota needs a period of at least 1us"
            )));
        }
        Ok(Period(period))
    }
}

/// A calendar period's unit as written: `day`, `week`, `month`, `year`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CalendarUnit {
    Day,
    Week,
    Month,
    Year,
}

impl CalendarUnit {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }
}

impl<'de> Deserialize<'de> for CalendarUnit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        [
            CalendarUnit::Day,
            CalendarUnit::Week,
            CalendarUnit::Month,
            CalendarUnit::Year,
        ]
        .into_iter()
        .find(|u| u.as_str() == s)
        .ok_or_else(|| {
            de::Error::custom(format!(
                "{s:?} is not a calendar period; write day, week, month or year"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods() {
        assert_eq!(Period::parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(Period::parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(Period::parse("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "10", "s", "1 m", "1w", "-1s"] {
            assert!(Period::parse(bad).is_err(), "{bad}");
        }
    }
}
