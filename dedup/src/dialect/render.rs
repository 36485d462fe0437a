//! The one step between a dialect's SQL files and the texts the database runs.
//!
//! Every statement is written whole in a file of its dialect (`dialect/<dialect>/*.sql`),
//! under a line `-- name: <name>` that the dialect's table ([`File`]) looks it up by; it
//! ends where the next `-- name:` line (or the file) does. Each file is read once per
//! process, when its dialect is first used, and rendered:
//!
//! - lines that start with `--` are dropped: they say why the SQL is as it is, to its
//!   reader (a comment inside a line is not allowed, so that nothing else is dropped);
//!   blank lines at the ends of a statement and a final `;` go too;
//! - the markers shared with the entity crate become their text: `{{columns}}` (every
//!   column of `task_run` the entity maps, in table order: what lookups select and writes
//!   return), `{{insert_columns}}` (the columns a new task is inserted with),
//!   `{{occupies_key}}` ("holds its key", [`OCCUPIES_KEY_SQL`]) and `{{runs_serially}}`
//!   ("takes its key's one run", [`RUNS_SERIALLY_SQL`]);
//! - a statement with `{{bound}}` becomes one text per claim bound ([`BOUNDS`]: the
//!   powers of two up to [`LARGEST_BOUND`]), that number in place of the marker
//!   (PostgreSQL's claims; [`bound`] says why).
//!
//! Statements whose length depends on a count (SQLite and MySQL/MariaDB bind one value
//! per row or id) keep their list markers until a call renders them ([`Template::render`]):
//!
//! - `{{name, GROUP}}`: `GROUP` as many times as the call says for `name`, separated by
//!   commas (`IN ({{ids, ?}})`, `VALUES {{rows, (?, ?)}}`);
//! - `{{name GROUP}}`: the same, separated by spaces (`CASE id {{slots WHEN ? THEN ?}} END`);
//! - `[[ ... ]]`: kept only when every list in it has at least one element (an optional
//!   filter, MySQL/MariaDB: `[[AND user_id NOT IN ({{users, ?}})]]`).
//!
//! Nothing else composes SQL (but the admin list's clauses, `dialect::admin`).

use std::borrow::Cow;

use task_dedup_entity::{OCCUPIES_KEY_SQL, RUNS_SERIALLY_SQL};

/// Every column of `task_run` the entity maps, in table order (`{{columns}}`). The
/// MySQL/MariaDB generated columns stay out.
pub(crate) const COLUMNS: &str = "id, user_id, task_type, resource_key, status, payload, result, \
     error, attempts, lease_owner, lease_expires_at, created_at, updated_at, started_at, \
     finished_at, run_at, priority, scope, dedup_window_end, concurrent, snoozes";

/// The columns a new task is inserted with (`{{insert_columns}}`): `status` and
/// `attempts` are literals (`'queued'`, `0`) in the statements, the others are bound in
/// this order (`executor::args::row`).
pub(crate) const INSERT_COLUMNS: &str = "id, user_id, task_type, resource_key, status, payload, \
     attempts, created_at, updated_at, run_at, priority, scope, dedup_window_end, concurrent";

/// How many texts a statement with `{{bound}}` has: one per power of two from 1 to
/// [`LARGEST_BOUND`].
pub(crate) const BOUNDS: usize = 11;

/// The largest claim a `{{bound}}` text holds: at least `MAX_CLAIM` (asserted where that
/// is defined).
pub(crate) const LARGEST_BOUND: i64 = 1 << (BOUNDS - 1);

/// The index of the text for a claim of up to `max` tasks (1 to `MAX_CLAIM`, checked
/// before): the smallest bound at least `max`.
///
/// Why PostgreSQL's claims have a bound in their text: their locked selection is
/// `LIMIT {{bound}}` and `LIMIT $n` (the claim's size) on top. With the size only as a
/// parameter PostgreSQL planned the statement at every execution (a `LIMIT $n` makes the
/// generic plan look costlier than any custom one, so the plan cache never switches to
/// it): 0.2 ms of planning per main claim and 0.6 ms per window claim in a drain, a
/// quarter and two fifths of their server time. With a literal bound the generic plan
/// wins after five executions where the claimed type is a fair share of the queue
/// (BENCHMARKS.md). Each text is prepared on a connection as it uses it.
pub(crate) fn bound(max: i64) -> usize {
    let max = u64::try_from(max.max(1)).unwrap_or(1);
    (max.next_power_of_two().trailing_zeros() as usize).min(BOUNDS - 1)
}

/// One SQL file, parsed into its named statements, each looked up once by its table.
pub(crate) struct File {
    /// The file's name, for the problems it reports.
    path: &'static str,
    /// Statements several dialects share (`dialect/shared.sql`): each dialect takes some.
    shared: bool,
    statements: Vec<(&'static str, String, bool)>,
    problems: Vec<String>,
}

impl File {
    /// The statements of `text` (a file's contents), by name. `path` names it in the
    /// problems.
    pub(crate) fn parse(path: &'static str, text: &'static str) -> File {
        let mut statements: Vec<(&'static str, String, bool)> = Vec::new();
        let mut problems = Vec::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if let Some(name) = trimmed.strip_prefix("-- name:") {
                statements.push((name.trim(), String::new(), false));
            } else if trimmed.starts_with("--") {
                continue;
            } else if let Some((name, sql, _)) = statements.last_mut() {
                if line.contains("--") && !line.contains("'--") {
                    problems.push(format!("{path}: {name}: a comment inside a line: {line}"));
                }
                sql.push_str(line.trim_end());
                sql.push('\n');
            } else if !trimmed.is_empty() {
                problems.push(format!("{path}: SQL before the first `-- name:` line"));
            }
        }
        for (_, sql, _) in &mut statements {
            let end = sql.trim_end().trim_end_matches(';').trim_end().len();
            sql.truncate(end);
            let start = sql.len() - sql.trim_start().len();
            sql.drain(..start);
            *sql = shared(sql);
        }
        File {
            path,
            shared: false,
            statements,
            problems,
        }
    }

    /// The statements several dialects share (`dialect/shared.sql`): one that a dialect
    /// does not take is no problem.
    pub(crate) fn parse_shared(path: &'static str, text: &'static str) -> File {
        File {
            shared: true,
            ..File::parse(path, text)
        }
    }

    /// The statement `name` if the file has it (a plain one, as [`text`](Self::text)).
    pub(crate) fn optional(&mut self, name: &str) -> Option<String> {
        self.has(name).then(|| self.text(name))
    }

    /// Whether the file has a statement `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.statements.iter().any(|(n, _, _)| *n == name)
    }

    /// The statement `name`, which has neither a bound nor lists.
    pub(crate) fn text(&mut self, name: &str) -> String {
        let sql = self.find(name);
        if sql.contains("{{") || sql.contains("[[") {
            self.problems.push(format!(
                "{}: {name}: a marker left in a plain statement",
                self.path
            ));
        }
        sql
    }

    /// The statement `name`, one text per bound when it has `{{bound}}`, its lists left
    /// for each call.
    pub(crate) fn template(&mut self, name: &str) -> Template {
        let sql = self.find(name);
        let texts = if sql.contains("{{bound}}") {
            (0..BOUNDS)
                .map(|i| sql.replace("{{bound}}", &(1_i64 << i).to_string()))
                .collect()
        } else {
            vec![sql]
        };
        Template { texts }
    }

    /// Every statement of the file not looked up, and every problem met: none in a
    /// file whose table is right (a unit test checks each dialect's).
    pub(crate) fn finish(mut self) -> Vec<String> {
        for (name, _, taken) in &self.statements {
            if !taken && !self.shared {
                self.problems
                    .push(format!("{}: {name}: not in the dialect's table", self.path));
            }
        }
        self.problems
    }

    fn find(&mut self, name: &str) -> String {
        match self.statements.iter_mut().find(|(n, _, _)| *n == name) {
            Some((_, sql, taken)) => {
                *taken = true;
                sql.clone()
            }
            None => {
                // An empty text fails at the database with a clear error; the unit test
                // of every table keeps it from happening.
                self.problems
                    .push(format!("{}: {name}: no such statement", self.path));
                String::new()
            }
        }
    }
}

/// The shared markers of `sql` replaced by their text.
fn shared(sql: &str) -> String {
    sql.replace("{{columns}}", COLUMNS)
        .replace("{{insert_columns}}", INSERT_COLUMNS)
        .replace("{{occupies_key}}", OCCUPIES_KEY_SQL)
        .replace("{{runs_serially}}", RUNS_SERIALLY_SQL)
}

/// A dialect's files by family (`enqueue`, `claim`, ..., the name of each file without
/// `.sql`) and the statements the dialects share (`shared.sql`), for its table to read.
pub(crate) struct Files {
    families: Vec<(&'static str, File)>,
    shared: File,
}

impl Files {
    /// `files` (path, contents), and `shared`.
    pub(crate) fn parse(
        files: &[(&'static str, &'static str)],
        shared: (&'static str, &'static str),
    ) -> Files {
        Files {
            families: files
                .iter()
                .map(|(path, text)| (family(path), File::parse(path, text)))
                .collect(),
            shared: File::parse_shared(shared.0, shared.1),
        }
    }

    /// The file of `family`; an empty one, and a problem, if the dialect has none.
    pub(crate) fn file(&mut self, family: &'static str) -> &mut File {
        let at = match self.families.iter().position(|(f, _)| *f == family) {
            Some(at) => at,
            None => {
                let mut missing = File::parse(family, "");
                missing
                    .problems
                    .push(format!("{family}: no such file in the dialect"));
                self.families.push((family, missing));
                self.families.len() - 1
            }
        };
        &mut self.families[at].1
    }

    /// The plain statement `name` of `family`'s file.
    pub(crate) fn text(&mut self, family: &'static str, name: &str) -> String {
        self.file(family).text(name)
    }

    /// The statement `name` of `family`'s file, which varies.
    pub(crate) fn template(&mut self, family: &'static str, name: &str) -> Template {
        self.file(family).template(name)
    }

    /// The plain statement `name` of `family`'s file if it has one, else the shared one.
    pub(crate) fn own_or_shared(&mut self, family: &'static str, name: &str) -> String {
        match self.file(family).optional(name) {
            Some(sql) => sql,
            None => self.shared.text(name),
        }
    }

    /// Every problem met, and every statement of a dialect's file its table did not read.
    pub(crate) fn finish(self) -> Vec<String> {
        self.families
            .into_iter()
            .map(|(_, file)| file)
            .chain(std::iter::once(self.shared))
            .flat_map(File::finish)
            .collect()
    }
}

/// A file's family: its name without folder and `.sql`.
pub(crate) fn family(path: &'static str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".sql").unwrap_or(name)
}

/// A statement that varies: one text per claim bound (`{{bound}}`), or with lists whose
/// length each call gives, or both.
#[derive(Debug)]
pub(crate) struct Template {
    texts: Vec<String>,
}

impl Template {
    /// The text for a claim of up to `max` tasks, its lists not rendered: for a
    /// statement without lists.
    pub(crate) fn at(&self, max: i64) -> &str {
        let i = if self.texts.len() == BOUNDS {
            bound(max)
        } else {
            0
        };
        self.texts.get(i).map_or("", String::as_str)
    }

    /// The text for a claim of up to `max` tasks (any, for a statement without a
    /// bound), each list `(name, count)` of `lists` repeated `count` times; borrowed
    /// when the statement has no list.
    pub(crate) fn render(&'static self, max: i64, lists: &[(&str, usize)]) -> Cow<'static, str> {
        let text = self.at(max);
        if !text.contains("{{") && !text.contains("[[") {
            return Cow::Borrowed(text);
        }
        Cow::Owned(expand_optional(text, lists))
    }

    /// Every text, for the snapshots.
    #[cfg(test)]
    pub(crate) fn texts(&self) -> &[String] {
        &self.texts
    }
}

/// `text` with its `[[ ... ]]` sections kept or dropped, then its lists expanded.
fn expand_optional(text: &str, lists: &[(&str, usize)]) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut rest = text;
    while let Some(start) = rest.find("[[") {
        out.push_str(&expand_lists(&rest[..start], lists));
        let after = &rest[start + 2..];
        let end = after.find("]]").unwrap_or(after.len());
        let section = &after[..end];
        if list_names(section).all(|name| count(lists, name) > 0) {
            out.push_str(&expand_lists(section, lists));
        } else {
            // The section's line goes with it, when it was the whole line.
            while out.ends_with(' ') {
                out.pop();
            }
            if out.ends_with('\n') && after[end..].starts_with("]]\n") {
                out.pop();
            }
        }
        rest = after.get(end + 2..).unwrap_or("");
    }
    out.push_str(&expand_lists(rest, lists));
    out
}

/// The names of the lists in `text`.
fn list_names(text: &str) -> impl Iterator<Item = &str> {
    text.split("{{").skip(1).filter_map(|marker| {
        let marker = marker.split("}}").next()?;
        let end = marker.find([',', ' ']).unwrap_or(marker.len());
        Some(&marker[..end])
    })
}

fn count(lists: &[(&str, usize)], name: &str) -> usize {
    lists
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, count)| *count)
}

/// `text` with each `{{name, GROUP}}` / `{{name GROUP}}` repeated as `lists` says.
fn expand_lists(text: &str, lists: &[(&str, usize)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").unwrap_or(after.len());
        let marker = &after[..end];
        let (name, separator, group) = match marker.find([',', ' ']) {
            Some(i) if marker[i..].starts_with(',') => (&marker[..i], ", ", marker[i + 1..].trim()),
            Some(i) => (&marker[..i], " ", marker[i + 1..].trim()),
            None => (marker, ", ", ""),
        };
        for n in 0..count(lists, name) {
            if n > 0 {
                out.push_str(separator);
            }
            out.push_str(group);
        }
        rest = after.get(end + 2..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_takes_the_smallest_bound_that_holds_it() {
        for (max, bound_) in [(1, 1), (2, 2), (3, 4), (8, 8), (9, 16), (513, 1024)] {
            assert_eq!(1 << bound(max), bound_, "{max}");
        }
        assert_eq!(bound(LARGEST_BOUND), BOUNDS - 1);
    }

    #[test]
    fn a_file_is_split_at_its_names_and_its_comments_dropped() {
        let mut file = File::parse(
            "test.sql",
            "-- The file's header.\n\n-- name: one\n-- Why.\nSELECT {{columns}}\nFROM task_run;\n\n\
             -- name: two\nSELECT 1\n  -- Why not.\n  FROM t\n",
        );
        assert_eq!(file.text("one"), format!("SELECT {COLUMNS}\nFROM task_run"));
        assert_eq!(file.text("two"), "SELECT 1\n  FROM t");
        assert_eq!(file.text("three"), "");
        assert_eq!(
            file.finish(),
            vec!["test.sql: three: no such statement".to_owned()]
        );
    }

    #[test]
    fn a_comment_inside_a_line_and_an_unread_statement_are_problems() {
        let mut file = File::parse(
            "test.sql",
            "-- name: one\nSELECT 1 -- one\n-- name: two\nSELECT 2\n",
        );
        let _ = file.text("one");
        assert_eq!(
            file.finish(),
            vec![
                "test.sql: one: a comment inside a line: SELECT 1 -- one".to_owned(),
                "test.sql: two: not in the dialect's table".to_owned(),
            ]
        );
    }

    #[test]
    fn a_bound_makes_one_text_per_power_of_two() {
        let mut file = File::parse("test.sql", "-- name: claim\nLIMIT {{bound}}\n");
        let claim: &'static Template = Box::leak(Box::new(file.template("claim")));
        assert_eq!(claim.texts().len(), BOUNDS);
        assert_eq!(claim.at(3), "LIMIT 4");
        assert_eq!(claim.render(1000, &[]), "LIMIT 1024");
    }

    #[test]
    fn lists_repeat_their_group_and_optional_sections_need_elements() {
        let mut file = File::parse(
            "test.sql",
            "-- name: many\nSELECT {{columns}} WHERE id IN ({{ids, ?}})\n\
             -- name: cases\nSET slot = CASE id {{slots WHEN ? THEN ?}} END\n\
             -- name: optional\nWHERE a = ?\n    [[AND u NOT IN ({{users, ?}})]]\n    [[AND t IN ({{types, ?}})]]\nLIMIT ?\n",
        );
        let many: &'static Template = Box::leak(Box::new(file.template("many")));
        let cases: &'static Template = Box::leak(Box::new(file.template("cases")));
        let optional: &'static Template = Box::leak(Box::new(file.template("optional")));
        assert_eq!(
            many.render(0, &[("ids", 3)]),
            format!("SELECT {COLUMNS} WHERE id IN (?, ?, ?)")
        );
        assert_eq!(
            cases.render(0, &[("slots", 2)]),
            "SET slot = CASE id WHEN ? THEN ? WHEN ? THEN ? END"
        );
        assert_eq!(
            optional.render(0, &[("users", 2), ("types", 0)]),
            "WHERE a = ?\n    AND u NOT IN (?, ?)\nLIMIT ?"
        );
        assert_eq!(
            optional.render(0, &[("users", 0), ("types", 1)]),
            "WHERE a = ?\n    AND t IN (?)\nLIMIT ?"
        );
        assert_eq!(optional.render(0, &[]), "WHERE a = ?\nLIMIT ?");
        assert!(file.finish().is_empty());
    }
}
