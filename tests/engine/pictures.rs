//! Draws the guide's picture of the six algorithms: the same traffic
//! against "5 per 10 s" in each, every request admitted or refused, and what
//! the quota has left after it. It runs the real implementation on a
//! `ManualClock`, so the picture is exact and the same on every run.
//!
//! The algorithms chapter of the guide shows `src/guide/algorithms.svg`;
//! this test fails when the file is not what the algorithms draw now, and
//! `TOLLGATE_WRITE_PICTURES=1 cargo test --test engine pictures` redraws it.

use std::fmt::Write as _;
use std::time::Duration;

use tollgate::{Algorithm, Limiter, ManualClock, MemoryBackend, Quota, Timestamp};

/// Seconds shown.
const SPAN: f64 = 30.0;
/// The clock's start: a multiple of 10 s, so fixed windows begin at 0, 10, 20.
const START: u64 = 1_000_000_000;

const LEFT: f64 = 130.0;
const WIDTH: f64 = 900.0;
const ROW: f64 = 92.0;
const TOP: f64 = 40.0;
/// Pixels per unit left in the quota.
const UNIT: f64 = 9.0;

/// One request: when it came, and what the quota answered.
struct Answer {
    at: f64,
    allowed: bool,
    delayed: bool,
    remaining: u64,
}

/// The traffic, in tenths of a second: a burst of 10 at 5 s, one a second
/// at 7 and 8 s, a burst across the fixed windows' boundary at 10 s, then
/// one every 1.5 s (a little over the quota's rate of one per 2 s).
fn traffic() -> Vec<u64> {
    let mut at: Vec<u64> = (50..60).collect();
    at.extend([70, 80]);
    at.extend((90..110).step_by(2));
    at.extend((140..300).step_by(15));
    at
}

fn run(algorithm: Algorithm) -> Result<Vec<Answer>, Box<dyn std::error::Error>> {
    let clock = ManualClock::new(Timestamp::from_secs(START));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let limiter = Limiter::new(
        backend,
        Quota::builder(algorithm, 5, Duration::from_secs(10)).build()?,
    );
    let mut answers = Vec::new();
    for tenth in traffic() {
        clock.set(Timestamp::from_micros(START * 1_000_000 + tenth * 100_000));
        let decision = limiter
            .check_now("client", 1)
            .ok_or("the memory backend decides at once")??;
        answers.push(Answer {
            at: tenth as f64 / 10.0,
            allowed: decision.allowed(),
            delayed: decision.delay() > Duration::ZERO,
            remaining: decision.remaining(),
        });
    }
    Ok(answers)
}

fn x(seconds: f64) -> f64 {
    LEFT + seconds * (WIDTH - LEFT - 20.0) / SPAN
}

fn draw(rows: &[(&str, Vec<Answer>)]) -> String {
    let height = TOP + ROW * rows.len() as f64 + 30.0;
    let mut svg = String::new();
    // No blank line anywhere: the picture is raw HTML inside Markdown.
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="18" font-size="13">5 per 10 s, the same requests: <tspan fill="#2e7d32">admitted</tspan>, <tspan fill="#ef6c00">admitted after a delay</tspan>, <tspan fill="#c62828">refused</tspan>; <tspan fill="#1565c0">left after each (0 to 5)</tspan></text>"##
    );
    for (i, (name, answers)) in rows.iter().enumerate() {
        let base = TOP + ROW * i as f64 + ROW - 22.0;
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{:.1}" font-size="13">{name}</text>"#,
            base - 20.0
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="#9e9e9e"/>"##,
            x(SPAN)
        );
        for tick in (0..=30).step_by(5) {
            let tx = x(f64::from(tick));
            let _ = writeln!(
                svg,
                r##"<line x1="{tx:.1}" y1="{base:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#9e9e9e"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#616161" font-size="10">{tick} s</text>"##,
                base + 4.0,
                base + 15.0
            );
        }
        // What is left, as steps from one answer to the next.
        let mut path = String::new();
        let mut last_y = None;
        for a in answers {
            let y = base - 10.0 - a.remaining as f64 * UNIT;
            match last_y {
                None => {
                    let _ = write!(path, "M{:.1},{y:.1}", x(a.at));
                }
                Some(prev) => {
                    let _ = write!(path, " L{:.1},{prev:.1} L{:.1},{y:.1}", x(a.at), x(a.at));
                }
            }
            last_y = Some(y);
        }
        if let Some(prev) = last_y {
            let _ = write!(path, " L{:.1},{prev:.1}", x(SPAN));
        }
        let _ = writeln!(
            svg,
            r##"<path d="{path}" fill="none" stroke="#1565c0" stroke-width="1.5"/>"##
        );
        for a in answers {
            let colour = match (a.allowed, a.delayed) {
                (false, _) => "#c62828",
                (true, true) => "#ef6c00",
                (true, false) => "#2e7d32",
            };
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"/>"#,
                x(a.at),
                base - 4.0
            );
        }
        let admitted = answers.iter().filter(|a| a.allowed).count();
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{:.1}" fill="#616161" font-size="11">{admitted} of {} admitted</text>"##,
            base - 4.0,
            answers.len()
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The picture the guide shows is the one the implementation draws today.
#[test]
fn the_algorithms_picture_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/guide/algorithms.svg");
    let mut rows = Vec::new();
    for (name, algorithm) in [
        ("GCRA", Algorithm::Gcra),
        ("token bucket", Algorithm::TokenBucket),
        ("leaky bucket", Algorithm::LeakyBucket),
        ("fixed window", Algorithm::FixedWindow),
        ("sliding window", Algorithm::SlidingWindow),
        ("sliding log", Algorithm::SlidingLog),
    ] {
        rows.push((name, run(algorithm).unwrap()));
    }
    let svg = draw(&rows);
    if std::env::var_os("TOLLGATE_WRITE_PICTURES").is_some() {
        std::fs::write(path, &svg).unwrap();
        return;
    }
    let shown = std::fs::read_to_string(path).unwrap();
    // Not `assert_eq!`: two whole pictures would bury the message.
    assert!(
        shown == svg,
        "src/guide/algorithms.svg is not what the algorithms draw now; redraw it with \
         `TOLLGATE_WRITE_PICTURES=1 cargo test --test engine pictures`"
    );
}
