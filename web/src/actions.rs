//! The actions: `POST /tasks/{id}/{retry|cancel|delete}` and
//! `POST /types/{type}/{pause|resume}`. Each is refused (403) in read-only mode and
//! without a valid CSRF token, before anything else is looked at; a success answers
//! `303 See Other` to the page that shows its outcome.

use axum::body::Bytes;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::response::Response;
use serde::Deserialize;
use task_dedup::{TaskAdmin, TaskWorker};

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
