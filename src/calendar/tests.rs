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
