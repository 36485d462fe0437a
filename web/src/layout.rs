//! The frame of every page (navigation, flash message, refresh script), the error page,
//! the style sheet, and the parts forms share.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::context::Ctx;
use crate::error::Error;

/// The style sheet: one file, no build step.
const STYLE: &str = include_str!("style.css");

/// `GET /style.css`.
pub(crate) async fn style() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/css; charset=utf-8"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ),
        ],
        STYLE,
    )
        .into_response()
}

/// A message at the top of a page: what an action did, or why it was refused.
pub(crate) struct Flash {
    /// The message (may hold a link).
    pub message: Markup,
    /// Whether it is a refusal (`class="error"`).
    pub error: bool,
}

impl Flash {
    /// The message after a successful action, from its `flash` parameter (a fixed word:
    /// the page never echoes text from the URL).
    pub fn done(code: Option<&str>) -> Option<Flash> {
        let message = match code? {
            "retried" => "Task retried: it is queued again.",
            "cancelled" => "Task cancelled.",
            "deleted" => "Task deleted.",
            "paused" => "Task type paused: workers claim none of its tasks until it is resumed.",
            "resumed" => "Task type resumed.",
            "already-paused" => "That task type was paused already.",
            "not-paused" => "That task type was not paused.",
            "limited" => "Limits set: every worker enforces them from its next claim on.",
            "limits-cleared" => "Limits cleared.",
            "no-limits" => "That task type had no limits.",
            "user-limited" => {
                "Limit per user across all types set: every worker enforces it from its next claim on."
            }
            "user-limit-cleared" => "Limit per user across all types cleared.",
            "no-user-limit" => "No limit per user across all types was set.",
            _ => return None,
        };
        Some(Flash {
            message: html! { (message) },
            error: false,
        })
    }
}

/// Which page the navigation marks as current.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Tasks,
    Other,
}

/// A whole page: `title`, `body`, the flash message, and the refresh script when
/// `refresh` (the overview and the list) and the dashboard refreshes.
pub(crate) fn page(
    ctx: &Ctx,
    title: &str,
    nav: Nav,
    flash: Option<Flash>,
    refresh: bool,
    body: Markup,
) -> Markup {
    let refresh_ms = ctx
        .app
        .refresh
        .filter(|_| refresh)
        .map(|every| every.as_millis());
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · task-dedup" }
                link rel="stylesheet" href=(ctx.url("/style.css"));
            }
            body {
                header {
                    span.brand { "task-dedup" }
                    nav {
                        a #nav-overview href=(ctx.home())
                            aria-current=[(nav == Nav::Overview).then_some("page")] { "Overview" }
                        a #nav-tasks href=(ctx.url("/tasks"))
                            aria-current=[(nav == Nav::Tasks).then_some("page")] { "Tasks" }
                    }
                    @if ctx.app.read_only {
                        span.badge #read-only { "read-only" }
                    }
                }
                main {
                    @if let Some(flash) = flash {
                        p #flash .error[flash.error] role=(if flash.error { "alert" } else { "status" }) {
                            (flash.message)
                        }
                    }
                    (body)
                }
                @if let Some(ms) = refresh_ms {
                    script nonce=(ctx.nonce) { (PreEscaped(refresh_script(ms))) }
                }
            }
        }
    }
}

/// Reloads the page every `ms` while it is visible and no form field has focus (the
/// flash message of an action is not shown again).
fn refresh_script(ms: u128) -> String {
    format!(
        "setInterval(function () {{\
           if (document.visibilityState !== 'visible') return;\
           var f = document.activeElement;\
           if (f && /^(INPUT|SELECT|TEXTAREA)$/.test(f.tagName)) return;\
           var u = new URL(location.href);\
           u.searchParams.delete('flash');\
           location.replace(u.toString());\
         }}, {ms});"
    )
}

/// The page of an error: the message as a refusal, and where to go from there.
pub(crate) fn error_page(ctx: &Ctx, error: &Error) -> Markup {
    let message = match error {
        Error::KeyHeld { id, holder } => html! {
            "Task " a href=(ctx.task_url(id)) { (id) } " was not retried: its key is held by task "
            a #holder href=(ctx.task_url(holder.id)) { (holder.id) }
            " (" (holder.status.as_str()) "). Cancel it or let it finish, then retry."
        },
        Error::WrongState { id, .. } => html! {
            (error.to_string()) ". " a href=(ctx.task_url(id)) { "Back to the task" }
        },
        Error::Database(_) => {
            html! { "The database failed; the server's log says why. Try again in a moment." }
        }
        other => html! { (other.to_string()) },
    };
    let title = error.status().canonical_reason().unwrap_or("Error");
    page(
        ctx,
        title,
        Nav::Other,
        Some(Flash {
            message,
            error: true,
        }),
        false,
        html! {
            h1 { (error.status().as_u16()) " " (title) }
            p { a href=(ctx.home()) { "Overview" } " · " a href=(ctx.url("/tasks")) { "Tasks" } }
        },
    )
}

/// The hidden CSRF field of an action form.
pub(crate) fn csrf_field(ctx: &Ctx) -> Markup {
    html! { input type="hidden" name="csrf_token" value=(ctx.csrf); }
}
