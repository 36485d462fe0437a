//! A Loco job as a `task_run` row: the payload envelope, the status names, the
//! priority, and the row read back as `loco_rs::bgworker::Job`.

use loco_rs::bgworker::{Job, JobStatus};
use serde_json::{Map, Value, json};
use task_dedup::{TaskStatus, task_run};

/// The payload field that holds what Loco enqueued: `{"loco": {"args": .., "queue":
/// .., "tags": [..]}}`. The dashboard shows it as it is.
pub const ENVELOPE: &str = "loco";

/// The payload of a job: its arguments, Loco's queue name and tags, kept for
/// [`get_jobs`](loco_rs::bgworker::QueueProvider::get_jobs) and the dashboard.
pub(crate) fn envelope(args: Value, queue: Option<&str>, tags: Option<&[String]>) -> Value {
    let mut inner = Map::new();
    inner.insert("args".into(), args);
    if let Some(queue) = queue {
        inner.insert("queue".into(), Value::String(queue.to_owned()));
    }
    if let Some(tags) = tags {
        inner.insert("tags".into(), json!(tags));
    }
    json!({ ENVELOPE: inner })
}

/// The arguments inside a job's payload, or `None` when the row is not a Loco job.
pub(crate) fn args(payload: Option<&Value>) -> Option<&Value> {
    payload?.get(ENVELOPE)?.get("args")
}

fn tags(payload: Option<&Value>) -> Option<Vec<String>> {
    let tags = payload?.get(ENVELOPE)?.get("tags")?.as_array()?;
    Some(
        tags.iter()
            .filter_map(|tag| tag.as_str().map(str::to_owned))
            .collect(),
    )
}

/// Loco's priority (any `i32`, higher first) in `task_run.priority` (`i16`, higher
/// first): saturated at the `i16` bounds, so order is kept except among values beyond
/// them.
pub(crate) fn priority(priority: Option<i32>) -> i16 {
    let priority = priority.unwrap_or(0);
    i16::try_from(priority).unwrap_or(if priority < 0 { i16::MIN } else { i16::MAX })
}

/// Loco's status for a task's.
pub(crate) fn loco_status(status: TaskStatus) -> JobStatus {
    match status {
        TaskStatus::Queued => JobStatus::Queued,
        TaskStatus::Running => JobStatus::Processing,
        TaskStatus::Succeeded => JobStatus::Completed,
        TaskStatus::Failed => JobStatus::Failed,
        // TaskStatus is non-exhaustive: a status added later is shown as cancelled
        // rather than as a state Loco would act on.
        _ => JobStatus::Cancelled,
    }
}

/// The task statuses of Loco's.
pub(crate) fn task_status(status: &JobStatus) -> TaskStatus {
    match status {
        JobStatus::Queued => TaskStatus::Queued,
        JobStatus::Processing => TaskStatus::Running,
        JobStatus::Completed => TaskStatus::Succeeded,
        JobStatus::Failed => TaskStatus::Failed,
        _ => TaskStatus::Cancelled,
    }
}

/// A `task_run` row as Loco's job: the id is the task's, the name its type (the class),
/// the data its arguments (the whole payload for a row that is not a Loco job).
pub(crate) fn job(task: task_run::Model) -> Job {
    let data = args(task.payload.as_ref())
        .cloned()
        .or_else(|| task.payload.clone())
        .unwrap_or(Value::Null);
    Job {
        id: task.id.to_string(),
        name: task.task_type,
        tags: tags(task.payload.as_ref()),
        data,
        status: loco_status(task.status),
        run_at: task.run_at,
        interval: None,
        created_at: Some(task.created_at),
        updated_at: Some(task.updated_at),
        priority: i32::from(task.priority),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_saturate_in_order() {
        assert_eq!(priority(None), 0);
        assert_eq!(priority(Some(-5)), -5);
        assert_eq!(priority(Some(i32::MAX)), i16::MAX);
        assert_eq!(priority(Some(i32::MIN)), i16::MIN);
    }

    #[test]
    fn statuses_round_trip() {
        for status in [
            JobStatus::Queued,
            JobStatus::Processing,
            JobStatus::Completed,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ] {
            assert_eq!(loco_status(task_status(&status)), status);
        }
    }

    #[test]
    fn the_envelope_keeps_args_queue_and_tags() {
        let tags = vec!["mail".to_owned()];
        let payload = envelope(json!({"to": "a@b"}), Some("default"), Some(&tags));
        assert_eq!(args(Some(&payload)), Some(&json!({"to": "a@b"})));
        assert_eq!(super::tags(Some(&payload)), Some(tags));
        assert_eq!(args(Some(&json!({"to": "a@b"}))), None);
    }
}
