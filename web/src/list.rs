//! `GET /tasks`: the task list, with the filters of [`TaskAdmin::list_tasks`](task_dedup::TaskAdmin::list_tasks), in keyset
//! pages.

use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use task_dedup::{Cursor, ListTasks, Order, Page, TaskAdmin, TaskFilter, TaskStatus};

use crate::context::Ctx;
use crate::error::Error;
use crate::format;
use crate::layout::{self, Flash, Nav};
use crate::overview::STATUSES;

/// The list's parameters as the filter form sends them: an empty value is no filter.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Params {
    status: String,
    #[serde(rename = "type")]
    task_type: String,
    user: String,
    key_prefix: String,
    created_after: String,
    created_before: String,
    order: String,
    after: String,
    limit: String,
    flash: Option<String>,
}

impl Params {
    /// The parameters a link to another page of the same list keeps.
    fn filters(&self) -> [(&'static str, &str); 8] {
        [
            ("status", &self.status),
            ("type", &self.task_type),
            ("user", &self.user),
            ("key_prefix", &self.key_prefix),
            ("created_after", &self.created_after),
            ("created_before", &self.created_before),
            ("order", &self.order),
            ("limit", &self.limit),
        ]
    }

    /// The query they make, checked as far as the dashboard can (the admin API checks
    /// the rest before any SQL).
    fn query(&self) -> Result<ListTasks, Error> {
        let mut filter = TaskFilter::new();
        if !self.status.is_empty() {
            let status: TaskStatus = self
                .status
                .parse()
                .map_err(|_| bad(format!("unknown status {:?}", self.status)))?;
            filter = filter.status(status);
        }
        if !self.task_type.is_empty() {
            filter = filter.task_type(&self.task_type);
        }
        if !self.user.is_empty() {
            filter = filter.user_id(&self.user);
        }
        if !self.key_prefix.is_empty() {
            filter = filter.key_prefix(&self.key_prefix);
        }
        if let Some(from) = time("created_after", &self.created_after)? {
            filter = filter.created_from(from);
        }
        if let Some(before) = time("created_before", &self.created_before)? {
            filter = filter.created_before(before);
        }
        let order = match self.order.as_str() {
            "" | "newest" => Order::NewestFirst,
            "oldest" => Order::OldestFirst,
            other => {
                return Err(bad(format!(
                    "order must be newest or oldest, not {other:?}"
                )));
            }
        };
        let mut query = ListTasks::new(filter).order(order);
        if !self.limit.is_empty() {
            let limit = self
                .limit
                .parse()
                .map_err(|_| bad(format!("limit must be a number, not {:?}", self.limit)))?;
            query = query.limit(limit);
        }
        if !self.after.is_empty() {
            let cursor: Cursor = self.after.parse()?;
            query = query.after(Some(cursor));
        }
        Ok(query)
    }
}

fn bad(message: String) -> Error {
    Error::BadRequest(message)
}

/// A time filter: RFC 3339, or a date and time without a zone (what a browser's
/// `datetime-local` field sends), taken as UTC.
fn time(name: &str, text: &str) -> Result<Option<DateTime<Utc>>, Error> {
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(Some(at.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|form| NaiveDateTime::parse_from_str(text, form).ok())
        .or_else(|| {
            NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .ok()
                .and_then(|day| day.and_hms_opt(0, 0, 0))
        })
        .map(|at| Some(at.and_utc()))
        .ok_or_else(|| {
            bad(format!(
                "{name} must be a time in RFC 3339 (2026-12-02T15:00:00Z), not {text:?}"
            ))
        })
}

/// `GET /tasks`.
pub(crate) async fn page(ctx: Ctx, RawQuery(query): RawQuery) -> Response {
    let params: Params = match serde_urlencoded::from_str(query.as_deref().unwrap_or_default()) {
        Ok(params) => params,
        Err(err) => {
            let params = Params::default();
            return render(&ctx, &params, Err(bad(format!("bad parameters: {err}"))));
        }
    };
    let listed = match params.query() {
        Ok(query) => ctx.app.db.list_tasks(&query).await.map_err(Error::from),
        Err(err) => Err(err),
    };
    render(&ctx, &params, listed)
}

/// The list page: the filter form, and the page of tasks or why there is none.
fn render(ctx: &Ctx, params: &Params, listed: Result<Page, Error>) -> Response {
    let (status, flash, table) = match listed {
        Ok(page) => (
            StatusCode::OK,
            Flash::done(params.flash.as_deref()),
            table(ctx, params, &page),
        ),
        Err(err @ Error::Database(_)) => return ctx.error(err),
        Err(err) => (
            err.status(),
            Some(Flash {
                message: html! { (err.to_string()) },
                error: true,
            }),
            html! {},
        ),
    };
    let body = html! {
        h1 { "Tasks" }
        (filters(ctx, params))
        (table)
    };
    ctx.html(
        status,
        layout::page(ctx, "Tasks", Nav::Tasks, flash, true, body),
    )
}

fn filters(ctx: &Ctx, params: &Params) -> Markup {
    html! {
        form #filters method="get" action=(ctx.url("/tasks")) {
            label {
                "Status "
                select name="status" {
                    option value="" selected[params.status.is_empty()] { "any" }
                    @for status in STATUSES {
                        option value=(status.as_str()) selected[params.status == status.as_str()] { (status.as_str()) }
                    }
                }
            }
            label { "Type " input name="type" value=(params.task_type) maxlength="64"; }
            label { "User " input name="user" value=(params.user) maxlength="64"; }
            label { "Key prefix " input name="key_prefix" value=(params.key_prefix) maxlength="255"; }
            label {
                "Created from "
                input name="created_after" value=(params.created_after) placeholder="2026-12-02T00:00:00Z";
            }
            label {
                "Created before "
                input name="created_before" value=(params.created_before) placeholder="2026-12-03T00:00:00Z";
            }
            label {
                "Order "
                select name="order" {
                    option value="newest" selected[params.order != "oldest"] { "newest first" }
                    option value="oldest" selected[params.order == "oldest"] { "oldest first" }
                }
            }
            @if !params.limit.is_empty() {
                input type="hidden" name="limit" value=(params.limit);
            }
            button type="submit" #apply-filters { "Apply" }
            " "
            a href=(ctx.url("/tasks")) { "Clear" }
        }
    }
}

fn table(ctx: &Ctx, params: &Params, page: &Page) -> Markup {
    let next = page.next.map(|cursor| {
        let cursor = cursor.to_string();
        let mut pairs = params.filters().to_vec();
        pairs.push(("after", &cursor));
        ctx.tasks_url(&pairs)
    });
    html! {
        table #tasks {
            thead {
                tr {
                    th scope="col" { "Task" }
                    th scope="col" { "Type" }
                    th scope="col" { "User" }
                    th scope="col" { "Key" }
                    th scope="col" { "Status" }
                    th scope="col" .num { "Attempts" }
                    th scope="col" { "Created" }
                    th scope="col" { "Run at" }
                }
            }
            tbody {
                @for task in &page.tasks {
                    tr data-task-id=(task.id) data-status=(task.status.as_str()) {
                        td { a.task-link href=(ctx.task_url(task.id)) { code { (task.id) } } }
                        td { (task.task_type) }
                        td { (task.user_id) }
                        td.key { (task.resource_key) }
                        td {
                            span class=(format!("status {}", task.status.as_str())) { (task.status.as_str()) }
                            // Back in the queue by its handler's choice, not a failure.
                            @if task.status == TaskStatus::Queued && task.snoozes > 0 {
                                " " span.snoozed title=(format!("snoozes: {}", task.snoozes)) { "snoozed" }
                            }
                        }
                        td.num { (task.attempts) }
                        td { time datetime=(format::rfc3339(task.created_at)) { (format::time(task.created_at)) } }
                        td { time datetime=(format::rfc3339(task.run_at)) { (format::time(task.run_at)) } }
                    }
                }
                @if page.tasks.is_empty() {
                    tr { td colspan="8" .empty { "No task matches." } }
                }
            }
        }
        nav.pages {
            @if !params.after.is_empty() {
                a #first-page href=(ctx.tasks_url(&params.filters())) { "First page" }
            }
            @if let Some(next) = next {
                a #next-page href=(next) { "Next page" }
            }
        }
    }
}
