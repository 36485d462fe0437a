//! MySQL/MariaDB's flows: without `RETURNING` (MariaDB has one, MySQL 8 does not), a
//! write and the read of its row run in one short transaction, whose row locks keep the
//! row as the write left it until the read.

use std::collections::HashSet;

use uuid::Uuid;

use super::args::{self, Arg};
use super::{EndMany, Executor, Inserted};
use crate::dialect::mysql::sql;
use crate::dialect::{Claim, Failure};
use task_dedup_entity::task_run;

/// A plain INSERT; the duplicate-key error on our index means "held" (and with
/// `replace`, the queued holder takes the new values).
pub(super) async fn insert(
    exec: &mut Executor<'_>,
    row: &task_run::Model,
    replace: bool,
) -> Result<Inserted, Failure> {
    match exec
        .affected(sql().statements.insert.as_str(), args::row(row).into())
        .await
    {
        Ok(_) => Ok(Inserted::Created),
        // Boxed, as the rare path: its transaction's state would otherwise sit in every
        // insert's future.
        Err(failure) if failure.is_held_key() && replace => {
            Box::pin(replace_queued(exec, row)).await
        }
        Err(failure) if failure.is_held_key() => Ok(Inserted::Held),
        Err(failure) => Err(failure),
    }
}

/// The insert and, when the key is held, the locking read of its holder, in one
/// transaction. A duplicate-key error leaves a shared lock on the holder's index entry
/// until the transaction ends, so the holder cannot finish between the two statements;
/// on a pool's autocommit connection it can, and a holder that keeps finishing there
/// starves a caller whose every read comes too late.
pub(super) async fn insert_then_read(
    exec: &mut Executor<'_>,
    row: &task_run::Model,
) -> Result<Inserted, Failure> {
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        match insert(&mut txn, row, false).await? {
            Inserted::Held => {
                let key = args::key_of(row);
                let holder = txn.find_occupant(key, row.dedup_window_end, true).await?;
                Ok(holder.map_or(Inserted::Held, |held| Inserted::Existing(Box::new(held))))
            }
            inserted => Ok(inserted),
        }
    }
    .await;
    txn.finish(outcome).await
}

/// After a duplicate-key error, with `ReplaceIfQueued`: the UPDATE and the read of its
/// row in one transaction, so the row returned is the one written.
async fn replace_queued(
    exec: &mut Executor<'_>,
    row: &task_run::Model,
) -> Result<Inserted, Failure> {
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        let mut values = vec![
            Arg::Json(row.payload.as_ref()),
            Arg::Time(row.run_at),
            Arg::I16(row.priority),
            Arg::Time(row.updated_at),
        ];
        values.extend(args::slot(args::key_of(row), row.dedup_window_end));
        if txn.affected(sql().replace.as_str(), values).await? != 1 {
            return Ok(None);
        }
        let key = args::slot(args::key_of(row), row.dedup_window_end);
        let read = sql().statements.find_occupant_after_conflict.as_str();
        txn.task(read, key.into()).await
    }
    .await;
    let stored = txn.finish(outcome).await?;
    Ok(match stored {
        Some(stored) => Inserted::Replaced(Box::new(stored)),
        None => Inserted::Held,
    })
}

/// Locks the next rows (skipping rows other claimers hold), keeps the first of each key
/// among them (in claim order; a `concurrent` task is a key of its own), updates them
/// and reads them back, in one short transaction. The UPDATE fails on
/// `task_running_resource_uidx` when a concurrent claim started a task of one of the keys
/// meanwhile.
pub(super) async fn claim(
    exec: &mut Executor<'_>,
    how: Claim,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
    max: i64,
) -> Result<Vec<task_run::Model>, Failure> {
    let dialect = exec.dialect;
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        let claims = &sql().claims;
        let select = if task_types.is_empty() {
            let select = match how {
                Claim::Probing => &claims.claim_any,
                Claim::Optimistic => &claims.optimistic_claim_any,
            };
            txn.rows(select.as_str(), vec![Arg::I64(max)]).await?
        } else {
            let mut values: Vec<Arg> = task_types.iter().map(|t| Arg::Str(t)).collect();
            values.push(Arg::I64(max));
            let select = match how {
                Claim::Probing => &claims.claim_types,
                Claim::Optimistic => &claims.optimistic_claim_types,
            };
            txn.rows(select.render(0, &[("types", task_types.len())]), values)
                .await?
        };
        let mut keys = HashSet::with_capacity(select.len());
        let mut ids = Vec::with_capacity(select.len());
        for row in &select {
            let key: (String, String, String) = (
                row.try_get("", "user_id")?,
                row.try_get("", "task_type")?,
                row.try_get("", "resource_key")?,
            );
            if row.try_get::<bool>("", "concurrent")? || keys.insert(key) {
                ids.push(row.try_get::<Uuid>("", "id")?);
            }
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut update = vec![Arg::Str(worker_id), args::interval(dialect, lease_micros)];
        update.extend(ids.iter().map(|id| Arg::Uuid(*id)));
        let count = [("ids", ids.len())];
        let moved = txn
            .affected(claims.claim_update.render(0, &count), update)
            .await?;
        if moved == 0 {
            return Ok(Vec::new());
        }
        let read = claims.claimed.render(0, &count);
        let tasks = txn
            .tasks(read, ids.into_iter().map(Arg::Uuid).collect())
            .await?;
        Ok(moved_by(tasks, worker_id))
    }
    .await;
    txn.finish(outcome).await
}

/// Of the tasks a claim's `UPDATE ... AND status = 'queued'` was given, read back in its
/// transaction, those it moved: running under `worker_id`. A task another claim moved
/// first (on Galera: another node's, applied here after the SELECT) is as that claim
/// left it; the transaction's write locks keep the ones it moved as it moved them.
pub(super) fn moved_by(mut tasks: Vec<task_run::Model>, worker_id: &str) -> Vec<task_run::Model> {
    tasks.retain(|t| {
        t.status == task_dedup_entity::TaskStatus::Running
            && t.lease_owner.as_deref() == Some(worker_id)
    });
    tasks
}

/// A compare-and-set transition (`sql` with `values`) of task `id`, then the row as it
/// is afterwards: the UPDATE's row lock is held until commit, so the read sees exactly
/// what the UPDATE wrote. `None` when the guard did not match.
pub(super) async fn transition(
    exec: &mut Executor<'_>,
    id: Uuid,
    sql: &'static str,
    values: Vec<Arg<'_>>,
) -> Result<Option<task_run::Model>, Failure> {
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        if txn.affected(sql, values).await? != 1 {
            return Ok(None);
        }
        txn.by_id(id).await
    }
    .await;
    txn.finish(outcome).await
}

/// A batch of endings (`sql` with `values`), in one short transaction: when the UPDATE
/// matched fewer rows than `ids`, the rows it left in the batch's status under
/// `worker_id` are read back while its row locks keep them as it left them (a retried
/// task could otherwise be claimed by another worker before the read).
pub(super) async fn end_many(
    exec: &mut Executor<'_>,
    sql: std::borrow::Cow<'static, str>,
    values: Vec<Arg<'_>>,
    batch: EndMany<'_>,
    ids: Vec<Uuid>,
    worker_id: &str,
) -> Result<Vec<Uuid>, Failure> {
    let dialect = exec.dialect;
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        if txn.affected(sql, values).await? == ids.len() as u64 {
            return Ok(ids);
        }
        let mut read = args::ids(dialect, &ids);
        read.push(Arg::Str(batch.status().as_str()));
        read.push(Arg::Str(worker_id));
        let ended_by = crate::dialect::mysql::sql()
            .ended_by
            .render(0, &[("rows", ids.len())]);
        let rows = txn.rows(ended_by, read).await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get_by_index(0))
            .collect::<Result<_, _>>()?)
    }
    .await;
    txn.finish(outcome).await
}

/// One batch of the pruner: the oldest expired rows locked (`SKIP LOCKED`: rows another
/// pruner holds are left to it), then deleted by id, in one short transaction. A
/// connection lost in between rolls it back whole: every row deleted or kept.
pub(super) async fn prune(exec: &mut Executor<'_>, values: Vec<Arg<'_>>) -> Result<u64, Failure> {
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        let rows = txn.rows(sql().statements.prune.as_str(), values).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let ids = rows
            .iter()
            .map(|row| row.try_get_by_index::<Uuid>(0).map(Arg::Uuid))
            .collect::<Result<Vec<_>, _>>()?;
        let delete = sql().prune_ids.render(0, &[("ids", ids.len())]);
        txn.affected(delete, ids).await
    }
    .await;
    txn.finish(outcome).await
}

/// The first try of a limited type whose only limit is `max_running`
/// ([`LockFree::Window`](super::limits::LockFree)), in a transaction without the type's
/// lock: in one statement, the next due tasks (locked, passing over those other claims
/// hold; `how` optimistic, without the probe for running tasks of their keys, whose
/// update then fails in `task_running_resource_uidx` when one runs), the limit and the
/// running tasks' slots; then one task per key, each started with a free slot from a
/// random one on (so that concurrent claims seldom pick the same). Starts nothing while
/// a running task holds no slot below the limit (the locked claim counts those). A slot
/// that a claim this read did not see took meanwhile fails the update in
/// `task_run_slot_uidx`, and the claim runs again. Nothing in a caller's transaction: a
/// REPEATABLE READ snapshot would read older slots, and each rerun would meet the same
/// taken ones; the locked claim's locking read sees the latest.
pub(super) async fn claim_by_read_slots(
    exec: &mut Executor<'_>,
    how: Claim,
    worker_id: &str,
    task_type: &str,
    lease_micros: i64,
    max: i64,
) -> Result<Vec<task_run::Model>, Failure> {
    if exec.in_transaction() {
        return Ok(Vec::new());
    }
    let mut txn = exec.begin(false).await?;
    let outcome = async {
        let Some(read) = txn.slots_and_candidates(task_type, how, max).await? else {
            return Ok(Vec::new());
        };
        let limit = read.limit;
        let mut taken = HashSet::with_capacity(read.running.len());
        for slot in read.running {
            match slot {
                Some(slot) if slot < limit => taken.insert(slot),
                _ => return Ok(Vec::new()),
            };
        }
        let room = (limit - taken.len() as i64).min(max);
        if room <= 0 {
            return Ok(Vec::new());
        }
        let mut keys = HashSet::with_capacity(read.candidates.len());
        let mut ids: Vec<Uuid> = read
            .candidates
            .iter()
            .filter(|c| c.concurrent || keys.insert((c.user_id.as_str(), c.resource_key.as_str())))
            .map(|c| c.id)
            .take(room as usize)
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let first = rand::random_range(0..limit);
        let slots: Vec<Option<i64>> = (0..limit)
            .map(|i| (first + i) % limit)
            .filter(|slot| !taken.contains(slot))
            .take(ids.len())
            .map(Some)
            .collect();
        ids.truncate(slots.len());
        txn.claim_ids(worker_id, lease_micros, &ids, &slots).await
    }
    .await;
    txn.finish(outcome).await
}
