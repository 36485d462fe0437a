//! [`TaskKey`]: the dedup key, validated before any SQL runs.

use std::fmt;

use crate::values::validate::{self, InvalidReason};
use task_dedup_entity::task_run::{RESOURCE_KEY_MAX_CHARS, TASK_TYPE_MAX_CHARS, USER_ID_MAX_CHARS};

/// The dedup key: at most one task per key is active at a time.
///
/// Keys are byte-exact on every dialect: `"a"`, `"A"` and `"a "` are three keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskKey {
    user_id: String,
    task_type: String,
    resource_key: String,
}

impl TaskKey {
    /// Validates and builds a key.
    ///
    /// # Errors
    /// [`InvalidKey`] naming the field when a part is empty, longer than its column
    /// (`user_id` and `task_type` 64 characters, `resource_key` 255; within the MySQL
    /// index limit of 3072 bytes even at 4 bytes a character), or contains a NUL byte.
    /// `?` turns it into [`DedupError::InvalidKey`](crate::DedupError::InvalidKey).
    ///
    /// ```
    /// use task_dedup::{DedupError, KeyField, TaskKey};
    ///
    /// let key = TaskKey::new("user-1", "render", "document/42")?;
    /// assert_eq!(key.resource_key(), "document/42");
    ///
    /// let err = TaskKey::new("user-1", "", "document/42").unwrap_err();
    /// assert_eq!(err.field, KeyField::TaskType);
    /// # Ok::<(), DedupError>(())
    /// ```
    pub fn new(
        user_id: impl Into<String>,
        task_type: impl Into<String>,
        resource_key: impl Into<String>,
    ) -> Result<TaskKey, InvalidKey> {
        let key = TaskKey {
            user_id: user_id.into(),
            task_type: task_type.into(),
            resource_key: resource_key.into(),
        };
        key.check(&[
            (KeyField::UserId, &key.user_id, USER_ID_MAX_CHARS),
            (KeyField::TaskType, &key.task_type, TASK_TYPE_MAX_CHARS),
            (
                KeyField::ResourceKey,
                &key.resource_key,
                RESOURCE_KEY_MAX_CHARS,
            ),
        ])?;
        Ok(key)
    }

    /// Checks `fields`, each against its column.
    fn check(&self, fields: &[(KeyField, &String, usize)]) -> Result<(), InvalidKey> {
        for &(field, value, max_chars) in fields {
            validate::text(value, max_chars).map_err(|reason| InvalidKey { field, reason })?;
        }
        Ok(())
    }

    /// A key that belongs to no user: work of the application itself (a nightly
    /// report, a cache to rebuild). Stored with an empty `user_id`, which no key made by
    /// [`TaskKey::new`] has, so keys without a user are unique among themselves and
    /// never collide with a user's.
    ///
    /// # Errors
    /// As [`TaskKey::new`], for the task type and the resource key.
    ///
    /// ```
    /// use task_dedup::TaskKey;
    ///
    /// let key = TaskKey::without_user("rebuild-sitemap", "site/main")?;
    /// assert_eq!(key.user_id(), "");
    /// assert!(!key.has_user());
    /// assert_ne!(key, TaskKey::new("site", "rebuild-sitemap", "site/main")?);
    /// # Ok::<(), task_dedup::InvalidKey>(())
    /// ```
    pub fn without_user(
        task_type: impl Into<String>,
        resource_key: impl Into<String>,
    ) -> Result<TaskKey, InvalidKey> {
        let key = TaskKey {
            user_id: String::new(),
            task_type: task_type.into(),
            resource_key: resource_key.into(),
        };
        key.check(&[
            (KeyField::TaskType, &key.task_type, TASK_TYPE_MAX_CHARS),
            (
                KeyField::ResourceKey,
                &key.resource_key,
                RESOURCE_KEY_MAX_CHARS,
            ),
        ])?;
        Ok(key)
    }

    /// Who the task belongs to: empty for a key [without a user](Self::without_user).
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// Whether the key belongs to a user (it was not made by
    /// [`without_user`](Self::without_user)).
    pub fn has_user(&self) -> bool {
        !self.user_id.is_empty()
    }

    /// What kind of work it is.
    pub fn task_type(&self) -> &str {
        &self.task_type
    }

    /// What the work is about.
    pub fn resource_key(&self) -> &str {
        &self.resource_key
    }

    /// The three parts, borrowed, in column order.
    pub(crate) fn parts(&self) -> [&str; 3] {
        [&self.user_id, &self.task_type, &self.resource_key]
    }

    /// The three parts, moved out.
    pub(crate) fn into_parts(self) -> (String, String, String) {
        (self.user_id, self.task_type, self.resource_key)
    }

    /// A key from parts that were validated before (a stored task's).
    pub(crate) fn from_trusted_parts(
        user_id: &str,
        task_type: &str,
        resource_key: &str,
    ) -> TaskKey {
        TaskKey {
            user_id: user_id.to_owned(),
            task_type: task_type.to_owned(),
            resource_key: resource_key.to_owned(),
        }
    }
}

impl fmt::Display for TaskKey {
    /// `("user", "type", "resource")`, quoted so that spaces and empty-looking parts
    /// show; `(no user, "type", "resource")` for a key without a user.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        KeyParts(self.parts()).fmt(f)
    }
}

/// A key borrowed from its three parts, in column order: the key of a row being
/// enqueued, which holds the key's strings, so that `find_or_enqueue` need not keep a
/// copy of them beside it (three allocations per call). Displayed as [`TaskKey`] is.
#[derive(Clone, Copy)]
pub(crate) struct KeyParts<'a>(pub [&'a str; 3]);

impl KeyParts<'_> {
    /// The key as a [`TaskKey`] of its own, for an error that outlives the row.
    pub(crate) fn to_key(self) -> TaskKey {
        let [user_id, task_type, resource_key] = self.0;
        TaskKey::from_trusted_parts(user_id, task_type, resource_key)
    }
}

impl fmt::Display for KeyParts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [user_id, task_type, resource_key] = self.0;
        if user_id.is_empty() {
            f.write_str("(no user, ")?;
        } else {
            write!(f, "({user_id:?}, ")?;
        }
        write!(f, "{task_type:?}, {resource_key:?})")
    }
}

/// A part of a [`TaskKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyField {
    /// `user_id`.
    UserId,
    /// `task_type`.
    TaskType,
    /// `resource_key`.
    ResourceKey,
}

impl KeyField {
    /// The column name.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyField::UserId => "user_id",
            KeyField::TaskType => "task_type",
            KeyField::ResourceKey => "resource_key",
        }
    }
}

impl fmt::Display for KeyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A part of a key is empty, too long or contains a NUL byte: what [`TaskKey::new`]
/// rejects, before any SQL runs. Converts into
/// [`DedupError::InvalidKey`](crate::DedupError::InvalidKey).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
#[non_exhaustive]
pub struct InvalidKey {
    /// The offending part of the key.
    pub field: KeyField,
    /// What is wrong with it.
    pub reason: InvalidReason,
}
