//! The statements of limits per task type ([`crate::dialect::limits`]): a limited
//! type's claim, step by step inside its transaction, and the stored settings.

use sea_orm::{FromQueryResult, QueryResult};
use uuid::Uuid;

use super::Executor;
use super::args::{self, Arg};
use crate::dialect::limits::ALL_TYPES;
use crate::dialect::{Claim, Dialect, Failure};
use task_dedup_entity::task_run;

/// A type's stored limits, as its claim reads them under the row's lock (the columns
/// of `Limits::lock` and `Limits::list`).
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub(crate) struct LimitRow {
    pub max_running: Option<i32>,
    pub max_running_per_user: Option<i32>,
    pub rate_starts: Option<i32>,
    pub rate_window_micros: Option<i64>,
    /// The start of the window `window_starts` counts, in microseconds since the epoch.
    pub window_start_micros: i64,
    pub window_starts: i32,
    /// Whether its claims take users in turn.
    pub fair: bool,
    /// The last user a fair claim served.
    pub fair_cursor: Option<String>,
    /// The database's clock.
    pub now_micros: i64,
}

/// What a limited claim locked: its type's limits, and the limit across all types.
#[derive(Debug, Default)]
pub(crate) struct Locked {
    /// The type's own row, if it has one.
    pub own: Option<LimitRow>,
    /// [`ALL_TYPES`]' row, if a limit across all types is set.
    pub all_types: Option<LimitRow>,
}

/// A limited type's row in [`Executor::list_limits`].
pub(crate) struct ListedLimit {
    pub task_type: String,
    pub limits: LimitRow,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    pub running: i64,
}

/// The lock-free tries of a limited type's claim, cheapest first (`lifecycle::limited`
/// says which to try; [`Executor::lock_free_claim`] which statement that is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockFree {
    /// The first try: a random range of free run slots, or the running tasks counted in
    /// the statement, or the slots read with the candidates.
    Window,
    /// The second: the free run slots read.
    Slots,
}

/// What `Executor::slots_and_candidates` read: a type's limit, its running tasks'
/// slots (`None`: a task without one) and its next due tasks.
#[cfg(feature = "mysql")]
pub(crate) struct SlotsRead {
    pub limit: i64,
    pub running: Vec<Option<i64>>,
    pub candidates: Vec<Candidate>,
}

/// A due task a limited claim may start (the columns of the candidate selections).
#[derive(FromQueryResult)]
pub(crate) struct Candidate {
    pub id: Uuid,
    pub user_id: String,
    /// With the user and the resource key, the task's key: one run each (a claim of
    /// the types without limits of their own reads several types at once).
    pub task_type: String,
    pub resource_key: String,
    pub concurrent: bool,
}

impl Executor<'_> {
    /// The limited task types.
    pub(crate) async fn limited_types(&mut self) -> Result<Vec<String>, Failure> {
        let rows = self
            .rows(self.dialect.limits().types.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get("", "task_type"))
            .collect::<Result<_, _>>()?)
    }

    /// `task_type`'s limits and the limit across all types, their rows locked until the
    /// transaction ends (`task_type` [`ALL_TYPES`]: that row alone).
    pub(crate) async fn lock_limits(&mut self, task_type: &str) -> Result<Locked, Failure> {
        let rows = self
            .rows(
                self.dialect.limits().lock.as_str(),
                vec![Arg::Str(task_type)],
            )
            .await?;
        let mut locked = Locked::default();
        for row in &rows {
            let limits = LimitRow::from_query_result(row, "")?;
            if row.try_get::<String>("", "task_type")? == ALL_TYPES {
                locked.all_types = Some(limits);
            } else {
                locked.own = Some(limits);
            }
        }
        Ok(locked)
    }

    /// Every running task's user.
    pub(crate) async fn running_users(&mut self) -> Result<Vec<String>, Failure> {
        let rows = self
            .rows(self.dialect.limits().running_users.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get("", "user_id"))
            .collect::<Result<_, _>>()?)
    }

    /// Up to `max` due tasks of `task_types` (any when empty) that have no limits of
    /// their own, in claim order, none of `excluded` users, locked (SQLite: under the
    /// transaction's write lock).
    pub(crate) async fn rest_candidates(
        &mut self,
        task_types: &[&str],
        excluded: &[&str],
        max: i64,
    ) -> Result<Vec<Candidate>, Failure> {
        let sql = self.dialect.limits().rest_candidates.render(
            max,
            &[("types", task_types.len()), ("users", excluded.len())],
        );
        let mut values = users(self.dialect, task_types);
        values.extend(users(self.dialect, excluded));
        values.push(Arg::I64(max));
        let rows = self.rows(sql, values).await?;
        candidates(&rows)
    }

    /// `task_type`'s running tasks: each one's user and run slot.
    pub(crate) async fn running_of_type(
        &mut self,
        task_type: &str,
    ) -> Result<Vec<(String, Option<i32>)>, Failure> {
        let rows = self
            .rows(
                self.dialect.limits().running.as_str(),
                vec![Arg::Str(task_type)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get("", "user_id")?, row.try_get("", "run_slot")?)))
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// The lock-free claim of a type whose only limit is `max_running` at `stage`, in
    /// the form `how`: up to `max` of its due tasks, as many as the limit leaves, started
    /// under `worker_id`'s lease without the type's lock. Which statement that is, is the
    /// dialect's: PostgreSQL a random range of free run slots (`Window`, or its optimistic
    /// form) or the free slots read (`Slots`); SQLite the running tasks counted in the
    /// statement (`Window`; writers take turns, so there is nothing to read at `Slots`);
    /// MySQL/MariaDB the slots read with the candidates and free ones picked, in a
    /// transaction of its own (`Window`; `executor::mysql`). Starts nothing where the
    /// dialect has no such try, for a type with other limits, or while one of its running
    /// tasks holds no slot below the limit. A slot another claim took first fails it
    /// ([`Kind::SlotTaken`](crate::dialect::Kind::SlotTaken)); a picked key that runs,
    /// in the optimistic form, too ([`Kind::RunningKey`](crate::dialect::Kind::RunningKey)):
    /// it took nothing then.
    pub(crate) async fn lock_free_claim(
        &mut self,
        stage: LockFree,
        how: Claim,
        worker_id: &str,
        task_type: &str,
        lease_micros: i64,
        max: i64,
    ) -> Result<Vec<task_run::Model>, Failure> {
        #[cfg(feature = "mysql")]
        if self.dialect == Dialect::MySql {
            return match stage {
                LockFree::Window => {
                    super::mysql::claim_by_read_slots(
                        self,
                        how,
                        worker_id,
                        task_type,
                        lease_micros,
                        max,
                    )
                    .await
                }
                LockFree::Slots => Ok(Vec::new()),
            };
        }
        let Some(sql) = self.lock_free_text(stage, how, max) else {
            return Ok(Vec::new());
        };
        let values = vec![
            Arg::Str(worker_id),
            args::interval(self.dialect, lease_micros),
            Arg::Str(task_type),
            Arg::I64(max),
        ];
        // In the caller's transaction, a savepoint: a slot another claim took (a unique
        // violation) would otherwise abort it.
        if self.in_transaction() {
            let mut txn = self.begin(false).await?;
            let outcome = txn.tasks(sql, values).await;
            return txn.finish(outcome).await;
        }
        // A rerun after a lost race, as the main claim's (`Executor::hold`).
        self.hold().await?;
        self.tasks(sql, values).await
    }

    /// The one statement of [`lock_free_claim`](Self::lock_free_claim) at `stage` where
    /// the dialect has one.
    fn lock_free_text(&self, stage: LockFree, how: Claim, max: i64) -> Option<&'static str> {
        let _ = (stage, how, max);
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                let texts = &crate::dialect::postgres::sql().lock_free;
                Some(match (stage, how) {
                    (LockFree::Window, Claim::Optimistic) => texts.optimistic_window_claim.at(max),
                    (LockFree::Window, Claim::Probing) => texts.window_claim.at(max),
                    (LockFree::Slots, _) => texts.slot_claim.at(max),
                })
            }
            // Writers take turns: the window claim's count is exact, and there are no
            // slots to read.
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => {
                let texts = &crate::dialect::sqlite::sql().lock_free;
                match (stage, how) {
                    (LockFree::Window, Claim::Optimistic) => Some(&texts.optimistic_window_claim),
                    (LockFree::Window, Claim::Probing) => Some(&texts.window_claim),
                    (LockFree::Slots, _) => None,
                }
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// A type whose only limit is `max_running`, in one statement (MySQL/MariaDB): up to
    /// `max` of its due tasks (locked; `how` optimistic: without the probe for running
    /// tasks of their keys), its limit, and its running tasks' slots (`None`: a task
    /// without one). `None` for a type with other limits.
    #[cfg(feature = "mysql")]
    pub(super) async fn slots_and_candidates(
        &mut self,
        task_type: &str,
        how: Claim,
        max: i64,
    ) -> Result<Option<SlotsRead>, Failure> {
        let claims = &crate::dialect::mysql::sql().claims;
        let sql = match how {
            Claim::Optimistic => &claims.slots_and_optimistic_candidates,
            Claim::Probing => &claims.slots_and_candidates,
        };
        let values = vec![Arg::Str(task_type), Arg::I64(max), Arg::Str(task_type)];
        let rows = self.rows(sql.as_str(), values).await?;
        let mut limit = None;
        let mut running = Vec::new();
        let mut candidates = Vec::new();
        for row in &rows {
            if row.try_get::<Option<Uuid>>("", "id")?.is_some() {
                candidates.push(Candidate::from_query_result(row, "")?);
                continue;
            }
            limit = Some(i64::from(row.try_get::<i32>("", "m")?));
            if row.try_get::<Option<String>>("", "status")?.is_some() {
                running.push(row.try_get::<Option<i32>>("", "slot")?.map(i64::from));
            }
        }
        Ok(limit.map(|limit| SlotsRead {
            limit,
            running,
            candidates,
        }))
    }

    /// Up to `max` due tasks of `task_type` in claim order, none of `excluded` users,
    /// locked (SQLite: under the transaction's write lock).
    pub(crate) async fn limited_candidates(
        &mut self,
        task_type: &str,
        excluded: &[&str],
        max: i64,
    ) -> Result<Vec<Candidate>, Failure> {
        let sql = self
            .dialect
            .limits()
            .candidates
            .render(max, &[("users", excluded.len())]);
        let mut values = vec![Arg::Str(task_type)];
        values.extend(users(self.dialect, excluded));
        values.push(Arg::I64(max));
        let rows = self.rows(sql, values).await?;
        candidates(&rows)
    }

    /// Up to `max` users with queued tasks of `task_type`, in order from the one after
    /// `cursor` (`""`: from the first).
    pub(crate) async fn fair_users(
        &mut self,
        task_type: &str,
        cursor: &str,
        max: i64,
    ) -> Result<Vec<String>, Failure> {
        let values = match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => vec![Arg::Str(task_type), Arg::Str(cursor), Arg::I64(max)],
            #[allow(unreachable_patterns)]
            _ => vec![
                Arg::Str(task_type),
                Arg::Str(cursor),
                Arg::Str(task_type),
                Arg::I64(max),
            ],
        };
        let rows = self
            .rows(self.dialect.limits().fair_users.as_str(), values)
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get("", "user_id"))
            .collect::<Result<_, _>>()?)
    }

    /// `user_id`'s next `max` due tasks of `task_type`, in claim order.
    pub(crate) async fn fair_heads(
        &mut self,
        task_type: &str,
        user_id: &str,
        max: i64,
    ) -> Result<Vec<Candidate>, Failure> {
        let values = vec![Arg::Str(task_type), Arg::Str(user_id), Arg::I64(max)];
        let rows = self
            .rows(self.dialect.limits().fair_heads.as_str(), values)
            .await?;
        candidates(&rows)
    }

    /// Records `user_id` as the last user a fair claim of `task_type` served.
    pub(crate) async fn set_fair_cursor(
        &mut self,
        task_type: &str,
        user_id: &str,
    ) -> Result<(), Failure> {
        let values = vec![Arg::Str(user_id), Arg::Str(task_type)];
        self.affected(self.dialect.limits().fair_cursor.as_str(), values)
            .await?;
        Ok(())
    }

    /// Moves the tasks `ids` that are still queued to `running` under `worker_id`'s
    /// lease, each with its run slot in `slots` (the same order); the tasks it moved.
    pub(crate) async fn claim_ids(
        &mut self,
        worker_id: &str,
        lease_micros: i64,
        ids: &[Uuid],
        slots: &[Option<i64>],
    ) -> Result<Vec<task_run::Model>, Failure> {
        let sql = self
            .dialect
            .limits()
            .claim_ids
            .render(0, &[("slots", ids.len()), ("ids", ids.len())]);
        let mut values = vec![
            Arg::Str(worker_id),
            args::interval(self.dialect, lease_micros),
        ];
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                values.push(Arg::Array(args::Array::Uuid(ids.to_vec())));
                let slots = slots.iter().map(|slot| slot.unwrap_or(-1)).collect();
                values.push(Arg::Array(args::Array::I64(slots)));
            }
            #[allow(unreachable_patterns)]
            _ => {
                for (id, slot) in ids.iter().zip(slots) {
                    values.extend([Arg::Uuid(*id), Arg::OptI64(*slot)]);
                }
                values.extend(ids.iter().map(|id| Arg::Uuid(*id)));
            }
        }
        match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                self.affected(sql, values).await?;
                let read = crate::dialect::mysql::sql()
                    .claims
                    .claimed
                    .render(0, &[("ids", ids.len())]);
                let tasks = self.tasks(read, args::ids(self.dialect, ids)).await?;
                Ok(super::mysql::moved_by(tasks, worker_id))
            }
            #[allow(unreachable_patterns)]
            _ => self.tasks(sql, values).await,
        }
    }

    /// Records the rate's window of `task_type`: its start and the starts in it.
    pub(crate) async fn set_window(
        &mut self,
        task_type: &str,
        start_micros: i64,
        starts: i64,
    ) -> Result<(), Failure> {
        let values = vec![
            Arg::I64(start_micros),
            Arg::I64(starts),
            Arg::Str(task_type),
        ];
        self.affected(self.dialect.limits().window.as_str(), values)
            .await?;
        Ok(())
    }

    /// Inserts or replaces `task_type`'s limits.
    pub(crate) async fn set_limits(
        &mut self,
        task_type: &str,
        [max_running, per_user, rate_starts, rate_window_micros]: [Option<i64>; 4],
        fair: bool,
    ) -> Result<(), Failure> {
        let values = vec![
            Arg::Str(task_type),
            Arg::OptI64(max_running),
            Arg::OptI64(per_user),
            Arg::OptI64(rate_starts),
            Arg::OptI64(rate_window_micros),
            Arg::Bool(fair),
        ];
        self.affected(self.dialect.limits().set.as_str(), values)
            .await?;
        Ok(())
    }

    /// Removes `task_type`'s limits; whether it had any.
    pub(crate) async fn clear_limits(&mut self, task_type: &str) -> Result<bool, Failure> {
        let values = vec![Arg::Str(task_type)];
        Ok(self
            .affected(self.dialect.limits().clear.as_str(), values)
            .await?
            == 1)
    }

    /// Every limited type, by name.
    pub(crate) async fn list_limits(&mut self) -> Result<Vec<ListedLimit>, Failure> {
        let rows = self
            .rows(self.dialect.limits().list.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok(ListedLimit {
                    task_type: row.try_get("", "task_type")?,
                    limits: LimitRow::from_query_result(row, "")?,
                    updated_at: row.try_get("", "updated_at")?,
                    running: row.try_get("", "running")?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }
}

/// The candidates `rows` hold.
fn candidates(rows: &[QueryResult]) -> Result<Vec<Candidate>, Failure> {
    Ok(rows
        .iter()
        .map(|row| Candidate::from_query_result(row, ""))
        .collect::<Result<_, sea_orm::DbErr>>()?)
}

/// The users a limited claim passes over (or the types it takes), as its dialect binds
/// them: as a claim binds task types (`args::task_types`: one PostgreSQL array, one JSON
/// array on SQLite), and one value each on MySQL/MariaDB.
fn users<'a>(dialect: Dialect, users: &[&'a str]) -> Vec<Arg<'a>> {
    match dialect {
        #[cfg(feature = "mysql")]
        Dialect::MySql => users.iter().map(|user| Arg::Str(user)).collect(),
        #[cfg(any(feature = "postgres", feature = "sqlite"))]
        #[allow(unreachable_patterns)]
        _ => vec![args::task_types(dialect, users)],
    }
}
