//! `GET /tasks/{id}`: one task, and the actions its status allows.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use task_dedup::{TaskAdmin, TaskStatus, task_run};
use uuid::Uuid;

use crate::context::Ctx;
use crate::error::Error;
use crate::format;
use crate::layout::{self, Flash, Nav, csrf_field};

#[derive(Debug, Default, Deserialize)]
struct Params {
    flash: Option<String>,
}

/// The task id of a path: a malformed one is a task that does not exist (404).
pub(crate) fn task_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, Error> {
    let Path(text) = path.map_err(|_| Error::NoSuchTask("in the path".to_owned()))?;
    Uuid::try_parse(&text).map_err(|_| Error::NoSuchTask(text))
}

/// `GET /tasks/{id}`.
pub(crate) async fn page(
    ctx: Ctx,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Response {
    let params: Params =
        serde_urlencoded::from_str(query.as_deref().unwrap_or_default()).unwrap_or_default();
    let page = async {
        let id = task_id(path)?;
        let task = ctx
            .app
            .db
            .get_task(id)
            .await?
            .ok_or_else(|| Error::NoSuchTask(id.to_string()))?;
        let title = format!("Task {}", task.id);
        let body = detail(&ctx, &task);
        Ok(ctx.html(
            StatusCode::OK,
            layout::page(
                &ctx,
                &title,
                Nav::Other,
                Flash::done(params.flash.as_deref()),
                false,
                body,
            ),
        ))
    };
    ctx.respond(page.await)
}

fn detail(ctx: &Ctx, task: &task_run::Model) -> Markup {
    let finished = matches!(
        task.status,
        TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Cancelled
    );
    html! {
        h1 { "Task " code { (task.id) } }
        dl.fields {
            dt { "Status" } dd #task-status data-status=(task.status.as_str()) {
                span class=(format!("status {}", task.status.as_str())) { (task.status.as_str()) }
            }
            dt { "Type" } dd #task-type {
                a href=(ctx.tasks_url(&[("type", &task.task_type)])) { (task.task_type) }
            }
            dt { "User" } dd #task-user {
                @if task.user_id.is_empty() { span.empty { "(none)" } }
                @else { a href=(ctx.tasks_url(&[("user", &task.user_id)])) { (task.user_id) } }
            }
            dt { "Key" } dd #task-key .key { (task.resource_key) }
            dt { "Scope" } dd #task-scope { (task.scope.as_str()) @if task.concurrent { ", concurrent" } }
            dt { "Priority" } dd #task-priority { (task.priority) }
            dt { "Attempts" } dd #task-attempts { (task.attempts) }
            dt { "Snoozes" } dd #task-snoozes { (task.snoozes) }
            dt { "Run at" } dd #task-run-at { (when(task.run_at)) }
            dt { "Created" } dd #task-created-at { (when(task.created_at)) }
            dt { "Updated" } dd #task-updated-at { (when(task.updated_at)) }
            dt { "Started" } dd #task-started-at { (maybe_when(task.started_at)) }
            dt { "Finished" } dd #task-finished-at { (maybe_when(task.finished_at)) }
            dt { "Lease owner" } dd #task-lease-owner {
                @if let Some(owner) = &task.lease_owner { (owner) } @else { span.empty { "—" } }
            }
            dt { "Lease expires" } dd #task-lease-expires-at { (maybe_when(task.lease_expires_at)) }
        }
        @if let Some(error) = &task.error {
            h2 { "Error" }
            pre #error { (error) }
        }
        h2 { "Payload" }
        pre #payload { (json(task.payload.as_ref())) }
        h2 { "Result" }
        pre #result { (json(task.result.as_ref())) }
        @if !ctx.app.read_only {
            (actions(ctx, task, finished))
        }
    }
}

/// The forms of the actions the task's status allows.
fn actions(ctx: &Ctx, task: &task_run::Model, finished: bool) -> Markup {
    let action = |name: &str| ctx.url(&format!("/tasks/{}/{name}", task.id));
    html! {
        section #actions {
            h2 { "Actions" }
            @if matches!(task.status, TaskStatus::Failed | TaskStatus::Cancelled) {
                form method="post" action=(action("retry")) {
                    (csrf_field(ctx))
                    button type="submit" #retry { "Retry" }
                    " Puts it back in the queue, due now, with a fresh attempt budget."
                }
            }
            @if task.status.is_active() {
                form method="post" action=(action("cancel")) {
                    (csrf_field(ctx))
                    label { "Reason " input name="reason" placeholder="cancelled from the dashboard" maxlength="1000"; }
                    " "
                    button type="submit" #cancel { "Cancel" }
                }
            }
            @if finished {
                form method="post" action=(action("delete")) {
                    (csrf_field(ctx))
                    button type="submit" #delete .danger { "Delete" }
                    " Removes the task for good."
                }
            }
        }
    }
}

fn json(value: Option<&serde_json::Value>) -> String {
    value.map_or_else(|| "null".to_owned(), format::json)
}

fn when(at: DateTime<Utc>) -> Markup {
    html! { time datetime=(format::rfc3339(at)) { (format::time(at)) } }
}

fn maybe_when(at: Option<DateTime<Utc>>) -> Markup {
    match at {
        Some(at) => when(at),
        None => html! { span.empty { "—" } },
    }
}
