//! The library's statements as the database sees them, read from the snapshots that pin
//! them (`dedup/src/dialect/snapshots`), so a test that explains or runs one follows any
//! change to its text.

use crate::Dialect;

/// The pinned text of statement `name` of `dialect` as the database sees it: from the
/// snapshots of the dialect's SQL files (`-- name: <name>` blocks; the admin list's
/// shapes as `-- <shape>`) and of the statements the dialects share, the final `;`
/// dropped. Panics when no snapshot has it.
pub fn statement(dialect: Dialect, name: &str) -> String {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../dedup/src/dialect/snapshots"
    );
    let mut paths: Vec<String> = std::fs::read_dir(dir)
        .expect("the dialect snapshots")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|file| {
            file.starts_with(&format!("task_dedup__dialect__tests__{}_", dialect.name()))
        })
        .collect();
    paths.sort();
    paths.push("task_dedup__dialect__tests__shared.snap".to_owned());
    for path in &paths {
        let text = std::fs::read_to_string(format!("{dir}/{path}")).unwrap_or_default();
        for header in [format!("-- name: {name}\n"), format!("-- {name}\n")] {
            if let Some(at) = text.find(&header) {
                let sql = &text[at + header.len()..];
                let end = sql.find(";\n").unwrap_or(sql.len());
                return sql[..end].to_owned();
            }
        }
    }
    panic!("no pinned statement {name} for {}", dialect.name())
}
