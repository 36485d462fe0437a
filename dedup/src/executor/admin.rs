//! The admin API's statements: lists built for their shape ([`ListShape`]) with their
//! values bound in its order, the counts and times of the overview, and the bulk
//! actions on a list of ids.

use uuid::Uuid;

use super::Executor;
use super::args::{self, Arg};
use crate::dialect::{Dialect, Failure, ListShape, admin};
use task_dedup_entity::task_run;

type Time = chrono::DateTime<chrono::Utc>;

/// A list's filters, validated: what [`Executor::list`] binds.
pub(crate) struct ListArgs<'a> {
    /// Statuses, any when empty.
    pub statuses: &'a [&'static str],
    pub task_type: Option<&'a str>,
    pub user_id: Option<&'a str>,
    /// Keys that start with this, byte for byte.
    pub key_prefix: Option<&'a str>,
    pub created_from: Option<Time>,
    pub created_before: Option<Time>,
    /// The page after this position (`created_at`, `id`) in the list's order.
    pub after: Option<(Time, Uuid)>,
    pub newest_first: bool,
    pub limit: i64,
}

impl ListArgs<'_> {
    fn shape(&self) -> ListShape {
        ListShape {
            statuses: admin::Statuses::of(self.statuses),
            task_type: self.task_type.is_some(),
            user_id: self.user_id.is_some(),
            key_prefix: self.key_prefix.is_some(),
            created_from: self.created_from.is_some(),
            created_before: self.created_before.is_some(),
            after: self.after.is_some(),
            newest_first: self.newest_first,
            bound: 1 << crate::dialect::render::bound(self.limit),
        }
    }

    /// The values, in the order [`ListShape`] documents.
    fn values(&self, dialect: Dialect) -> Vec<Arg<'_>> {
        let mut values: Vec<Arg<'_>> = match dialect {
            // The statuses are written in PostgreSQL's text (`dialect::admin`).
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Vec::new(),
            #[allow(unreachable_patterns)]
            _ => admin::Statuses::of(self.statuses)
                .names()
                .map(Arg::Str)
                .collect(),
        };
        values.extend(self.task_type.map(Arg::Str));
        values.extend(self.user_id.map(Arg::Str));
        if let Some(prefix) = self.key_prefix {
            match dialect {
                #[cfg(feature = "postgres")]
                Dialect::Postgres => values.push(Arg::String(like_prefix(prefix))),
                #[allow(unreachable_patterns)]
                _ => values.extend([Arg::Str(prefix), Arg::String(prefix_range(prefix))]),
            }
        }
        values.extend(self.created_from.map(Arg::Time));
        values.extend(self.created_before.map(Arg::Time));
        if let Some((created_at, id)) = self.after {
            match dialect {
                #[cfg(feature = "mysql")]
                Dialect::MySql => values.extend([
                    Arg::Time(created_at),
                    Arg::Time(created_at),
                    Arg::Time(created_at),
                    Arg::Uuid(id),
                ]),
                #[allow(unreachable_patterns)]
                _ => values.extend([Arg::Time(created_at), Arg::Uuid(id)]),
            }
        }
        values.push(Arg::I64(self.limit));
        values
    }
}

/// A LIKE pattern matching the strings that start with `prefix`: its `!`, `%` and `_`
/// escaped with `!` (the statement's `ESCAPE '!'`), then `%`.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '!' | '%' | '_') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// The successor of `prefix`: the least string greater, in code-point (UTF-8 byte)
/// order, than every string that starts with `prefix`, so that those strings are
/// exactly the range `[prefix, successor)`. Its last character that is not U+10FFFF
/// goes up by one (past the surrogates), and what follows it is dropped. A prefix of
/// U+10FFFF characters only has no successor: 256 of them are greater than every key
/// that starts with it (a key has at most 255 characters, and on MySQL/MariaDB at most
/// 1,020 bytes, 255 such characters).
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
pub(crate) fn prefix_range(prefix: &str) -> String {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return chars.into_iter().collect();
        }
    }
    std::iter::repeat_n(char::MAX, 256).collect()
}

impl Executor<'_> {
    /// Whether the admin API's reads go through [`Executor::admin_rows`]'s transaction:
    /// PostgreSQL on a pool (a caller's transaction is left as it is: the setting would
    /// outlive the read there).
    fn admin_reads_without_jit(&self) -> bool {
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => !self.in_transaction(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The rows of an admin read: on PostgreSQL on a pool in a transaction of its own
    /// with JIT off (`admin.sql`'s `without_jit` says why), elsewhere as they come.
    async fn admin_rows(
        &mut self,
        sql: impl Into<std::borrow::Cow<'static, str>>,
        values: Vec<Arg<'_>>,
    ) -> Result<Vec<sea_orm::QueryResult>, Failure> {
        #[cfg(feature = "postgres")]
        if self.admin_reads_without_jit() {
            let mut txn = self.begin(false).await?;
            let outcome = async {
                let without_jit = crate::dialect::postgres::sql().without_jit.as_str();
                txn.affected(without_jit, vec![]).await?;
                txn.rows(sql, values).await
            }
            .await;
            return txn.finish(outcome).await;
        }
        self.rows(sql, values).await
    }

    /// One page of tasks.
    pub(crate) async fn list(
        &mut self,
        list: &ListArgs<'_>,
    ) -> Result<Vec<task_run::Model>, Failure> {
        let sql = admin::list(self.dialect, list.shape());
        let values = list.values(self.dialect);
        if self.admin_reads_without_jit() {
            // A page of at most a few hundred rows, off the hot path: SeaORM's mapping.
            use super::row::TaskRow;
            let rows = self.admin_rows(sql, values).await?;
            return Ok(rows.iter().map(TaskRow::task).collect::<Result<_, _>>()?);
        }
        self.tasks(sql, values).await
    }

    /// The database's clock.
    pub(crate) async fn now(&mut self) -> Result<Time, Failure> {
        let rows = self.rows(self.dialect.admin().now.as_str(), vec![]).await?;
        let row = rows.first().ok_or_else(|| {
            Failure::from(sea_orm::DbErr::Custom(
                "task-dedup: the clock query returned no row".to_owned(),
            ))
        })?;
        Ok(row.try_get("", "now")?)
    }

    /// The number of tasks per (type, status).
    pub(crate) async fn counts(&mut self) -> Result<Vec<(String, String, i64)>, Failure> {
        let rows = self
            .rows(self.dialect.admin().counts.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok((
                    row.try_get("", "task_type")?,
                    row.try_get("", "status")?,
                    row.try_get("", "n")?,
                ))
            })
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// Every task type there is, in order.
    pub(crate) async fn task_types(&mut self) -> Result<Vec<String>, Failure> {
        let rows = self
            .admin_rows(self.dialect.admin().task_types.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get("", "task_type"))
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// The tasks of `task_type` per status (every status, 0 included), each count
    /// stopping at `limit`.
    pub(crate) async fn counts_of_type(
        &mut self,
        task_type: &str,
        limit: i64,
    ) -> Result<Vec<(String, i64)>, Failure> {
        let repeats = match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => admin::COUNTED_STATUSES,
            #[allow(unreachable_patterns)]
            _ => 1,
        };
        let values = (0..repeats)
            .flat_map(|_| [Arg::Str(task_type), Arg::I64(limit)])
            .collect();
        let rows = self
            .admin_rows(self.dialect.admin().counts_of_type.as_str(), values)
            .await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get("", "status")?, row.try_get("", "n")?)))
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// Tasks created, succeeded and failed per minute over the last hour: (what, minute
    /// since the epoch, count).
    pub(crate) async fn throughput(&mut self) -> Result<Vec<(String, i64, i64)>, Failure> {
        let rows = self
            .admin_rows(self.dialect.admin().throughput.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok((
                    row.try_get("", "what")?,
                    row.try_get("", "minute")?,
                    row.try_get("", "n")?,
                ))
            })
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// The creation time of the oldest queued task of each type.
    pub(crate) async fn oldest_queued(&mut self) -> Result<Vec<(String, Time)>, Failure> {
        let rows = self
            .admin_rows(self.dialect.admin().oldest_queued.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get("", "task_type")?, row.try_get("", "oldest")?)))
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// Deletes task `id` if it is finished; whether it did.
    pub(crate) async fn delete(&mut self, id: Uuid) -> Result<bool, Failure> {
        let deleted = self
            .affected(self.dialect.admin().delete.as_str(), vec![Arg::Uuid(id)])
            .await?;
        Ok(deleted == 1)
    }

    /// Cancels those of `ids` that are queued or running, with `reason`; how many.
    pub(crate) async fn cancel_many(&mut self, reason: &str, ids: &[Uuid]) -> Result<u64, Failure> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut values = vec![Arg::Str(reason)];
        values.extend(args::ids(self.dialect, ids));
        let sql = self
            .dialect
            .admin()
            .cancel_many
            .render(0, &[("ids", ids.len())]);
        self.affected(sql, values).await
    }

    /// Deletes those of `ids` that are finished; how many.
    pub(crate) async fn delete_many(&mut self, ids: &[Uuid]) -> Result<u64, Failure> {
        if ids.is_empty() {
            return Ok(0);
        }
        let values = args::ids(self.dialect, ids);
        let sql = self
            .dialect
            .admin()
            .delete_many
            .render(0, &[("ids", ids.len())]);
        self.affected(sql, values).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_wildcards_in_a_prefix_are_escaped() {
        assert_eq!(like_prefix("a"), "a%");
        assert_eq!(like_prefix("50%_off!"), "50!%!_off!!%");
        assert_eq!(like_prefix("café/"), "café/%");
    }

    #[test]
    fn a_prefix_range_ends_at_its_successor() {
        assert_eq!(prefix_range("a"), "b");
        assert_eq!(prefix_range("50%_off!"), "50%_off\"");
        assert_eq!(prefix_range("café/"), "café0");
        assert_eq!(prefix_range("caf\u{FF}"), "caf\u{100}");
        assert_eq!(prefix_range("a\u{D7FF}"), "a\u{E000}");
        assert_eq!(prefix_range("a\u{10FFFF}"), "b");
        assert_eq!(prefix_range("a\u{10FFFF}\u{10FFFF}"), "b");
        let none = prefix_range("\u{10FFFF}");
        assert_eq!(none.chars().count(), 256);
        assert!(none.chars().all(|c| c == char::MAX));
    }
}
