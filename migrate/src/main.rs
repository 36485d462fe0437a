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
//!
//! The same subcommands are `task-dedup migrate ...` (crate `task-dedup-cli`), which
//! shares this crate's library: this command stays for those who install only it.

use clap::Parser;
use sea_orm_migration::sea_orm::Database;
use task_dedup_migrate::{DEFAULT_URL, DatabaseArgs, MigrateCommand, redacted};

#[derive(Debug, Parser)]
#[command(version, about = "Apply task-dedup's migrations")]
struct Cli {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Show debug messages.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Option<MigrateCommand>,
}

#[tokio::main]
async fn main() {
    // Before parsing: clap reads DATABASE_URL from the environment.
    task_dedup_migrate::load_dotenv();
    let cli = Cli::parse();
    if let Err(error) = run(cli).await {
        eprintln!("task-dedup-migrate: {error}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    task_dedup_migrate::setup_tracing(cli.verbose, task_dedup_migrate::MIGRATE_TRACING);
    let url = cli.database.url_or(DEFAULT_URL);
    eprintln!("task-dedup-migrate: database {}", redacted(&url));
    let options = cli.database.connect_options(&url, cli.verbose).await?;
    let db = Database::connect(options).await?;
    cli.command
        .unwrap_or(MigrateCommand::Up {
            num: None,
            online: task_dedup_migrate::OnlineArgs::default(),
        })
        .run(&db)
        .await?;
    db.close().await?;
    Ok(())
}
