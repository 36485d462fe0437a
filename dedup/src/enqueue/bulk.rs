//! [`TaskDedup::find_or_enqueue_many`](crate::TaskDedup::find_or_enqueue_many): many
//! tasks in a few statements per chunk, each with the outcome `find_or_enqueue` would
//! have given it.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::DbErr;
use uuid::Uuid;

use super::outcome::Enqueued;
use crate::connect::retry::{MAX_ENQUEUE_ATTEMPTS, Retrying};
use crate::dialect::Failure;
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::key::TaskKey;
use crate::values::task::{NewTask, OnConflict};
use task_dedup_entity::task_run::{self, TaskStatus};

/// One task of a batch, with the index of its input.
struct Item {
    index: usize,
    replace: bool,
    row: task_run::Model,
}

/// What became of a task of a chunk; `Created` is the item's own row.
enum Outcome {
    Created,
    Existing(task_run::Model),
    Replaced(task_run::Model),
}

/// The slot a task competes for: its key and window.
type Slot = (String, String, String, i64);

fn slot_of(row: &task_run::Model) -> Slot {
    (
        row.user_id.clone(),
        row.task_type.clone(),
        row.resource_key.clone(),
        row.dedup_window_end,
    )
}

/// Enqueues `tasks` on `db`, retrying each chunk's lost rounds within `budget` (the
/// handle's when `None`).
pub(crate) async fn find_or_enqueue_many<C: DedupConnection>(
    db: &C,
    budget: Option<Duration>,
    tasks: Vec<NewTask>,
) -> Result<Vec<Enqueued>, DedupError> {
    for (index, task) in tasks.iter().enumerate() {
        task.validate().map_err(|source| DedupError::InvalidItem {
            index,
            source: Box::new(source.into()),
        })?;
    }
    let mut exec = Executor::on(db)?;
    super::guard::ensure(db, budget, &mut exec).await?;
    let chunk_size = exec.dialect().bulk().chunk;
    let count = tasks.len();
    let now = task_run::now();
    let mut items: Vec<Item> = tasks
        .into_iter()
        .enumerate()
        .map(|(index, task)| {
            let (on_conflict, row) = task.into_row_at(now);
            let replace = on_conflict == OnConflict::ReplaceIfQueued;
            Item {
                index,
                replace,
                row,
            }
        })
        .collect();
    // Sorted by slot: repeats of a slot become neighbours (the first occurrence
    // decides), and concurrent batches take their locks in one order.
    items.sort_by(|a, b| {
        (
            &a.row.user_id,
            &a.row.task_type,
            &a.row.resource_key,
            a.row.dedup_window_end,
            a.index,
        )
            .cmp(&(
                &b.row.user_id,
                &b.row.task_type,
                &b.row.resource_key,
                b.row.dedup_window_end,
                b.index,
            ))
    });
    let mut repeats = Vec::new();
    items.dedup_by(|later, first| {
        let same = later.row.user_id == first.row.user_id
            && later.row.task_type == first.row.task_type
            && later.row.resource_key == first.row.resource_key
            && later.row.dedup_window_end == first.row.dedup_window_end;
        if same {
            repeats.push((later.index, first.index));
        }
        same
    });

    let mut outcomes: Vec<Option<Enqueued>> = (0..count).map(|_| None).collect();
    let mut items = items.into_iter();
    loop {
        let mut chunk: Vec<Item> = items.by_ref().take(chunk_size).collect();
        if chunk.is_empty() {
            break;
        }
        let mut retrying = Retrying::new(db, budget, "find_or_enqueue_many");
        let chunk_outcomes = enqueue_chunk(&mut exec, &mut retrying, &mut chunk).await?;
        for (item, outcome) in chunk.into_iter().zip(chunk_outcomes) {
            outcomes[item.index] = Some(match outcome {
                Outcome::Created => Enqueued::Created(item.row),
                Outcome::Existing(task) => Enqueued::Existing(task),
                Outcome::Replaced(task) => Enqueued::Replaced(task),
            });
        }
    }
    for (index, first) in repeats {
        outcomes[index] = outcomes[first]
            .as_ref()
            .map(|outcome| Enqueued::Existing(outcome.task().clone()));
    }
    tracing::debug!(tasks = count, "batch enqueued");
    outcomes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| DedupError::Database(DbErr::Custom("a batch item got no outcome".into())))
}

/// Enqueues one chunk: rounds until every task has its outcome. A round runs again for
/// the tasks whose key was held by a task that let go of it before it could be read
/// (with fresh ids), after a deadlock on a pool, and after a lost connection (with the
/// same ids: what the lost round stored is found by id and returned as `Existing`).
async fn enqueue_chunk(
    exec: &mut Executor<'_>,
    retrying: &mut Retrying<'_>,
    chunk: &mut [Item],
) -> Result<Vec<Outcome>, DedupError> {
    let mut outcomes: Vec<Option<Outcome>> = (0..chunk.len()).map(|_| None).collect();
    // Rounds that ran to their end: only they can find a key's holder gone. A round lost
    // with its connection or aborted by a deadlock is the retry driver's to count (its
    // budget, its limit), not contention on a key.
    let mut rounds = 0;
    loop {
        let pending: Vec<usize> = (0..chunk.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        let Some(&first_pending) = pending.first() else {
            break;
        };
        let contention = || {
            let row = &chunk[first_pending].row;
            DedupError::Contention {
                key: TaskKey::from_trusted_parts(&row.user_id, &row.task_type, &row.resource_key),
                attempts: MAX_ENQUEUE_ATTEMPTS,
            }
        };
        if rounds >= MAX_ENQUEUE_ATTEMPTS {
            return Err(contention());
        }
        let after_lost_attempt = retrying.after_lost_attempt();
        let attempt = async { Ok(round(exec, chunk, &pending, after_lost_attempt).await?) };
        let found = match retrying.run(attempt).await {
            None => continue,
            // On a pool, a database that kept aborting the round is contention.
            Some(Err(DedupError::TransactionAborted(_))) if !exec.in_transaction() => {
                return Err(contention());
            }
            Some(outcome) => outcome?,
        };
        rounds += 1;
        for (i, outcome) in found {
            outcomes[i] = Some(outcome);
        }
        for &i in &pending {
            if outcomes[i].is_none() {
                // Its key's holder let go before it was read: insert again.
                chunk[i].row.id = Uuid::now_v7();
            }
        }
    }
    outcomes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| DedupError::Database(DbErr::Custom("a batch item got no outcome".into())))
}

/// One round over the `pending` tasks of `chunk`. On a pool, SQLite and MySQL/MariaDB
/// run it in a transaction of their own (IMMEDIATE on SQLite; see
/// `Dialect::bulk_round_in_transaction`). In the caller's transaction everything runs in
/// it.
async fn round(
    exec: &mut Executor<'_>,
    chunk: &[Item],
    pending: &[usize],
    after_lost_attempt: bool,
) -> Result<Vec<(usize, Outcome)>, Failure> {
    if exec.in_transaction() || !exec.dialect().bulk_round_in_transaction() {
        return round_on(exec, chunk, pending, after_lost_attempt, false).await;
    }
    let mut txn = exec.begin(true).await?;
    let found = round_on(&mut txn, chunk, pending, after_lost_attempt, true).await;
    txn.finish(found).await
}

/// Insert first, then read who holds the keys that were taken: a constant number of
/// statements whatever the number of tasks. Returns outcomes by position in `chunk`.
async fn round_on(
    exec: &mut Executor<'_>,
    chunk: &[Item],
    pending: &[usize],
    after_lost_attempt: bool,
    own_transaction: bool,
) -> Result<Vec<(usize, Outcome)>, Failure> {
    let mut found = Vec::with_capacity(pending.len());
    let mut rest = pending.to_vec();
    if after_lost_attempt {
        // The lost round may have committed some rows: those are returned as they are.
        let ids: Vec<Uuid> = rest.iter().map(|&i| chunk[i].row.id).collect();
        let mut stored: HashMap<Uuid, task_run::Model> = exec
            .by_ids(&ids)
            .await?
            .into_iter()
            .map(|task| (task.id, task))
            .collect();
        rest.retain(|&i| match stored.remove(&chunk[i].row.id) {
            Some(task) => {
                found.push((i, Outcome::Existing(task)));
                false
            }
            None => true,
        });
    }
    let rows = |group: &[usize]| group.iter().map(|&i| &chunk[i].row).collect::<Vec<_>>();
    let (replace, plain): (Vec<usize>, Vec<usize>) = rest.iter().partition(|&&i| chunk[i].replace);
    let inserted = exec.insert_many(&rows(&plain), &rows(&replace)).await?;
    let mut replaced: HashMap<Slot, task_run::Model> = inserted
        .replaced
        .into_iter()
        .map(|task| (slot_of(&task), task))
        .collect();
    rest.retain(|&i| {
        let item = &chunk[i];
        if inserted.created.contains(&item.row.id) {
            found.push((i, Outcome::Created));
            false
        } else if let Some(task) = replaced.remove(&slot_of(&item.row)) {
            found.push((i, Outcome::Replaced(task)));
            false
        } else {
            true
        }
    });
    if rest.is_empty() {
        return Ok(found);
    }
    let after_own_insert = own_transaction && !after_lost_attempt;
    let mut holders: HashMap<Slot, task_run::Model> = exec
        .find_occupants(&rows(&rest), after_own_insert)
        .await?
        .into_iter()
        .map(|task| (slot_of(&task), task))
        .collect();
    for i in rest {
        let item = &chunk[i];
        // Not found: its holder let go in between; the round runs again for it.
        let Some(task) = holders.remove(&slot_of(&item.row)) else {
            continue;
        };
        // MySQL/MariaDB: the insert's `ON DUPLICATE KEY UPDATE` replaced every queued
        // holder of a `ReplaceIfQueued` task, and its locks kept it queued since.
        let outcome =
            if item.replace && !exec.reports_replaced() && task.status == TaskStatus::Queued {
                Outcome::Replaced(task)
            } else {
                Outcome::Existing(task)
            };
        found.push((i, outcome));
    }
    Ok(found)
}
