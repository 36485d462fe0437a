//! [`Schedule`]: when a periodic task's ticks fall, as a cron expression (parsed by
//! [croner](https://docs.rs/croner)) or a fixed interval, read on the clock of UTC or of
//! a named time zone ([chrono-tz](https://docs.rs/chrono-tz)). A schedule is checked by
//! [`WorkerBuilder::build`](crate::WorkerBuilder::build), which turns it into [`Ticks`].
//!
//! Every tick is a pure function of the schedule: any number of processes compute the
//! same instants, which is what lets each of them enqueue every tick and the database
//! keep one task per tick (see [`WorkerBuilder::periodic`](crate::WorkerBuilder::periodic)).

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use crate::values::error::DedupError;

/// The most missed ticks a [`Schedule::catch_up`] may ask for.
pub const MAX_CATCH_UP: u32 = 1_000;

/// When the ticks of a periodic task fall
/// ([`WorkerBuilder::periodic`](crate::WorkerBuilder::periodic)).
///
/// - [`Schedule::cron`]: a cron expression of 5 fields (minute granularity), or 6 with
///   seconds first, `@hourly`-style nicknames, `L`, `W` and `#` (croner's syntax).
///   Daylight-saving changes follow croner: a time the clock skips (spring forward) runs
///   at the first time after the gap, and a time the clock shows twice (fall back) runs
///   once for an expression with a fixed hour (`30 2 * * *`) and in both passes for one
///   whose hour is a wildcard or a range (`*/15 * * * *`).
/// - [`Schedule::every`]: a tick whenever the schedule's clock shows a whole multiple of
///   the interval counted from 1970-01-01 00:00 on that clock: `every(15 min)` ticks at
///   :00, :15, :30, :45; `every(6 h)` at 00:00, 06:00, 12:00 and 18:00 (an interval that
///   divides a day starts again at each midnight). In a zone, a time its clock skips has
///   no tick and a time it shows twice has two: across a change of one hour, `every(1 h)`
///   ticks each real hour.
///
/// Both read UTC unless [`in_tz`](Schedule::in_tz) names a zone. On start a worker
/// enqueues at most the latest tick that is already past ([`catch_up`](Schedule::catch_up)).
///
/// ```
/// use std::time::Duration;
/// use task_dedup::Schedule;
///
/// let nightly = Schedule::cron("30 2 * * *").in_tz("Europe/Berlin");
/// let quarter_hourly = Schedule::every(Duration::from_secs(15 * 60)).catch_up(0);
/// let weekly = Schedule::cron("@weekly").in_tz(task_dedup::chrono_tz::America::New_York);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Schedule {
    rule: Rule,
    zone: Option<Zone>,
    catch_up: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Cron(String),
    Every(Duration),
}

/// The time zone a [`Schedule`] reads its clock in: a [`chrono_tz::Tz`], or an IANA name
/// (`"Europe/Berlin"`) that [`WorkerBuilder::build`](crate::WorkerBuilder::build) looks up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Zone {
    /// A zone of the IANA database, as chrono-tz has it.
    Tz(Tz),
    /// An IANA zone name, looked up when the worker is built.
    Name(String),
}

impl From<Tz> for Zone {
    fn from(tz: Tz) -> Zone {
        Zone::Tz(tz)
    }
}

impl From<&str> for Zone {
    fn from(name: &str) -> Zone {
        Zone::Name(name.to_owned())
    }
}

impl From<String> for Zone {
    fn from(name: String) -> Zone {
        Zone::Name(name)
    }
}

impl Schedule {
    /// Ticks at the times a cron expression matches, e.g. `"0 * * * *"` (every hour),
    /// `"*/10 * * * * *"` (every ten seconds), `"0 9 * * MON-FRI"`. Checked by
    /// [`build`](crate::WorkerBuilder::build).
    pub fn cron(expression: impl Into<String>) -> Schedule {
        Schedule {
            rule: Rule::Cron(expression.into()),
            zone: None,
            catch_up: 1,
        }
    }

    /// Ticks at whole multiples of `interval` on the schedule's clock (see [`Schedule`]).
    /// `interval` is whole seconds, at least one; checked by
    /// [`build`](crate::WorkerBuilder::build).
    pub fn every(interval: Duration) -> Schedule {
        Schedule {
            rule: Rule::Every(interval),
            zone: None,
            catch_up: 1,
        }
    }

    /// Reads the schedule's clock in `zone` (a [`chrono_tz::Tz`] or an IANA name such as
    /// `"Europe/Berlin"`) rather than UTC.
    #[must_use]
    pub fn in_tz(mut self, zone: impl Into<Zone>) -> Schedule {
        self.zone = Some(zone.into());
        self
    }

    /// How many of the ticks already past a worker enqueues when it starts, the latest
    /// ones (at most [`MAX_CATCH_UP`]). Default 1: the latest tick, so that a restart
    /// (or a deploy) in the middle of a period still gets that period's task unless some
    /// process enqueued it; 0: none, the first tick is the next one. While it runs, a
    /// worker that fell behind (the database unreachable for longer than a tick, the
    /// process suspended) enqueues the latest `max(catch_up, 1)` of the ticks it passed.
    ///
    /// Retention keeps a tick's task at least until its window (to the next tick) ends,
    /// so the latest tick is never enqueued twice; an older tick is recognised as
    /// already enqueued only while its task is kept: keep `catch_up` ticks within the
    /// retention of finished tasks ([`Retention`](crate::Retention)).
    #[must_use]
    pub fn catch_up(mut self, ticks: u32) -> Schedule {
        self.catch_up = ticks;
        self
    }

    /// Checks the schedule and computes what its ticks need.
    ///
    /// # Errors
    /// [`DedupError::InvalidSchedule`] naming the expression: a cron expression croner
    /// rejects or that never matches, an unknown zone name, an interval that is not
    /// whole seconds of at least one, or a catch-up over [`MAX_CATCH_UP`].
    pub(crate) fn ticks(&self) -> Result<Ticks, DedupError> {
        let invalid = |reason: String| DedupError::InvalidSchedule {
            expression: self.to_string(),
            reason,
        };
        let zone = match &self.zone {
            None => Tz::UTC,
            Some(Zone::Tz(tz)) => *tz,
            Some(Zone::Name(name)) => name
                .parse::<Tz>()
                .map_err(|_| invalid(format!("unknown time zone `{name}`")))?,
        };
        if self.catch_up > MAX_CATCH_UP {
            return Err(invalid(format!(
                "catch_up is {}, at most {MAX_CATCH_UP}",
                self.catch_up
            )));
        }
        let rule = match &self.rule {
            Rule::Cron(expression) => {
                let cron = croner::parser::CronParser::builder()
                    .seconds(croner::parser::Seconds::Optional)
                    .build()
                    .parse(expression)
                    .map_err(|err| invalid(err.to_string()))?;
                Compiled::Cron(Box::new(cron))
            }
            Rule::Every(interval) => {
                let secs = i64::try_from(interval.as_secs()).unwrap_or(i64::MAX);
                if secs == 0 || interval.subsec_nanos() != 0 || secs > MAX_EVERY_SECS {
                    return Err(invalid(
                        "an interval of whole seconds, from 1 s to 100 years".to_owned(),
                    ));
                }
                Compiled::Every(secs)
            }
        };
        let ticks = Ticks {
            rule,
            zone,
            catch_up: self.catch_up,
            expression: self.to_string(),
        };
        if ticks.after(Utc::now()).is_none() {
            return Err(invalid("it has no tick from now on".to_owned()));
        }
        Ok(ticks)
    }
}

impl fmt::Display for Schedule {
    /// The expression (`0 * * * *`, `every 60s`), and its zone if not UTC.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Rule::Cron(expression) => f.write_str(expression)?,
            Rule::Every(interval) if interval.subsec_nanos() == 0 => {
                write!(f, "every {}s", interval.as_secs())?;
            }
            Rule::Every(interval) => write!(f, "every {interval:?}")?,
        }
        match &self.zone {
            None => Ok(()),
            Some(Zone::Tz(tz)) => write!(f, " in {}", tz.name()),
            Some(Zone::Name(name)) => write!(f, " in {name}"),
        }
    }
}

/// About a hundred years: an `every` interval beyond it is surely a mistake, and the
/// arithmetic stays far from overflowing.
const MAX_EVERY_SECS: i64 = 100 * 366 * 86_400;

/// Zones change their offset at most once in this span (real zones change it a few
/// times a year): [`every`](Schedule::every)'s search checks the offset at both ends.
const OFFSET_STEP: i64 = 6 * 3_600;

/// A checked [`Schedule`]: its ticks, computed.
#[derive(Debug)]
pub(crate) struct Ticks {
    rule: Compiled,
    zone: Tz,
    catch_up: u32,
    expression: String,
}

#[derive(Debug)]
enum Compiled {
    Cron(Box<croner::Cron>),
    /// Whole seconds.
    Every(i64),
}

impl Ticks {
    /// The schedule as written, for logs and errors.
    pub(crate) fn expression(&self) -> &str {
        &self.expression
    }

    /// [`Schedule::catch_up`].
    pub(crate) fn catch_up(&self) -> u32 {
        self.catch_up
    }

    /// The first tick after `t`, or `None` when the schedule has no more ticks.
    pub(crate) fn after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Ticks are whole seconds: the first tick after `t` is the first after its second.
        let second = t.timestamp();
        match &self.rule {
            Compiled::Cron(cron) => {
                let from = DateTime::from_timestamp(second, 0)?.with_timezone(&self.zone);
                let next = cron.find_next_occurrence(&from, false).ok()?;
                Some(next.with_timezone(&Utc))
            }
            Compiled::Every(every) => {
                DateTime::from_timestamp(self.every_after(*every, second)?, 0)
            }
        }
    }

    /// The last tick at or before `t`, or `None` when there is none.
    pub(crate) fn at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let second = t.timestamp();
        match &self.rule {
            Compiled::Cron(cron) => {
                let from = DateTime::from_timestamp(second, 0)?.with_timezone(&self.zone);
                let previous = cron.find_previous_occurrence(&from, true).ok()?;
                Some(previous.with_timezone(&Utc))
            }
            Compiled::Every(every) => {
                DateTime::from_timestamp(self.every_at_or_before(*every, second)?, 0)
            }
        }
    }

    /// The zone's offset (local minus UTC, in seconds) at Unix second `at`.
    fn offset(&self, at: i64) -> Option<i64> {
        let utc = DateTime::from_timestamp(at, 0)?.naive_utc();
        let offset = self.zone.offset_from_utc_datetime(&utc).fix();
        Some(i64::from(offset.local_minus_utc()))
    }

    /// The first second after `from` whose local clock reading is a multiple of
    /// `every`. Within a stretch of one offset those seconds are `u` with
    /// `(u + offset) % every == 0`; at an offset change the search starts again from
    /// the change under the new offset (a clock set back shows a range twice, and its
    /// ticks come twice; a clock set forward skips the ticks it jumps over).
    fn every_after(&self, every: i64, mut from: i64) -> Option<i64> {
        let mut inclusive = false;
        for _ in 0..MAX_STEPS {
            let offset = self.offset(from)?;
            let start = if inclusive {
                from
            } else {
                from.checked_add(1)?
            };
            let candidate =
                start.checked_add((every - (start + offset).rem_euclid(every)) % every)?;
            let horizon = from.checked_add(OFFSET_STEP)?;
            let probe = candidate.min(horizon);
            if self.offset(probe)? == offset {
                if candidate <= horizon {
                    return Some(candidate);
                }
                from = horizon;
            } else {
                // The first second of the new offset: no tick under the old one before it.
                let (mut old, mut new) = (from, probe);
                while new - old > 1 {
                    let mid = old + (new - old) / 2;
                    if self.offset(mid)? == offset {
                        old = mid;
                    } else {
                        new = mid;
                    }
                }
                from = new;
            }
            inclusive = true;
        }
        None
    }

    /// The last second at or before `from` whose local clock reading is a multiple of
    /// `every`: [`every_after`](Self::every_after) backwards.
    fn every_at_or_before(&self, every: i64, mut from: i64) -> Option<i64> {
        let mut inclusive = true;
        for _ in 0..MAX_STEPS {
            let offset = self.offset(from)?;
            let end = if inclusive {
                from
            } else {
                from.checked_sub(1)?
            };
            let candidate = end.checked_sub((end + offset).rem_euclid(every))?;
            let horizon = from.checked_sub(OFFSET_STEP)?;
            let probe = candidate.max(horizon);
            if self.offset(probe)? == offset {
                if candidate >= horizon {
                    return Some(candidate);
                }
                from = horizon;
                inclusive = true;
            } else {
                // The last second of the earlier offset: ticks before it are read with it.
                let (mut old, mut new) = (probe, from);
                while new - old > 1 {
                    let mid = old + (new - old) / 2;
                    if self.offset(mid)? == offset {
                        new = mid;
                    } else {
                        old = mid;
                    }
                }
                from = old;
                inclusive = true;
            }
        }
        None
    }
}

/// Steps of [`OFFSET_STEP`] an `every` search takes at most: beyond an interval of
/// [`MAX_EVERY_SECS`] and the offset changes within it.
const MAX_STEPS: usize = (MAX_EVERY_SECS / OFFSET_STEP) as usize + 1_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("an RFC 3339 time")
            .with_timezone(&Utc)
    }

    /// The ticks after `from`, `n` of them, as RFC 3339 in UTC.
    fn next(ticks: &Ticks, from: &str, n: usize) -> Vec<String> {
        let mut at = utc(from);
        let mut out = Vec::new();
        for _ in 0..n {
            at = ticks.after(at).expect("a next tick");
            out.push(at.to_rfc3339());
        }
        out
    }

    /// The ticks at or before `from`, `n` of them, latest first.
    fn previous(ticks: &Ticks, from: &str, n: usize) -> Vec<String> {
        let mut at = utc(from);
        let mut out = Vec::new();
        for _ in 0..n {
            let tick = ticks.at_or_before(at).expect("a previous tick");
            out.push(tick.to_rfc3339());
            at = tick - chrono::Duration::seconds(1);
        }
        out
    }

    fn ticks(schedule: Schedule) -> Ticks {
        schedule.ticks().expect("a valid schedule")
    }

    #[test]
    fn cron_in_utc() {
        let hourly = ticks(Schedule::cron("0 * * * *"));
        assert_eq!(
            next(&hourly, "2026-12-02T10:00:00Z", 2),
            ["2026-12-02T11:00:00+00:00", "2026-12-02T12:00:00+00:00"]
        );
        // A tick is not after itself, and sub-seconds do not matter.
        assert_eq!(
            next(&hourly, "2026-12-02T10:59:59.999Z", 1),
            ["2026-12-02T11:00:00+00:00"]
        );
        assert_eq!(
            previous(&hourly, "2026-12-02T11:00:00.500Z", 2),
            ["2026-12-02T11:00:00+00:00", "2026-12-02T10:00:00+00:00"]
        );
        let seconds = ticks(Schedule::cron("*/10 * * * * *"));
        assert_eq!(
            next(&seconds, "2026-12-02T10:00:05Z", 2),
            ["2026-12-02T10:00:10+00:00", "2026-12-02T10:00:20+00:00"]
        );
    }

    /// Spring forward in Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC).
    /// Fall back, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC).
    #[test]
    fn a_fixed_cron_time_across_daylight_saving_in_berlin() {
        let nightly = ticks(Schedule::cron("30 2 * * *").in_tz("Europe/Berlin"));
        // 02:30 does not exist on the 29th: croner runs it at the first time after the
        // gap, 03:00 CEST. Once a day all the same.
        assert_eq!(
            next(&nightly, "2026-03-27T12:00:00Z", 4),
            [
                "2026-03-28T01:30:00+00:00", // 02:30 CET
                "2026-03-29T01:00:00+00:00", // 03:00 CEST, right after the gap
                "2026-03-30T00:30:00+00:00", // 02:30 CEST
                "2026-03-31T00:30:00+00:00",
            ]
        );
        // 02:30 happens twice on the 25th: once is run, the first.
        assert_eq!(
            next(&nightly, "2026-10-23T12:00:00Z", 4),
            [
                "2026-10-24T00:30:00+00:00", // 02:30 CEST
                "2026-10-25T00:30:00+00:00", // 02:30 CEST, the first of the two
                "2026-10-26T01:30:00+00:00", // 02:30 CET
                "2026-10-27T01:30:00+00:00",
            ]
        );
        // Backwards the same days (what catch-up walks).
        assert_eq!(
            previous(&nightly, "2026-10-26T12:00:00Z", 3),
            [
                "2026-10-26T01:30:00+00:00",
                "2026-10-25T00:30:00+00:00",
                "2026-10-24T00:30:00+00:00",
            ]
        );
        assert_eq!(
            previous(&nightly, "2026-03-30T12:00:00Z", 3),
            [
                "2026-03-30T00:30:00+00:00",
                "2026-03-29T01:00:00+00:00",
                "2026-03-28T01:30:00+00:00",
            ]
        );
    }

    #[test]
    fn an_hourly_every_across_daylight_saving_in_berlin_ticks_each_real_hour() {
        let hourly =
            ticks(Schedule::every(Duration::from_secs(3_600)).in_tz(chrono_tz::Europe::Berlin));
        // 02:00 CET is skipped: 01:00 CET then 03:00 CEST, one real hour apart.
        assert_eq!(
            next(&hourly, "2026-03-28T23:30:00Z", 3),
            [
                "2026-03-29T00:00:00+00:00", // 01:00 CET
                "2026-03-29T01:00:00+00:00", // 03:00 CEST
                "2026-03-29T02:00:00+00:00", // 04:00 CEST
            ]
        );
        // 02:00 is shown twice: two ticks, an hour apart.
        assert_eq!(
            next(&hourly, "2026-10-24T23:30:00Z", 3),
            [
                "2026-10-25T00:00:00+00:00", // 02:00 CEST
                "2026-10-25T01:00:00+00:00", // 02:00 CET
                "2026-10-25T02:00:00+00:00", // 03:00 CET
            ]
        );
        assert_eq!(
            previous(&hourly, "2026-10-25T02:30:00Z", 3),
            [
                "2026-10-25T02:00:00+00:00",
                "2026-10-25T01:00:00+00:00",
                "2026-10-25T00:00:00+00:00",
            ]
        );
        assert_eq!(
            previous(&hourly, "2026-03-29T02:30:00Z", 3),
            [
                "2026-03-29T02:00:00+00:00",
                "2026-03-29T01:00:00+00:00",
                "2026-03-29T00:00:00+00:00",
            ]
        );
    }

    #[test]
    fn every_six_hours_follows_the_local_clock() {
        let six = ticks(Schedule::every(Duration::from_secs(6 * 3_600)).in_tz("Europe/Berlin"));
        // 00:00, 06:00, 12:00, 18:00 local, whatever the offset.
        assert_eq!(
            next(&six, "2026-03-28T20:00:00Z", 5),
            [
                "2026-03-28T23:00:00+00:00", // 00:00 CET
                "2026-03-29T04:00:00+00:00", // 06:00 CEST: five real hours later
                "2026-03-29T10:00:00+00:00",
                "2026-03-29T16:00:00+00:00",
                "2026-03-29T22:00:00+00:00", // 00:00 CEST
            ]
        );
        assert_eq!(
            previous(&six, "2026-03-29T04:00:00Z", 2),
            ["2026-03-29T04:00:00+00:00", "2026-03-28T23:00:00+00:00"]
        );
    }

    #[test]
    fn every_in_a_zone_with_a_half_hour_offset() {
        // India is UTC+05:30 all year: its hours start at half past in UTC.
        let hourly = ticks(Schedule::every(Duration::from_secs(3_600)).in_tz("Asia/Kolkata"));
        assert_eq!(
            next(&hourly, "2026-12-02T10:00:00Z", 2),
            ["2026-12-02T10:30:00+00:00", "2026-12-02T11:30:00+00:00"]
        );
        // In UTC, multiples since the epoch.
        let utc_hourly = ticks(Schedule::every(Duration::from_secs(3_600)));
        assert_eq!(
            next(&utc_hourly, "2026-12-02T10:00:00Z", 1),
            ["2026-12-02T11:00:00+00:00"]
        );
        let seven = ticks(Schedule::every(Duration::from_secs(7)));
        let tick = seven.after(utc("2026-12-02T10:00:00Z")).expect("tick");
        assert_eq!(tick.timestamp() % 7, 0);
        assert_eq!(seven.at_or_before(tick), Some(tick));
    }

    #[test]
    fn daily_every_is_local_midnight_and_rare_crons_are_found() {
        let daily = ticks(Schedule::every(Duration::from_secs(86_400)).in_tz("Europe/Berlin"));
        assert_eq!(
            next(&daily, "2026-03-28T12:00:00Z", 2),
            [
                "2026-03-28T23:00:00+00:00", // 00:00 CET, the 29th
                "2026-03-29T22:00:00+00:00", // 00:00 CEST, the 30th: 23 hours later
            ]
        );
        // A leap day is years away at times: still a valid schedule.
        let leap = ticks(Schedule::cron("0 0 29 2 *"));
        assert_eq!(
            next(&leap, "2026-12-02T10:00:00Z", 1),
            ["2028-02-29T00:00:00+00:00"]
        );
        assert_eq!(
            previous(&leap, "2026-12-02T10:00:00Z", 1),
            ["2024-02-29T00:00:00+00:00"]
        );
    }

    #[test]
    fn bad_schedules_name_their_expression() {
        let cases = [
            (Schedule::cron("61 * * * *"), "61 * * * *"),
            (Schedule::cron("not a cron"), "not a cron"),
            (Schedule::cron("0 0 30 2 *"), "0 0 30 2 *"),
            (
                Schedule::cron("0 * * * *").in_tz("Mars/Olympus_Mons"),
                "0 * * * * in Mars/Olympus_Mons",
            ),
            (Schedule::every(Duration::ZERO), "every 0s"),
            (Schedule::every(Duration::from_millis(1_500)), "every 1.5s"),
            (
                Schedule::every(Duration::from_secs(60)).catch_up(1_001),
                "every 60s",
            ),
        ];
        for (schedule, expression) in cases {
            match schedule.ticks() {
                Err(DedupError::InvalidSchedule {
                    expression: named, ..
                }) => assert_eq!(named, expression),
                other => panic!("{expression}: {other:?}"),
            }
        }
        let err = Schedule::cron("0 * * * *")
            .in_tz("Mars/Olympus_Mons")
            .ticks()
            .expect_err("unknown zone");
        assert!(err.to_string().contains("Mars/Olympus_Mons"), "{err}");
    }
}
