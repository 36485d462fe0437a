//! One direct connection before the pool opens, to say why a database cannot be reached.
//!
//! A pool keeps retrying a connection that fails for a reason it deems transient (a
//! refused connection, an unknown host) until its acquire timeout, 30 s, and then reports
//! only "pool timed out while waiting for an open connection". A single connection
//! attempt fails at once with the cause; [`probe`] turns it into one line naming it.

use std::str::FromStr;
use std::time::Duration;

use sea_orm_migration::sea_orm::sqlx;
use sqlx::Connection;

/// How long the probe waits for a host name to resolve and for the server to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The databases the command can connect to, by URL scheme.
enum Server {
    Postgres,
    MySql,
    Sqlite,
}

/// Connects once to the database of `url` (PostgreSQL, MySQL/MariaDB, a SQLite file) and
/// closes the connection. `Err` is one line naming the cause: connection refused,
/// unknown host, no answer, authentication failed, no such database (for SQLite a file
/// that does not exist, unless the URL says `mode=rwc`), or the server's own message.
pub async fn probe(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|err| format!("not a database URL: {err}"))?;
    let (server, default_port) = match parsed.scheme() {
        "postgres" | "postgresql" => (Server::Postgres, 5432),
        "mysql" | "mariadb" => (Server::MySql, 3306),
        "sqlite" => (Server::Sqlite, 0),
        other => {
            return Err(format!(
                "unsupported database URL scheme {other:?} (postgres, mysql or sqlite)"
            ));
        }
    };
    // Where the database is, as the messages name it: `host:port`, or SQLite's file.
    let place = match server {
        Server::Sqlite => sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .map_err(|err| format!("invalid database URL: {err}"))?
            .get_filename()
            .display()
            .to_string(),
        Server::Postgres | Server::MySql => {
            let host = parsed.host_str().unwrap_or("localhost");
            let port = parsed.port().unwrap_or(default_port);
            resolve(host, port).await?;
            format!("{host}:{port}")
        }
    };
    let attempt = async {
        match server {
            Server::Postgres => connect_once::<sqlx::PgConnection>(url).await,
            Server::MySql => connect_once::<sqlx::MySqlConnection>(url).await,
            Server::Sqlite => connect_once::<sqlx::SqliteConnection>(url).await,
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(cause(&err, &place)),
        Err(_) => Err(format!(
            "no answer from {place} within {} s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// Opens one connection of type `C` to `url` and closes it.
async fn connect_once<C: Connection>(url: &str) -> Result<(), sqlx::Error> {
    let options = C::Options::from_str(url)?;
    C::connect_with(&options).await?.close().await
}

/// Resolves `host`: a host name that does not resolve says so, rather than an I/O error.
async fn resolve(host: &str, port: u16) -> Result<(), String> {
    let lookup = async {
        let addresses = tokio::net::lookup_host((host, port)).await;
        addresses.map(|mut addresses| addresses.next().is_some())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, lookup).await {
        Ok(Ok(true)) => Ok(()),
        Ok(_) => Err(format!("unknown host {host:?}")),
        Err(_) => Err(format!(
            "host {host:?} did not resolve within {} s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// SQLite's result code for a file it cannot open (`SQLITE_CANTOPEN`).
const SQLITE_CANTOPEN: &str = "14";

/// SQLSTATEs of PostgreSQL's refusals at connection time.
const PG_INVALID_PASSWORD: &str = "28P01";
const PG_INVALID_AUTHORIZATION: &str = "28000";
const PG_INVALID_CATALOG_NAME: &str = "3D000";
/// MySQL/MariaDB's: access denied (with or without a password), access denied to a
/// database, unknown database.
const ER_ACCESS_DENIED: u16 = 1045;
const ER_ACCESS_DENIED_NO_PASSWORD: u16 = 1698;
const ER_DBACCESS_DENIED: u16 = 1044;
const ER_BAD_DB: u16 = 1049;

/// One line naming why a connection to `place` (`host:port`, a SQLite file) failed with
/// `err`.
fn cause(err: &sqlx::Error, place: &str) -> String {
    match err {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("connection refused by {place} (is the server running and listening there?)")
        }
        sqlx::Error::Io(io) => format!("cannot reach {place}: {io}"),
        sqlx::Error::Tls(tls) => format!("TLS with {place} failed: {tls}"),
        sqlx::Error::Configuration(config) => format!("invalid database URL: {config}"),
        sqlx::Error::Database(db) => {
            let message = db.message();
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                return match pg.code() {
                    PG_INVALID_PASSWORD | PG_INVALID_AUTHORIZATION => {
                        format!("authentication failed: {message}")
                    }
                    PG_INVALID_CATALOG_NAME => format!("no such database: {message}"),
                    code => format!("the server refused the connection ({code}): {message}"),
                };
            }
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return match my.number() {
                    ER_ACCESS_DENIED | ER_ACCESS_DENIED_NO_PASSWORD | ER_DBACCESS_DENIED => {
                        format!("authentication failed: {message}")
                    }
                    ER_BAD_DB => format!("no such database: {message}"),
                    number => format!("the server refused the connection ({number}): {message}"),
                };
            }
            // Neither PostgreSQL's nor MySQL's (both returned above): SQLite's.
            if db.code().as_deref() == Some(SQLITE_CANTOPEN)
                && !std::path::Path::new(place).exists()
            {
                return format!("no such database: the SQLite file {place} does not exist");
            }
            format!("the database refused the connection: {message}")
        }
        other => other.to_string(),
    }
}
