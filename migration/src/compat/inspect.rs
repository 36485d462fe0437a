//! Reads `task_run` as the database describes it, on each dialect, without changing it.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, QueryResult, Statement};

use crate::sql::Dialect;

/// One column as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    pub name: String,
    /// The type's name, lowercase, without length: `varchar`, `uuid`, `timestamptz`,
    /// `binary`, `datetime`, ... On SQLite, the declared type.
    pub data_type: String,
    /// The declared length: characters for character types, bytes for binary ones.
    pub length: Option<u32>,
    /// MySQL/MariaDB: fractional-second digits of `datetime`.
    pub precision: Option<u32>,
    pub nullable: bool,
    pub has_default: bool,
    /// A generated (computed) column; never written by inserts.
    pub generated: bool,
    /// MySQL/MariaDB: a character column's collation (`utf8mb4_general_ci`).
    pub collation: Option<String>,
}

impl Column {
    /// How the type reads in a message: `varchar(64)`, `uuid`.
    pub(crate) fn type_text(&self) -> String {
        match (self.length, self.precision) {
            (Some(length), _) => format!("{}({length})", self.data_type),
            (None, Some(precision)) => format!("{}({precision})", self.data_type),
            (None, None) => self.data_type.clone(),
        }
    }
}

/// `task_run` as found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    pub columns: Vec<Column>,
    /// Every index but the primary key's.
    pub indexes: Vec<String>,
    /// SQLite: one `id` value that is not a 16-byte blob (how SeaORM stores a UUID there),
    /// quoted as SQL would show it.
    pub foreign_id: Option<String>,
}

impl Table {
    pub(crate) fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|column| column.name == name)
    }
}

/// Describes `task_run`, which must exist.
pub(crate) async fn inspect(manager: &SchemaManager<'_>, dialect: Dialect) -> Result<Table, DbErr> {
    match dialect {
        Dialect::Sqlite => sqlite(manager).await,
        Dialect::Postgres => postgres(manager).await,
        Dialect::MySql => mysql(manager).await,
    }
}

async fn query(
    manager: &SchemaManager<'_>,
    dialect: Dialect,
    sql: &str,
) -> Result<Vec<QueryResult>, DbErr> {
    manager
        .get_connection()
        .query_all_raw(Statement::from_string(dialect.backend(), sql))
        .await
}

async fn sqlite(manager: &SchemaManager<'_>) -> Result<Table, DbErr> {
    let mut table = Table::default();
    // table_xinfo also lists generated columns (hidden = 2 or 3).
    for row in query(manager, Dialect::Sqlite, "PRAGMA table_xinfo(task_run)").await? {
        let declared: String = row.try_get("", "type")?;
        let (data_type, length) = split_declared_type(&declared);
        table.columns.push(Column {
            name: row.try_get("", "name")?,
            data_type,
            length,
            precision: None,
            nullable: row.try_get::<i32>("", "notnull")? == 0,
            has_default: row.try_get::<Option<String>>("", "dflt_value")?.is_some(),
            generated: row.try_get::<i32>("", "hidden")? >= 2,
            collation: None,
        });
    }
    for row in query(manager, Dialect::Sqlite, "PRAGMA index_list(task_run)").await? {
        if row.try_get::<String>("", "origin")? != "pk" {
            table.indexes.push(row.try_get("", "name")?);
        }
    }
    if table.column("id").is_some() {
        let sample = query(
            manager,
            Dialect::Sqlite,
            "SELECT quote(id) AS sample FROM task_run \
             WHERE typeof(id) <> 'blob' OR length(id) <> 16 LIMIT 1",
        )
        .await?;
        table.foreign_id = sample
            .first()
            .map(|row| row.try_get::<String>("", "sample"))
            .transpose()?;
    }
    Ok(table)
}

/// `varchar(64)` → (`varchar`, 64); `uuid_text` → (`uuid_text`, None).
fn split_declared_type(declared: &str) -> (String, Option<u32>) {
    let lower = declared.trim().to_ascii_lowercase();
    match lower.split_once('(') {
        Some((name, rest)) => {
            let length = rest
                .trim_end_matches(')')
                .split(',')
                .next()
                .and_then(|n| n.trim().parse().ok());
            (name.trim().to_owned(), length)
        }
        None => (lower, None),
    }
}

async fn postgres(manager: &SchemaManager<'_>) -> Result<Table, DbErr> {
    let mut table = Table::default();
    let columns = query(
        manager,
        Dialect::Postgres,
        "SELECT column_name::text AS name, udt_name::text AS data_type, \
                character_maximum_length AS length, is_nullable = 'YES' AS nullable, \
                column_default IS NOT NULL OR is_identity = 'YES' AS has_default, \
                is_generated = 'ALWAYS' AS generated \
         FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = 'task_run' \
         ORDER BY ordinal_position",
    )
    .await?;
    for row in columns {
        table.columns.push(Column {
            name: row.try_get("", "name")?,
            data_type: row.try_get("", "data_type")?,
            length: row
                .try_get::<Option<i32>>("", "length")?
                .and_then(|n| <u32 as TryFrom<_>>::try_from(n).ok()),
            precision: None,
            nullable: row.try_get("", "nullable")?,
            has_default: row.try_get("", "has_default")?,
            generated: row.try_get("", "generated")?,
            collation: None,
        });
    }
    let indexes = query(
        manager,
        Dialect::Postgres,
        "SELECT c.relname::text AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = 'task_run'::regclass AND NOT i.indisprimary ORDER BY 1",
    )
    .await?;
    for row in indexes {
        table.indexes.push(row.try_get("", "name")?);
    }
    Ok(table)
}

async fn mysql(manager: &SchemaManager<'_>) -> Result<Table, DbErr> {
    let mut table = Table::default();
    // CAST: information_schema columns come back as binary strings on some servers.
    let columns = query(
        manager,
        Dialect::MySql,
        "SELECT CAST(COLUMN_NAME AS CHAR) AS name, CAST(DATA_TYPE AS CHAR) AS data_type, \
                CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED) AS length, \
                CAST(DATETIME_PRECISION AS SIGNED) AS `precision`, \
                IS_NULLABLE = 'YES' AS nullable, \
                (COLUMN_DEFAULT IS NOT NULL AND COLUMN_DEFAULT <> 'NULL') AS has_default, \
                EXTRA LIKE '%GENERATED%' AS `generated`, \
                CAST(COLLATION_NAME AS CHAR) AS collation \
         FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' \
         ORDER BY ORDINAL_POSITION",
    )
    .await?;
    for row in columns {
        table.columns.push(Column {
            name: row.try_get("", "name")?,
            data_type: row.try_get::<String>("", "data_type")?.to_ascii_lowercase(),
            length: row
                .try_get::<Option<i64>>("", "length")?
                .and_then(|n| <u32 as TryFrom<_>>::try_from(n).ok()),
            precision: row
                .try_get::<Option<i64>>("", "precision")?
                .and_then(|n| <u32 as TryFrom<_>>::try_from(n).ok()),
            nullable: row.try_get::<i64>("", "nullable")? != 0,
            has_default: row.try_get::<i64>("", "has_default")? != 0,
            generated: row.try_get::<i64>("", "generated")? != 0,
            collation: row.try_get("", "collation")?,
        });
    }
    let indexes = query(
        manager,
        Dialect::MySql,
        "SELECT DISTINCT CAST(INDEX_NAME AS CHAR) AS name FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' \
           AND INDEX_NAME <> 'PRIMARY' ORDER BY 1",
    )
    .await?;
    for row in indexes {
        table.indexes.push(row.try_get("", "name")?);
    }
    Ok(table)
}

/// MySQL/MariaDB: the server's byte-exact collation of `utf8mb4`, the first of
/// [`EXACT_COLLATIONS`](super::latest::EXACT_COLLATIONS) it has, if any.
pub(crate) async fn mysql_exact_collation(
    manager: &SchemaManager<'_>,
) -> Result<Option<&'static str>, DbErr> {
    let names = super::latest::EXACT_COLLATIONS
        .iter()
        .map(|name| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let rows = query(
        manager,
        Dialect::MySql,
        &format!(
            "SELECT CAST(COLLATION_NAME AS CHAR) AS name FROM information_schema.COLLATIONS \
             WHERE COLLATION_NAME IN ({names})"
        ),
    )
    .await?;
    let found = rows
        .iter()
        .map(|row| row.try_get::<String>("", "name"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(super::latest::EXACT_COLLATIONS
        .into_iter()
        .find(|name| found.iter().any(|f| f == name)))
}

#[cfg(test)]
mod tests {
    use super::split_declared_type;

    #[test]
    fn declared_types_split_into_name_and_length() {
        assert_eq!(
            split_declared_type("varchar(64)"),
            ("varchar".into(), Some(64))
        );
        assert_eq!(
            split_declared_type("NUMERIC(10, 2)"),
            ("numeric".into(), Some(10))
        );
        assert_eq!(split_declared_type("uuid_text"), ("uuid_text".into(), None));
        assert_eq!(split_declared_type(""), (String::new(), None));
    }
}
