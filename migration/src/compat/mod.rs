//! [`ensure_schema`]: the compat patch for a `task_run` table that predates the
//! migrations, made by hand or by an older release.

mod inspect;
mod latest;

use std::fmt;

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::TransactionTrait;

pub use latest::ColumnProblem;

use crate::m20261130_000002_task_dedup_active_resource_uidx as active_index;
use crate::sql::{self, Dialect};

/// What the changes of [`ensure_schema_online`](crate::online::ensure_schema_online)
/// that belong to no migration are reported under.
const COMPAT: &str = "ensure_schema";

/// What [`ensure_schema`] changed. [`CompatReport::is_unchanged`] means the schema already
/// held the guarantee.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompatReport {
    /// `task_run` did not exist and was created.
    pub created_table: bool,
    /// Columns that were missing and were added (nullable or defaulted ones, and on
    /// MySQL/MariaDB the generated column behind the unique index).
    pub added_columns: Vec<String>,
    /// MySQL/MariaDB: key columns made byte-exact: a `utf8mb4` `VARCHAR` given the
    /// server's binary NO PAD collation (`utf8mb4_nopad_bin` on MariaDB,
    /// `utf8mb4_0900_bin` on MySQL 8), any other converted to `VARBINARY`.
    pub converted_columns: Vec<&'static str>,
    /// Duplicate active rows marked `cancelled` (the oldest task of each key stays).
    pub cancelled_duplicates: u64,
    /// Indexes that were missing and were created.
    pub created_indexes: Vec<String>,
    /// [`ensure_schema_online`](crate::online::ensure_schema_online): each change it
    /// made online, and how long it took. Empty for [`ensure_schema`].
    pub online: Vec<crate::online::Change>,
}

impl CompatReport {
    /// Whether nothing had to change.
    pub fn is_unchanged(&self) -> bool {
        *self == CompatReport::default()
    }
}

impl fmt::Display for CompatReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unchanged() {
            return f.write_str("task_run already up to date");
        }
        let mut parts = Vec::new();
        if self.created_table {
            parts.push("created table task_run".to_owned());
        }
        if !self.added_columns.is_empty() {
            parts.push(format!("added columns {}", self.added_columns.join(", ")));
        }
        if !self.converted_columns.is_empty() {
            parts.push(format!(
                "made columns byte-exact: {}",
                self.converted_columns.join(", ")
            ));
        }
        if self.cancelled_duplicates > 0 {
            parts.push(format!(
                "cancelled {} duplicate active task(s)",
                self.cancelled_duplicates
            ));
        }
        if !self.created_indexes.is_empty() {
            parts.push(format!("created {}", self.created_indexes.join(", ")));
        }
        if !self.online.is_empty() {
            parts.push(format!("{} change(s) made online", self.online.len()));
        }
        f.write_str(&parts.join("; "))
    }
}

/// Why [`ensure_schema`] did not bring `task_run` up to date.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// Columns the library cannot use and `ensure_schema` cannot convert safely. Found
    /// by inspecting the whole table before any change: nothing was altered.
    #[error(
        "task_run cannot be brought up to task-dedup's schema (nothing was changed): {}",
        .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    Incompatible {
        /// One entry per offending column.
        problems: Vec<ColumnProblem>,
    },
    /// A database error, including a dialect this crate was built without.
    #[error(transparent)]
    Database(#[from] DbErr),
    /// [`ensure_schema_online`](crate::online::ensure_schema_online): an online build
    /// gave up (see [`OnlineError`](crate::online::OnlineError)); what it built stays.
    #[error(transparent)]
    Online(crate::online::OnlineError),
}

impl From<crate::online::OnlineError> for SchemaError {
    fn from(err: crate::online::OnlineError) -> Self {
        match err {
            crate::online::OnlineError::Database(db) => SchemaError::Database(db),
            other => SchemaError::Online(other),
        }
    }
}

/// Brings `task_run` up to the dedup guarantee, whatever state it is in, and reports what
/// it changed.
///
/// It inspects the whole table first. A column it cannot use or convert (TEXT ids on
/// SQLite, a `bigserial` id on PostgreSQL, a key column shorter than the library's
/// limits, `timestamp` without time zone, a NOT NULL column the library never writes...)
/// fails with [`SchemaError::Incompatible`] naming every such column, what it found and
/// what it needs, and nothing is altered.
///
/// Otherwise it adds missing nullable or defaulted columns, makes MySQL/MariaDB key
/// columns byte-exact, cancels duplicate active rows exactly as the unique-index migration
/// does, and applies every migration step that is not in effect yet (each step is
/// idempotent). It creates the table when it does not exist. Cheap when there is nothing
/// to do, so it is safe to call at every start-up. It records nothing in a migration
/// ledger; running a migrator afterwards changes nothing.
///
/// # Errors
/// [`SchemaError::Incompatible`] as above; [`SchemaError::Database`] for a database error
/// (then the steps already applied stay applied; calling again picks up where it
/// stopped).
///
/// # Example
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let db = sea_orm_migration::sea_orm::Database::connect("sqlite::memory:").await?;
/// let report = task_dedup_migration::ensure_schema(&db).await?;
/// assert!(report.created_table);
/// assert!(task_dedup_migration::ensure_schema(&db).await?.is_unchanged());
/// # Ok(())
/// # }
/// ```
pub async fn ensure_schema<'c, C>(db: C) -> Result<CompatReport, SchemaError>
where
    C: IntoSchemaManagerConnection<'c>,
{
    let manager = SchemaManager::new(db);
    let dialect = Dialect::of(&manager)?;
    if dialect == Dialect::MySql {
        // DDL commits implicitly there, transaction or not; every step is idempotent,
        // so after an error a second call completes the work.
        return ensure_schema_in(&manager, dialect, None).await;
    }
    // One transaction (a savepoint in the caller's): all or nothing, and one connection
    // sees every step (pooled SQLite connections would see stale schemas in between).
    let txn = manager.get_connection().begin().await?;
    let report = ensure_schema_in(&SchemaManager::new(&txn), dialect, None).await?;
    txn.commit().await?;
    Ok(report)
}

/// The compat patch on `manager`'s connection; with `online`, each change a writer could
/// wait for is made online first (outside any transaction), and the migrations then find
/// it done.
pub(crate) async fn ensure_schema_in(
    manager: &SchemaManager<'_>,
    dialect: Dialect,
    online: Option<&crate::online::Run<'_>>,
) -> Result<CompatReport, SchemaError> {
    let mut report = CompatReport::default();
    let before = if manager.has_table("task_run").await? {
        let table = inspect::inspect(manager, dialect).await?;
        let problems = latest::problems(&table, dialect);
        if !problems.is_empty() {
            return Err(SchemaError::Incompatible { problems });
        }
        table
    } else {
        report.created_table = true;
        inspect::Table::default()
    };

    if !report.created_table {
        // The columns of the first migration a table may lack; later migrations add
        // their own below.
        let missing = latest::COLUMNS
            .iter()
            .filter(|s| !s.from_migration && before.column(s.name).is_none());
        for spec in missing {
            let add = latest::add_column(dialect, spec);
            match online {
                Some(run) => {
                    run.alter(COMPAT, format!("column {}", spec.name), &add)
                        .await?
                }
                None => sql::run(manager, &[&add]).await?,
            }
        }
        let exact_collation =
            if dialect == Dialect::MySql && latest::mysql_inexact_keys(&before).next().is_some() {
                inspect::mysql_exact_collation(manager).await?
            } else {
                None
            };
        if dialect == Dialect::MySql
            && let Some((columns, alter)) = latest::mysql_exact_keys(&before, exact_collation)
        {
            match online {
                Some(run) => run.alter(COMPAT, columns.join(", "), &alter).await?,
                None => sql::run(manager, &[&alter]).await?,
            }
            report.converted_columns = columns;
        }
        if !before
            .indexes
            .iter()
            .any(|i| i == active_index::ACTIVE_RESOURCE_UIDX)
        {
            report.cancelled_duplicates = active_index::cancel_duplicate_active(manager).await?;
        }
    }
    for migration in crate::migrations() {
        if let Some(run) = online {
            run.prepare(migration.name()).await?;
        }
        migration.up(manager).await?;
    }
    if let Some(run) = online {
        report.online = run.take_changes();
    }

    let after = inspect::inspect(manager, dialect).await?;
    if !report.created_table {
        report.added_columns = after
            .columns
            .iter()
            .filter(|c| before.column(&c.name).is_none())
            .map(|c| c.name.clone())
            .collect();
    }
    report.created_indexes = after
        .indexes
        .into_iter()
        .filter(|i| !before.indexes.contains(i))
        .collect();
    Ok(report)
}
