//! PostgreSQL URLs with several hosts (`postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write`),
//! as an HA manager (pg_auto_failover, Patroni) hands them out: sqlx takes one host per
//! pool and refuses such a URL ("invalid port number"), and ignores
//! `target_session_attrs`. [`connect_with`](super::connect_with) opens the pool on the
//! host that takes writes, found by asking each in turn as libpq does, and keeps the
//! formation's hosts ([`FORMATIONS`]). When the pool's connections are lost or its
//! server turned read-only (a switchover, a failover), the retry driver asks again
//! ([`repoint`]) and points the pool at the new primary before its next attempt; so does
//! the Worker's wake-up listener before it listens again.
//!
//! With `target_session_attrs=read-write` a new connection to a server that is
//! read-only (a standby, or a primary being promoted) is refused before the pool hands
//! it out, so a pool never fills with connections whose writes fail with 25006.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sea_orm::sqlx::{self, Connection};
use sea_orm::{ConnectOptions, DbErr, RuntimeErr};

use crate::executor::takes_writes;
use crate::values::error::DedupError;

/// A pool's acquire timeout on a formation, unless the options set one. sqlx keeps
/// connecting to the pool's one host until the acquire times out (a former primary
/// that refuses connections while it restarts as a standby, or that is read-only once
/// it has), and only a timed-out acquire lets the retry driver point the pool at the
/// new primary: so a second, not SeaORM's 30 s. A pool busy for longer than that times
/// out too, which the retry driver also takes as a lost connection and retries.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the probe of one host may take (connect and ask): a host that is down must
/// not hold up the search for the one that is up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A URL with several hosts, taken apart: each host's own URL (the rest of the URL
/// unchanged but for `target_session_attrs`), and whether only a read-write server
/// will do.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    /// One single-host URL per host, in the URL's order.
    pub urls: Vec<String>,
    /// `target_session_attrs=read-write` (or `primary`): only a server that takes writes.
    pub read_write: bool,
}

/// Splits `url` when it is a PostgreSQL URL with more than one host; `None` otherwise.
pub(crate) fn parse(url: &str) -> Option<Hosts> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme, "postgres" | "postgresql") {
        return None;
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    if !hosts.contains(',') {
        return None;
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, query),
        None => (tail, ""),
    };
    let mut read_write = false;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| match pair.split_once('=') {
            Some(("target_session_attrs", value)) => {
                read_write = matches!(value, "read-write" | "primary");
                false
            }
            _ => true,
        })
        .collect();
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let urls = hosts
        .split(',')
        .map(|host| format!("{scheme}://{userinfo}{host}{path}{query}"))
        .collect();
    Some(Hosts { urls, read_write })
}

/// A pool opened on a URL with several hosts: the hosts' options, whether only a
/// read-write server will do.
struct Formation {
    hosts: Vec<PgConnectOptions>,
    read_write: bool,
}

/// The formations this process opened pools on.
static FORMATIONS: RwLock<Vec<Arc<Formation>>> = RwLock::new(Vec::new());

/// The formation `pool` connects to one host of, if any.
fn formation_of(pool: &PgPool) -> Option<Arc<Formation>> {
    let current = pool.connect_options();
    let formations = FORMATIONS.read().ok()?;
    formations
        .iter()
        .find(|formation| formation.hosts.iter().any(|host| same_host(host, &current)))
        .cloned()
}

fn same_host(a: &PgConnectOptions, b: &PgConnectOptions) -> bool {
    a.get_host() == b.get_host()
        && a.get_port() == b.get_port()
        && a.get_database() == b.get_database()
}

/// Whether the server of `options` answers, and takes writes.
async fn probe(options: &PgConnectOptions) -> Option<bool> {
    let ask = async {
        let mut conn = PgConnection::connect_with(options).await.ok()?;
        let writable = takes_writes(&mut conn).await;
        let _ = conn.close().await;
        Some(writable)
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .ok()
        .flatten()
}

/// The first host, in the URL's order, that answers and (with `read_write`) takes
/// writes: how libpq picks one.
async fn pick(hosts: &[PgConnectOptions], read_write: bool) -> Option<&PgConnectOptions> {
    for host in hosts {
        match probe(host).await {
            Some(writable) if writable || !read_write => return Some(host),
            _ => {}
        }
    }
    None
}

/// Connects to the host of `hosts` that takes writes (or answers, without
/// `read_write`), with the caller's settings; remembers the formation for [`repoint`].
pub(crate) async fn connect(
    options: &ConnectOptions,
    hosts: Hosts,
) -> Result<sea_orm::DatabaseConnection, DedupError> {
    let parsed = hosts
        .urls
        .iter()
        .map(|url| url.parse::<PgConnectOptions>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| DedupError::Database(DbErr::Conn(RuntimeErr::SqlxError(Arc::new(e)))))?;
    let Some(chosen) = pick(&parsed, hosts.read_write).await else {
        let which = if hosts.read_write {
            "takes writes"
        } else {
            "answers"
        };
        return Err(DedupError::ConnectionLost(DbErr::Conn(
            RuntimeErr::Internal(format!(
                "none of the hosts {} {which}",
                hosts.urls.join(", ")
            )),
        )));
    };
    let index = parsed
        .iter()
        .position(|host| same_host(host, chosen))
        .unwrap_or(0);
    let mut single = with_url(options, &hosts.urls[index]);
    if options.get_acquire_timeout().is_none() {
        single.acquire_timeout(ACQUIRE_TIMEOUT);
    }
    if hosts.read_write {
        single.map_sqlx_postgres_pool_opts(|pool| {
            pool.after_connect(|conn, _| {
                Box::pin(async move {
                    if takes_writes(conn).await {
                        Ok(())
                    } else {
                        Err(sqlx::Error::Protocol(
                            "target_session_attrs=read-write: the server is read-only \
                             (or did not answer)"
                                .into(),
                        ))
                    }
                })
            })
        });
    }
    let db = sea_orm::Database::connect(single).await?;
    if let Ok(mut formations) = FORMATIONS.write() {
        let known = formations.iter().any(|formation| {
            formation.read_write == hosts.read_write
                && formation.hosts.len() == parsed.len()
                && formation
                    .hosts
                    .iter()
                    .zip(&parsed)
                    .all(|(a, b)| same_host(a, b))
        });
        if !known {
            formations.push(Arc::new(Formation {
                hosts: parsed,
                read_write: hosts.read_write,
            }));
        }
    }
    Ok(db)
}

/// `options` with another URL: SeaORM's options have no setter for it, so the settings
/// it lets one read are carried over (pool sizes, timeouts, logging, the idle ping,
/// laziness). Callbacks set on them (`after_connect`, `map_sqlx_*`) cannot be read and
/// are not.
fn with_url(options: &ConnectOptions, url: &str) -> ConnectOptions {
    let mut single = ConnectOptions::new(url.to_owned());
    if let Some(n) = options.get_max_connections() {
        single.max_connections(n);
    }
    if let Some(n) = options.get_min_connections() {
        single.min_connections(n);
    }
    if let Some(timeout) = options.get_connect_timeout() {
        single.connect_timeout(timeout);
    }
    if let Some(timeout) = options.get_acquire_timeout() {
        single.acquire_timeout(timeout);
    }
    if let Some(idle) = options.get_idle_timeout() {
        single.idle_timeout(idle);
    }
    if let Some(lifetime) = options.get_max_lifetime() {
        single.max_lifetime(lifetime);
    }
    if let Some(timeout) = options.get_statement_timeout() {
        single.statement_timeout(timeout);
    }
    if let Some(idle) = options.get_test_before_acquire_if_idle_for() {
        single.test_before_acquire_if_idle_for(idle);
    }
    let (slow_level, slow_after) = options.get_sqlx_slow_statements_logging_settings();
    single
        .sqlx_logging(options.get_sqlx_logging())
        .sqlx_logging_level(options.get_sqlx_logging_level())
        .sqlx_slow_statements_logging_settings(slow_level, slow_after)
        .test_before_acquire(options.get_test_before_acquire())
        .connect_lazy(options.get_connect_lazy());
    single
}

/// After a lost connection on `pool`: when it was opened on a URL with several hosts,
/// finds the one that now takes writes and points the pool's new connections at it.
/// Whether it moved (its idle connections, to the former host, are then for the caller
/// to close).
pub(crate) async fn repoint(pool: &PgPool) -> bool {
    let Some(formation) = formation_of(pool) else {
        return false;
    };
    let current = pool.connect_options();
    match pick(&formation.hosts, formation.read_write).await {
        Some(host) if !same_host(host, &current) => {
            tracing::warn!(
                from = %format!("{}:{}", current.get_host(), current.get_port()),
                to = %format!("{}:{}", host.get_host(), host.get_port()),
                "the primary moved; the pool now connects to the new one"
            );
            pool.set_connect_options(host.clone());
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_several_hosts_is_split_per_host() {
        let hosts = parse(
            "postgres://app:pw@db1:5441,db2:5442/app?sslmode=disable&target_session_attrs=read-write",
        )
        .expect("several hosts");
        assert_eq!(
            hosts.urls,
            [
                "postgres://app:pw@db1:5441/app?sslmode=disable",
                "postgres://app:pw@db2:5442/app?sslmode=disable",
            ]
        );
        assert!(hosts.read_write);
        let any = parse("postgresql://db1,db2/app").expect("several hosts");
        assert_eq!(any.urls, ["postgresql://db1/app", "postgresql://db2/app"]);
        assert!(!any.read_write);
        assert!(parse("postgres://app@db1:5432/app").is_none());
        assert!(parse("mysql://root@a,b/test").is_none());
    }
}
