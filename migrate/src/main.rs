//! `task-dedup-migrate`: applies task-dedup's migrations to a database of its own or next
//! to an application's tables (its ledger is `task_dedup_migrations`).
//!
//! ```text
//! cargo run -p task-dedup-migrate -- up            # also down, status, refresh, reset
//! task-dedup-migrate -u postgres://user@host/db up
//! ```
//!
//! The database comes from `-u/--database-url`, else `DATABASE_URL` from the environment,
//! else `DATABASE_URL` from a `.env` file in the current directory or above (the order
//! sea-orm-cli uses), else the SQLite file `task_dedup.db` in the current directory.
//! `-s/--database-schema` (or `DATABASE_SCHEMA`) sets PostgreSQL's search path.
//!
//! A database it cannot reach fails within seconds with one line naming the cause
//! (connection refused, unknown host, no answer, authentication failed, no such
//! database) and exit status 1.

mod probe;

use clap::{Parser, Subcommand};
use sea_orm_migration::MigratorTrait;
use sea_orm_migration::sea_orm::{ConnectOptions, Database};
use task_dedup_migration::Migrator;

/// The embedded database used when no URL is given anywhere.
const DEFAULT_URL: &str = "sqlite://task_dedup.db?mode=rwc";

#[derive(Debug, Parser)]
#[command(version, about = "Apply task-dedup's migrations")]
struct Cli {
    /// Database URL. Default: `DATABASE_URL`, then the SQLite file `task_dedup.db`.
    #[arg(short = 'u', long, global = true, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// PostgreSQL schema (search path); ignored by MySQL and SQLite. Default: `public`.
    #[arg(short = 's', long, global = true, env = "DATABASE_SCHEMA")]
    database_schema: Option<String>,
    /// Show debug messages.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

/// sea-orm-cli's migration commands, except `fresh`, which drops every table of the
/// database (the application's too), and `init`/`generate`, which write source files.
#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending migrations (the default).
    Up {
        /// Apply at most this many.
        #[arg(short, long)]
        num: Option<u32>,
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

#[tokio::main]
async fn main() {
    // Before parsing: clap reads DATABASE_URL from the environment, which `.env` fills
    // only where the real environment does not set it.
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    if let Err(error) = run(cli).await {
        eprintln!("task-dedup-migrate: {error}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    setup_tracing(cli.verbose);
    let url = cli.database_url.unwrap_or_else(|| DEFAULT_URL.to_owned());
    eprintln!("task-dedup-migrate: database {}", redacted(&url));
    if let Err(cause) = probe::probe(&url).await {
        return Err(format!("cannot connect to {}: {cause}", redacted(&url)).into());
    }
    let mut options = ConnectOptions::new(url);
    // Reachable a moment ago: a pool that still cannot connect says so soon.
    options
        .sqlx_logging(cli.verbose)
        .connect_timeout(probe::PROBE_TIMEOUT)
        .acquire_timeout(probe::PROBE_TIMEOUT);
    if let Some(schema) = cli.database_schema {
        options.set_schema_search_path(schema);
    }
    let db = Database::connect(options).await?;
    match cli.command.unwrap_or(Command::Up { num: None }) {
        Command::Up { num } => Migrator::up(&db, num).await?,
        Command::Down { num } => Migrator::down(&db, Some(num)).await?,
        Command::Status => Migrator::status(&db).await?,
        Command::Refresh => Migrator::refresh(&db).await?,
        Command::Reset => Migrator::reset(&db).await?,
    }
    db.close().await?;
    Ok(())
}

/// The URL with its password replaced, fit to print.
fn redacted(url: &str) -> String {
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

/// sea-orm-migration reports each step through `tracing`; show those lines plainly.
fn setup_tracing(verbose: bool) {
    let filter = if verbose {
        "debug"
    } else {
        "sea_orm_migration=info"
    };
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
    use super::redacted;

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
        assert_eq!(redacted(DEFAULT_URL_FOR_TEST), DEFAULT_URL_FOR_TEST);
        assert_eq!(redacted("not a url"), "(an unparsable URL)");
    }

    const DEFAULT_URL_FOR_TEST: &str = super::DEFAULT_URL;
}
