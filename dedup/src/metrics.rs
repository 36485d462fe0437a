//! Counters and histograms through the [`metrics`](https://docs.rs/metrics) facade, with
//! the `metrics` feature; nothing without it. Every operation records, whoever calls it
//! (a [`Worker`](crate::Worker) or the application through [`TaskLifecycle`](crate::TaskLifecycle)):
//!
//! | name | kind | what |
//! |---|---|---|
//! | `task_dedup_enqueued_total{outcome}` | counter | `find_or_enqueue(_many)` outcomes: `created`, `existing`, `replaced` |
//! | `task_dedup_contention_total` | counter | `find_or_enqueue` gave up with `Contention` |
//! | `task_dedup_connection_retries_total{operation}` | counter | attempts run again after a lost connection |
//! | `task_dedup_claimed_total` | counter | tasks claimed |
//! | `task_dedup_finished_total{outcome}` | counter | transitions out of `running` or `queued`: `completed`, `failed`, `retried` (back to the queue with a backoff), `released`, `snoozed` (back to the queue, the attempt not counted), `cancelled` |
//! | `task_dedup_reaped_total{outcome}` | counter | expired leases: `requeued`, `failed` |
//! | `task_dedup_pruned_total{status}` | counter | finished tasks the pruner deleted: `succeeded`, `failed`, `cancelled` |
//! | `task_dedup_pause_changes_total{action}` | counter | task types paused or resumed (`pause`, `resume`), counted when the call changed something |
//! | `task_dedup_limit_waits_total{limit}` | counter | claims of a limited type that left due tasks queued for a limit: `max_running`, `max_running_per_user`, `rate`, `user_limit` (across all types) |
//! | `task_dedup_timed_out_total` | counter | a `Worker`'s attempts that ran out of their timeout (also counted as `retried` or `failed`) |
//! | `task_dedup_lost_total` | counter | a `Worker`'s tasks taken away while they ran, or whose end it could not record |
//! | `task_dedup_listener_unheard_total` | counter | a `Worker`'s checks that its PostgreSQL listener hears notifications, gone unheard (a transaction pooler between them): it polls instead |
//! | `task_dedup_enqueue_to_start_seconds` | histogram | from `run_at` (the enqueue, unless scheduled or retried) to the claim |
//! | `task_dedup_claim_to_finish_seconds{outcome}` | histogram | a `Worker`'s tasks, from claim to recorded end; outcomes as above, and `lost` |
//! | `task_dedup_periodic_ticks_total{task_type, outcome}` | counter | a `Worker`'s ticks of periodic tasks: `created`, `existing` (another worker was first), `failed` (an enqueue that failed; retried), `skipped` (passed over while behind) |

#[cfg(feature = "metrics")]
mod enabled {
    use std::time::Duration;

    pub(crate) fn enqueued(outcome: &'static str, count: u64) {
        metrics::counter!("task_dedup_enqueued_total", "outcome" => outcome).increment(count);
    }

    pub(crate) fn contention() {
        metrics::counter!("task_dedup_contention_total").increment(1);
    }

    pub(crate) fn connection_retry(operation: &'static str) {
        metrics::counter!("task_dedup_connection_retries_total", "operation" => operation)
            .increment(1);
    }

    pub(crate) fn claimed(enqueue_to_start: Duration) {
        metrics::counter!("task_dedup_claimed_total").increment(1);
        metrics::histogram!("task_dedup_enqueue_to_start_seconds")
            .record(enqueue_to_start.as_secs_f64());
    }

    pub(crate) fn finished(outcome: &'static str) {
        metrics::counter!("task_dedup_finished_total", "outcome" => outcome).increment(1);
    }

    pub(crate) fn reaped(requeued: u64, failed: u64) {
        metrics::counter!("task_dedup_reaped_total", "outcome" => "requeued").increment(requeued);
        metrics::counter!("task_dedup_reaped_total", "outcome" => "failed").increment(failed);
    }

    pub(crate) fn pruned(status: &'static str, count: u64) {
        metrics::counter!("task_dedup_pruned_total", "status" => status).increment(count);
    }

    pub(crate) fn pause_changed(action: &'static str) {
        metrics::counter!("task_dedup_pause_changes_total", "action" => action).increment(1);
    }

    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn periodic_ticks(task_type: &'static str, outcome: &'static str, count: u64) {
        metrics::counter!(
            "task_dedup_periodic_ticks_total",
            "task_type" => task_type,
            "outcome" => outcome
        )
        .increment(count);
    }

    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn handled(outcome: &'static str, claim_to_finish: Duration) {
        if outcome == "lost" {
            metrics::counter!("task_dedup_lost_total").increment(1);
        }
        metrics::histogram!("task_dedup_claim_to_finish_seconds", "outcome" => outcome)
            .record(claim_to_finish.as_secs_f64());
    }

    pub(crate) fn limit_waited(limit: &'static str) {
        metrics::counter!("task_dedup_limit_waits_total", "limit" => limit).increment(1);
    }

    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn timed_out() {
        metrics::counter!("task_dedup_timed_out_total").increment(1);
    }

    #[cfg_attr(not(all(feature = "worker", feature = "postgres")), allow(dead_code))]
    pub(crate) fn listener_unheard() {
        metrics::counter!("task_dedup_listener_unheard_total").increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::missing_const_for_fn)]
mod enabled {
    use std::time::Duration;

    pub(crate) fn enqueued(_: &'static str, _: u64) {}
    pub(crate) fn contention() {}
    pub(crate) fn connection_retry(_: &'static str) {}
    pub(crate) fn claimed(_: Duration) {}
    pub(crate) fn finished(_: &'static str) {}
    pub(crate) fn reaped(_: u64, _: u64) {}
    pub(crate) fn pruned(_: &'static str, _: u64) {}
    pub(crate) fn pause_changed(_: &'static str) {}
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn periodic_ticks(_: &'static str, _: &'static str, _: u64) {}
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn handled(_: &'static str, _: Duration) {}
    pub(crate) fn limit_waited(_: &'static str) {}
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn timed_out() {}
    #[cfg_attr(not(all(feature = "worker", feature = "postgres")), allow(dead_code))]
    pub(crate) fn listener_unheard() {}
}

pub(crate) use enabled::*;
