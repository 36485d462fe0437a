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
}

/// Connects once to the database of `url` (PostgreSQL, MySQL/MariaDB, a SQLite file) and
/// closes the connection. `Err` is one line naming the cause: connection refused,
/// unknown host, no answer, authentication failed, no such database (a SQLite file that
/// does not exist, unless the URL says `mode=rwc`), or the server's own message.
pub async fn probe(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|err| format!("not a database URL: {err}"))?;
    let (server, default_port) = match parsed.scheme() {
        "postgres" | "postgresql" => (Server::Postgres, 5432),
        "mysql" | "mariadb" => (Server::MySql, 3306),
        "sqlite" => return probe_sqlite(url).await,
        other => {
            return Err(format!(
                "unsupported database URL scheme {other:?} (postgres, mysql or sqlite)"
            ));
        }
    };
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let port = parsed.port().unwrap_or(default_port);
    // A host name that does not resolve says so, rather than an I/O error.
    let lookup = async {
        let addresses = tokio::net::lookup_host((host.as_str(), port)).await;
        addresses.map(|mut addresses| addresses.next().is_some())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, lookup).await {
        Ok(Ok(true)) => {}
        Ok(_) => return Err(format!("unknown host {host:?}")),
        Err(_) => {
            return Err(format!(
                "host {host:?} did not resolve within {} s",
                PROBE_TIMEOUT.as_secs()
            ));
        }
    }
    let attempt = async {
        match server {
            Server::Postgres => {
                let options = sqlx::postgres::PgConnectOptions::from_str(url)?;
                sqlx::PgConnection::connect_with(&options)
                    .await?
                    .close()
                    .await
            }
            Server::MySql => {
                let options = sqlx::mysql::MySqlConnectOptions::from_str(url)?;
                sqlx::MySqlConnection::connect_with(&options)
                    .await?
                    .close()
                    .await
            }
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(cause(&err, &host, port)),
        Err(_) => Err(format!(
            "no answer from {host}:{port} within {} s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// Opens the SQLite database of `url` once: a file that does not exist (and that the URL
/// does not ask to create) is named, rather than SQLite's "unable to open database file".
async fn probe_sqlite(url: &str) -> Result<(), String> {
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|err| format!("invalid database URL: {err}"))?;
    let attempt = async {
        sqlx::SqliteConnection::connect_with(&options)
            .await?
            .close()
            .await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(sqlx::Error::Database(db)))
            if db.code().as_deref() == Some(SQLITE_CANTOPEN)
                && !options.get_filename().exists() =>
        {
            Err(format!(
                "no such database: the SQLite file {} does not exist",
                options.get_filename().display()
            ))
        }
        Ok(Err(err)) => Err(format!("cannot open the SQLite database: {err}")),
        Err(_) => Err(format!(
            "the SQLite database did not open within {} s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// SQLite's result code for a file it cannot open.
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

/// One line naming why a connection to `host:port` failed with `err`.
fn cause(err: &sqlx::Error, host: &str, port: u16) -> String {
    match err {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!(
                "connection refused by {host}:{port} (is the server running and listening there?)"
            )
        }
        sqlx::Error::Io(io) => format!("cannot reach {host}:{port}: {io}"),
        sqlx::Error::Tls(tls) => format!("TLS with {host}:{port} failed: {tls}"),
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
            format!("the server refused the connection: {message}")
        }
        other => other.to_string(),
    }
}
