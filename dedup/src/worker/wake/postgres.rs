//! The PostgreSQL listener: LISTEN on the wake-up channel, on a connection that must be
//! a session of its own, which it checks.
//!
//! Behind a transaction pooler (PgBouncer in `pool_mode = transaction`, and the like)
//! the LISTEN runs on whichever server connection the pooler lends, which goes back to
//! the pool: the listener hears nothing, and the server connection hands the
//! notifications to whichever client borrows it next, whose driver fails on the
//! unexpected message. So the listener first LISTENs on a probe channel of its own
//! (a name no one else notifies), in the same round trip as it asks for its server
//! process id, and checks that it hears what the worker then notifies there through
//! its pool ([`PROBE`](crate::dialect::postgres::PROBE): only when that server process
//! has been idle for a while, so that the probe does not reach another client of a
//! pooler); only then does it LISTEN on the wake-up channel. The check runs again every [`RECHECK_EVERY`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::DatabaseConnection;
use sea_orm::sqlx::PgPool;
use sea_orm::sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::executor::Executor;
use crate::values::connection::Target;

/// How long the listener waits after it LISTENed before its first check: its server
/// process must have been idle for 100 ms to be notified (see
/// [`PROBE`](crate::dialect::postgres::PROBE)).
pub(crate) const CHECK_SETTLE: Duration = Duration::from_millis(250);

/// How long the listener waits to hear its probe.
pub(crate) const CHECK_WAIT: Duration = Duration::from_secs(2);

/// How often a listener that heard its probe checks again.
pub(crate) const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// The first pause before the listener listens again after its connection failed:
/// doubled at each failure in a row, up to 1 s. Short at first, so that after a
/// failover the wake-ups are back within a second of the new primary taking writes.
const RELISTEN_FIRST: Duration = Duration::from_millis(100);

/// A listener that listened this long before failing starts again from
/// [`RELISTEN_FIRST`].
const LISTENED_LONG: Duration = Duration::from_secs(10);

/// A worker's PostgreSQL listener, until its worker stops.
pub(in crate::worker) struct Listener {
    /// The worker's pool, where the listener takes its connection unless `url`.
    pub pool: PgPool,
    /// A URL of its own (a direct connection, past a pooler).
    pub url: Option<String>,
    /// The worker's pool as SeaORM's, through which the probe is notified (as the
    /// application's enqueues notify).
    pub db: DatabaseConnection,
    /// Rung for each wake-up notification, and when listening (again).
    pub bell: Arc<Notify>,
    /// Rung for each cancel notification, and when listening (again): a cancel
    /// notified meanwhile is lost.
    pub cancels: Arc<Notify>,
    /// Whether the listener hears every notification now.
    pub listening: Arc<AtomicBool>,
    /// How many checks went unheard.
    pub unheard: Arc<AtomicU64>,
}

/// Why a listener stopped listening.
enum Stopped {
    /// Its connection or a statement failed: it listens again a second later.
    Failed(String),
    /// A check went unheard (why): it stops for good, and the worker polls.
    Unheard(String),
}

impl From<sea_orm::sqlx::Error> for Stopped {
    fn from(err: sea_orm::sqlx::Error) -> Stopped {
        Stopped::Failed(err.to_string())
    }
}

impl Listener {
    /// Listens, and rings the bell for each notification, until `stop` or a check goes
    /// unheard. Rings too after listening again on a new connection (what was notified
    /// meanwhile is lost); when that fails, tries again after a pause growing from
    /// 100 ms to 1 s, the worker's poll covering the gap. On a pool opened on several
    /// hosts it first looks for the primary (a failover moved it: the pool's own calls
    /// may not have noticed yet).
    pub(in crate::worker) async fn run(self, stop: CancellationToken) {
        let mut failures: u32 = 0;
        loop {
            let listening_since = Instant::now();
            let stopped = tokio::select! {
                () = stop.cancelled() => return,
                stopped = self.listen() => stopped,
            };
            if listening_since.elapsed() > LISTENED_LONG {
                failures = 0;
            }
            self.listening.store(false, Ordering::Relaxed);
            self.bell.notify_waiters();
            self.cancels.notify_waiters();
            match stopped {
                Stopped::Failed(err) => {
                    tracing::warn!(error = %err, "wake-up listener failed; listening again (polling meanwhile)");
                }
                Stopped::Unheard(why) => {
                    self.unheard.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::listener_unheard();
                    tracing::warn!(
                        why,
                        "the wake-up listener's connection is not a session of its own (behind \
                         a transaction pooler such as PgBouncer in transaction mode, LISTEN does \
                         not hold): the worker polls instead (poll_interval). For prompt \
                         wake-ups give the listener a direct connection (listen_url)"
                    );
                    return;
                }
            }
            let pause = RELISTEN_FIRST * 2u32.pow(failures.min(4));
            failures += 1;
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause.min(Duration::from_secs(1))) => {}
            }
            if self.url.is_none() {
                crate::connect::formation::repoint(&self.pool).await;
            }
        }
    }

    /// One connection's life: connect, check, LISTEN on the wake-up channel, ring the
    /// bell for each notification, check every [`RECHECK_EVERY`].
    async fn listen(&self) -> Stopped {
        let connected = match &self.url {
            Some(url) => PgListener::connect(url).await,
            None => PgListener::connect_with(&self.pool).await,
        };
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(err) => return err.into(),
        };
        let listener = &mut listener;
        let mut probe = Probe::new();
        let stopped: Result<std::convert::Infallible, Stopped> = async {
            probe.listen(listener).await?;
            tokio::time::sleep(CHECK_SETTLE).await;
            probe.check(listener, self).await?;
            listener
                .listen_all([
                    crate::dialect::postgres::CHANNEL,
                    crate::dialect::postgres::CANCEL_CHANNEL,
                ])
                .await?;
            self.listening.store(true, Ordering::Relaxed);
            self.bell.notify_waiters();
            self.cancels.notify_waiters();
            let mut next_check = Instant::now() + RECHECK_EVERY;
            loop {
                match tokio::time::timeout_at(next_check, listener.try_recv()).await {
                    Ok(Ok(Some(notification))) => {
                        self.ring(notification.channel());
                    }
                    // The connection was lost: listen again on a new one, checked again.
                    Ok(Ok(None)) => return Err(Stopped::Failed("connection lost".to_owned())),
                    Ok(Err(err)) => return Err(err.into()),
                    Err(_) => {
                        probe.check(listener, self).await?;
                        next_check = Instant::now() + RECHECK_EVERY;
                    }
                }
            }
        }
        .await;
        let Err(stopped) = stopped;
        if matches!(stopped, Stopped::Unheard(_)) {
            // What it listens to may sit on a server connection of the pooler: let go
            // of it, where the pooler lends that one (best effort; nothing else
            // notifies the probe channel, and the wake-up channel is never listened
            // to unheard).
            let _ = listener.unlisten_all().await;
        }
        stopped
    }

    /// Rings the bell of a notification heard on `channel`.
    fn ring(&self, channel: &str) {
        if channel == crate::dialect::postgres::CANCEL_CHANNEL {
            self.cancels.notify_waiters();
        } else {
            self.bell.notify_waiters();
        }
    }
}

/// The listener's probe: a channel of its own, the server process listening there, and
/// the payloads it sent.
struct Probe {
    channel: String,
    pid: i64,
    sent: u64,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            channel: format!("task_dedup_probe_{}", uuid::Uuid::now_v7().simple()),
            pid: 0,
            sent: 0,
        }
    }

    /// LISTENs on the probe channel and learns the server process that does, in one
    /// round trip (a pooler lends one server connection to the whole of it).
    async fn listen(&mut self, listener: &mut PgListener) -> Result<(), Stopped> {
        use sea_orm::sqlx::Row;
        let sql = format!(
            r#"LISTEN "{}"; SELECT pg_backend_pid() AS pid"#,
            self.channel
        );
        let rows = sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut *listener)
            .await?;
        let pid: i32 = match rows.first() {
            Some(row) => row.try_get("pid")?,
            None => return Err(Stopped::Failed("no server process id".to_owned())),
        };
        self.pid = i64::from(pid);
        Ok(())
    }

    /// Notifies the probe channel through `db` (the worker's pool) if the listener's
    /// server process has been idle for a while, and waits up to [`CHECK_WAIT`] to
    /// hear it on `listener`, ringing the bells of `owner` for the notifications heard
    /// meanwhile. Not notified (that process was busy: another client's) is unheard.
    async fn check(&mut self, listener: &mut PgListener, owner: &Listener) -> Result<(), Stopped> {
        let db = &owner.db;
        self.sent += 1;
        let payload = self.sent.to_string();
        let sent = async {
            let mut exec = Executor::new(Target::Pool(db), None)?;
            exec.probe(&self.channel, &payload, self.pid).await
        };
        match Box::pin(sent).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Stopped::Unheard(format!(
                    "its server process {} served another client",
                    self.pid
                )));
            }
            Err(failure) => return Err(Stopped::Failed(failure.err.to_string())),
        }
        let deadline = Instant::now() + CHECK_WAIT;
        loop {
            let Ok(notification) = tokio::time::timeout_at(deadline, listener.try_recv()).await
            else {
                return Err(Stopped::Unheard(format!(
                    "its probe, notified through the worker's pool, was not heard within \
                     {CHECK_WAIT:?}"
                )));
            };
            match notification? {
                Some(n) if n.channel() == self.channel => {
                    if n.payload() == payload {
                        return Ok(());
                    }
                }
                Some(n) => owner.ring(n.channel()),
                None => {
                    return Err(Stopped::Failed(
                        "the connection was lost during its check".to_owned(),
                    ));
                }
            }
        }
    }
}
