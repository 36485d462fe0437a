//! What a command prints: a table for people, or one JSON document with `--json`.

use std::io::{ErrorKind, Write};
use std::time::Duration;

use chrono::{DateTime, Utc};
use comfy_table::{Table, presets};
use serde::Serialize;

use crate::failure::Failure;

/// The text a person reads for a command's outcome.
pub(crate) trait Human {
    /// Lines ending with a newline.
    fn human(&self) -> String;
}

/// Prints `outcome` on stdout: as one JSON document when `json`, else as text. A reader
/// that stops reading early (`| head`) ends the output, not the command with a panic.
pub(crate) fn emit<T: Serialize + Human>(outcome: &T, json: bool) -> Result<(), Failure> {
    let text = if json {
        let mut document = serde_json::to_string_pretty(outcome)
            .map_err(|err| Failure::failed(format!("cannot write JSON: {err}")))?;
        document.push('\n');
        document
    } else {
        outcome.human()
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() != ErrorKind::BrokenPipe => {
            Err(Failure::failed(format!("cannot write the output: {err}")))
        }
        _ => Ok(()),
    }
}

/// Columns aligned on spaces, a header row first, no borders: easy to read and to `grep`.
pub(crate) fn table<const N: usize>(
    header: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) -> String {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING).set_header(header);
    for row in rows {
        table.add_row(row);
    }
    // comfy-table pads the first column on the left too: one space every line begins with.
    let text = table.to_string();
    let mut lines: String = text
        .lines()
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n");
    lines.push('\n');
    lines
}

/// A time to the second, UTC.
pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// An optional time, `-` when absent.
pub(crate) fn maybe_time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), time)
}

/// A duration to the second (`1h 2m 3s`).
pub(crate) fn age(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// Serializes a duration as whole seconds (`age_seconds` fields).
pub(crate) fn seconds<S: serde::Serializer>(
    duration: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(duration.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_without_borders() {
        let text = table(
            ["TYPE", "COUNT"],
            [
                ["export".to_owned(), "3".to_owned()],
                ["render-pdf".to_owned(), "12".to_owned()],
            ],
        );
        assert_eq!(text, "TYPE        COUNT\nexport      3\nrender-pdf  12\n");
    }

    #[test]
    fn ages_are_whole_seconds() {
        assert_eq!(age(Duration::from_millis(3_723_900)), "1h 2m 3s");
        assert_eq!(age(Duration::ZERO), "0s");
    }
}
