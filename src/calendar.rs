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
mod tests;
