//! The `http_api` example over real HTTP, on every dialect: a storm of identical requests
//! creates one task, bad input gets a JSON 4xx, cancel answers 404/409 (200 again when
//! repeated) and releases the
//! key, a failing projection write rolls the enqueue back.

// The example itself, not a copy: its router, migrator and projection entity.
#[path = "../../examples/http_api.rs"]
#[allow(dead_code)]
mod example;

use std::sync::Arc;
use std::time::Duration;

use example::workflow_run;
use harness::{Pool, TestDb, matrix};
use reqwest::{Client, RequestBuilder, StatusCode, Url};
use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::{Value, json};
use task_dedup::{TaskAdmin, TaskLifecycle, TaskStatus, task_run};
use task_dedup_migration::MigratorTrait;
use tokio::sync::Barrier;
use uuid::Uuid;

matrix!(
    fifty_identical_posts_create_one_task,
    bad_input_gets_a_json_4xx,
    ids_unknown_or_malformed_get_a_json_4xx,
    cancel_answers_404_409_and_releases_the_key,
    failed_projection_write_rolls_back_the_enqueue,
    typed_exports_take_key_and_policies_from_their_type,
    admin_asks_for_credentials_and_serves_with_them,
);

const STORM: usize = 50;
const SERVER_POOL: u32 = 16;

/// The example's router on an ephemeral port of 127.0.0.1, on the test's database
/// migrated with the example's own migrator (task-dedup's migrations plus the projection).
struct Server {
    base: Url,
    client: Client,
    serve: tokio::task::JoinHandle<()>,
    _pool: Pool,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

async fn start(db: &TestDb) -> Server {
    example::Migrator::up(&db.db, None)
        .await
        .expect("example migrations apply");
    let pool = db.pool(SERVER_POOL).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let app = example::router(pool.db.clone(), Some(admin_credentials()));
    let serve = tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let client = Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    Server {
        base: Url::parse(&format!("http://{address}/")).expect("base url"),
        client,
        serve,
        _pool: pool,
    }
}

impl Server {
    /// The URL of `segments`, each percent-encoded as one path segment.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("http URL")
            .clear()
            .extend(segments);
        url
    }

    /// `POST /users/{user_id}/exports`: the example's typed enqueue.
    fn post_export(&self, user_id: &str, body: &Value) -> RequestBuilder {
        self.client
            .post(self.url(&["users", user_id, "exports"]))
            .json(body)
    }

    fn cancel(&self, id: &str) -> RequestBuilder {
        self.client.post(self.url(&["tasks", id, "cancel"]))
    }

    fn get_task(&self, id: &str) -> RequestBuilder {
        self.client.get(self.url(&["tasks", id]))
    }
}

/// The dashboard's credentials in the tests.
fn admin_credentials() -> example::Credentials {
    example::Credentials {
        user: "ops".to_owned(),
        password: "s3cret: with a colon".to_owned(),
    }
}

/// Sends `request`; the body must be JSON whatever the status.
async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status}: body is not JSON ({e}): {text:?}"));
    (status, body)
}

/// `body` is `{"error": "..."}` with a message containing `needle`, and nothing else.
#[track_caller]
fn assert_error(
    (status, body): (StatusCode, Value),
    expected: StatusCode,
    needle: &str,
    case: &str,
) {
    assert_eq!(status, expected, "{case}: {body}");
    let message = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no \"error\" string in {body}"));
    assert!(
        message.contains(needle),
        "{case}: {message:?} lacks {needle:?}"
    );
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{case}: {body}");
}

fn id_of(body: &Value) -> Uuid {
    body["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no id in {body}"))
}

async fn projection(db: &TestDb) -> Vec<workflow_run::Model> {
    workflow_run::Entity::find()
        .all(&db.db)
        .await
        .expect("read projection")
}

async fn task_count(db: &TestDb) -> u64 {
    task_run::Entity::find().count(&db.db).await.expect("count")
}

async fn fifty_identical_posts_create_one_task(db: &TestDb) {
    let server = Arc::new(start(db).await);
    let (user, report) = ("alice", "2026-11 café 🦀");
    let resource = format!("report/{report}");
    let body = json!({"report": report, "work_ms": 3});
    let barrier = Arc::new(Barrier::new(STORM));
    let requests: Vec<_> = (0..STORM)
        .map(|_| {
            let (server, barrier, body) = (server.clone(), barrier.clone(), body.clone());
            tokio::spawn(async move {
                let request = server.post_export(user, &body);
                barrier.wait().await;
                let response = request.send().await.expect("request");
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .map(|l| l.to_str().expect("ascii").to_owned());
                let status = response.status();
                let body: Value = response.json().await.expect("JSON body");
                (status, location, body)
            })
        })
        .collect();
    let mut responses = Vec::with_capacity(STORM);
    for request in requests {
        responses.push(request.await.expect("request task"));
    }

    let created: Vec<_> = responses
        .iter()
        .filter(|(status, _, _)| *status == StatusCode::CREATED)
        .collect();
    let deduplicated = responses
        .iter()
        .filter(|(status, _, body)| *status == StatusCode::OK && body["deduplicated"] == true)
        .count();
    assert_eq!(created.len(), 1, "exactly one 201");
    assert_eq!(deduplicated, STORM - 1, "every other answer is a 200 hit");
    let (_, _, first) = created[0];
    assert_eq!(first["deduplicated"], false);
    let id = id_of(first);
    let task_location = format!("/tasks/{id}");
    for (_, location, body) in &responses {
        assert_eq!(id_of(body), id, "every answer carries the same task");
        assert_eq!(location.as_deref(), Some(&*task_location));
        assert_eq!(body["status"], "queued");
        assert_eq!(
            body["payload"],
            json!({"user": user, "report": report, "work_ms": 3, "fail": false, "flaky": false})
        );
        assert_eq!(
            (&body["user_id"], &body["task_type"], &body["resource_key"]),
            (&json!(user), &json!("export"), &json!(resource))
        );
    }

    assert_eq!(task_count(db).await, 1);
    let rows = projection(db).await;
    assert_eq!(rows.len(), 1, "one projection row: {rows:?}");
    let row = &rows[0];
    assert_eq!(row.task_id, id);
    assert_eq!(row.status, TaskStatus::Queued);
    assert_eq!(
        (&*row.user_id, &*row.task_type, &*row.resource_key),
        (user, "export", &*resource)
    );

    // GET answers the stored task: the POST's body without `deduplicated`.
    let (status, got) = send(server.get_task(&id.to_string())).await;
    assert_eq!(status, StatusCode::OK);
    let mut expected = first.clone();
    expected
        .as_object_mut()
        .expect("object")
        .remove("deduplicated");
    assert_eq!(got, expected);
}

async fn bad_input_gets_a_json_4xx(db: &TestDb) {
    let server = start(db).await;
    let ok = |report: &str| json!({ "report": report });
    let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;

    let raw = |body: &'static str| {
        server
            .client
            .post(server.url(&["users", "alice", "exports"]))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
    };
    assert_error(
        send(raw(r#"{"report": "2026-11","#)).await,
        StatusCode::BAD_REQUEST,
        "",
        "truncated JSON",
    );
    assert_error(
        send(raw("not json")).await,
        StatusCode::BAD_REQUEST,
        "",
        "not JSON",
    );
    let untyped = server
        .client
        .post(server.url(&["users", "alice", "exports"]))
        .body(ok("doc").to_string());
    assert_error(
        send(untyped).await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "",
        "no content type",
    );
    assert_error(
        send(server.post_export("alice", &json!({"work_ms": 5}))).await,
        unprocessable,
        "report",
        "missing field",
    );
    assert_error(
        send(server.post_export("alice", &json!({"report": 5}))).await,
        unprocessable,
        "report",
        "wrong type",
    );

    let (long, long_user) = ("x".repeat(256), "u".repeat(65));
    // The key comes from the type (`report/{report}`), the user from the path.
    let key_cases = [
        ("alice", ok(&long), "255", "resource_key too long"),
        ("alice", ok("a\0b"), "NUL", "NUL in resource_key"),
        ("al\0ice", ok("doc"), "user_id", "NUL in user_id (path %00)"),
        (&*long_user, ok("doc"), "user_id", "user_id too long"),
    ];
    for (user, body, needle, case) in key_cases {
        assert_error(
            send(server.post_export(user, &body)).await,
            unprocessable,
            needle,
            case,
        );
    }

    let mut invalid_utf8 = server.base.clone();
    invalid_utf8.set_path("/users/%FF/exports");
    assert_error(
        send(server.client.post(invalid_utf8).json(&ok("doc"))).await,
        StatusCode::BAD_REQUEST,
        "",
        "user_id not UTF-8 (path %FF)",
    );
    assert_error(
        send(server.client.get(server.url(&["nowhere"]))).await,
        StatusCode::NOT_FOUND,
        "route",
        "unknown route",
    );
    assert_error(
        send(
            server
                .client
                .get(server.url(&["users", "alice", "exports"])),
        )
        .await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method",
        "wrong method",
    );
    assert_eq!(task_count(db).await, 0, "no bad request wrote a task");
    assert!(projection(db).await.is_empty());

    // At the limits is fine: a key of 255 characters, four-byte ones among them, stored
    // and read back unchanged.
    let crabs = "🦀".repeat(255 - "report/".len());
    let (status, body) = send(server.post_export("alice", &ok(&crabs))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let key = format!("report/{crabs}");
    assert_eq!(body["resource_key"], json!(key));
    assert_eq!(projection(db).await[0].resource_key, key);
}

async fn ids_unknown_or_malformed_get_a_json_4xx(db: &TestDb) {
    let server = start(db).await;
    let unknown = Uuid::now_v7().to_string();
    assert_error(
        send(server.get_task(&unknown)).await,
        StatusCode::NOT_FOUND,
        &unknown,
        "GET unknown id",
    );
    assert_error(
        send(server.cancel(&unknown)).await,
        StatusCode::NOT_FOUND,
        &unknown,
        "cancel unknown id",
    );
    for malformed in ["not-a-uuid", "42", "0195f7d2-0000-7000-8000-00000000000g"] {
        assert_error(
            send(server.get_task(malformed)).await,
            StatusCode::BAD_REQUEST,
            "",
            &format!("GET {malformed}"),
        );
        assert_error(
            send(server.cancel(malformed)).await,
            StatusCode::BAD_REQUEST,
            "",
            &format!("cancel {malformed}"),
        );
    }
    assert!(projection(db).await.is_empty());
}

async fn cancel_answers_404_409_and_releases_the_key(db: &TestDb) {
    let server = start(db).await;
    let doc = json!({"report": "doc"});
    let (status, first) = send(server.post_export("alice", &doc)).await;
    assert_eq!(status, StatusCode::CREATED);
    let first_id = id_of(&first).to_string();

    // Bad cancel bodies are refused before anything changes.
    let bad_json = server
        .cancel(&first_id)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body("{");
    assert_error(
        send(bad_json).await,
        StatusCode::BAD_REQUEST,
        "",
        "bad JSON",
    );
    for (reason, case) in [
        ("a\0b".to_owned(), "NUL"),
        (
            "r".repeat(task_dedup::task_run::ERROR_MAX_CHARS + 1),
            "too long",
        ),
    ] {
        assert_error(
            send(server.cancel(&first_id).json(&json!({ "reason": reason }))).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "reason",
            case,
        );
    }
    let (_, still) = send(server.get_task(&first_id)).await;
    assert_eq!(still["status"], "queued");

    let (status, cancelled) = send(
        server
            .cancel(&first_id)
            .json(&json!({"reason": "changed my mind"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["error"], "changed my mind");
    // Cancelling again (a client retrying a request whose answer it lost) answers the
    // task as it was cancelled the first time.
    let (status, again) = send(
        server
            .cancel(&first_id)
            .json(&json!({"reason": "a retried request"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, cancelled);

    // The key is free again: a new task, not a hit.
    let (status, second) = send(server.post_export("alice", &doc)).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert_eq!(second["deduplicated"], false);
    assert_ne!(id_of(&second), id_of(&first));
    let second_id = id_of(&second);

    // A task a worker finished cannot be cancelled either. No body: the default reason.
    let worker = "test-worker";
    let claimed = db
        .db
        .claim(worker, &["export"], Duration::from_secs(60))
        .await
        .expect("claim")
        .expect("a queued task");
    assert_eq!(claimed.id, second_id);
    db.db
        .complete(second_id, worker, None)
        .await
        .expect("complete");
    assert_error(
        send(server.cancel(&second_id.to_string())).await,
        StatusCode::CONFLICT,
        "succeeded",
        "cancel a succeeded task",
    );
    let (status, third) = send(server.post_export("alice", &doc)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, third) = send(server.cancel(&id_of(&third).to_string())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(third["error"], "cancelled through the API");

    let rows = projection(db).await;
    let status_of = |id: Uuid| rows.iter().find(|r| r.task_id == id).map(|r| r.status);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(status_of(id_of(&first)), Some(TaskStatus::Cancelled));
    assert_eq!(status_of(id_of(&third)), Some(TaskStatus::Cancelled));
    // The worker does not write the projection: it shows what the service last saw.
    assert_eq!(status_of(second_id), Some(TaskStatus::Queued));
}

async fn failed_projection_write_rolls_back_the_enqueue(db: &TestDb) {
    let server = start(db).await;
    db.exec("DROP TABLE workflow_run").await;
    let doc = json!({"report": "doc"});
    assert_error(
        send(server.post_export("alice", &doc)).await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error",
        "projection table gone",
    );
    // The task and its projection row commit together or not at all.
    assert_eq!(task_count(db).await, 0);
}

async fn typed_exports_take_key_and_policies_from_their_type(db: &TestDb) {
    let server = start(db).await;
    let post = |body: Value| server.post_export("alice", &body);
    let (status, created) = send(post(json!({"report": "2026-11", "work_ms": 5}))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["task_type"], "export");
    assert_eq!(created["resource_key"], "report/2026-11");
    assert_eq!(created["user_id"], "alice");
    assert_eq!(created["scope"], "queued");
    assert_eq!(created["payload"]["work_ms"], 5);
    let (status, again) = send(post(json!({"report": "2026-11"}))).await;
    assert_eq!(
        (status, again["deduplicated"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(id_of(&again), id_of(&created));
    // The typed route refuses what does not fit the type, before any SQL.
    assert_error(
        send(post(json!({"report": "x".repeat(300)}))).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "resource_key",
        "a report too long for the key",
    );
    assert_error(
        send(post(json!({"report": 7}))).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "report",
        "report of the wrong type",
    );
    assert_eq!(task_count(db).await, 1);
}

async fn admin_asks_for_credentials_and_serves_with_them(db: &TestDb) {
    let server = start(db).await;
    let (status, body) = send(server.post_export("alice", &json!({"report": "<b>1</b>"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = id_of(&body);
    let admin = admin_credentials();
    let page = |segments: &[&str]| server.client.get(server.url(segments));

    // Without credentials, or with wrong ones: 401 and a basic-authentication challenge,
    // on the pages and the actions alike.
    for request in [
        page(&["admin"]),
        page(&["admin", "tasks", &id.to_string()]),
        page(&["admin"]).basic_auth(&admin.user, Some("wrong")),
        page(&["admin"]).basic_auth("someone", Some(&admin.password)),
        server
            .client
            .post(server.url(&["admin", "tasks", &id.to_string(), "cancel"])),
    ] {
        let response = request.send().await.expect("request");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let challenge = response.headers()[reqwest::header::WWW_AUTHENTICATE]
            .to_str()
            .expect("ascii");
        assert!(challenge.starts_with("Basic realm="), "{challenge}");
    }
    assert_eq!(
        db.db.get_task(id).await.expect("get").expect("task").status,
        TaskStatus::Queued
    );

    // With them: the overview (also at /admin/), the list and the task.
    for segments in [
        &["admin"][..],
        &["admin", ""],
        &["admin", "tasks"],
        &["admin", "tasks", &id.to_string()],
    ] {
        let response = page(segments)
            .basic_auth(&admin.user, Some(&admin.password))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), StatusCode::OK, "{segments:?}");
        assert!(
            response.headers()[reqwest::header::CONTENT_TYPE]
                .to_str()
                .expect("ascii")
                .starts_with("text/html")
        );
        let html = response.text().await.expect("body");
        assert!(html.contains("id=\"nav-overview\""), "{html}");
        if segments.len() > 1 && !segments[1].is_empty() {
            assert!(html.contains(&id.to_string()), "{segments:?}: {html}");
            assert!(html.contains("report/&lt;b&gt;1&lt;/b&gt;"), "{html}");
        } else {
            assert!(html.contains("data-task-type=\"export\""), "{html}");
        }
    }

    // The API itself asks for nothing.
    let (status, _) = send(server.get_task(&id.to_string())).await;
    assert_eq!(status, StatusCode::OK);
}
