//! What the `task-dedup-migrate` command and the `task-dedup` command (crate
//! `task-dedup-cli`) share: where the database URL comes from ([`DatabaseArgs`]), the
//! connection [`probe`] that names why a database cannot be reached, and the migrate
//! subcommands ([`MigrateCommand`]).
//!
//! A library for those two programs, not an API of its own: it follows them, and may
//! change whenever they do.

pub mod probe;

use std::time::Duration;

use clap::{Args, Subcommand};
use sea_orm_migration::MigratorTrait;
use sea_orm_migration::sea_orm::{ConnectOptions, DatabaseConnection, DbErr};
use task_dedup_migration::Migrator;
use task_dedup_migration::online::{self, OnlineError, OnlineOptions};

/// The embedded database used when no URL is given anywhere; created if missing (the
/// migrate commands). [`EXISTING_SQLITE_URL`] is the same file, not created.
pub const DEFAULT_URL: &str = "sqlite://task_dedup.db?mode=rwc";

/// [`DEFAULT_URL`] without `mode=rwc`: for commands that read or change tasks, which have
/// nothing to do in a database that does not exist yet.
pub const EXISTING_SQLITE_URL: &str = "sqlite://task_dedup.db";

/// The database options of both commands: `-u/--database-url` (else `DATABASE_URL` from
/// the environment, which [`load_dotenv`] fills from `.env` where it is unset) and
/// `-s/--database-schema` (`DATABASE_SCHEMA`).
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Database URL. Default: `DATABASE_URL` (from the environment, then `.env`), then
    /// the SQLite file `task_dedup.db`.
    #[arg(short = 'u', long, global = true, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// PostgreSQL schema (search path); ignored by MySQL and SQLite. Default: `public`.
    #[arg(short = 's', long, global = true, env = "DATABASE_SCHEMA")]
    pub database_schema: Option<String>,
}

impl DatabaseArgs {
    /// The URL given, or `default` when none is.
    pub fn url_or(&self, default: &str) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| default.to_owned())
    }

    /// Probes `url` ([`probe::probe`]) and returns the pool's options for it: the
    /// schema, SeaORM's statement log only when `verbose`, and connect and acquire
    /// timeouts of [`probe::PROBE_TIMEOUT`]. `Err` is one line: `cannot connect to
    /// <url, password redacted>: <cause>`.
    pub async fn connect_options(
        &self,
        url: &str,
        verbose: bool,
    ) -> Result<ConnectOptions, String> {
        if let Err(cause) = probe::probe(url).await {
            return Err(format!("cannot connect to {}: {cause}", redacted(url)));
        }
        let mut options = ConnectOptions::new(url);
        // Reachable a moment ago: a pool that still cannot connect says so soon.
        options
            .sqlx_logging(verbose)
            .connect_timeout(probe::PROBE_TIMEOUT)
            .acquire_timeout(probe::PROBE_TIMEOUT);
        if let Some(schema) = &self.database_schema {
            options.set_schema_search_path(schema.clone());
        }
        Ok(options)
    }
}

/// Reads `.env` (in the current directory or above) into the environment where the
/// environment does not set a variable already; call it before parsing the arguments, so
/// that clap sees `DATABASE_URL`. A missing or unreadable file is no error: the URL then
/// comes from elsewhere.
pub fn load_dotenv() {
    let _ = dotenvy::dotenv();
}

/// sea-orm-cli's migration commands, except `fresh`, which drops every table of the
/// database (the application's too), and `init`/`generate`, which write source files.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum MigrateCommand {
    /// Apply pending migrations (the default).
    Up {
        /// Apply at most this many.
        #[arg(short, long)]
        num: Option<u32>,
        /// How indexes are built: `--online` for a table that takes writes meanwhile.
        #[command(flatten)]
        online: OnlineArgs,
    },
    /// Roll back applied migrations.
    Down {
        /// Roll back this many.
        #[arg(short, long, default_value_t = 1)]
        num: u32,
    },
    /// Show which migrations are applied.
    Status,
    /// Roll back every applied migration, then apply them all.
    Refresh,
    /// Roll back every applied migration.
    Reset,
}

/// `migrate up`'s options for online builds.
#[derive(Debug, Clone, Copy, Args)]
pub struct OnlineArgs {
    /// Build every index without stopping writes: PostgreSQL `CREATE INDEX
    /// CONCURRENTLY`, MySQL/MariaDB `ALGORITHM=INPLACE, LOCK=NONE` (a run that stops
    /// before step 12, or step 12 on a table made before it, still copies the table for
    /// the generated columns); SQLite: as without it. Says what it built, how, and how
    /// long it took.
    #[arg(long)]
    pub online: bool,
    /// With --online: the longest a statement waits for a lock that writers queue
    /// behind before it is retried, in milliseconds (MySQL: rounded up to seconds).
    #[arg(long, default_value_t = default_lock_timeout_ms(), value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub lock_timeout_ms: u64,
    /// With --online: how many times a statement runs before `up` gives up.
    #[arg(long, default_value_t = OnlineOptions::default().attempts, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub attempts: u32,
}

impl Default for OnlineArgs {
    /// Not online; [`OnlineOptions`]'s lock timeout and attempts (the command's defaults).
    fn default() -> Self {
        OnlineArgs {
            online: false,
            lock_timeout_ms: default_lock_timeout_ms(),
            attempts: OnlineOptions::default().attempts,
        }
    }
}

/// [`OnlineOptions`]'s default lock timeout, in the milliseconds the command takes.
fn default_lock_timeout_ms() -> u64 {
    u64::try_from(OnlineOptions::default().lock_timeout.as_millis()).unwrap_or(u64::MAX)
}

impl OnlineArgs {
    fn options(&self) -> OnlineOptions {
        let mut options = OnlineOptions::default();
        options.lock_timeout = Duration::from_millis(self.lock_timeout_ms);
        options.attempts = self.attempts;
        options
    }
}

impl MigrateCommand {
    /// Runs the command on `db` with task-dedup's standalone [`Migrator`] (its ledger is
    /// `task_dedup_migrations`). Each step is reported through `tracing`
    /// ([`setup_tracing`] shows it), and so is each online build.
    ///
    /// `up` first drops the INVALID indexes a failed or killed online build left
    /// (PostgreSQL) and builds them again online, in either mode: a migration would
    /// otherwise take them for built. `status` names them.
    ///
    /// # Errors
    /// The migration's database error; an online build that gave up (as
    /// `DbErr::Migration`, naming the index).
    pub async fn run(self, db: &DatabaseConnection) -> Result<(), DbErr> {
        match self {
            MigrateCommand::Up { num, online } if online.online => {
                let report = online::up_online(db, num, &online.options())
                    .await
                    .map_err(online_err)?;
                say_online(&report);
                Ok(())
            }
            MigrateCommand::Up { num, online } => {
                let repaired = online::repair_invalid_indexes(db, &online.options())
                    .await
                    .map_err(online_err)?;
                say_online(&repaired);
                Migrator::up(db, num).await
            }
            MigrateCommand::Down { num } => Migrator::down(db, Some(num)).await,
            MigrateCommand::Status => {
                Migrator::status(db).await?;
                for index in online::invalid_indexes(db).await? {
                    tracing::warn!(
                        "index {index} of task_run is INVALID (a failed or killed online \
                         build): the database does not use it; `migrate up` rebuilds it"
                    );
                }
                Ok(())
            }
            MigrateCommand::Refresh => Migrator::refresh(db).await,
            MigrateCommand::Reset => Migrator::reset(db).await,
        }
    }
}

/// Reports what an online `up` did, one line per change.
fn say_online(report: &online::OnlineReport) {
    if report.fresh {
        tracing::info!("task_run did not exist: built as is (no writers to protect)");
    }
    for index in &report.repaired {
        tracing::info!("dropped INVALID index {index} (a failed or killed build); built again");
    }
    // Each change was reported as it was made (target task_dedup_migration).
}

fn online_err(err: OnlineError) -> DbErr {
    match err {
        OnlineError::Database(db) => db,
        other => DbErr::Migration(other.to_string()),
    }
}

/// The URL with its password replaced, fit to print.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Only fails for URLs that cannot have a password, which this one has.
            let _ = parsed.set_password(Some("****"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "(an unparsable URL)".to_owned(),
    }
}

/// The filter the migrate commands pass to [`setup_tracing`]: each migration step, each
/// online build, each INVALID index.
pub const MIGRATE_TRACING: &str =
    "sea_orm_migration=info,task_dedup_migration=info,task_dedup_migrate=info";

/// Shows `tracing` events on stderr, plainly: those `filter` selects (an `EnvFilter`
/// directive such as `sea_orm_migration=info`, which shows each migration step), or
/// every debug event when `verbose`, with its target and level.
pub fn setup_tracing(verbose: bool, filter: &str) {
    let filter = if verbose { "debug" } else { filter };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_target(verbose)
        .with_level(verbose)
        .without_time()
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_URL, redacted};

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            redacted("postgres://app:s3cret@db.example/prod?sslmode=require"),
            "postgres://app:****@db.example/prod?sslmode=require"
        );
        assert_eq!(
            redacted("mysql://root@127.0.0.1:3306/test"),
            "mysql://root@127.0.0.1:3306/test"
        );
        assert_eq!(redacted(DEFAULT_URL), DEFAULT_URL);
        assert_eq!(redacted("not a url"), "(an unparsable URL)");
    }
}
