//! Calendar periods: a day, week, month or year as a time zone's clocks and
//! calendars count it, for quotas that reset on the customer's billing day
//! rather than every so many seconds.
//!
//! A period is worked out from an instant: the local date there, the
//! period's first date, and the first instant of that date and of the next
//! period's. A local day is then 23 or 25 hours long across a change of
//! summer time, a month 28 to 31 days. The time zone database is the one
//! built into the crate (jiff's bundled copy), never the machine's: every
//! server of a fleet, and a container without `/usr/share/zoneinfo`, finds
//! the same bounds for the same instant.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;

/// A day of the week, the first of a [`CalendarPeriod::Week`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    /// Days since Monday: 0 to 6.
    fn days_from_monday(self) -> i8 {
        self as i8
    }

    /// Its name in lower case, as rules files write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Weekday::Monday => "monday",
            Weekday::Tuesday => "tuesday",
            Weekday::Wednesday => "wednesday",
            Weekday::Thursday => "thursday",
            Weekday::Friday => "friday",
            Weekday::Saturday => "saturday",
            Weekday::Sunday => "sunday",
        }
    }
}

impl FromStr for Weekday {
    type Err = CalendarError;

    /// `monday` to `sunday`, any case, or their first three letters.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let all = [
            Weekday::Monday,
            Weekday::Tuesday,
            Weekday::Wednesday,
            Weekday::Thursday,
            Weekday::Friday,
            Weekday::Saturday,
            Weekday::Sunday,
        ];
        all.into_iter()
            .find(|d| d.as_str() == lower || (lower.len() == 3 && d.as_str().starts_with(&lower)))
            .ok_or_else(|| CalendarError(format!("{s:?} is not a day of the week")))
    }
}

/// Which calendar period a quota counts, and on which day it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarPeriod {
    /// From one local midnight to the next (23 to 25 hours).
    Day,
    /// Seven local days from `starts_on`.
    Week {
        /// The first day of each week.
        starts_on: Weekday,
    },
    /// From day `starts_on` (1 to 31) of one month to the same day of the
    /// next; in a month too short for it, its last day (a period starting
    /// on the 31st starts on 30 April, then on 31 May).
    Month {
        /// The first day of each period, 1 to 31.
        starts_on: u8,
    },
    /// From 1 January to 1 January.
    Year,
}

impl CalendarPeriod {
    /// Its name as rules files write it: `day`, `week`, `month`, `year`.
    pub fn unit(self) -> &'static str {
        match self {
            CalendarPeriod::Day => "day",
            CalendarPeriod::Week { .. } => "week",
            CalendarPeriod::Month { .. } => "month",
            CalendarPeriod::Year => "year",
        }
    }
}

/// Why a calendar could not be made: an unknown time zone, or a first day
/// out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarError(String);

impl fmt::Display for CalendarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CalendarError {}

/// A calendar period in an IANA time zone: the windows of a calendar
/// quota (see [`QuotaBuilder::calendar`](crate::QuotaBuilder::calendar)).
///
/// ```
/// use tollgate::calendar::{Calendar, CalendarPeriod};
/// use tollgate::Timestamp;
///
/// // Billing months from the 15th, in Seoul.
/// let months = Calendar::new(CalendarPeriod::Month { starts_on: 15 }, "Asia/Seoul")?;
/// // 2026-11-20T12:00:00Z
/// let (start, end) = months.bounds(Timestamp::from_secs(1_795_176_000)).unwrap();
/// assert_eq!(start.as_micros() / 1_000_000, 1_794_668_400); // 2026-11-15T00:00+09:00
/// assert_eq!(end.as_micros() / 1_000_000, 1_797_260_400); // 2026-12-15T00:00+09:00
/// # Ok::<(), tollgate::calendar::CalendarError>(())
/// ```
#[derive(Clone)]
pub struct Calendar {
    period: CalendarPeriod,
    zone: TimeZone,
    zone_name: Arc<str>,
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("period", &self.period)
            .field("time_zone", &self.zone_name)
            .finish()
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.period == other.period && self.zone_name == other.zone_name
    }
}

impl Eq for Calendar {}

impl std::hash::Hash for Calendar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.period.hash(state);
        self.zone_name.hash(state);
    }
}

impl Calendar {
    /// `period` in the IANA time zone `time_zone` (`Europe/Paris`, `UTC`),
    /// looked up in the database built into the crate.
    pub fn new(period: CalendarPeriod, time_zone: &str) -> Result<Self, CalendarError> {
        if let CalendarPeriod::Month { starts_on } = period {
            if !(1..=31).contains(&starts_on) {
                return Err(CalendarError(format!(
                    "a month starts on a day from 1 to 31, not {starts_on}"
                )));
            }
        }
        let zone = jiff::tz::db().get(time_zone).map_err(|_| {
            CalendarError(format!(
                "{time_zone:?} is not an IANA time zone (such as Europe/Paris or UTC)"
            ))
        })?;
        Ok(Calendar {
            period,
            zone,
            zone_name: time_zone.into(),
        })
    }

    /// The period counted and its first day.
    pub fn period(&self) -> CalendarPeriod {
        self.period
    }

    /// The time zone's name, as given.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// The longest such period can be: what a store keeps a window for.
    pub fn longest(&self) -> Duration {
        let days = match self.period {
            // A day may gain an hour; a zone may also move across the date
            // line (Samoa skipped a day in 2011, others repeated one).
            CalendarPeriod::Day => 2,
            CalendarPeriod::Week { .. } => 8,
            CalendarPeriod::Month { .. } => 32,
            CalendarPeriod::Year => 367,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The period holding `at`: its first instant and the first instant of
    /// the next one (`start <= at < end`). `None` past the year 9999, the
    /// end of the calendar's range.
    pub fn bounds(&self, at: crate::Timestamp) -> Option<(crate::Timestamp, crate::Timestamp)> {
        let micros = i64::try_from(at.as_micros()).ok()?;
        let instant = jiff::Timestamp::from_microsecond(micros).ok()?;
        let date = self.zone.to_datetime(instant).date();
        let (first, next) = self.dates_around(date)?;
        let start = self.first_instant(first)?;
        let end = self.first_instant(next)?;
        // A zone that repeats a date (moving back across the date line)
        // could put `at` before its own date's start; the period then
        // holds it from `at` on.
        Some((
            start.min(at),
            end.max(crate::Timestamp::from_micros(at.as_micros() + 1)),
        ))
    }

    /// The first date of the period holding `date`, and of the next.
    fn dates_around(&self, date: Date) -> Option<(Date, Date)> {
        match self.period {
            CalendarPeriod::Day => Some((date, date.tomorrow().ok()?)),
            CalendarPeriod::Week { starts_on } => {
                let today = date.weekday().to_monday_zero_offset();
                let back = (today - starts_on.days_from_monday()).rem_euclid(7);
                let first = date.checked_sub(jiff::Span::new().days(back)).ok()?;
                Some((first, first.checked_add(jiff::Span::new().days(7)).ok()?))
            }
            CalendarPeriod::Month { starts_on } => {
                let this = month_start(date.year(), date.month(), starts_on)?;
                if date >= this {
                    let (y, m) = next_month(date.year(), date.month());
                    Some((this, month_start(y, m, starts_on)?))
                } else {
                    let (y, m) = previous_month(date.year(), date.month());
                    Some((month_start(y, m, starts_on)?, this))
                }
            }
            CalendarPeriod::Year => {
                let first = Date::new(date.year(), 1, 1).ok()?;
                Some((first, Date::new(date.year().checked_add(1)?, 1, 1).ok()?))
            }
        }
    }

    /// The first instant of `date` in the zone: midnight, or the end of a
    /// gap that swallows midnight (a zone that springs forward at 00:00).
    fn first_instant(&self, date: Date) -> Option<crate::Timestamp> {
        let zoned = date.to_zoned(self.zone.clone()).ok()?;
        let micros = zoned.timestamp().as_microsecond();
        u64::try_from(micros)
            .ok()
            .map(crate::Timestamp::from_micros)
    }
}

/// A calendar as the fixed window counts by it: one per distinct calendar
/// for the life of the process, so that quotas' parameters stay plain
/// `Copy` numbers with a reference beside them, and with the window that
/// held last remembered, so that a check works out the bounds with the
/// time zone rules once a period, not once a request.
#[derive(Debug)]
pub(crate) struct Windows {
    pub calendar: Calendar,
    /// The last window looked up: its first microsecond and its end.
    last: Mutex<(u64, u64)>,
}

impl PartialEq for Windows {
    fn eq(&self, other: &Self) -> bool {
        self.calendar == other.calendar
    }
}

impl Eq for Windows {}

impl std::hash::Hash for Windows {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.calendar.hash(state);
    }
}

impl Windows {
    /// The one `Windows` of `calendar`. Kept for the life of the process:
    /// there are at most some ten thousand calendars (4 units, 31 first
    /// days, the zones), and a reloaded rules file finds its own again.
    pub(crate) fn of(calendar: &Calendar) -> &'static Windows {
        static ALL: Mutex<Vec<&'static Windows>> = Mutex::new(Vec::new());
        let mut all = ALL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = all.iter().find(|w| w.calendar == *calendar) {
            return found;
        }
        let windows: &'static Windows = Box::leak(Box::new(Windows {
            calendar: calendar.clone(),
            last: Mutex::new((0, 0)),
        }));
        all.push(windows);
        windows
    }

    /// The window holding the instant `t` (microseconds since the epoch):
    /// its first microsecond and its end. Past the calendar's range (the
    /// year 9999), windows of the longest period since the epoch.
    pub(crate) fn at(&self, t: u64) -> (u64, u64) {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.0 <= t && t < last.1 {
            return *last;
        }
        let window = match self.calendar.bounds(crate::Timestamp::from_micros(t)) {
            Some((start, end)) => (start.as_micros(), end.as_micros()),
            None => {
                let longest = crate::clock::micros(self.calendar.longest());
                let start = t - t % longest;
                (start, start + longest)
            }
        };
        *last = window;
        window
    }

    /// The end of the window that starts at `start`.
    pub(crate) fn end_of(&self, start: u64) -> u64 {
        self.at(start).1
    }
}

/// Day `day` of month `month` of `year`, or the month's last day if it is
/// shorter.
fn month_start(year: i16, month: i8, day: u8) -> Option<Date> {
    let first = Date::new(year, month, 1).ok()?;
    let day = i8::try_from(day).ok()?.min(first.days_in_month());
    Date::new(year, month, day).ok()
}

fn next_month(year: i16, month: i8) -> (i16, i8) {
    if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    }
}

fn previous_month(year: i16, month: i8) -> (i16, i8) {
    if month == 1 {
        (year - 1, 12)
    } else {
        (year, month - 1)
    }
}

/// A calendar period's first day as written: a weekday name for weeks
/// (`monday`), a day of the month for months (`15`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg(feature = "rules")]
pub(crate) enum StartsOn {
    Weekday(Weekday),
    Day(u8),
}

#[cfg(feature = "rules")]
impl<'de> serde::Deserialize<'de> for StartsOn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        use serde::de;
        impl de::Visitor<'_> for Visit {
            type Value = StartsOn;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a day of the month (1 to 31) or of the week (monday)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<StartsOn, E> {
                match u8::try_from(n) {
                    Ok(day @ 1..=31) => Ok(StartsOn::Day(day)),
                    _ => Err(E::custom(format!(
                        "a month starts on a day from 1 to 31, not {n}"
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<StartsOn, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "a month starts on a day from 1 to 31, not {n}"
                    ))),
                }
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StartsOn, E> {
                if let Ok(n) = s.parse::<u64>() {
                    return self.visit_u64(n);
                }
                s.parse()
                    .map(StartsOn::Weekday)
                    .map_err(|e: CalendarError| E::custom(e.to_string()))
            }
        }
        d.deserialize_any(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;

    /// An instant written as RFC 3339 with an offset.
    fn at(s: &str) -> Timestamp {
        let ts: jiff::Timestamp = s.parse().expect(s);
        Timestamp::from_micros(u64::try_from(ts.as_microsecond()).unwrap())
    }

    fn hours(start: Timestamp, end: Timestamp) -> u64 {
        (end.as_micros() - start.as_micros()) / 3_600_000_000
    }

    #[test]
    fn seoul_month_from_the_15th_resets_on_december_15() {
        let cal = Calendar::new(CalendarPeriod::Month { starts_on: 15 }, "Asia/Seoul").unwrap();
        let (start, end) = cal.bounds(at("2026-12-14T23:59:59+09:00")).unwrap();
        assert_eq!(start, at("2026-11-15T00:00:00+09:00"));
        assert_eq!(end, at("2026-12-15T00:00:00+09:00"));
        // The first instant of the next period opens it.
        let (start, end) = cal.bounds(at("2026-12-15T00:00:00+09:00")).unwrap();
        assert_eq!(start, at("2026-12-15T00:00:00+09:00"));
        assert_eq!(end, at("2027-01-15T00:00:00+09:00"));
        // In UTC it is still the 14th: the zone decides, not UTC.
        let (_, end) = cal.bounds(at("2026-12-14T15:30:00Z")).unwrap();
        assert_eq!(end, at("2027-01-15T00:00:00+09:00"));
    }

    #[test]
    fn new_york_days_last_23_and_25_hours_across_the_2026_changes() {
        let cal = Calendar::new(CalendarPeriod::Day, "America/New_York").unwrap();
        // Summer time starts on 8 March 2026 at 02:00 local.
        let (start, end) = cal.bounds(at("2026-03-08T12:00:00-04:00")).unwrap();
        assert_eq!(start, at("2026-03-08T00:00:00-05:00"));
        assert_eq!(end, at("2026-03-09T00:00:00-04:00"));
        assert_eq!(hours(start, end), 23);
        // It ends on 1 November 2026 at 02:00 local.
        let (start, end) = cal.bounds(at("2026-11-01T01:30:00-05:00")).unwrap();
        assert_eq!(start, at("2026-11-01T00:00:00-04:00"));
        assert_eq!(end, at("2026-11-02T00:00:00-05:00"));
        assert_eq!(hours(start, end), 25);
        // An ordinary day.
        let (start, end) = cal.bounds(at("2026-06-01T09:00:00-04:00")).unwrap();
        assert_eq!(hours(start, end), 24);
    }

    #[test]
    fn months_clamp_to_short_months() {
        let cal = Calendar::new(CalendarPeriod::Month { starts_on: 31 }, "UTC").unwrap();
        let (start, end) = cal.bounds(at("2026-02-10T00:00:00Z")).unwrap();
        assert_eq!(start, at("2026-01-31T00:00:00Z"));
        assert_eq!(end, at("2026-02-28T00:00:00Z"));
        let (start, end) = cal.bounds(at("2026-02-28T00:00:00Z")).unwrap();
        assert_eq!(start, at("2026-02-28T00:00:00Z"));
        assert_eq!(end, at("2026-03-31T00:00:00Z"));
        let (start, end) = cal.bounds(at("2026-04-30T10:00:00Z")).unwrap();
        assert_eq!(start, at("2026-04-30T00:00:00Z"));
        assert_eq!(end, at("2026-05-31T00:00:00Z"));
        // Across the year.
        let (start, end) = cal.bounds(at("2026-12-31T00:00:00Z")).unwrap();
        assert_eq!(start, at("2026-12-31T00:00:00Z"));
        assert_eq!(end, at("2027-01-31T00:00:00Z"));
    }

    #[test]
    fn weeks_start_on_their_weekday() {
        // 26 November 2026 is a Thursday.
        let monday = Calendar::new(
            CalendarPeriod::Week {
                starts_on: Weekday::Monday,
            },
            "Europe/Paris",
        )
        .unwrap();
        let (start, end) = monday.bounds(at("2026-11-26T12:00:00+01:00")).unwrap();
        assert_eq!(start, at("2026-11-23T00:00:00+01:00"));
        assert_eq!(end, at("2026-11-30T00:00:00+01:00"));
        let thursday = Calendar::new(
            CalendarPeriod::Week {
                starts_on: "thu".parse().unwrap(),
            },
            "Europe/Paris",
        )
        .unwrap();
        let (start, end) = thursday.bounds(at("2026-11-26T00:00:00+01:00")).unwrap();
        assert_eq!(start, at("2026-11-26T00:00:00+01:00"));
        assert_eq!(end, at("2026-12-03T00:00:00+01:00"));
        // The week of 25 October 2026, when summer time ends, is 169 hours.
        let (start, end) = monday.bounds(at("2026-10-22T00:00:00+02:00")).unwrap();
        assert_eq!(hours(start, end), 7 * 24 + 1);
    }

    #[test]
    fn years_and_midnight_gaps() {
        let year = Calendar::new(CalendarPeriod::Year, "Australia/Sydney").unwrap();
        let (start, end) = year.bounds(at("2026-06-01T00:00:00Z")).unwrap();
        assert_eq!(start, at("2026-01-01T00:00:00+11:00"));
        assert_eq!(end, at("2027-01-01T00:00:00+11:00"));
        // Santiago springs forward at midnight: 6 September 2026 begins at 01:00.
        let day = Calendar::new(CalendarPeriod::Day, "America/Santiago").unwrap();
        let (start, _) = day.bounds(at("2026-09-06T12:00:00-03:00")).unwrap();
        assert_eq!(start, at("2026-09-06T01:00:00-03:00"));
    }

    #[test]
    fn refuses_unknown_zones_and_days() {
        assert!(Calendar::new(CalendarPeriod::Day, "Mars/Olympus").is_err());
        assert!(Calendar::new(CalendarPeriod::Month { starts_on: 0 }, "UTC").is_err());
        assert!(Calendar::new(CalendarPeriod::Month { starts_on: 32 }, "UTC").is_err());
        assert!("fun".parse::<Weekday>().is_err());
        assert_eq!("SUNDAY".parse::<Weekday>(), Ok(Weekday::Sunday));
    }

    #[test]
    fn every_instant_lies_in_its_period() {
        let cal = Calendar::new(CalendarPeriod::Day, "America/New_York").unwrap();
        let mut t = at("2026-01-01T00:00:00Z").as_micros();
        let stop = at("2027-01-01T00:00:00Z").as_micros();
        while t < stop {
            let (s, e) = cal.bounds(Timestamp::from_micros(t)).unwrap();
            assert!(s.as_micros() <= t && t < e.as_micros());
            t += 3_599_000_000; // not a divisor of an hour: every minute offset
        }
    }
}
