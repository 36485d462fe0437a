//! Retries: what [`fail`](crate::TaskLifecycle::fail) does with a failed attempt, and the
//! exponential backoff with jitter that decides it.

use std::time::Duration;

use crate::values::error::DedupError;
use crate::values::validate::InvalidArgument;

/// What to do with a task whose attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retry {
    /// Fail for good: the task becomes `failed` and releases its key.
    Never,
    /// Run it again after this delay: the task goes back to `queued` with `run_at` this
    /// far in the future (by the database's clock), keeping its key the whole time.
    After(Duration),
}

/// Exponential backoff with jitter and an attempt limit: what a worker runtime or the
/// reaper uses to decide [`Retry`].
///
/// The delay before attempt `n + 1` is `base_delay * 2^(n - 1)`, capped at `max_delay`,
/// then spread by ±`jitter` (a fraction) so that tasks that failed together do not run
/// again together. After `max_attempts` attempts the task fails for good.
///
/// ```
/// use std::time::Duration;
/// use task_dedup::{Retry, RetryPolicy};
///
/// let policy = RetryPolicy { jitter: 0.0, ..RetryPolicy::default() };
/// assert_eq!(policy.after_attempt(1), Retry::After(Duration::from_secs(1)));
/// assert_eq!(policy.after_attempt(3), Retry::After(Duration::from_secs(4)));
/// assert_eq!(policy.after_attempt(policy.max_attempts), Retry::Never);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; at least 1 (1 = never retry).
    pub max_attempts: i32,
    /// The delay after the first failed attempt.
    pub base_delay: Duration,
    /// The longest delay.
    pub max_delay: Duration,
    /// How far a delay may stray either way, as a fraction of it (0.0 to 1.0).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    /// 20 attempts, 1 s doubling up to 1 h, ±20 % jitter: about 10 hours from the first
    /// attempt to the last.
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 20,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(3_600),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// Checks the fields: `max_attempts >= 1`, `base_delay <= max_delay`,
    /// `0.0 <= jitter <= 1.0`.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] naming the field.
    pub fn validate(&self) -> Result<(), DedupError> {
        let invalid =
            |name, expected| DedupError::from(InvalidArgument::out_of_range(name, expected));
        if self.max_attempts < 1 {
            return Err(invalid("max_attempts", "at least 1"));
        }
        if self.base_delay > self.max_delay {
            return Err(invalid("base_delay", "at most max_delay"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(invalid("jitter", "between 0.0 and 1.0"));
        }
        Ok(())
    }

    /// What to do after attempt number `attempts` (a task's `attempts` once claimed)
    /// failed.
    pub fn after_attempt(&self, attempts: i32) -> Retry {
        if attempts >= self.max_attempts {
            return Retry::Never;
        }
        let doublings = u32::try_from(attempts.saturating_sub(1).clamp(0, 62)).unwrap_or(0);
        let delay = self
            .base_delay
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max_delay);
        Retry::After(self.spread(delay))
    }

    /// `delay` moved by a random amount within ±`jitter` of it.
    fn spread(&self, delay: Duration) -> Duration {
        if self.jitter <= 0.0 {
            return delay;
        }
        let factor = 1.0 + self.jitter * (2.0 * rand::random::<f64>() - 1.0);
        delay.mul_f64(factor.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_stop_at_the_limit() {
        let policy = RetryPolicy {
            max_attempts: 40,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            jitter: 0.0,
        };
        let delays: Vec<_> = (1..=6).map(|n| policy.after_attempt(n)).collect();
        let ms = |n| Retry::After(Duration::from_millis(n));
        assert_eq!(
            delays,
            [ms(100), ms(200), ms(400), ms(800), ms(1_000), ms(1_000)]
        );
        assert_eq!(policy.after_attempt(39), ms(1_000), "no overflow far out");
        assert_eq!(policy.after_attempt(40), Retry::Never);
        assert_eq!(policy.after_attempt(41), Retry::Never);
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let policy = RetryPolicy {
            jitter: 0.5,
            ..RetryPolicy::default()
        };
        for _ in 0..1_000 {
            let Retry::After(delay) = policy.after_attempt(2) else {
                panic!("retried");
            };
            assert!(
                delay >= Duration::from_secs(1) && delay <= Duration::from_secs(3),
                "{delay:?}"
            );
        }
    }

    #[test]
    fn invalid_policies_are_rejected() {
        let ok = RetryPolicy::default();
        assert!(ok.validate().is_ok());
        for bad in [
            RetryPolicy {
                max_attempts: 0,
                ..ok
            },
            RetryPolicy { jitter: 1.5, ..ok },
            RetryPolicy { jitter: -0.1, ..ok },
            RetryPolicy {
                base_delay: Duration::from_secs(7_200),
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
