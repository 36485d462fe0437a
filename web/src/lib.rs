//! A dashboard for [task-dedup](https://docs.rs/task-dedup): an [`axum::Router`] your
//! application nests under the prefix it chooses, with server-rendered HTML and CSS and
//! no front-end build step.
//!
//! - **Overview**: tasks per type and status (counted up to
//!   [`DEFAULT_COUNT_LIMIT`](task_dedup::DEFAULT_COUNT_LIMIT), then shown as "1,000+", so
//!   that the page stays fast on a large table), a throughput chart of the last hour (SVG),
//!   the oldest queued task per type, the paused types, pause and resume per type, the
//!   limits per type (tasks running against them, starts in the rate's window), set
//!   and cleared.
//! - **Tasks**: the list with the filters of [`TaskAdmin::list_tasks`](task_dedup::TaskAdmin::list_tasks) (status, type,
//!   user, key prefix, creation time, order) in keyset pages.
//! - **Task**: one task, its payload and result pretty-printed, its error, attempts,
//!   timestamps, lease, scope, `run_at` and priority; retry, cancel and delete.
//!
//! Every page works with JavaScript off (plain links and forms); with it on, the overview
//! and the list reload themselves every [`refresh_interval`](Dashboard::refresh_interval)
//! while the tab is visible and no form field has focus.
//!
//! ```no_run
//! use axum::Router;
//! use task_dedup_web::Dashboard;
//!
//! # async fn app(db: sea_orm::DatabaseConnection) {
//! // Your routes, and the dashboard under /admin (behind your authentication layer).
//! let app: Router = Router::new().nest("/admin", Dashboard::new(db).router());
//! # let _ = app;
//! # }
//! ```
//!
//! Nest it rather than merge it, at a static path (its links are built from the path it
//! is nested at, as axum's `NestedPath` gives it): the router has a fallback of its own
//! (the dashboard's 404 page), and axum refuses to merge two routers that both have one. A router nested
//! at `/admin` answers `/admin`, not `/admin/` (axum's rule); redirect the latter in
//! your application if your users type it.
//!
//! # Authentication is the application's
//!
//! The dashboard shows payloads and can cancel and delete tasks: put it behind the
//! authentication your application already has, as a tower layer on the router it
//! returns (`Dashboard::new(db).router().layer(...)`). The `http_api` example of the
//! repository uses basic authentication. [`Dashboard::read_only`] hides and refuses every
//! action, for operators who may look but not touch.
//!
//! # Cross-site request forgery
//!
//! Every action is a `POST` form, checked twice before anything runs:
//!
//! 1. **Fetch metadata.** A request whose `Sec-Fetch-Site` header is neither
//!    `same-origin` nor `none` is refused; without that header (an older browser), an
//!    `Origin` header that does not name the request's `Host` is refused.
//! 2. **A double-submit token.** The pages set a random 256-bit token in a cookie
//!    (`task_dedup_csrf`, `HttpOnly`, `SameSite=Strict`, scoped to the dashboard's path)
//!    and put the same token in a hidden field of each form; an action whose field does
//!    not equal the cookie is refused (403, "CSRF"). The cookie is not marked `Secure`:
//!    behind a proxy that terminates TLS the dashboard cannot tell; it carries no
//!    credential, only the token an attacker would have to read.
//!
//! Why this design rather than a signed token: it needs no secret to configure, share
//! between instances or rotate, and no server-side session, so any number of instances
//! behind a load balancer accept each other's forms. Another site can neither read the
//! cookie to copy it into its form nor make the browser send it cross-site
//! (`SameSite=Strict`); the weakness of a plain double-submit cookie — a sibling
//! subdomain that writes the cookie — is closed by the fetch-metadata check, which such
//! a subdomain fails (`same-site`, not `same-origin`).
//!
//! # Escaping
//!
//! Keys, types, users, payloads and errors are user input. The pages are written with
//! [maud](https://maud.lambda.xyz), which escapes every interpolated string; URLs are
//! built from percent-encoded segments and query values. Each response also carries a
//! `Content-Security-Policy` that allows no script but the page's own refresh script
//! (by nonce), so an injection that slipped through would still not run.
//!
//! # Errors
//!
//! A bad filter or page size is a 400 page, an unknown or malformed task id a 404, an
//! action on a task in the wrong state (or a retry whose key another task holds) a 409,
//! a refused action (CSRF, read-only) a 403. Only a failing database is a 5xx; its
//! message goes to the log (`tracing`), not to the page.

mod actions;
mod context;
mod error;
mod format;
mod layout;
mod list;
mod overview;
mod task;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use sea_orm::DatabaseConnection;

/// The refresh interval of a [`Dashboard`] that does not set one.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// The shortest refresh interval: shorter ones are raised to it.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The dashboard's configuration: build it, then take its [`router`](Dashboard::router).
///
/// ```no_run
/// use std::time::Duration;
///
/// use task_dedup_web::Dashboard;
///
/// # fn app(db: sea_orm::DatabaseConnection) -> axum::Router {
/// let dashboard = Dashboard::new(db)
///     .read_only(true)
///     .refresh_interval(Some(Duration::from_secs(30)));
/// axum::Router::new().nest("/queue", dashboard.router())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Dashboard {
    db: DatabaseConnection,
    read_only: bool,
    refresh: Option<Duration>,
}

impl Dashboard {
    /// A dashboard of the tasks in `db` (a pool: the dashboard runs each page's reads and
    /// each action on it), with actions, refreshing every
    /// [`DEFAULT_REFRESH_INTERVAL`].
    pub fn new(db: DatabaseConnection) -> Dashboard {
        Dashboard {
            db,
            read_only: false,
            refresh: Some(DEFAULT_REFRESH_INTERVAL),
        }
    }

    /// With `true`, no action form is shown and every action (`POST`) is refused with
    /// 403.
    pub fn read_only(mut self, read_only: bool) -> Dashboard {
        self.read_only = read_only;
        self
    }

    /// How often the overview and the task list reload themselves when JavaScript is on
    /// (at least [`MIN_REFRESH_INTERVAL`]); `None`: never.
    pub fn refresh_interval(mut self, every: Option<Duration>) -> Dashboard {
        self.refresh = every.map(|every| every.max(MIN_REFRESH_INTERVAL));
        self
    }

    /// The dashboard's routes, to [`nest`](Router::nest) under a prefix of the
    /// application's choice (links and forms follow it):
    ///
    /// | route | what |
    /// |---|---|
    /// | `GET /` | the overview |
    /// | `GET /tasks` | the task list (`status`, `type`, `user`, `key_prefix`, `created_after`, `created_before`, `order`, `after`, `limit`) |
    /// | `GET /tasks/{id}` | one task |
    /// | `POST /tasks/{id}/retry`, `/cancel`, `/delete` | the actions on a task |
    /// | `POST /types/{type}/pause`, `/resume` | pause or resume a task type |
    /// | `POST /limits` | set a task type's limits (`task_type`, `max_running`, `per_user`, `rate_starts`, `rate_per_seconds`, `fair`), or clear them (`limits_action=clear`) |
    /// | `GET /style.css` | the style sheet |
    pub fn router(self) -> Router {
        Router::new()
            .route("/", get(overview::page))
            .route("/tasks", get(list::page))
            .route("/tasks/{id}", get(task::page))
            .route("/tasks/{id}/{action}", post(actions::task))
            .route("/types/{task_type}/{action}", post(actions::task_type))
            .route("/limits", post(actions::limits))
            .route("/style.css", get(layout::style))
            .fallback(context::not_found)
            .method_not_allowed_fallback(context::method_not_allowed)
            .with_state(Arc::new(self))
    }
}
