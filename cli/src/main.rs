//! `task-dedup`: see and steer task-dedup's tasks from a shell.
//!
//! ```text
//! task-dedup tasks list --status failed --type export      # also show, retry, cancel,
//! task-dedup tasks retry --status failed --limit 100       #   delete, stats
//! task-dedup pause export                                  # resume, paused
//! task-dedup limits set export --max-running 2 --per-user 1  # list, clear
//! task-dedup limits set-user 3                             # clear-user: across types
//! task-dedup prune --failed 30d
//! task-dedup migrate up                                    # as task-dedup-migrate
//! ```
//!
//! The database comes from `-u/--database-url`, else `DATABASE_URL` (the environment,
//! then `.env`), else the SQLite file `task_dedup.db` (which `migrate` creates, and the
//! other commands expect to exist), as for `task-dedup-migrate`, whose library this
//! command shares. Tables by default; `--json` prints one JSON document instead.
//!
//! Exit status: 0 done; 1 failed (the database, a refused action, no such task); 2 bad
//! usage (checked before any connection, or by the library before any SQL). Errors are
//! one line on stderr, `task-dedup: <what went wrong>`.

mod failure;
mod limits;
mod ops;
mod output;
mod tasks;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sea_orm::{Database, DatabaseConnection};
use task_dedup_migrate::{DEFAULT_URL, DatabaseArgs, EXISTING_SQLITE_URL, MigrateCommand};

use crate::failure::Failure;

#[derive(Debug, Parser)]
#[command(
    name = "task-dedup",
    version,
    about = "See and steer task-dedup's tasks",
    propagate_version = true
)]
struct Cli {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Print one JSON document (field names in the crate's README) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Show debug messages.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List, show, retry, cancel and delete tasks; counts and throughput (`tasks stats`).
    #[command(subcommand)]
    Tasks(tasks::TasksCommand),
    /// Pause a task type: no worker claims its tasks until it is resumed.
    Pause {
        /// The task type.
        task_type: String,
    },
    /// Resume a paused task type.
    Resume {
        /// The task type.
        task_type: String,
    },
    /// List the paused task types.
    Paused,
    /// Limits per task type, across every worker: running at once, per user, starts per
    /// window, users in turn.
    #[command(subcommand)]
    Limits(limits::LimitsCommand),
    /// Delete the finished tasks past their retention (a worker's defaults unless set).
    Prune(ops::PruneArgs),
    /// Apply or roll back task-dedup's migrations (the commands of task-dedup-migrate).
    #[command(subcommand)]
    Migrate(MigrateCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    // Before parsing: clap reads DATABASE_URL from the environment.
    task_dedup_migrate::load_dotenv();
    let outcome = match Cli::try_parse() {
        Ok(cli) => run(cli).await,
        Err(usage) => Err(Failure::from_clap(usage)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let Cli {
        database,
        json,
        verbose,
        command,
    } = cli;
    if let Command::Migrate(migrate) = command {
        if json {
            return Err(Failure::usage("--json does not apply to migrate"));
        }
        task_dedup_migrate::setup_tracing(verbose, task_dedup_migrate::MIGRATE_TRACING);
        let url = database.url_or(DEFAULT_URL);
        say_database(&url);
        let options = database
            .connect_options(&url, verbose)
            .await
            .map_err(Failure::failed)?;
        let db = Database::connect(options)
            .await
            .map_err(Failure::database)?;
        migrate.run(&db).await.map_err(Failure::database)?;
        return db.close().await.map_err(Failure::database);
    }
    // The library's own events (a prune's summary) would repeat what the output says.
    task_dedup_migrate::setup_tracing(verbose, "warn");
    let db = connect(&database, verbose).await?;
    let outcome = match command {
        Command::Tasks(tasks) => tasks.run(&db, json).await,
        Command::Pause { task_type } => ops::pause(&db, &task_type, true, json).await,
        Command::Resume { task_type } => ops::pause(&db, &task_type, false, json).await,
        Command::Paused => ops::paused(&db, json).await,
        Command::Limits(limits) => limits.run(&db, json).await,
        Command::Prune(prune) => prune.run(&db, json).await,
        // Run above, before any other connection.
        Command::Migrate(_) => Ok(()),
    };
    // The outcome's error, if any, says more than one of closing.
    let closed = db.close().await;
    outcome?;
    closed.map_err(Failure::database)
}

/// Says on stderr which database the command works on (password redacted).
fn say_database(url: &str) {
    let line = format!("task-dedup: database {}", task_dedup_migrate::redacted(url));
    // Nobody to tell: the command goes on.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A pool on the database `args` name, after the probe said it can be reached.
async fn connect(args: &DatabaseArgs, verbose: bool) -> Result<DatabaseConnection, Failure> {
    let url = args.url_or(EXISTING_SQLITE_URL);
    if verbose {
        say_database(&url);
    }
    let mut options = args
        .connect_options(&url, verbose)
        .await
        .map_err(Failure::failed)?;
    // One command, one statement at a time.
    options.max_connections(2);
    Ok(task_dedup::connect_with(options).await?)
}
