//! Values as the pages write them: URL parts, times, ages, counts, JSON.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// What a path segment keeps as it is: letters, digits and `-._~` (RFC 3986's
/// unreserved characters); everything else, `/` included, is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` as one path segment.
pub(crate) fn segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// A query string of the pairs whose value is not empty (form-encoded).
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let pairs: Vec<_> = pairs
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .collect();
    // Serializing string pairs cannot fail; an empty query is the harmless fallback.
    serde_urlencoded::to_string(pairs).unwrap_or_default()
}

/// A time as the pages show it, to the second, in UTC.
pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A time in RFC 3339 (a `<time datetime>`, a filter's value).
pub(crate) fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// An age in its two largest units: `45 s`, `3 min 12 s`, `2 h 5 min`, `3 d 4 h`.
pub(crate) fn age(age: Duration) -> String {
    let s = age.as_secs();
    let (d, h, m) = (s / 86_400, s / 3_600 % 24, s / 60 % 60);
    match s {
        0..60 => format!("{s} s"),
        60..3_600 => format!("{m} min {} s", s % 60),
        3_600..86_400 => format!("{} h {m} min", s / 3_600),
        _ => format!("{d} d {h} h"),
    }
}

/// A count with thousands separators: `1,234,567`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A stored JSON value, indented.
pub(crate) fn json(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_the_pages_show_them() {
        assert_eq!(segment("a/b <c>?%"), "a%2Fb%20%3Cc%3E%3F%25");
        assert_eq!(segment("ok-1.2_~"), "ok-1.2_~");
        assert_eq!(
            query(&[("type", "a&b=c"), ("user", ""), ("status", "queued")]),
            "type=a%26b%3Dc&status=queued"
        );
        assert_eq!(query(&[("user", "")]), "");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(age(Duration::from_secs(45)), "45 s");
        assert_eq!(age(Duration::from_secs(192)), "3 min 12 s");
        assert_eq!(age(Duration::from_secs(7_500)), "2 h 5 min");
        assert_eq!(age(Duration::from_secs(273_600)), "3 d 4 h");
    }
}
