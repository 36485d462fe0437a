//! The actions: `POST /tasks/{id}/{retry|cancel|delete}`,
//! `POST /types/{type}/{pause|resume}` and `POST /limits` (set or clear a type's limits,
//! or the limit per user across all types). Each is refused (403) in read-only mode and
//! without a valid CSRF token, before anything else is looked at; a success answers
//! `303 See Other` to the page that shows its outcome.

use axum::body::Bytes;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::response::Response;
use serde::Deserialize;
use std::time::Duration;

use task_dedup::{TaskAdmin, TaskLifecycle, TypeLimits};

use crate::context::Ctx;
use crate::error::Error;
use crate::format;
use crate::task::task_id;

/// The reason a cancel records when the form gives none.
const DEFAULT_REASON: &str = "cancelled from the dashboard";

/// An action form's fields.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Form {
    csrf_token: Option<String>,
    reason: Option<String>,
    // The limits form's fields (`POST /limits`): empty means not set.
    task_type: Option<String>,
    max_running: Option<String>,
    per_user: Option<String>,
    rate_starts: Option<String>,
    rate_per_seconds: Option<String>,
    fair: Option<String>,
    /// The limit per user across all types (`limits_action=set-user`).
    user_max_running: Option<String>,
    /// `clear` to remove the type's limits, `set-user`/`clear-user` for the limit per
    /// user across all types, else set the type's.
    limits_action: Option<String>,
}

/// The form, once the request may act (read-only mode, CSRF).
fn allowed(ctx: &Ctx, body: &Bytes) -> Result<Form, Error> {
    // A body that does not parse has no token: the CSRF check refuses it.
    let form: Form = serde_urlencoded::from_bytes(body).unwrap_or_default();
    ctx.allow_action(form.csrf_token.as_deref())?;
    Ok(form)
}

/// `POST /tasks/{id}/{action}`.
pub(crate) async fn task(
    ctx: Ctx,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Bytes,
) -> Response {
    let outcome = async {
        let form = allowed(&ctx, &body)?;
        let Path((id, action)) = path.map_err(|_| Error::NoSuchPage)?;
        let id = task_id(Ok(Path(id)))?;
        let db = &ctx.app.db;
        match action.as_str() {
            "retry" => {
                db.retry_task(id).await?;
                Ok(ctx.see_other(&format!("{}?flash=retried", ctx.task_url(id))))
            }
            "cancel" => {
                let reason = form
                    .reason
                    .as_deref()
                    .map(str::trim)
                    .filter(|reason| !reason.is_empty())
                    .unwrap_or(DEFAULT_REASON);
                db.cancel_task(id, reason).await?;
                Ok(ctx.see_other(&format!("{}?flash=cancelled", ctx.task_url(id))))
            }
            "delete" => {
                db.delete_task(id).await?;
                Ok(ctx.see_other(&ctx.tasks_url(&[("flash", "deleted")])))
            }
            _ => Err(Error::NoSuchPage),
        }
    };
    ctx.respond(outcome.await)
}

/// `POST /types/{type}/{action}`.
pub(crate) async fn task_type(
    ctx: Ctx,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Bytes,
) -> Response {
    let outcome = async {
        allowed(&ctx, &body)?;
        // A type that is not valid UTF-8 once decoded cannot exist.
        let Path((task_type, action)) = path.map_err(|_| {
            Error::BadRequest("the task type in the path is not valid UTF-8".to_owned())
        })?;
        let db = &ctx.app.db;
        let flash = match action.as_str() {
            "pause" if db.pause(&task_type).await? => "paused",
            "pause" => "already-paused",
            "resume" if db.resume(&task_type).await? => "resumed",
            "resume" => "not-paused",
            _ => return Err(Error::NoSuchPage),
        };
        Ok(ctx.see_other(&format!(
            "{}?{}",
            ctx.home(),
            format::query(&[("flash", flash)])
        )))
    };
    ctx.respond(outcome.await)
}

/// `POST /limits`: sets the limits the form gives for its `task_type`, replacing any it
/// had, or clears them (`limits_action=clear`).
pub(crate) async fn limits(ctx: Ctx, body: Bytes) -> Response {
    let outcome = async {
        let form = allowed(&ctx, &body)?;
        let task_type = form.task_type.as_deref().map(str::trim).unwrap_or_default();
        let db = &ctx.app.db;
        let flash = match form.limits_action.as_deref() {
            Some("clear") => match db.clear_limits(task_type).await? {
                true => "limits-cleared",
                false => "no-limits",
            },
            Some("set-user") => {
                let n = number("user_max_running", &form.user_max_running)?
                    .ok_or_else(|| Error::BadRequest("user_max_running: required".to_owned()))?;
                db.set_user_limit(n).await?;
                "user-limited"
            }
            Some("clear-user") => match db.clear_user_limit().await? {
                true => "user-limit-cleared",
                false => "no-user-limit",
            },
            _ => {
                db.set_limits(task_type, &limits_of(&form)?).await?;
                "limited"
            }
        };
        Ok(ctx.see_other(&format!(
            "{}?{}",
            ctx.home(),
            format::query(&[("flash", flash)])
        )))
    };
    ctx.respond(outcome.await)
}

/// A whole number field of the limits forms (empty: not set); the library checks its
/// range.
fn number<T: std::str::FromStr>(name: &str, field: &Option<String>) -> Result<Option<T>, Error> {
    match field.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| Error::BadRequest(format!("{name}: not a whole number: {text:?}"))),
    }
}

/// The limits the form sets; the library checks their ranges.
fn limits_of(form: &Form) -> Result<TypeLimits, Error> {
    let mut limits = TypeLimits::new();
    if let Some(n) = number("max_running", &form.max_running)? {
        limits = limits.max_running(n);
    }
    if let Some(n) = number("per_user", &form.per_user)? {
        limits = limits.max_running_per_user(n);
    }
    match (
        number::<u32>("rate_starts", &form.rate_starts)?,
        number::<u64>("rate_per_seconds", &form.rate_per_seconds)?,
    ) {
        (None, None) => {}
        (Some(starts), Some(per)) => limits = limits.rate(starts, Duration::from_secs(per)),
        _ => {
            return Err(Error::BadRequest(
                "a rate needs both its starts and its window".to_owned(),
            ));
        }
    }
    if form.fair.is_some() {
        limits = limits.fair_between_users();
    }
    Ok(limits)
}
