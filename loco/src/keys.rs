//! Which `(user_id, task_type, resource_key)` a Loco job holds: the class name is the
//! task type; the rest comes from the class's [`Dedup`] rule.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};
use task_dedup::TaskKey;

use crate::error::QueueError;
use uuid::Uuid;

/// The `user_id` of a Loco job whose class names none ([`JobKey::user`]).
pub const DEFAULT_USER_ID: &str = "loco";

/// The prefix of the resource key a class deduplicated by its arguments gets: the
/// rest is the SHA-256 of the arguments' canonical JSON, in hex.
pub const ARGS_KEY_PREFIX: &str = "args:";

/// The prefix of the resource key of a job that is never deduplicated
/// ([`Dedup::Never`]): the rest is a fresh UUID, so no two such jobs share a key.
pub const UNIQUE_KEY_PREFIX: &str = "job:";

/// The key a class's rule gives one job: the resource it is about and, optionally, the
/// user it belongs to (else [`DEFAULT_USER_ID`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobKey {
    /// The resource key: at most one active job of the class per (user, resource).
    pub resource_key: String,
    /// The user the job belongs to.
    pub user_id: Option<String>,
}

impl JobKey {
    /// A key for `resource_key`, under [`DEFAULT_USER_ID`].
    pub fn new(resource_key: impl Into<String>) -> JobKey {
        JobKey {
            resource_key: resource_key.into(),
            user_id: None,
        }
    }

    /// The same key under the application's user `user_id` (the dashboard and
    /// `TaskAdmin` filter by it).
    pub fn user(mut self, user_id: impl Into<String>) -> JobKey {
        self.user_id = Some(user_id.into());
        self
    }
}

type KeyFn = dyn Fn(&Value) -> Result<JobKey, String> + Send + Sync;

/// How the jobs of one Loco worker class are deduplicated.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Dedup {
    /// The default: one active job per class and arguments, whatever the order of the
    /// keys in the arguments' JSON objects (River's "unique by args").
    #[default]
    ByArgs,
    /// One active job per key that the class's function reads from the arguments.
    ByKey(Arc<KeyFn>),
    /// Never: every `perform_later` creates a job.
    Never,
}

impl fmt::Debug for Dedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dedup::ByArgs => "ByArgs",
            Dedup::ByKey(_) => "ByKey(..)",
            Dedup::Never => "Never",
        })
    }
}

impl Dedup {
    /// [`Dedup::ByKey`] from a function of the worker's own argument type: the
    /// arguments Loco enqueues are decoded into `A` first.
    pub fn by_key<A, F>(key: F) -> Dedup
    where
        A: DeserializeOwned,
        F: Fn(&A) -> JobKey + Send + Sync + 'static,
    {
        Dedup::ByKey(Arc::new(move |args: &Value| {
            A::deserialize(args)
                .map(|args| key(&args))
                .map_err(|err| err.to_string())
        }))
    }

    /// The key of one job of `class` with `args`.
    ///
    /// # Errors
    /// [`QueueError::Key`] when a part is empty or longer than its column (a class
    /// name is the task type: at most 64 characters); [`QueueError::KeyUnreadable`]
    /// when the arguments do not decode into the type a [`Dedup::by_key`] function
    /// reads.
    pub fn key(&self, class: &str, args: &Value) -> Result<TaskKey, QueueError> {
        let job = match self {
            Dedup::ByArgs => JobKey::new(args_key(args)),
            Dedup::ByKey(key) => key(args).map_err(|reason| QueueError::KeyUnreadable {
                class: class.to_owned(),
                reason,
            })?,
            Dedup::Never => JobKey::new(format!("{UNIQUE_KEY_PREFIX}{}", Uuid::now_v7())),
        };
        let user = job.user_id.as_deref().unwrap_or(DEFAULT_USER_ID);
        Ok(TaskKey::new(user, class, job.resource_key)?)
    }
}

/// `args:` and the SHA-256 of `args`' canonical JSON: objects' keys sorted at every
/// level, no whitespace. Two argument values that differ only in key order get the
/// same key.
pub fn args_key(args: &Value) -> String {
    let mut canonical = Vec::with_capacity(128);
    write_canonical(args, &mut canonical);
    let digest = Sha256::digest(&canonical);
    let mut key = String::with_capacity(ARGS_KEY_PREFIX.len() + 64);
    key.push_str(ARGS_KEY_PREFIX);
    for byte in digest {
        key.push(HEX[usize::from(byte >> 4)]);
        key.push(HEX[usize::from(byte & 0xf)]);
    }
    key
}

const HEX: [char; 16] = [
    '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f',
];

// serde_json's map keeps insertion order when any crate of the tree enables its
// `preserve_order` feature, so key order is imposed here rather than assumed.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // A scalar's JSON is its Display form (strings quoted and escaped).
    out.extend_from_slice(value.to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_args_key() {
        let a = json!({"user": 7, "export": {"format": "csv", "rows": [1, 2]}});
        let b: Value =
            serde_json::from_str(r#"{"export": {"rows": [1, 2], "format": "csv"}, "user": 7}"#)
                .unwrap_or_default();
        assert_eq!(args_key(&a), args_key(&b));
        assert_ne!(args_key(&a), args_key(&json!({"user": 8})));
        assert_ne!(args_key(&json!([1, 2])), args_key(&json!([2, 1])));
        assert_eq!(args_key(&a).len(), ARGS_KEY_PREFIX.len() + 64);
    }

    #[test]
    fn never_gives_every_job_its_own_key() {
        let args = json!({"n": 1});
        let a = Dedup::Never.key("Mailer", &args);
        let b = Dedup::Never.key("Mailer", &args);
        assert!(matches!((a, b), (Ok(a), Ok(b)) if a != b));
    }

    #[test]
    fn a_key_function_that_cannot_read_the_args_is_a_clear_error() {
        #[derive(serde::Deserialize)]
        struct Export {
            user: u64,
        }
        let rule = Dedup::by_key(|e: &Export| JobKey::new("export").user(e.user.to_string()));
        let key = rule.key("Export", &json!({"user": 3}));
        assert!(matches!(&key, Ok(k) if k.user_id() == "3" && k.resource_key() == "export"));
        let err = rule.key("Export", &json!({"who": 3}));
        assert!(
            matches!(&err, Err(QueueError::KeyUnreadable { class, .. }) if class == "Export"),
            "{err:?}"
        );
    }
}
