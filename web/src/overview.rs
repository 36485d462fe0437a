//! `GET /`: tasks per type and status, the throughput of the last hour, the oldest queued
//! task per type, the paused types, the limits per type (and the form that sets them).

use std::collections::BTreeMap;

use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use task_dedup::{
    DEFAULT_COUNT_LIMIT, LimitedType, MinuteCounts, OldestQueued, TaskAdmin, TaskLifecycle,
    TaskStatus, Throughput, UserLimit,
};

use crate::context::Ctx;
use crate::error::Error;
use crate::format;
use crate::layout::{self, Flash, Nav, csrf_field};

/// The statuses as columns, in a task's order of life.
pub(crate) const STATUSES: [TaskStatus; 5] = [
    TaskStatus::Queued,
    TaskStatus::Running,
    TaskStatus::Succeeded,
    TaskStatus::Failed,
    TaskStatus::Cancelled,
];

/// The overview's parameters: the outcome of the action that led here.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    flash: Option<String>,
}

/// `GET /`.
pub(crate) async fn page(ctx: Ctx, RawQuery(query): RawQuery) -> Response {
    // Only a flash word is read here: a query that does not parse shows no message.
    let params: Params =
        serde_urlencoded::from_str(query.as_deref().unwrap_or_default()).unwrap_or_default();
    ctx.respond(overview(&ctx, Flash::done(params.flash.as_deref())).await)
}

/// One row of the counts table: a task type.
#[derive(Default)]
struct TypeRow<'a> {
    /// Per status of [`STATUSES`]: the count, and whether it is a lower bound (the
    /// count stopped at [`DEFAULT_COUNT_LIMIT`]).
    counts: [(u64, bool); 5],
    oldest: Option<&'a OldestQueued>,
    paused_at: Option<DateTime<Utc>>,
}

async fn overview(ctx: &Ctx, flash: Option<Flash>) -> Result<Response, Error> {
    let db = &ctx.app.db;
    // Capped: a full count reads the whole table (354 ms on 1,000,000 tasks), the capped
    // one at most the limit's index entries per type and status.
    let counts = db.counts_up_to(DEFAULT_COUNT_LIMIT).await?;
    let throughput = db.throughput().await?;
    let oldest = db.oldest_queued().await?;
    let paused = db.paused().await?;
    let limits = db.limits().await?;
    let user_limit = db.user_limit().await?;

    let mut types: BTreeMap<&str, TypeRow<'_>> = BTreeMap::new();
    for count in &counts {
        let row = types.entry(&count.task_type).or_default();
        if let Some(i) = STATUSES.iter().position(|s| *s == count.status) {
            row.counts[i] = (count.count, count.at_least);
        }
    }
    for queued in &oldest {
        types.entry(&queued.task_type).or_default().oldest = Some(queued);
    }
    for paused in &paused {
        types.entry(&paused.task_type).or_default().paused_at = Some(paused.paused_at);
    }

    let body = html! {
        h1 { "Overview" }
        section #counts-section {
            h2 { "Tasks by type and status" }
            p.note {
                "Counts stop at " (format::count(DEFAULT_COUNT_LIMIT)) " per type and status (shown as "
                (format::count(DEFAULT_COUNT_LIMIT)) "+), so that the page stays fast on a large table."
            }
            @if types.is_empty() {
                p.empty { "No tasks yet." }
            }
            table #counts {
                thead {
                    tr {
                        th scope="col" { "Type" }
                        @for status in STATUSES { th scope="col" .num { (status.as_str()) } }
                        th scope="col" { "Oldest queued" }
                        @if !ctx.app.read_only { th scope="col" { span.visually-hidden { "Actions" } } }
                    }
                }
                tbody {
                    @for (task_type, row) in &types {
                        (type_row(ctx, task_type, row))
                    }
                }
            }
        }
        section #throughput-section {
            h2 { "Throughput, last hour" }
            (chart(&throughput))
        }
        section #oldest-section {
            h2 { "Oldest queued task per type" }
            table #oldest-queued {
                thead { tr { th scope="col" { "Type" } th scope="col" { "Waiting for" } th scope="col" { "Created" } } }
                tbody {
                    @for queued in &oldest {
                        tr data-task-type=(queued.task_type) {
                            td { (queued.task_type) }
                            td.num { (format::age(queued.age)) }
                            td { time datetime=(format::rfc3339(queued.created_at)) { (format::time(queued.created_at)) } }
                        }
                    }
                    @if oldest.is_empty() {
                        tr { td colspan="3" .empty { "No queued tasks." } }
                    }
                }
            }
        }
        section #paused-types {
            h2 { "Paused types" }
            @if paused.is_empty() {
                p.empty { "No type is paused." }
            } @else {
                ul {
                    @for paused in &paused {
                        li data-task-type=(paused.task_type) {
                            strong { (paused.task_type) } ", since "
                            time datetime=(format::rfc3339(paused.paused_at)) { (format::time(paused.paused_at)) }
                        }
                    }
                }
            }
        }
        (limits_section(ctx, &limits, user_limit.as_ref()))
    };
    Ok(ctx.html(
        StatusCode::OK,
        layout::page(ctx, "Overview", Nav::Overview, flash, true, body),
    ))
}

fn type_row(ctx: &Ctx, task_type: &str, row: &TypeRow<'_>) -> Markup {
    let paused = row.paused_at.is_some();
    let (action, label) = if paused {
        ("resume", "Resume")
    } else {
        ("pause", "Pause")
    };
    html! {
        tr data-task-type=(task_type) .paused[paused] {
            th scope="row" {
                a href=(ctx.tasks_url(&[("type", task_type)])) { (task_type) }
                @if paused { " " span.badge { "paused" } }
            }
            @for (status, (n, lower_bound)) in STATUSES.iter().zip(row.counts) {
                td.num data-status=(status.as_str()) {
                    @if n == 0 {
                        "0"
                    } @else {
                        a href=(ctx.tasks_url(&[("type", task_type), ("status", status.as_str())])) {
                            @if lower_bound {
                                span title=(format!("at least {}: counts stop there", format::count(n))) {
                                    (format::count(n)) "+"
                                }
                            } @else {
                                (format::count(n))
                            }
                        }
                    }
                }
            }
            td.num { @if let Some(oldest) = row.oldest { (format::age(oldest.age)) } @else { "—" } }
            @if !ctx.app.read_only {
                td {
                    form method="post" action=(ctx.url(&format!("/types/{}/{action}", format::segment(task_type)))) {
                        (csrf_field(ctx))
                        button type="submit" data-action=(action) data-task-type=(task_type) { (label) }
                    }
                }
            }
        }
    }
}

/// The limit per user across all types (with the users at it now) and the limited
/// types: their limits, the running tasks against them (the slots in use), the starts
/// in the rate's window; a clear button each and forms that set them.
fn limits_section(ctx: &Ctx, limits: &[LimitedType], user_limit: Option<&UserLimit>) -> Markup {
    let count = |n: Option<u32>| n.map_or_else(|| "—".to_owned(), |n| format::count(u64::from(n)));
    html! {
        section #limits-section {
            h2 { "Limits" }
            @if let Some(limit) = user_limit {
                p #user-limit {
                    "At most " span data-limit="user-max" { (format::count(u64::from(limit.max_running))) }
                    " running per user across all types: "
                    span data-limit="users-running" { (format::count(limit.users_running)) } " users running, "
                    span data-limit="users-at-limit" { (format::count(limit.users_at_limit)) } " at the limit."
                }
                @if !ctx.app.read_only {
                    form #clear-user-limit method="post" action=(ctx.url("/limits")) {
                        (csrf_field(ctx))
                        button type="submit" name="limits_action" value="clear-user" data-action="clear-user-limit" { "Clear the limit per user" }
                    }
                }
            }
            @if limits.is_empty() {
                p.empty { "No type is limited." }
            } @else {
                table #limits {
                    thead {
                        tr {
                            th scope="col" { "Type" }
                            th scope="col" .num { "Running" }
                            th scope="col" .num { "Per user" }
                            th scope="col" { "Rate" }
                            th scope="col" { "Users in turn" }
                            @if !ctx.app.read_only { th scope="col" { span.visually-hidden { "Actions" } } }
                        }
                    }
                    tbody {
                        @for limit in limits {
                            tr data-task-type=(limit.task_type) {
                                th scope="row" { (limit.task_type) }
                                td.num data-limit="running" {
                                    (format::count(limit.running))
                                    @if let Some(max) = limit.limits.max_running { " / " (format::count(u64::from(max))) }
                                }
                                td.num data-limit="per-user" { (count(limit.limits.max_running_per_user)) }
                                td data-limit="rate" {
                                    @if let Some(rate) = limit.limits.rate {
                                        (format::count(u64::from(rate.starts))) " per " (format::age(rate.per))
                                        " (" (format::count(limit.starts_in_window)) " used)"
                                    } @else { "—" }
                                }
                                td data-limit="fair" { @if limit.limits.fair { "yes" } @else { "no" } }
                                @if !ctx.app.read_only {
                                    td {
                                        form method="post" action=(ctx.url("/limits")) {
                                            (csrf_field(ctx))
                                            input type="hidden" name="task_type" value=(limit.task_type);
                                            button type="submit" name="limits_action" value="clear" data-action="clear-limits" { "Clear" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if !ctx.app.read_only {
                form #set-limits method="post" action=(ctx.url("/limits")) {
                    (csrf_field(ctx))
                    label { "Type " input type="text" name="task_type" required; }
                    label { "Running at most " input type="number" name="max_running" min="1"; }
                    label { "Per user " input type="number" name="per_user" min="1"; }
                    label { "Starts " input type="number" name="rate_starts" min="1"; }
                    label { "per seconds " input type="number" name="rate_per_seconds" min="1"; }
                    label { input type="checkbox" name="fair" value="on"; " users in turn" }
                    button type="submit" name="limits_action" value="set" data-action="set-limits" { "Set limits" }
                }
                form #set-user-limit method="post" action=(ctx.url("/limits")) {
                    (csrf_field(ctx))
                    label { "Per user, all types, at most " input type="number" name="user_max_running" min="1" required; }
                    button type="submit" name="limits_action" value="set-user" data-action="set-user-limit" { "Set" }
                }
            }
        }
    }
}

/// Chart geometry: the plot's size in SVG units.
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 160.0;
const LEFT: f64 = 40.0;

/// One line of the chart: what it counts in a minute.
type Series = fn(&MinuteCounts) -> u64;

/// The last hour as three lines (created, succeeded, failed per minute), drawn as SVG.
fn chart(throughput: &Throughput) -> Markup {
    let minutes = &throughput.minutes;
    let max = minutes
        .iter()
        .map(|m| m.created.max(m.succeeded).max(m.failed))
        .max()
        .unwrap_or(0)
        .max(1);
    let step = (WIDTH - LEFT) / (minutes.len().max(2) - 1) as f64;
    let points = |value: Series| -> String {
        minutes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let x = LEFT + i as f64 * step;
                let y = HEIGHT - (value(m) as f64 / max as f64) * (HEIGHT - 10.0);
                format!("{x:.1},{y:.1}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let total =
        |value: fn(&task_dedup::MinuteCounts) -> u64| -> u64 { minutes.iter().map(value).sum() };
    let series: [(&str, Series); 3] = [
        ("created", |m| m.created),
        ("succeeded", |m| m.succeeded),
        ("failed", |m| m.failed),
    ];
    html! {
        svg #throughput xmlns="http://www.w3.org/2000/svg" role="img"
            viewBox=(format!("0 0 {WIDTH} {}", HEIGHT + 20.0))
            aria-labelledby="throughput-title" {
            title #throughput-title { "Tasks created, succeeded and failed per minute over the last hour" }
            line.axis x1=(LEFT) y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
            line.axis x1=(LEFT) y1="10" x2=(LEFT) y2=(HEIGHT) {}
            text.label x=(LEFT - 4.0) y="14" text-anchor="end" { (format::count(max)) }
            text.label x=(LEFT - 4.0) y=(HEIGHT) text-anchor="end" { "0" }
            text.label x=(LEFT) y=(HEIGHT + 16.0) { "60 min ago" }
            text.label x=(WIDTH) y=(HEIGHT + 16.0) text-anchor="end" { "now" }
            @for (name, value) in series {
                polyline class=(format!("series {name}")) data-series=(name) points=(points(value)) {}
            }
        }
        ul.legend {
            @for (name, value) in series {
                li class=(name) { span.swatch {} (name) ": " (format::count(total(value))) }
            }
        }
    }
}
