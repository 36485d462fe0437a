//! The claim of a limited task type (`task_dedup_limits`; statements in
//! [`crate::dialect::limits`]), and which types are limited.
//!
//! One short transaction per type: lock the type's row (its claims run one at a time in
//! every process), count its running tasks per user afresh, compute the room its limits
//! leave (running anywhere, per user, starts in the rate's window), select that many due
//! tasks (passing over users at their limit, one per key), start them, and count them in
//! the window. With fairness, the tasks are taken from the users with queued work in
//! turn, continuing after the last user the previous claim served ([`fair`]). Every
//! other claim passes over limited types, so nothing starts a task of
//! a limited type but this, under the lock; the count is of the rows themselves, so no
//! counter drifts when a worker dies (its tasks stop counting once the reaper requeues
//! them).
//!
//! A limit per user across all types (the row of the empty type, `ALL_TYPES`) is locked
//! with the type's row in the same statement, and its count of every user's running
//! tasks applies beside the type's own; while it is set, the types without limits of
//! their own are claimed under its lock too ([`claim_rest`]), and the claims without a
//! lock start nothing (their statements check for the row).
//!
//! Which types are limited is read once a second per database and process
//! ([`limited_types`](crate::maintenance::limits::limited_types)); a limit set meanwhile is enforced at once all the same (the
//! other claims read the table in their own statements), and its tasks wait until this
//! process reads the list again.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::{MAX_CLAIM_RACES, claim_mode};
use crate::connect::retry::Retrying;
use crate::dialect::limits::ALL_TYPES;
use crate::dialect::{Claim, Failure};
use crate::executor::Executor;
use crate::executor::limits::{Candidate, LimitRow, LockFree};
use crate::maintenance::limits::{counted, window};
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate::MAX_CLAIM;
use task_dedup_entity::task_run;
use uuid::Uuid;

/// How many due tasks a claim under a per-user limit reads per task it may start: the
/// batch passes over a user's tasks beyond that user's room.
const PER_USER_READ_AHEAD: i64 = 4;

/// How many users a fair claim visits at most (the next claim goes on after them).
const FAIR_WALK: i64 = 64;

/// Claims up to `max` due tasks of the limited `task_type`, as its limits allow: first
/// the executor's lock-free claims of a type whose only limit is `max_running`
/// ([`LockFree`]; they start nothing otherwise), then, for what they left, the locked
/// claim.
///
/// With a limit across all types set (`across`), only the locked claim: the others do
/// not count a user's tasks of other types.
///
/// Also when to claim the type again, when its rate decides it ([`Opening`]).
pub(super) async fn claim<C: DedupConnection>(
    db: &C,
    exec: &mut Executor<'_>,
    worker_id: &str,
    task_type: &str,
    lease_micros: i64,
    max: i64,
    across: bool,
) -> Result<(Vec<task_run::Model>, Option<Instant>), DedupError> {
    // As the main claim: a claim lost with its connection is not run again.
    let mut retrying = Retrying::new(db, Some(Duration::ZERO), "claim");
    let mut races = 0;
    let mut claimed = Vec::new();
    let mut opening = None;
    let mut stage = if across { Stage::Locked } else { Stage::Window };
    // The window claim's form, as the main claim's: optimistic on a queue of distinct
    // keys, probing for a while after it met a running key.
    let mut how = match stage {
        Stage::Window => claim_mode::choose(exec).await,
        _ => Claim::Probing,
    };
    loop {
        let want = max - claimed.len() as i64;
        let attempt = async {
            let outcome = match stage {
                Stage::Locked => {
                    let mut txn = exec.begin(true).await?;
                    let outcome = start(&mut txn, worker_id, task_type, lease_micros, want).await;
                    txn.finish(outcome).await
                }
                Stage::Window => exec
                    .lock_free_claim(
                        LockFree::Window,
                        how,
                        worker_id,
                        task_type,
                        lease_micros,
                        want,
                    )
                    .await
                    .map(|tasks| (tasks, None)),
                Stage::Slots => exec
                    .lock_free_claim(
                        LockFree::Slots,
                        how,
                        worker_id,
                        task_type,
                        lease_micros,
                        want,
                    )
                    .await
                    .map(|tasks| (tasks, None)),
            };
            match outcome {
                // The optimistic window claim picked a task whose key runs.
                Err(failure)
                    if failure.is_running_key()
                        && how == Claim::Optimistic
                        && stage == Stage::Window =>
                {
                    Ok(Err(Lost::RunningKey))
                }
                // Another claim took a picked slot first, or started a task of a picked
                // key (a claim of the key outside the limits: a `concurrent` follow-up's).
                Err(failure) if failure.is_lost_claim_race() => Ok(Err(Lost::Race)),
                outcome => Ok(Ok(outcome?)),
            }
        };
        // Boxed, as in `retried`.
        match retrying.run(Box::pin(attempt)).await {
            Some(Ok(Err(Lost::RunningKey))) => {
                claim_mode::met_running_key(exec);
                how = Claim::Probing;
            }
            Some(Ok(Ok((tasks, opens)))) => {
                let full = tasks.len() as i64 == want;
                claimed.extend(tasks);
                opening = opens;
                stage = match stage {
                    _ if full => return Ok((claimed, opening)),
                    Stage::Window => Stage::Slots,
                    Stage::Slots => Stage::Locked,
                    Stage::Locked => return Ok((claimed, opening)),
                };
            }
            Some(Ok(Err(Lost::Race))) if races < MAX_CLAIM_RACES => races += 1,
            Some(Ok(Err(Lost::Race))) => return Ok((claimed, opening)),
            Some(Err(err)) => return Err(err),
            None => {}
        }
    }
}

/// Why a lock-free try of a limited type's claim took nothing: it runs again.
enum Lost {
    /// Another claim took a picked slot first, or started a task of a picked key.
    Race,
    /// The optimistic window claim picked a task whose key runs (or two of one key):
    /// the probing form runs instead.
    RunningKey,
}

/// The tries of a limited type's claim, cheapest first; each takes what the one before
/// left. The first two are the executor's lock-free claims ([`LockFree`]: which
/// statement each is, and whether the dialect has it, is the executor's to say).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// [`LockFree::Window`], optimistic where the main claim would be.
    Window,
    /// [`LockFree::Slots`].
    Slots,
    /// The type's row locked, its running tasks counted ([`start`]).
    Locked,
}

/// One attempt, in its transaction: the tasks it started, and when to claim the type
/// again if its rate decides that ([`Opening`]).
async fn start(
    txn: &mut Executor<'_>,
    worker_id: &str,
    task_type: &str,
    lease_micros: i64,
    max: i64,
) -> Result<(Vec<task_run::Model>, Option<Instant>), Failure> {
    let locked = txn.lock_limits(task_type).await?;
    let read_at = Instant::now();
    let Some(limits) = locked.own else {
        // Cleared since this process read the list: the other claims take its tasks.
        return Ok((Vec::new(), None));
    };
    let mut across = match &locked.all_types {
        Some(row) => PerUser::across_types(txn, row).await?,
        None => None,
    };
    // Counted only for a limit on running tasks (a rate or fairness alone needs none):
    // each user's running tasks, and the run slots they hold.
    let mut per_user: HashMap<String, i64> = HashMap::new();
    let mut slots: HashSet<i32> = HashSet::new();
    if limits.max_running.is_some() || limits.max_running_per_user.is_some() {
        for (user, slot) in txn.running_of_type(task_type).await? {
            *per_user.entry(user).or_default() += 1;
            slots.extend(slot);
        }
    }
    let room = Room::of(&limits, per_user.values().sum(), max);
    if room.tasks <= 0 {
        if let Some(limit) = room.bound {
            crate::metrics::limit_waited(limit);
        }
        let opens = match (room.bound, window(&limits)) {
            (Some("rate"), Some(counted)) => {
                Opening::of(&limits, counted, read_at)
                    .when_due(txn, task_type)
                    .await?
            }
            _ => None,
        };
        return Ok((Vec::new(), opens));
    }
    let mut per_type = room.per_user.map(|limit| PerUser {
        limit,
        running: per_user,
    });
    let excluded = PerUser::full(&[&per_type, &across]);
    let excluded: Vec<&str> = excluded.iter().map(String::as_str).collect();
    let (candidates, walked) = if limits.fair {
        let cursor = limits.fair_cursor.as_deref().unwrap_or("");
        fair(txn, task_type, cursor, &excluded, room.tasks).await?
    } else {
        let read = match (&per_type, &across) {
            (None, None) => room.tasks,
            _ => (room.tasks * PER_USER_READ_AHEAD).min(MAX_CLAIM as i64),
        };
        let candidates = txn.limited_candidates(task_type, &excluded, read).await?;
        (candidates, None)
    };
    let (mut ids, served) = pick(&candidates, room.tasks, &mut [&mut per_type, &mut across]);
    // The next fair claim goes on after the last user served, or, when none had a task
    // due, after the last user walked (so users whose tasks are not due yet do not hold
    // the turn).
    if let Some(user) = served.or(walked.as_deref())
        && limits.fair_cursor.as_deref() != Some(user)
    {
        txn.set_fair_cursor(task_type, user).await?;
    }
    if !excluded.is_empty() && (ids.len() as i64) < room.tasks {
        crate::metrics::limit_waited(match per_type {
            Some(_) => "max_running_per_user",
            None => "user_limit",
        });
    }
    if ids.is_empty() {
        return Ok((Vec::new(), None));
    }
    // Under `max_running`, each task takes a free run slot below it, as the
    // one-statement claim does: `task_run_slot_uidx` keeps the two from taking one twice.
    let slots: Vec<Option<i64>> = match limits.max_running {
        Some(limit) => (0..limit)
            .filter(|slot| !slots.contains(slot))
            .map(|slot| Some(i64::from(slot)))
            .take(ids.len())
            .collect(),
        None => vec![None; ids.len()],
    };
    ids.truncate(slots.len());
    let claimed = txn.claim_ids(worker_id, lease_micros, &ids, &slots).await?;
    let mut opens = None;
    if let (Some(rate), Some(length), Some(window)) = (
        limits.rate_starts,
        limits.rate_window_micros,
        window(&limits),
    ) {
        // Counted where the database stamped them: `claim_ids` reads the clock again,
        // maybe in the next window.
        let stamped = claimed
            .iter()
            .filter_map(|task| task.started_at)
            .map(|at| at.timestamp_micros())
            .max();
        let (start, starts) = counted(window, length, stamped, claimed.len() as i64);
        txn.set_window(task_type, start, starts).await?;
        // The window is full, or the rate cut this claim in the window it counted and
        // its tasks went to the next one, which has room: claim again when it opens, or
        // at once.
        if starts >= i64::from(rate) || room.bound == Some("rate") {
            opens = Opening::of(&limits, (start, starts), read_at)
                .when_due(txn, task_type)
                .await?;
        }
    }
    Ok((claimed, opens))
}

/// When a rate-limited type's window lets a claim start tasks again: the opening of the
/// next window when the current one is full, else now. By the database's clock (the
/// window's start and length are the row's, `now_micros` its clock when the row was
/// read), turned into an instant of this process from when the row arrived: never
/// before the opening, later by the time the read took to come back.
struct Opening {
    at: Instant,
}

impl Opening {
    /// `counted`: the window as recorded now (its start, its starts); `read_at`: when
    /// the row with `now_micros` arrived.
    fn of(limits: &LimitRow, counted: (i64, i64), read_at: Instant) -> Opening {
        let (start, starts) = counted;
        let full = limits
            .rate_starts
            .is_some_and(|rate| starts >= i64::from(rate));
        let length = limits.rate_window_micros.unwrap_or(0);
        let wait = if full {
            start.saturating_add(length) - limits.now_micros
        } else {
            0
        };
        Opening {
            at: read_at + Duration::from_micros(u64::try_from(wait).unwrap_or(0)),
        }
    }

    /// The opening, if tasks of the type are due (one read of the claim's candidates):
    /// a worker with nothing due waits for its wake-ups and its poll, as before.
    async fn when_due(
        self,
        txn: &mut Executor<'_>,
        task_type: &str,
    ) -> Result<Option<Instant>, Failure> {
        let due = txn.limited_candidates(task_type, &[], 1).await?;
        Ok((!due.is_empty()).then_some(self.at))
    }
}

/// The claim of the types without limits of their own while a limit across all types
/// is set (the main claims pass over every task then): in a transaction of its own
/// that locks that limit's row, so these claims and the limited types' run one at a
/// time, each counting every user's running tasks afresh. `None` when no such limit is
/// set (any more): the main claim takes these types.
pub(super) async fn claim_rest<C: DedupConnection>(
    db: &C,
    exec: &mut Executor<'_>,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
    max: i64,
) -> Result<Option<Vec<task_run::Model>>, DedupError> {
    let mut retrying = Retrying::new(db, Some(Duration::ZERO), "claim");
    let mut races = 0;
    loop {
        let attempt = async {
            let mut txn = exec.begin(true).await?;
            let outcome = start_rest(&mut txn, worker_id, task_types, lease_micros, max).await;
            match txn.finish(outcome).await {
                Err(failure) if failure.is_lost_claim_race() => Ok(None),
                outcome => Ok(Some(outcome?)),
            }
        };
        // Boxed, as in `retried`.
        match retrying.run(Box::pin(attempt)).await {
            Some(Ok(Some(tasks))) => return Ok(tasks),
            Some(Ok(None)) if races < MAX_CLAIM_RACES => races += 1,
            Some(Ok(None)) => return Ok(Some(Vec::new())),
            Some(Err(err)) => return Err(err),
            None => {}
        }
    }
}

/// One attempt of [`claim_rest`], in its transaction.
async fn start_rest(
    txn: &mut Executor<'_>,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
    max: i64,
) -> Result<Option<Vec<task_run::Model>>, Failure> {
    let Some(row) = txn.lock_limits(ALL_TYPES).await?.all_types else {
        return Ok(None);
    };
    let mut across = PerUser::across_types(txn, &row).await?;
    let excluded = PerUser::full(&[&across]);
    let excluded: Vec<&str> = excluded.iter().map(String::as_str).collect();
    let read = (max * PER_USER_READ_AHEAD).min(MAX_CLAIM as i64);
    let candidates = txn.rest_candidates(task_types, &excluded, read).await?;
    let (ids, _) = pick(&candidates, max, &mut [&mut across]);
    if !excluded.is_empty() && (ids.len() as i64) < max {
        crate::metrics::limit_waited("user_limit");
    }
    if ids.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let slots = vec![None; ids.len()];
    Ok(Some(
        txn.claim_ids(worker_id, lease_micros, &ids, &slots).await?,
    ))
}

/// A limit on each user's running tasks (of one type, or across all types) and what
/// each user runs now.
struct PerUser {
    limit: i64,
    running: HashMap<String, i64>,
}

impl PerUser {
    /// The limit across all types that `row` holds, with every user's running tasks
    /// counted afresh (`None`: the row holds no such limit).
    async fn across_types(
        txn: &mut Executor<'_>,
        row: &LimitRow,
    ) -> Result<Option<PerUser>, Failure> {
        let Some(limit) = row.max_running_per_user else {
            return Ok(None);
        };
        let mut running: HashMap<String, i64> = HashMap::new();
        for user in txn.running_users().await? {
            *running.entry(user).or_default() += 1;
        }
        Ok(Some(PerUser {
            limit: i64::from(limit),
            running,
        }))
    }

    /// The users at one of `limits` (the claim passes over their tasks).
    fn full(limits: &[&Option<PerUser>]) -> Vec<String> {
        limits
            .iter()
            .copied()
            .flatten()
            .flat_map(|l| l.running.iter().filter(|(_, n)| **n >= l.limit))
            .map(|(user, _)| user.clone())
            .collect()
    }

    fn allows(&self, user: &str) -> bool {
        self.running.get(user).copied().unwrap_or(0) < self.limit
    }

    fn count(&mut self, user: &str) {
        match self.running.get_mut(user) {
            Some(n) => *n += 1,
            None => {
                self.running.insert(user.to_owned(), 1);
            }
        }
    }
}

/// Up to `max` of `candidates` in their order, one per key (but `concurrent` tasks),
/// none of a user that one of `limits` leaves no room (each counting what it takes):
/// their ids, and the user of the last one.
fn pick<'c>(
    candidates: &'c [Candidate],
    max: i64,
    limits: &mut [&mut Option<PerUser>],
) -> (Vec<Uuid>, Option<&'c str>) {
    let mut keys = HashSet::with_capacity(candidates.len());
    let mut ids = Vec::with_capacity(candidates.len());
    let mut served = None;
    for candidate in candidates {
        if ids.len() as i64 >= max {
            break;
        }
        let user = candidate.user_id.as_str();
        let key = (
            user,
            candidate.task_type.as_str(),
            candidate.resource_key.as_str(),
        );
        if !candidate.concurrent && !keys.insert(key) {
            continue;
        }
        if !limits
            .iter()
            .flat_map(|l| l.as_ref())
            .all(|l| l.allows(user))
        {
            continue;
        }
        for limit in limits.iter_mut().flat_map(|l| l.as_mut()) {
            limit.count(user);
        }
        ids.push(candidate.id);
        served = Some(user);
    }
    (ids, served)
}

/// A fair claim's candidates: users with queued tasks of `task_type` in turn from the
/// one after `cursor` (wrapping around to the first), those at their per-user limit
/// (`excluded`) passed over, and `tasks` shared out between them: each user's first due
/// task, then each one's second, and so on. Also the last user walked.
async fn fair(
    txn: &mut Executor<'_>,
    task_type: &str,
    cursor: &str,
    excluded: &[&str],
    tasks: i64,
) -> Result<(Vec<Candidate>, Option<String>), Failure> {
    let walk = (tasks + excluded.len() as i64).min(FAIR_WALK);
    let mut users = txn.fair_users(task_type, cursor, walk).await?;
    if (users.len() as i64) < walk && !cursor.is_empty() {
        for user in txn
            .fair_users(task_type, "", walk - users.len() as i64)
            .await?
        {
            if !users.contains(&user) {
                users.push(user);
            }
        }
    }
    let walked = users.last().cloned();
    users.retain(|user| !excluded.contains(&user.as_str()));
    if users.is_empty() {
        return Ok((Vec::new(), walked));
    }
    // One lookup per user (`fair_heads`' index), however long its backlog.
    let share = (tasks + users.len() as i64 - 1) / users.len() as i64;
    let mut heads = Vec::with_capacity(users.len());
    for user in &users {
        heads.push(txn.fair_heads(task_type, user, share).await?.into_iter());
    }
    let mut turns = Vec::with_capacity(tasks as usize);
    for _ in 0..share {
        turns.extend(heads.iter_mut().filter_map(Iterator::next));
    }
    Ok((turns, walked))
}

/// What a type's limits leave a claim of `max` tasks.
#[derive(Debug, PartialEq, Eq)]
struct Room {
    /// Tasks it may start (0 or less: none).
    tasks: i64,
    /// The limit that left less than `max`, if one did.
    bound: Option<&'static str>,
    /// The per-user limit, if set.
    per_user: Option<i64>,
}

impl Room {
    /// `running`: the type's tasks running now.
    fn of(limits: &LimitRow, running: i64, max: i64) -> Room {
        let mut room = Room {
            tasks: max,
            bound: None,
            per_user: limits.max_running_per_user.map(i64::from),
        };
        if let Some(limit) = limits.max_running {
            room.at_most(i64::from(limit) - running, "max_running");
        }
        if let (Some(starts), Some((_, used))) = (limits.rate_starts, window(limits)) {
            room.at_most(i64::from(starts) - used, "rate");
        }
        room
    }

    fn at_most(&mut self, tasks: i64, limit: &'static str) {
        if tasks < self.tasks {
            self.tasks = tasks;
            self.bound = Some(limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_running: Option<i32>, rate: Option<(i32, i64)>, now: i64) -> LimitRow {
        LimitRow {
            max_running,
            max_running_per_user: None,
            rate_starts: rate.map(|(starts, _)| starts),
            rate_window_micros: rate.map(|(_, window)| window),
            window_start_micros: 1_000,
            window_starts: 2,
            fair: false,
            fair_cursor: None,
            now_micros: now,
        }
    }

    #[test]
    fn the_tightest_limit_sets_the_room() {
        // Two users, 2 and 1 running.
        let running = 3;
        let room = Room::of(&limits(Some(5), None, 1_500), running, 10);
        assert_eq!((room.tasks, room.bound), (2, Some("max_running")));
        // 3 starts a window, 2 in the current one: room for 1.
        let room = Room::of(&limits(Some(5), Some((3, 1_000)), 1_500), running, 10);
        assert_eq!((room.tasks, room.bound), (1, Some("rate")));
        // A new window: its count starts at 0.
        let room = Room::of(&limits(Some(5), Some((3, 1_000)), 2_000), running, 10);
        assert_eq!((room.tasks, room.bound), (2, Some("max_running")));
        // Lowered below what runs: no room, nothing interrupted.
        let room = Room::of(&limits(Some(1), None, 1_500), running, 10);
        assert_eq!(room.tasks, -2);
        let room = Room::of(&limits(None, None, 1_500), running, 10);
        assert_eq!((room.tasks, room.bound), (10, None));
    }
}
