//! Run with `cargo run --example http_api`.
//!
//! The shape of the application task-dedup came from: an HTTP service that enqueues
//! background work per user and resource, where a double click, a retrying client or two
//! browser tabs must not start the same work twice.
//!
//! - `POST /users/{user_id}/exports` with `{"report", "work_ms"?, "fail"?, "flaky"?}`
//!   enqueues a typed task ([`tasks::Export`], which the `worker` example runs; its key
//!   and policies come from the type) and answers `201 Created` with the new task, or
//!   `200 OK` with the task already in flight. The body is the task plus
//!   `"deduplicated": false` / `true`. The client names no task type or key: the type
//!   decides them, so a request cannot enqueue work the service does not offer.
//! - `GET /tasks/{id}` answers the task, or 404.
//! - `POST /tasks/{id}/cancel` with an optional `{"reason"}` answers the cancelled task
//!   (again, unchanged, when it was cancelled already); 404 for an unknown id, 409 when the
//!   task finished otherwise.
//!
//! Every error is JSON, `{"error": "..."}`. Bad input is always a 4xx; only a failing
//! database gives a 5xx.
//!
//! - `/admin` is the dashboard of [`task_dedup_web`], nested in the service's router.
//!   Authentication is the application's choice, not the dashboard's: here a tower layer
//!   asks for basic authentication (user `ADMIN_USER`, default `admin`, and password
//!   `ADMIN_PASSWORD`; without `ADMIN_PASSWORD` the dashboard is not mounted). Basic
//!   authentication sends the password with every request: serve it over TLS.
//!
//! The service keeps its own `workflow_run` projection (the last known state of each task
//! it enqueued or cancelled), created by its own migration spliced next to task-dedup's in
//! [`Migrator`]. The projection is written in the same transaction as the enqueue or the
//! cancel, from their outcome; it is never read to decide anything. The `worker` example
//! does not write it, so a task a worker finished shows here as this service last saw it.
//!
//! ```text
//! cargo run --example http_api &
//! curl -i -X POST localhost:3000/users/alice/exports -H 'content-type: application/json' \
//!      -d '{"report": "2026-11", "work_ms": 2000}'
//! curl -i localhost:3000/tasks/<id>
//! curl -i -X POST localhost:3000/tasks/<id>/cancel -H 'content-type: application/json' \
//!      -d '{"reason": "changed my mind"}'
//! cargo run --example worker        # works the queue of the same database
//! ADMIN_PASSWORD=secret cargo run --example http_api   # then open localhost:3000/admin
//! ```
//!
//! `DATABASE_URL` switches the database (default: the embedded SQLite file
//! `http_api.db`), `BIND` the address (default `127.0.0.1:3000`).

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use task_dedup::{DedupError, Enqueued, TaskDedup, TaskLifecycle, task_run};
use task_dedup_migration::{MigrationTrait, MigratorTrait};
use uuid::Uuid;

#[path = "shared/tasks.rs"]
pub mod tasks;

const DEFAULT_DATABASE_URL: &str = "sqlite://http_api.db?mode=rwc";
const DEFAULT_BIND: &str = "127.0.0.1:3000";
/// How often a transaction is run when the database aborts it to break a deadlock.
const TRANSACTION_ATTEMPTS: u32 = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let bind = std::env::var("BIND").unwrap_or_else(|_| DEFAULT_BIND.to_owned());

    let admin = match std::env::var("ADMIN_PASSWORD") {
        Ok(password) if !password.is_empty() => Some(Credentials {
            user: std::env::var("ADMIN_USER").unwrap_or_else(|_| "admin".to_owned()),
            password,
        }),
        _ => {
            tracing::info!("ADMIN_PASSWORD is not set: the dashboard (/admin) is not mounted");
            None
        }
    };

    let db = setup(&url).await?;
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    tracing::info!(address = %listener.local_addr()?, backend = ?db.get_database_backend(), "listening");
    axum::serve(listener, router(db.clone(), admin))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down: finishing the requests in flight");
        })
        .await?;
    db.close().await?;
    Ok(())
}

/// Connects with task-dedup's pool settings and applies [`Migrator`].
pub async fn setup(url: &str) -> Result<DatabaseConnection, DbErr> {
    let db = task_dedup::connect(url).await?;
    Migrator::up(&db, None).await?;
    Ok(db)
}

/// The service's routes on `db`, and the dashboard at `/admin` for `admin`.
pub fn router(db: DatabaseConnection, admin: Option<Credentials>) -> Router {
    let api = Router::new()
        .route("/users/{user_id}/exports", post(enqueue_export))
        .route("/tasks/{id}", get(get_task))
        .route("/tasks/{id}/cancel", post(cancel))
        .fallback(async || ApiError::NoRoute)
        .method_not_allowed_fallback(async || ApiError::MethodNotAllowed)
        .with_state(db.clone());
    match admin {
        Some(admin) => {
            let dashboard =
                task_dedup_web::Dashboard::new(db)
                    .router()
                    .layer(middleware::from_fn_with_state(
                        std::sync::Arc::new(admin.header()),
                        basic_auth,
                    ));
            // A router nested at /admin answers /admin, not /admin/: send the latter there.
            api.route("/admin/", get(async || Redirect::permanent("/admin")))
                .nest("/admin", dashboard)
        }
        None => api,
    }
}

/// Who may open the dashboard.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl Credentials {
    /// The `Authorization` header that carries them.
    pub fn header(&self) -> String {
        use base64::Engine;
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// Basic authentication in front of the dashboard: the application's choice (any tower
/// layer does; the dashboard has no notion of users).
async fn basic_auth(
    State(expected): State<std::sync::Arc<String>>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes())
        .unwrap_or_default();
    // Compared without stopping at the first difference: the header holds a password.
    let matches = given.len() == expected.len()
        && given
            .iter()
            .zip(expected.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if matches {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"task-dedup dashboard\", charset=\"UTF-8\""),
        )],
        "authentication required",
    )
        .into_response()
}

/// The application's migrator: task-dedup's migrations, then the application's own.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations = task_dedup_migration::migrations();
        migrations.push(Box::new(create_workflow_run::Migration));
        migrations
    }
}

/// Answer of `POST /users/{user_id}/exports`: the task, and whether it was already in
/// flight.
#[derive(Debug, Serialize)]
pub struct EnqueueResponse {
    #[serde(flatten)]
    pub task: task_run::Model,
    pub deduplicated: bool,
}

/// Body of `POST /users/{user_id}/exports`: an [`tasks::Export`] but its user.
#[derive(Debug, Deserialize)]
pub struct ExportRequest {
    pub report: String,
    #[serde(default)]
    pub work_ms: Option<u64>,
    #[serde(default)]
    pub fail: bool,
    #[serde(default)]
    pub flaky: bool,
}

/// Body of `POST /tasks/{id}/cancel`; the body itself is optional too.
#[derive(Debug, Deserialize)]
pub struct CancelRequest {
    #[serde(default)]
    pub reason: Option<String>,
}

/// A typed task: its key, payload and policies come from [`tasks::Export`].
async fn enqueue_export(
    State(db): State<DatabaseConnection>,
    user_id: Result<Path<String>, PathRejection>,
    body: Result<Json<ExportRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(user) = user_id?;
    let Json(request) = body?;
    let export = tasks::Export {
        user,
        report: request.report,
        work_ms: request.work_ms,
        fail: request.fail,
        flaky: request.flaky,
    };
    let outcome = with_retries(|| enqueue_in_transaction(&db, &export)).await?;
    Ok(enqueued(outcome))
}

/// `201 Created` with the new task, or `200 OK` with the one already in flight.
fn enqueued(outcome: Enqueued) -> Response {
    let (status, deduplicated) = if outcome.is_created() {
        (StatusCode::CREATED, false)
    } else {
        (StatusCode::OK, true)
    };
    let task = outcome.into_task();
    let location = format!("/tasks/{}", task.id);
    let body = EnqueueResponse { task, deduplicated };
    (status, [(header::LOCATION, location)], Json(body)).into_response()
}

async fn get_task(
    State(db): State<DatabaseConnection>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<task_run::Model>, ApiError> {
    let Path(id) = id?;
    // Read from `task_run`, the source of truth, not from the projection.
    match task_run::Entity::find_by_id(id).one(&db).await? {
        Some(task) => Ok(Json(task)),
        None => Err(DedupError::NotFound { id }.into()),
    }
}

async fn cancel(
    State(db): State<DatabaseConnection>,
    id: Result<Path<Uuid>, PathRejection>,
    body: Result<Option<Json<CancelRequest>>, JsonRejection>,
) -> Result<Json<task_run::Model>, ApiError> {
    let Path(id) = id?;
    let reason = body?
        .and_then(|Json(request)| request.reason)
        .unwrap_or_else(|| "cancelled through the API".to_owned());
    let task = with_retries(|| cancel_in_transaction(&db, id, &reason)).await?;
    Ok(Json(task))
}

/// Enqueues the typed `task` and records the outcome in the projection, in one
/// transaction: the projection row of a created task commits with it, or neither does.
/// On an error (a key the type makes too long is refused before any SQL of its own) the
/// transaction is dropped uncommitted, and SeaORM rolls it back.
async fn enqueue_in_transaction(
    db: &DatabaseConnection,
    task: &tasks::Export,
) -> Result<Enqueued, ApiError> {
    let txn = db.begin().await?;
    // The unique index decides; the projection only follows the outcome. A hit leaves
    // the transaction usable, so the projection write goes on in it.
    let outcome = txn.enqueue(task).await?;
    project(&txn, outcome.task()).await?;
    txn.commit().await?;
    Ok(outcome)
}

/// Cancels task `id` and records it in the projection, in one transaction.
async fn cancel_in_transaction(
    db: &DatabaseConnection,
    id: Uuid,
    reason: &str,
) -> Result<task_run::Model, ApiError> {
    let txn = db.begin().await?;
    let task = txn.cancel(id, reason).await?;
    project(&txn, &task).await?;
    txn.commit().await?;
    Ok(task)
}

/// Records `task` in the `workflow_run` projection, inserting or updating its row (an
/// existing task may have been enqueued by another service).
///
/// The projection stays outside the source of truth: nothing here, nor anywhere in this
/// service, reads `workflow_run` to decide whether a task is a duplicate. Only
/// `task_run`'s unique index decides that, inside `find_or_enqueue`.
async fn project(txn: &DatabaseTransaction, task: &task_run::Model) -> Result<(), DbErr> {
    let row = workflow_run::ActiveModel {
        task_id: Set(task.id),
        user_id: Set(task.user_id.clone()),
        task_type: Set(task.task_type.clone()),
        resource_key: Set(task.resource_key.clone()),
        status: Set(task.status),
        updated_at: Set(task.updated_at),
    };
    use workflow_run::Column;
    workflow_run::Entity::insert(row)
        .on_conflict(
            OnConflict::column(Column::TaskId)
                .update_columns([Column::Status, Column::UpdatedAt])
                .to_owned(),
        )
        .exec_without_returning(txn)
        .await?;
    Ok(())
}

/// Runs `run` again while the database aborts its transaction to break a deadlock
/// (PostgreSQL, MySQL/MariaDB), up to [`TRANSACTION_ATTEMPTS`] times. Only the owner of a
/// transaction can run it again (see `DedupError::TransactionAborted`).
async fn with_retries<T, F>(run: impl Fn() -> F) -> Result<T, ApiError>
where
    F: Future<Output = Result<T, ApiError>>,
{
    let mut attempt = 1;
    loop {
        match run().await {
            Err(err) if err.is_aborted_transaction() && attempt < TRANSACTION_ATTEMPTS => {
                tracing::debug!(attempt, error = %err, "transaction aborted by the database; running it again");
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// Everything a request can fail with; each becomes a status and `{"error": "..."}`.
#[derive(Debug)]
pub enum ApiError {
    Dedup(DedupError),
    Json(JsonRejection),
    Path(PathRejection),
    /// The service's own statements (the projection, reads).
    Database(DbErr),
    NoRoute,
    MethodNotAllowed,
}

impl From<DedupError> for ApiError {
    fn from(err: DedupError) -> Self {
        ApiError::Dedup(err)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(err: JsonRejection) -> Self {
        ApiError::Json(err)
    }
}

impl From<PathRejection> for ApiError {
    fn from(err: PathRejection) -> Self {
        ApiError::Path(err)
    }
}

impl From<DbErr> for ApiError {
    fn from(err: DbErr) -> Self {
        ApiError::Database(err)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Dedup(err) => err.fmt(f),
            ApiError::Json(err) => f.write_str(&err.body_text()),
            ApiError::Path(err) => f.write_str(&err.body_text()),
            ApiError::Database(err) => err.fmt(f),
            ApiError::NoRoute => f.write_str("no such route"),
            ApiError::MethodNotAllowed => f.write_str("method not allowed on this route"),
        }
    }
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::Dedup(err) => dedup_status(err),
            // axum's own choice: 400 for malformed JSON, 415 without a JSON content type,
            // 422 for a missing field or a wrong type.
            ApiError::Json(err) => err.status(),
            ApiError::Path(err) => err.status(),
            ApiError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NoRoute => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// Whether the database rolled the whole transaction back to break a deadlock or a
    /// serialization conflict, so that running it again may succeed.
    fn is_aborted_transaction(&self) -> bool {
        match self {
            ApiError::Dedup(err) => matches!(err, DedupError::TransactionAborted(_)),
            // The service's own statements in the same transaction can be the victim too.
            ApiError::Database(err) => task_dedup::is_transaction_conflict(err),
            _ => false,
        }
    }
}

/// The HTTP status of each [`DedupError`], in one place.
fn dedup_status(err: &DedupError) -> StatusCode {
    match err {
        // Rejected before any SQL ran: the request is wrong.
        DedupError::InvalidKey { .. } | DedupError::InvalidArgument { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        DedupError::NotFound { .. } => StatusCode::NOT_FOUND,
        // The task is not in a state the request applies to (e.g. it already finished).
        DedupError::InvalidTransition { .. } | DedupError::LeaseNotHeld { .. } => {
            StatusCode::CONFLICT
        }
        // Safe to retry later: the client should.
        _ if err.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
        // The database, or (`DedupError` is non-exhaustive) a variant added later: a
        // server problem until this function learns about it.
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = if status.is_server_error() {
            // Log the details; do not hand database internals to the client.
            tracing::error!(error = %self, ?self, "request failed");
            match status {
                StatusCode::SERVICE_UNAVAILABLE => "busy, retry shortly".to_owned(),
                _ => "internal error".to_owned(),
            }
        } else {
            self.to_string()
        };
        let mut response = (status, Json(serde_json::json!({ "error": message }))).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// The `workflow_run` projection: the last state this service saw of each task.
pub mod workflow_run {
    use sea_orm::entity::prelude::*;
    use task_dedup::TaskStatus;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "workflow_run")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub task_id: Uuid,
        pub user_id: String,
        pub task_type: String,
        pub resource_key: String,
        pub status: TaskStatus,
        /// The task's `updated_at` when this row was written.
        pub updated_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The application's own migration, spliced after task-dedup's in [`Migrator`].
mod create_workflow_run {
    use sea_orm::DbBackend;
    use task_dedup_migration::{
        ColumnDef, DbErr, MigrationName, MigrationTrait, SchemaManager, Table,
    };

    use super::workflow_run::{Column, Entity};
    use task_dedup::task_run::{RESOURCE_KEY_MAX_CHARS, TASK_TYPE_MAX_CHARS, USER_ID_MAX_CHARS};

    pub struct Migration;

    /// In an application this is `#[derive(DeriveMigrationName)]` on a file named after
    /// the migration; this example is one file, so the name is spelled out. It is the
    /// migration's identity in `seaql_migrations`: never change it.
    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261201_000001_http_api_create_workflow_run"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let backend = manager.get_database_backend();
            let mut table = Table::create();
            table
                .table(Entity)
                .if_not_exists()
                .col(
                    ColumnDef::new(Column::TaskId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(Column::UserId)
                        .string_len(USER_ID_MAX_CHARS as u32)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(Column::TaskType)
                        .string_len(TASK_TYPE_MAX_CHARS as u32)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(Column::ResourceKey)
                        .string_len(RESOURCE_KEY_MAX_CHARS as u32)
                        .not_null(),
                )
                .col(ColumnDef::new(Column::Status).string_len(16).not_null());
            let mut updated_at = ColumnDef::new(Column::UpdatedAt);
            match backend {
                // Microseconds, as task_run has them; plain `timestamp` has whole seconds.
                DbBackend::MySql => {
                    updated_at.custom("datetime(6)");
                    // Keys are any Unicode; do not depend on the server's default charset.
                    table.character_set("utf8mb4");
                }
                _ => {
                    updated_at.timestamp_with_time_zone();
                }
            }
            table.col(updated_at.not_null());
            manager.create_table(table).await
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            manager
                .drop_table(Table::drop().table(Entity).if_exists().to_owned())
                .await
        }
    }
}
