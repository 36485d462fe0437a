//! PostgreSQL statements with their parameters written in as literals, for
//! [`PoolerMode::NoPreparedStatements`](crate::PoolerMode): one simple-protocol message
//! per statement, which a pooler without named prepared statements runs on one server.
//!
//! Every value becomes a typed constant of the type sqlx would bind it as (`text`,
//! `uuid`, `jsonb`, `int8`, ...), so the statement plans and compares exactly as with
//! bound parameters. Text is written as an escape string, `E'...'`, with `\` and `'`
//! doubled: an `E` string means the same whatever `standard_conforming_strings` says, so
//! no setting of the server or the session can let a value end its literal early. The
//! session's client encoding is UTF-8 (sqlx sets it at connect), where no multi-byte
//! character contains the byte of `\` or `'`. A NUL character, which PostgreSQL text
//! cannot hold and which would end the message early, is refused before any SQL is sent
//! (task-dedup's validation refuses it in every input before that).
//!
//! Only the statement's placeholders (`$1`, `$2`, ...) are replaced; the statement texts
//! are task-dedup's own, and a value written in is never scanned again, so a value
//! holding `$2` stays text.

use std::fmt::Write;

use sea_orm::DbErr;

use super::args::{Arg, Array};

/// `sql` with its placeholders replaced by the literals of `args` (`$1` by the first).
pub(crate) fn render(sql: &str, args: &[Arg<'_>]) -> Result<String, DbErr> {
    let mut out = String::with_capacity(sql.len() + 32 * args.len());
    let mut rest = sql;
    while let Some(at) = rest.find(['$', '\'', '"']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let quote = tail.as_bytes()[0];
        if quote != b'$' {
            // A quoted literal or identifier of the statement: copied as it is (a doubled
            // quote inside is two literals in a row, copied the same way).
            let end = tail[1..].find(quote as char).map_or(tail.len(), |i| i + 2);
            out.push_str(&tail[..end]);
            rest = &tail[end..];
            continue;
        }
        let digits = tail[1..].bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push('$');
            rest = &tail[1..];
            continue;
        }
        let number: usize = tail[1..=digits]
            .parse()
            .map_err(|_| unbound(&tail[..=digits]))?;
        let arg = number
            .checked_sub(1)
            .and_then(|i| args.get(i))
            .ok_or_else(|| unbound(&tail[..=digits]))?;
        literal(&mut out, arg)?;
        rest = &tail[1 + digits..];
    }
    out.push_str(rest);
    Ok(out)
}

fn unbound(placeholder: &str) -> DbErr {
    DbErr::Custom(format!(
        "task-dedup: the statement's {placeholder} has no parameter"
    ))
}

/// Writes `arg` as a typed constant.
fn literal(out: &mut String, arg: &Arg<'_>) -> Result<(), DbErr> {
    match arg {
        Arg::Uuid(v) => typed(out, v, "uuid"),
        Arg::Str(v) => text(out, v, "text")?,
        Arg::String(v) => text(out, v, "text")?,
        Arg::Json(v) => json(out, *v)?,
        Arg::I16(v) => typed(out, v, "int2"),
        Arg::I64(v) => typed(out, v, "int8"),
        Arg::OptI64(Some(v)) => typed(out, v, "int8"),
        Arg::OptI64(None) => out.push_str("NULL::int8"),
        Arg::Bool(v) => out.push_str(if *v { "TRUE" } else { "FALSE" }),
        Arg::Time(v) => typed(out, &time(v), "timestamptz"),
        Arg::Array(array) => {
            // Each element written as the scalar it is.
            let (elements, element_type): (Vec<Arg<'_>>, _) = match array {
                Array::Uuid(v) => (v.iter().map(|v| Arg::Uuid(*v)).collect(), "uuid"),
                Array::Str(v) => (v.iter().map(|v| Arg::Str(v)).collect(), "text"),
                Array::Json(v) => (v.iter().map(|v| Arg::Json(*v)).collect(), "jsonb"),
                Array::Bool(v) => (v.iter().map(|v| Arg::Bool(*v)).collect(), "bool"),
                Array::Time(v) => (v.iter().map(|v| Arg::Time(*v)).collect(), "timestamptz"),
                Array::I16(v) => (v.iter().map(|v| Arg::I16(*v)).collect(), "int2"),
                Array::I64(v) => (v.iter().map(|v| Arg::I64(*v)).collect(), "int8"),
            };
            out.push_str("ARRAY[");
            for (i, element) in elements.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                literal(out, element)?;
            }
            // An empty array's type comes from the cast alone.
            let _ = write!(out, "]::{element_type}[]");
        }
    }
    Ok(())
}

/// A value whose text form holds neither quote nor backslash (digits, a UUID, a time),
/// quoted and cast.
fn typed(out: &mut String, value: &impl std::fmt::Display, ty: &str) {
    let _ = write!(out, "'{value}'::{ty}");
}

fn time(value: &chrono::DateTime<chrono::Utc>) -> String {
    // Microseconds, as PostgreSQL keeps them (and sqlx's binary encoding sends).
    value.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// `value` as an escape string literal cast to `ty`.
fn text(out: &mut String, value: &str, ty: &str) -> Result<(), DbErr> {
    if value.contains('\0') {
        return Err(DbErr::Custom(
            "task-dedup: a NUL character in a text value (PostgreSQL text cannot hold it)"
                .to_owned(),
        ));
    }
    out.reserve(value.len() + 4 + ty.len());
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push_str("'::");
    out.push_str(ty);
    Ok(())
}

/// A JSON value as `jsonb` (serde_json escapes NUL as `\u0000` in JSON text, which
/// PostgreSQL's `jsonb` refuses as it refuses the same value bound), or `NULL::jsonb`.
fn json(out: &mut String, value: Option<&serde_json::Value>) -> Result<(), DbErr> {
    match value {
        Some(value) => text(out, &value.to_string(), "jsonb"),
        None => {
            out.push_str("NULL::jsonb");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn one(arg: Arg<'_>) -> String {
        render("$1", &[arg]).expect("renders")
    }

    #[test]
    fn text_is_an_escape_string_with_quotes_and_backslashes_doubled() {
        assert_eq!(one(Arg::Str("plain")), "E'plain'::text");
        assert_eq!(one(Arg::Str("it's")), "E'it''s'::text");
        assert_eq!(one(Arg::Str(r"a\b")), r"E'a\\b'::text");
        assert_eq!(one(Arg::Str(r"\'")), r"E'\\'''::text");
        assert_eq!(
            one(Arg::Str(r"'; DROP TABLE task_run; --")),
            r"E'''; DROP TABLE task_run; --'::text"
        );
        assert_eq!(one(Arg::Str("$$ $1 $a$ E'x'")), "E'$$ $1 $a$ E''x'''::text");
        assert_eq!(one(Arg::Str("café ✓ 𝄞")), "E'café ✓ 𝄞'::text");
        assert_eq!(one(Arg::Str("")), "E''::text");
    }

    #[test]
    fn nul_is_refused() {
        assert!(render("$1", &[Arg::Str("a\0b")]).is_err());
        assert!(render("$1", &[Arg::Array(Array::Str(vec!["ok", "\0"]))]).is_err());
    }

    #[test]
    fn every_scalar_is_a_typed_constant() {
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(
            one(Arg::Uuid(id)),
            "'01234567-89ab-cdef-0123-456789abcdef'::uuid"
        );
        assert_eq!(one(Arg::I64(-5)), "'-5'::int8");
        assert_eq!(one(Arg::I16(3)), "'3'::int2");
        assert_eq!(one(Arg::Bool(true)), "TRUE");
        assert_eq!(one(Arg::Json(None)), "NULL::jsonb");
        let payload = serde_json::json!({"a'b": "c\\d\"e", "n": [1, null]});
        assert_eq!(
            one(Arg::Json(Some(&payload))),
            r#"E'{"a''b":"c\\\\d\\"e","n":[1,null]}'::jsonb"#
        );
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 123_456_789).expect("a time");
        assert_eq!(
            one(Arg::Time(at)),
            "'2023-11-14T22:13:20.123456Z'::timestamptz"
        );
    }

    #[test]
    fn arrays_carry_their_element_type_even_when_empty() {
        assert_eq!(one(Arg::Array(Array::Uuid(vec![]))), "ARRAY[]::uuid[]");
        assert_eq!(
            one(Arg::Array(Array::Str(vec!["a", "'"]))),
            "ARRAY[E'a'::text,E''''::text]::text[]"
        );
        let json = serde_json::json!(1);
        assert_eq!(
            one(Arg::Array(Array::Json(vec![Some(&json), None]))),
            "ARRAY[E'1'::jsonb,NULL::jsonb]::jsonb[]"
        );
        assert_eq!(
            one(Arg::Array(Array::Bool(vec![true, false]))),
            "ARRAY[TRUE,FALSE]::bool[]"
        );
        assert_eq!(
            one(Arg::Array(Array::I16(vec![1]))),
            "ARRAY['1'::int2]::int2[]"
        );
        assert_eq!(
            one(Arg::Array(Array::I64(vec![-1]))),
            "ARRAY['-1'::int8]::int8[]"
        );
        let at = chrono::DateTime::from_timestamp(0, 0).expect("a time");
        assert_eq!(
            one(Arg::Array(Array::Time(vec![at]))),
            "ARRAY['1970-01-01T00:00:00.000000Z'::timestamptz]::timestamptz[]"
        );
    }

    #[test]
    fn placeholders_are_replaced_once_and_values_never_rescanned() {
        let sql = "SELECT $1, $2::text[], $10 FROM t WHERE a = '$1' AND \"$2\" = $1";
        let args: Vec<Arg<'_>> = (0..10)
            .map(|i| if i == 1 { Arg::Str("$1") } else { Arg::I64(i) })
            .collect();
        assert_eq!(
            render(sql, &args).expect("renders"),
            "SELECT '0'::int8, E'$1'::text::text[], '9'::int8 FROM t \
             WHERE a = '$1' AND \"$2\" = '0'::int8"
        );
    }

    #[test]
    fn a_placeholder_without_its_parameter_is_an_error() {
        assert!(render("SELECT $2", &[Arg::I64(1)]).is_err());
        assert!(render("SELECT $0", &[Arg::I64(1)]).is_err());
        assert_eq!(render("SELECT $", &[]).expect("no placeholder"), "SELECT $");
    }
}
