//! SeaORM's entity-first workflow (`db.get_schema_builder().register(..).apply(db)`): a
//! `task_run` made from its entity has no unique index (SeaORM cannot express a partial
//! one), so the dedup guarantee would be missing, and on MySQL/MariaDB its timestamps
//! would have second precision. [`apply_with_task_run`] applies the builder with your
//! entities, then creates `task_run` as the migrations do, with [`ensure_schema`].

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;
use sea_orm_migration::sea_orm::schema::SchemaBuilder;

use crate::compat::{CompatReport, SchemaError, ensure_schema};

/// Applies `builder` (your entities; do not register `task_run::Entity` yourself), then
/// [`ensure_schema`], which creates `task_run` exactly as the migrations do: with its
/// unique index and, on MySQL/MariaDB, byte-exact key columns, the generated column the
/// index reads and microsecond timestamps.
///
/// For tests and prototypes built entity-first; an application with migrations splices
/// [`migrations()`](crate::migrations) instead. Like `SchemaBuilder::apply`, it fails when
/// one of your tables already exists. A `task_run` the builder made from the entity is
/// completed where it can be (PostgreSQL, SQLite) and refused with
/// [`SchemaError::Incompatible`] where it cannot (MySQL/MariaDB's second-precision
/// timestamps).
///
/// # Errors
/// [`SchemaError::Database`] when the builder fails (e.g. a table exists); then as
/// [`ensure_schema`].
///
/// # Example
/// ```no_run
/// # async fn run(db: sea_orm_migration::sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
/// // let builder = db.get_schema_builder().register(post::Entity);
/// let builder = db.get_schema_builder();
/// let report = task_dedup_migration::apply_with_task_run(builder, &db).await?;
/// assert!(report.created_table);
/// # Ok(())
/// # }
/// ```
pub async fn apply_with_task_run<'c, C>(
    builder: SchemaBuilder,
    db: &'c C,
) -> Result<CompatReport, SchemaError>
where
    C: ConnectionTrait,
    &'c C: IntoSchemaManagerConnection<'c>,
{
    builder.apply(db).await?;
    ensure_schema(db).await
}
