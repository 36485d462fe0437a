//! The latest `task_run` schema, as [`ensure_schema`](crate::ensure_schema) needs it: what
//! each column must be for the library to use it, and how to add the columns a table made
//! by hand or by an older release may lack. The migrations never read this: each states
//! its own DDL.

use std::fmt;

use task_dedup_entity::task_run::{
    ERROR_MAX_CHARS, LEASE_OWNER_MAX_CHARS, RESOURCE_KEY_MAX_CHARS, SCOPE_MAX_CHARS,
    STATUS_MAX_CHARS, TASK_TYPE_MAX_CHARS, USER_ID_MAX_CHARS,
};

use super::inspect::{Column, Table};
use crate::sql::Dialect;

/// What a column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A UUID: `uuid` / 16-byte blob / `binary(16)`.
    Uuid,
    /// A part of the dedup key or a worker id: byte-exact text of at most this many
    /// characters (`VARBINARY` on MySQL/MariaDB, or a `utf8mb4` character column in a
    /// byte-exact collation: [`EXACT_COLLATIONS`]).
    Key(usize),
    /// Short text of at most this many characters.
    Text(usize),
    /// Long text (error messages).
    LongText,
    Json,
    /// A 32-bit integer (the library reads `i32`).
    Int,
    /// A 16-bit integer (the library reads `i16`).
    SmallInt,
    /// A 64-bit integer (the library reads `i64`).
    BigInt,
    /// A UTC timestamp with microseconds.
    Timestamp,
    /// A boolean (`boolean`; `tinyint(1)` on MySQL/MariaDB).
    Bool,
}

/// One column of the latest schema.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    /// The library writes NULL into it.
    pub nullable: bool,
    /// A table without it can get it: it admits NULL or has a default.
    pub addable: bool,
    /// A later migration adds it (so `ensure_schema` leaves that to the migration).
    pub from_migration: bool,
}

const fn spec(name: &'static str, kind: Kind, nullable: bool, addable: bool) -> Spec {
    Spec {
        name,
        kind,
        nullable,
        addable,
        from_migration: false,
    }
}

/// A column a later migration adds, with a default.
const fn later(name: &'static str, kind: Kind) -> Spec {
    Spec {
        name,
        kind,
        nullable: false,
        addable: true,
        from_migration: true,
    }
}

/// Every column the library reads or writes, in table order.
pub(crate) const COLUMNS: [Spec; 21] = [
    spec("id", Kind::Uuid, false, false),
    spec("user_id", Kind::Key(USER_ID_MAX_CHARS), false, false),
    spec("task_type", Kind::Key(TASK_TYPE_MAX_CHARS), false, false),
    spec(
        "resource_key",
        Kind::Key(RESOURCE_KEY_MAX_CHARS),
        false,
        false,
    ),
    spec("status", Kind::Text(STATUS_MAX_CHARS), false, false),
    spec("payload", Kind::Json, true, true),
    spec("result", Kind::Json, true, true),
    spec("error", Kind::LongText, true, true),
    spec("attempts", Kind::Int, false, true),
    spec("lease_owner", Kind::Key(LEASE_OWNER_MAX_CHARS), true, true),
    spec("lease_expires_at", Kind::Timestamp, true, true),
    spec("created_at", Kind::Timestamp, false, false),
    spec("updated_at", Kind::Timestamp, false, false),
    spec("started_at", Kind::Timestamp, true, true),
    spec("finished_at", Kind::Timestamp, true, true),
    later("run_at", Kind::Timestamp),
    later("priority", Kind::SmallInt),
    later("scope", Kind::Text(SCOPE_MAX_CHARS)),
    later("dedup_window_end", Kind::BigInt),
    later("concurrent", Kind::Bool),
    later("snoozes", Kind::Int),
];

/// The MySQL/MariaDB generated columns behind the unique indexes, old and new.
const GENERATED: [&str; 3] = ["active_marker", "occupied", "running_slot"];

/// A column [`ensure_schema`](crate::ensure_schema) cannot make usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnProblem {
    /// The column's name.
    pub column: String,
    /// What the table has.
    pub found: String,
    /// What task-dedup needs.
    pub needs: String,
}

impl fmt::Display for ColumnProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "column {}: found {}, needs {}",
            self.column, self.found, self.needs
        )
    }
}

/// Everything about `table` that [`ensure_schema`](crate::ensure_schema) could not fix.
pub(crate) fn problems(table: &Table, dialect: Dialect) -> Vec<ColumnProblem> {
    let mut problems = Vec::new();
    for spec in COLUMNS {
        let Some(column) = table.column(spec.name) else {
            if !spec.addable {
                problems.push(problem(
                    spec.name,
                    "no such column".to_owned(),
                    "it (it cannot be added to rows that exist: add it by hand)",
                ));
            }
            continue;
        };
        if let Err(needs) = accepts(dialect, spec.kind, column) {
            problems.push(problem(spec.name, column.type_text(), &needs));
        }
        if spec.nullable && !column.nullable && !column.has_default {
            problems.push(problem(
                spec.name,
                "NOT NULL without a default".to_owned(),
                "it to admit NULL, which task-dedup writes there",
            ));
        }
    }
    if let Some(sample) = &table.foreign_id {
        problems.push(problem(
            "id",
            format!("values that are not 16-byte UUID blobs (e.g. {sample})"),
            "UUIDs stored as SeaORM stores them on SQLite: 16-byte blobs",
        ));
    }
    for column in &table.columns {
        let ours = COLUMNS.iter().any(|spec| spec.name == column.name)
            || GENERATED.contains(&column.name.as_str());
        if !ours && !column.generated && !column.nullable && !column.has_default {
            problems.push(problem(
                &column.name,
                "NOT NULL without a default".to_owned(),
                "a default or NULL: task-dedup's inserts do not set this column",
            ));
        }
    }
    problems
}

fn problem(column: &str, found: String, needs: &str) -> ColumnProblem {
    ColumnProblem {
        column: column.to_owned(),
        found,
        needs: needs.to_owned(),
    }
}

/// Whether `column` can hold `kind` as the library reads and writes it; otherwise what
/// it needs. MySQL/MariaDB key columns of a character type are accepted: `ensure_schema`
/// makes them byte-exact (`mysql_exact_keys`).
fn accepts(dialect: Dialect, kind: Kind, column: &Column) -> Result<(), String> {
    let data_type = column.data_type.as_str();
    let chars = column.length.map(|n| n as usize);
    match dialect {
        Dialect::Sqlite => {
            // SQLite stores what it is given, but a column's affinity converts values:
            // INTEGER PRIMARY KEY is the rowid, numeric affinities turn digit strings
            // into numbers.
            let affinity = sqlite_affinity(data_type);
            let ok = match kind {
                Kind::Int | Kind::SmallInt | Kind::BigInt => affinity == Affinity::Integer,
                // `boolean` has NUMERIC affinity; both store 0 and 1 as integers.
                Kind::Bool => matches!(affinity, Affinity::Integer | Affinity::Numeric),
                Kind::Uuid => affinity != Affinity::Integer,
                Kind::Timestamp => matches!(
                    affinity,
                    Affinity::Text | Affinity::Blob | Affinity::Numeric
                ),
                _ => matches!(affinity, Affinity::Text | Affinity::Blob),
            };
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{} (a declared type with {})",
                    sqlite_type(kind),
                    match kind {
                        Kind::Int | Kind::SmallInt | Kind::BigInt => "INTEGER affinity",
                        Kind::Bool => "INTEGER or NUMERIC affinity",
                        Kind::Uuid => "any affinity but INTEGER, which would make it the rowid",
                        _ => "TEXT or BLOB affinity",
                    }
                ))
            }
        }
        Dialect::Postgres => {
            let ok = match kind {
                Kind::Uuid => data_type == "uuid",
                Kind::Key(max) | Kind::Text(max) => {
                    data_type == "text"
                        || (data_type == "varchar" && chars.is_none_or(|n| n >= max))
                }
                Kind::LongText => {
                    data_type == "text"
                        || (data_type == "varchar" && chars.is_none_or(|n| n >= ERROR_MAX_CHARS))
                }
                Kind::Json => matches!(data_type, "jsonb" | "json"),
                Kind::Int => data_type == "int4",
                Kind::SmallInt => data_type == "int2",
                Kind::BigInt => data_type == "int8",
                Kind::Timestamp => data_type == "timestamptz",
                Kind::Bool => data_type == "bool",
            };
            if ok { Ok(()) } else { Err(postgres_type(kind)) }
        }
        Dialect::MySql => {
            let ok = match kind {
                Kind::Uuid => data_type == "binary" && chars == Some(16),
                Kind::Key(max) | Kind::Text(max) => match data_type {
                    // Lengths of binary types are bytes: 4 a character.
                    "varbinary" => chars.is_some_and(|n| n >= max * 4),
                    "varchar" | "char" => chars.is_some_and(|n| n >= max),
                    "text" | "mediumtext" | "longtext" => true,
                    _ => false,
                },
                Kind::LongText => matches!(data_type, "text" | "mediumtext" | "longtext"),
                // MariaDB reports JSON as longtext.
                Kind::Json => matches!(data_type, "json" | "longtext"),
                // sqlx reads any signed integer type into i32, checking the range.
                Kind::Int | Kind::SmallInt | Kind::BigInt => {
                    matches!(data_type, "int" | "bigint" | "mediumint" | "smallint")
                }
                Kind::Timestamp => data_type == "datetime" && column.precision == Some(6),
                Kind::Bool => data_type == "tinyint",
            };
            if ok { Ok(()) } else { Err(mysql_type(kind)) }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Affinity {
    Integer,
    Text,
    Blob,
    Real,
    Numeric,
}

/// SQLite's rules for a declared type's affinity (<https://sqlite.org/datatype3.html>).
fn sqlite_affinity(declared: &str) -> Affinity {
    let declared = declared.to_ascii_uppercase();
    if declared.contains("INT") {
        Affinity::Integer
    } else if ["CHAR", "CLOB", "TEXT"]
        .iter()
        .any(|t| declared.contains(t))
    {
        Affinity::Text
    } else if declared.is_empty() || declared.contains("BLOB") {
        Affinity::Blob
    } else if ["REAL", "FLOA", "DOUB"]
        .iter()
        .any(|t| declared.contains(t))
    {
        Affinity::Real
    } else {
        Affinity::Numeric
    }
}

fn sqlite_type(kind: Kind) -> String {
    match kind {
        Kind::SmallInt => "smallint".to_owned(),
        Kind::BigInt => "bigint".to_owned(),
        Kind::Uuid => "uuid_text".to_owned(),
        Kind::Key(max) | Kind::Text(max) => format!("varchar({max})"),
        Kind::LongText => "text".to_owned(),
        Kind::Json => "jsonb_text".to_owned(),
        Kind::Int => "integer".to_owned(),
        Kind::Timestamp => "timestamp_with_timezone_text".to_owned(),
        Kind::Bool => "boolean".to_owned(),
    }
}

fn postgres_type(kind: Kind) -> String {
    match kind {
        Kind::SmallInt => "smallint".to_owned(),
        Kind::BigInt => "bigint".to_owned(),
        Kind::Uuid => "uuid".to_owned(),
        Kind::Key(max) | Kind::Text(max) => format!("varchar({max})"),
        Kind::LongText => "text".to_owned(),
        Kind::Json => "jsonb".to_owned(),
        Kind::Int => "integer".to_owned(),
        Kind::Timestamp => "timestamp with time zone".to_owned(),
        Kind::Bool => "boolean".to_owned(),
    }
}

fn mysql_type(kind: Kind) -> String {
    match kind {
        Kind::SmallInt => "smallint".to_owned(),
        Kind::BigInt => "bigint".to_owned(),
        Kind::Uuid => "binary(16)".to_owned(),
        Kind::Key(max) => format!("varbinary({})", max * 4),
        Kind::Text(max) => format!("varchar({max})"),
        Kind::LongText => "text".to_owned(),
        Kind::Json => "json".to_owned(),
        Kind::Int => "int".to_owned(),
        Kind::Timestamp => "datetime(6)".to_owned(),
        Kind::Bool => "boolean".to_owned(),
    }
}

/// `ALTER TABLE task_run ADD COLUMN ...` for a column a table lacks (`spec.addable`).
pub(crate) fn add_column(dialect: Dialect, spec: &Spec) -> String {
    let column_type = match dialect {
        Dialect::Sqlite => sqlite_type(spec.kind),
        Dialect::Postgres => postgres_type(spec.kind),
        Dialect::MySql => mysql_type(spec.kind),
    };
    let null = if spec.nullable {
        "NULL"
    } else {
        "NOT NULL DEFAULT 0"
    };
    format!(
        "ALTER TABLE task_run ADD COLUMN {} {column_type} {null}",
        spec.name
    )
}

/// MySQL/MariaDB: the `utf8mb4` collations that compare keys as their bytes compare
/// (binary, NO PAD: `'a'` and `'a '` differ, as in `VARBINARY`; the order of code points
/// is UTF-8's byte order), in the order of preference: MariaDB's, then MySQL 8's.
pub(crate) const EXACT_COLLATIONS: [&str; 2] = ["utf8mb4_nopad_bin", "utf8mb4_0900_bin"];

/// MySQL/MariaDB: whether a key column compares byte for byte already.
fn is_exact(column: &Column) -> bool {
    column.data_type == "varbinary"
        || (column.data_type == "varchar"
            && column
                .collation
                .as_deref()
                .is_some_and(|c| EXACT_COLLATIONS.contains(&c)))
}

/// MySQL/MariaDB: the key columns (and `lease_owner`) the table has that do not compare
/// byte for byte yet, with their specs.
pub(crate) fn mysql_inexact_keys(table: &Table) -> impl Iterator<Item = (&'static Spec, &Column)> {
    COLUMNS
        .iter()
        .filter(|spec| matches!(spec.kind, Kind::Key(_)))
        .filter_map(|spec| Some((spec, table.column(spec.name)?)))
        .filter(|(_, column)| !is_exact(column))
}

/// MySQL/MariaDB: the key columns (and `lease_owner`) that do not compare byte for byte
/// yet, and the one `ALTER TABLE` that makes them all exact. A `utf8mb4` `VARCHAR` keeps
/// its type and takes the server's exact collation: a change of collation only, which
/// MariaDB makes without copying the table (`ALGORITHM=INSTANT`, or `INPLACE` with the
/// column's indexes rebuilt, writes going on); converting to `VARBINARY`, the way for
/// every other type or character set (and for a server without such a collation),
/// copies the table.
///
/// `exact_collation`: the server's (`inspect::mysql_exact_collation`), looked up only
/// when [`mysql_inexact_keys`] finds any.
pub(crate) fn mysql_exact_keys(
    table: &Table,
    exact_collation: Option<&str>,
) -> Option<(Vec<&'static str>, String)> {
    let mut converted = Vec::new();
    let mut clauses = Vec::new();
    for (spec, column) in mysql_inexact_keys(table) {
        let null = if spec.nullable { "NULL" } else { "NOT NULL" };
        let utf8mb4 = column
            .collation
            .as_deref()
            .is_some_and(|c| c.starts_with("utf8mb4_"));
        let column_type = match (exact_collation, column.length) {
            (Some(collation), Some(length)) if column.data_type == "varchar" && utf8mb4 => {
                format!("varchar({length}) CHARACTER SET utf8mb4 COLLATE {collation}")
            }
            _ => mysql_type(spec.kind),
        };
        clauses.push(format!("MODIFY {} {column_type} {null}", spec.name));
        converted.push(spec.name);
    }
    (!converted.is_empty()).then(|| {
        (
            converted,
            format!("ALTER TABLE task_run {}", clauses.join(", ")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_affinity_follows_the_documented_rules() {
        assert_eq!(sqlite_affinity("INTEGER"), Affinity::Integer);
        assert_eq!(sqlite_affinity("bigint"), Affinity::Integer);
        assert_eq!(sqlite_affinity("varchar(64)"), Affinity::Text);
        assert_eq!(sqlite_affinity("uuid_text"), Affinity::Text);
        assert_eq!(sqlite_affinity(""), Affinity::Blob);
        assert_eq!(sqlite_affinity("double"), Affinity::Real);
        assert_eq!(sqlite_affinity("datetime"), Affinity::Numeric);
    }

    #[test]
    fn added_columns_are_nullable_or_defaulted() {
        for spec in COLUMNS.iter().filter(|s| s.addable && !s.from_migration) {
            assert!(spec.nullable || spec.kind == Kind::Int, "{}", spec.name);
        }
        let attempts = COLUMNS
            .iter()
            .find(|s| s.name == "attempts")
            .expect("attempts");
        assert_eq!(
            add_column(Dialect::Postgres, attempts),
            "ALTER TABLE task_run ADD COLUMN attempts integer NOT NULL DEFAULT 0"
        );
    }
}
