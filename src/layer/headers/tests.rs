use super::*;

#[test]
fn single_value_styles_show_the_quota_with_less_remaining() {
    let set = |limit: u64, remaining: u64, reset: Option<u64>| {
        let mut h = Headers::new();
        h.push((Name::RateLimitLimit, number(limit)));
        h.push((Name::RateLimitRemaining, number(remaining)));
        h.extend(reset.map(|r| (Name::RateLimitReset, number(r))));
        h
    };
    let mut rate = set(10, 3, Some(6));
    add_headers(&mut rate, set(4, 1, None));
    assert_eq!(rate.as_slice(), set(4, 1, None).as_slice());
    let mut rate = set(10, 1, Some(6));
    add_headers(&mut rate, set(4, 1, None));
    assert_eq!(rate.as_slice(), set(10, 1, Some(6)).as_slice(), "a tie");
    let mut none = Headers::new();
    add_headers(&mut none, set(4, 2, None));
    assert_eq!(none.as_slice(), set(4, 2, None).as_slice());
}

/// A calendar quota's `w` is its period now: February 2026 has 28
/// days, March 31; New York's 2026-03-08 lasts 23 hours. A plain
/// quota's is its period.
#[test]
fn a_calendar_window_is_the_period_now() {
    use crate::Quota;
    use crate::calendar::{Calendar, CalendarPeriod};
    let month = Calendar::new(CalendarPeriod::Month { starts_on: 1 }, "UTC").unwrap();
    let day = Calendar::new(CalendarPeriod::Day, "America/New_York").unwrap();
    let set = QuotaSet::new(
        "cal",
        [
            Quota::per_calendar(10, month)
                .name("month")
                .build()
                .unwrap(),
            Quota::per_calendar(5, day).name("day").build().unwrap(),
            Quota::gcra(3, Duration::from_secs(90))
                .name("plain")
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    const DAY: u64 = 86_400;
    // 2026-02-10T12:00Z and 2026-03-08T12:00Z, in microseconds.
    let february = (1_770_681_600 + 12 * 3_600) * 1_000_000;
    let march_8 = (1_772_928_000 + 12 * 3_600) * 1_000_000;
    let value = |now| policy_value(&set, now).to_str().unwrap().to_owned();
    assert_eq!(
        value(february),
        format!(
            "\"month\";q=10;w={}, \"day\";q=5;w={DAY}, \"plain\";q=3;w=90",
            28 * DAY
        )
    );
    assert_eq!(
        value(march_8),
        format!(
            "\"month\";q=10;w={}, \"day\";q=5;w={}, \"plain\";q=3;w=90",
            31 * DAY,
            23 * 3_600
        )
    );
    assert!(
        policy_header(&set).calendar.is_some(),
        "written per response"
    );
    let plain = QuotaSet::single(Quota::gcra(3, Duration::from_secs(90)).build().unwrap());
    assert!(policy_header(&plain).calendar.is_none(), "written once");
}

#[test]
fn a_value_longer_than_the_stack_buffer_spills_whole() {
    let piece = "\"a-quota-with-a-long-name\";r=12345;t=60, ";
    let mut buffer = Buffer::new();
    let mut expected = String::new();
    for _ in 0..10 {
        buffer.push(piece);
        expected.push_str(piece);
    }
    assert!(expected.len() > 128);
    assert_eq!(buffer.value().unwrap().to_str().unwrap(), expected);
}

#[test]
fn retry_after_rounds_up_and_is_never_zero() {
    assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
    assert_eq!(retry_after_secs(Duration::ZERO), 1);
    assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
}
