//! The dashboard (`task-dedup-web`) over HTTP, on every dialect, nested at `/admin`:
//! every route's page, filters and keyset pages, bad ids and bad filters (404/400, never
//! 500), the actions and their refusals (409 with the key's holder, 403 for CSRF and in
//! read-only mode), escaping of hostile strings in text, attributes and URLs, and a
//! failing database as the one 500.

use std::collections::HashSet;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use harness::rows::at;
use harness::{TestDb, matrix};
use scraper::{ElementRef, Html, Selector};
use sea_orm::{ActiveValue::Set, ConnectionTrait, EntityTrait};
use task_dedup::{NewTask, TaskAdmin, TaskDedup, TaskKey, TaskLifecycle, TaskStatus, task_run};
use task_dedup_web::Dashboard;
use tower::ServiceExt;
use uuid::Uuid;

matrix!(
    overview_counts_types_and_shows_paused_ones,
    list_filters_and_pages_through_every_task,
    bad_filters_are_400_and_empty_ones_no_filter,
    task_page_shows_the_task_and_bad_ids_are_404,
    a_snoozed_task_is_marked_in_the_list_and_counted_on_its_page,
    actions_retry_cancel_delete_pause_and_resume,
    limits_are_shown_set_and_cleared,
    retry_of_a_held_key_is_409_naming_the_holder,
    actions_on_tasks_in_the_wrong_state_are_409,
    actions_without_the_csrf_token_or_cross_site_are_403,
    read_only_hides_and_refuses_every_action,
    hostile_strings_are_escaped_in_text_attributes_and_urls,
    unknown_paths_are_404_and_the_style_sheet_is_served,
    a_failing_database_is_the_one_500,
);

const PREFIX: &str = "/admin";

/// The dashboard nested at [`PREFIX`], as an application mounts it.
fn app(db: &TestDb, read_only: bool) -> Router {
    Router::new().nest(
        PREFIX,
        Dashboard::new(db.db.clone()).read_only(read_only).router(),
    )
}

/// A response, its page parsed.
struct Page {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
    html: Html,
}

impl Page {
    fn all(&self, selector: &str) -> Vec<ElementRef<'_>> {
        let selector = Selector::parse(selector).expect("selector");
        self.html.select(&selector).collect()
    }

    fn one(&self, selector: &str) -> ElementRef<'_> {
        let found = self.all(selector);
        assert_eq!(found.len(), 1, "{selector} in {}", self.body);
        found[0]
    }

    fn text(&self, selector: &str) -> String {
        self.one(selector).text().collect()
    }

    fn flash(&self) -> (String, bool) {
        let flash = self.one("#flash");
        (
            flash.text().collect(),
            flash.value().classes().any(|c| c == "error"),
        )
    }

    fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no Location: {} {}", self.status, self.body))
    }
}

/// A browser of one: it keeps the CSRF cookie the pages set.
struct Browser {
    app: Router,
    cookie: Option<String>,
}

impl Browser {
    fn new(app: Router) -> Browser {
        Browser { app, cookie: None }
    }

    async fn send(&mut self, request: Request<Body>) -> Page {
        let response = self.app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        if let Some(set) = headers.get(header::SET_COOKIE) {
            let set = set.to_str().expect("ascii");
            assert!(
                set.contains("HttpOnly") && set.contains("SameSite=Strict"),
                "{set}"
            );
            assert!(set.contains("; Path=/"), "{set}");
            let pair = set.split(';').next().expect("pair");
            self.cookie = Some(pair.to_owned());
        }
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        let body = String::from_utf8(bytes.to_vec()).expect("utf-8");
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
        let html = Html::parse_document(&body);
        Page {
            status,
            headers,
            body,
            html,
        }
    }

    async fn get(&mut self, uri: &str) -> Page {
        let mut request = Request::get(uri);
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::empty()).expect("request"))
            .await
    }

    /// Posts `form` as a same-origin browser does (fetch metadata, the cookie).
    async fn post(&mut self, uri: &str, form: &[(&str, &str)]) -> Page {
        self.post_with(uri, form, &[("sec-fetch-site", "same-origin")])
            .await
    }

    async fn post_with(
        &mut self,
        uri: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Page {
        let mut request =
            Request::post(uri).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = serde_urlencoded::to_string(form).expect("form");
        self.send(request.body(Body::from(body)).expect("request"))
            .await
    }

    /// Posts an action the way its page's form does (its token), and follows the 303.
    async fn act(&mut self, uri: &str, form: &[(&str, &str)]) -> Page {
        let token = self.csrf_token().await;
        let mut fields = vec![("csrf_token", token.as_str())];
        fields.extend_from_slice(form);
        let answer = self.post(uri, &fields).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        let location = answer.location().to_owned();
        self.get(&location).await
    }

    /// The token of this browser's cookie, read from an action form of the overview.
    async fn csrf_token(&mut self) -> String {
        if let Some(cookie) = &self.cookie {
            return cookie
                .split_once('=')
                .map(|(_, v)| v.to_owned())
                .expect("pair");
        }
        let page = self.get(PREFIX).await;
        let token = page
            .all("input[name=csrf_token]")
            .first()
            .and_then(|input| input.attr("value"))
            .map(str::to_owned);
        let cookie = self.cookie.clone().expect("the page set the cookie");
        if let Some(token) = &token {
            assert!(cookie.ends_with(token.as_str()), "{cookie} / {token}");
        }
        cookie
            .split_once('=')
            .map(|(_, v)| v.to_owned())
            .expect("pair")
    }
}

/// A task row as the tests want it.
struct Seed<'a> {
    user: &'a str,
    task_type: &'a str,
    key: &'a str,
    status: TaskStatus,
    seconds: i64,
    payload: Option<serde_json::Value>,
    error: Option<&'a str>,
}

impl<'a> Seed<'a> {
    fn new(task_type: &'a str, key: &'a str, status: TaskStatus, seconds: i64) -> Seed<'a> {
        Seed {
            user: "u1",
            task_type,
            key,
            status,
            seconds,
            payload: None,
            error: None,
        }
    }
}

async fn insert(db: &TestDb, seed: Seed<'_>) -> Uuid {
    let id = Uuid::now_v7();
    let created_at = at(seed.seconds);
    let finished = !seed.status.is_active();
    task_run::Entity::insert(task_run::ActiveModel {
        id: Set(id),
        user_id: Set(seed.user.to_owned()),
        task_type: Set(seed.task_type.to_owned()),
        resource_key: Set(seed.key.to_owned()),
        status: Set(seed.status),
        payload: Set(seed.payload),
        error: Set(seed.error.map(str::to_owned)),
        attempts: Set(if finished { 1 } else { 0 }),
        created_at: Set(created_at),
        updated_at: Set(created_at),
        finished_at: Set(finished.then_some(created_at)),
        ..Default::default()
    })
    .exec_without_returning(&db.db)
    .await
    .expect("seed");
    id
}

/// The ids of the task rows of a list page.
fn listed(page: &Page) -> Vec<Uuid> {
    page.all("#tasks tr[data-task-id]")
        .iter()
        .map(|row| row.attr("data-task-id").expect("id").parse().expect("uuid"))
        .collect()
}

async fn overview_counts_types_and_shows_paused_ones(db: &TestDb) {
    db.migrate().await;
    use TaskStatus::*;
    for (i, (task_type, status)) in [
        ("export", Queued),
        ("export", Queued),
        ("export", Failed),
        ("export", Succeeded),
        ("mail", Running),
        ("mail", Cancelled),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("k{i}");
        insert(db, Seed::new(task_type, &key, status, i as i64)).await;
    }
    db.db.pause("mail").await.expect("pause");
    db.db.pause("idle").await.expect("pause");
    // Past the overview's count limit, a count is a lower bound.
    let many = (0..=task_dedup::DEFAULT_COUNT_LIMIT)
        .map(|i| NewTask::new(TaskKey::new("u", "bulk", format!("k{i}")).expect("key")));
    db.db.find_or_enqueue_many(many).await.expect("enqueue");

    let mut browser = Browser::new(app(db, false));
    // Nested at /admin, axum routes /admin (not /admin/) to the dashboard's `/`.
    for uri in [PREFIX.to_owned(), format!("{PREFIX}?flash=bogus")] {
        let page = browser.get(&uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}");
        let count = |task_type: &str, status: &str| {
            page.text(&format!(
                "#counts tr[data-task-type={task_type}] td[data-status={status}]"
            ))
        };
        assert_eq!(count("export", "queued"), "2");
        assert_eq!(count("export", "failed"), "1");
        assert_eq!(count("export", "succeeded"), "1");
        assert_eq!(count("export", "running"), "0");
        assert_eq!(count("mail", "running"), "1");
        assert_eq!(count("mail", "cancelled"), "1");
        // A paused type without tasks still has its row, to resume it from.
        assert_eq!(count("idle", "queued"), "0");
        assert_eq!(count("bulk", "queued"), "1,000+");
        assert_eq!(page.all("#counts tbody tr").len(), 4);
        assert_eq!(page.all("svg#throughput polyline").len(), 3);
        assert_eq!(
            page.all("#oldest-queued tr[data-task-type]")
                .iter()
                .map(|r| r.attr("data-task-type").expect("type"))
                .collect::<Vec<_>>(),
            ["bulk", "export"]
        );
        let paused: Vec<_> = page
            .all("#paused-types li[data-task-type]")
            .iter()
            .map(|li| li.attr("data-task-type").expect("type"))
            .collect();
        assert_eq!(paused, ["idle", "mail"]);
        let action = |task_type: &str| {
            page.one(&format!(
                "#counts tr[data-task-type={task_type}] button[type=submit]"
            ))
            .attr("data-action")
            .expect("data-action")
            .to_owned()
        };
        assert_eq!(action("export"), "pause");
        assert_eq!(action("mail"), "resume");
        assert_eq!(page.one("#nav-overview").attr("href"), Some(PREFIX));
        assert!(
            page.all("#flash").is_empty(),
            "an unknown flash word shows nothing"
        );
        assert_eq!(page.one("#nav-tasks").attr("href"), Some("/admin/tasks"));
        // The refresh script, allowed by the policy's nonce and nothing else.
        let script = page.one("script");
        let policy = page.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("ascii");
        let nonce = script.attr("nonce").expect("nonce");
        assert!(
            policy.contains(&format!("script-src 'nonce-{nonce}'")),
            "{policy}"
        );
        assert!(script.inner_html().contains("10000"));
    }
    // Without refresh, no script at all.
    let quiet = Router::new().nest(
        PREFIX,
        Dashboard::new(db.db.clone())
            .refresh_interval(None)
            .router(),
    );
    let page = Browser::new(quiet).get(PREFIX).await;
    assert!(page.all("script").is_empty());
}

async fn list_filters_and_pages_through_every_task(db: &TestDb) {
    db.migrate().await;
    use TaskStatus::*;
    let mut ids = Vec::new();
    for (i, (user, task_type, key, status)) in [
        ("u1", "export", "report/1", Failed),
        ("u1", "export", "report/2", Succeeded),
        ("u2", "export", "report/3", Queued),
        ("u2", "mail", "inbox/1", Failed),
        ("u3", "mail", "inbox/2", Running),
        ("u3", "sync", "report/9", Cancelled),
        ("u3", "sync", "other/1", Queued),
    ]
    .into_iter()
    .enumerate()
    {
        let mut seed = Seed::new(task_type, key, status, i as i64);
        seed.user = user;
        ids.push(insert(db, seed).await);
    }
    let newest_first = |keep: &[usize]| -> Vec<Uuid> {
        let mut picked: Vec<Uuid> = keep.iter().map(|&i| ids[i]).collect();
        picked.reverse();
        picked
    };
    let mut browser = Browser::new(app(db, false));
    let cases: Vec<(String, Vec<Uuid>)> = vec![
        (String::new(), newest_first(&[0, 1, 2, 3, 4, 5, 6])),
        ("status=failed".into(), newest_first(&[0, 3])),
        ("type=mail".into(), newest_first(&[3, 4])),
        ("type=export&status=queued".into(), newest_first(&[2])),
        ("user=u3".into(), newest_first(&[4, 5, 6])),
        ("key_prefix=report%2F".into(), newest_first(&[0, 1, 2, 5])),
        (
            format!(
                "created_after={}&created_before={}",
                at(2).to_rfc3339(),
                at(5).to_rfc3339()
            )
            .replace('+', "%2B"),
            newest_first(&[2, 3, 4]),
        ),
        ("order=oldest&type=sync".into(), vec![ids[5], ids[6]]),
        // What the filter form sends when nothing is chosen: no filter.
        (
            "status=&type=&user=&key_prefix=&created_after=&created_before=&order=newest".into(),
            newest_first(&[0, 1, 2, 3, 4, 5, 6]),
        ),
    ];
    for (query, expected) in cases {
        let page = browser.get(&format!("{PREFIX}/tasks?{query}")).await;
        assert_eq!(page.status, StatusCode::OK, "{query}: {}", page.body);
        assert_eq!(listed(&page), expected, "{query}");
        for row in page.all("#tasks tr[data-task-id]") {
            let id = row.attr("data-task-id").expect("id");
            let link = row
                .select(&Selector::parse("a.task-link").expect("selector"))
                .next()
                .expect("link");
            assert_eq!(
                link.attr("href"),
                Some(format!("/admin/tasks/{id}").as_str())
            );
        }
        assert!(page.all("#next-page").is_empty(), "{query}");
    }

    // Pages of 2, by the next-page links, keeping the filter: every task once.
    let mut uri = format!("{PREFIX}/tasks?limit=2&key_prefix=report");
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = browser.get(&uri).await;
        assert_eq!(page.status, StatusCode::OK);
        let rows = listed(&page);
        assert!(rows.len() <= 2);
        seen.extend(rows);
        pages += 1;
        match page.all("#next-page").first() {
            Some(next) => uri = next.attr("href").expect("href").to_owned(),
            None => break,
        }
        assert!(uri.contains("key_prefix=report"), "{uri}");
    }
    assert_eq!(seen, newest_first(&[0, 1, 2, 5]));
    assert_eq!(pages, 2);

    // The form keeps what was asked.
    let page = browser
        .get(&format!(
            "{PREFIX}/tasks?status=failed&type=mail&order=oldest"
        ))
        .await;
    let form = page.one("form#filters");
    assert_eq!(form.attr("method"), Some("get"));
    assert_eq!(
        page.one("select[name=status] option[selected]")
            .attr("value"),
        Some("failed")
    );
    assert_eq!(page.one("input[name=type]").attr("value"), Some("mail"));
    assert_eq!(
        page.one("select[name=order] option[selected]")
            .attr("value"),
        Some("oldest")
    );
    for name in ["user", "key_prefix", "created_after", "created_before"] {
        page.one(&format!("form#filters input[name={name}]"));
    }
    page.one("button#apply-filters[type=submit]");
    assert_eq!(page.all("select[name=status] option").len(), 6);
}

async fn bad_filters_are_400_and_empty_ones_no_filter(db: &TestDb) {
    db.migrate().await;
    let mut browser = Browser::new(app(db, false));
    let long = "t".repeat(65);
    for query in [
        "status=bogus".to_owned(),
        "status=QUEUED".to_owned(),
        "order=sideways".to_owned(),
        "limit=0".to_owned(),
        "limit=1001".to_owned(),
        "limit=-1".to_owned(),
        "limit=ten".to_owned(),
        "limit=99999999999999999999999".to_owned(),
        "after=garbage".to_owned(),
        "after=1.2".to_owned(),
        "created_after=yesterday".to_owned(),
        "created_before=2026-13-01T00:00:00Z".to_owned(),
        "created_after=2026-12-02T00:00:00Z&created_before=2026-12-01T00:00:00Z".to_owned(),
        format!("type={long}"),
        format!("user={}", "u".repeat(65)),
        format!("key_prefix={}", "k".repeat(256)),
        "type=%00".to_owned(),
        "status=queued&status=failed".to_owned(),
    ] {
        let page = browser.get(&format!("{PREFIX}/tasks?{query}")).await;
        assert_eq!(
            page.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            page.body
        );
        let (message, error) = page.flash();
        assert!(error && !message.is_empty(), "{query}");
        // The form is there to fix the query.
        page.one("form#filters");
    }
    // Zone-less times (a datetime-local field) are taken as UTC.
    let page = browser
        .get(&format!("{PREFIX}/tasks?created_after=2026-12-02T10:00"))
        .await;
    assert_eq!(page.status, StatusCode::OK);
}

async fn task_page_shows_the_task_and_bad_ids_are_404(db: &TestDb) {
    db.migrate().await;
    let mut seed = Seed::new("export", "report/7", TaskStatus::Failed, 0);
    seed.payload = Some(serde_json::json!({"report": "2026-11", "pages": [1, 2]}));
    seed.error = Some("disk full");
    let id = insert(db, seed).await;
    let mut browser = Browser::new(app(db, false));
    let page = browser.get(&format!("{PREFIX}/tasks/{id}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.text("#task-status"), "failed");
    assert_eq!(page.text("#task-key"), "report/7");
    assert_eq!(page.text("#task-attempts"), "1");
    assert_eq!(page.text("#error"), "disk full");
    let payload: serde_json::Value =
        serde_json::from_str(&page.text("#payload")).expect("payload is JSON");
    assert_eq!(payload["pages"][1], 2);
    assert!(page.text("#payload").contains('\n'), "pretty-printed");
    assert_eq!(page.text("#result"), "null");
    for field in [
        "#task-type",
        "#task-user",
        "#task-scope",
        "#task-priority",
        "#task-run-at",
        "#task-created-at",
        "#task-finished-at",
        "#task-lease-owner",
    ] {
        page.one(field);
    }
    // A failed task: retry and delete, no cancel.
    page.one("button#retry");
    page.one("button#delete");
    assert!(page.all("button#cancel").is_empty());

    for bad in [
        Uuid::now_v7().to_string(),
        "not-a-uuid".to_owned(),
        "%FF%FE".to_owned(),
        "1".to_owned(),
        format!("{id}x"),
    ] {
        let page = browser.get(&format!("{PREFIX}/tasks/{bad}")).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{bad}");
        assert!(page.flash().1);
    }
}

/// A task its handler snoozed: the list marks it `snoozed` beside `queued`, its page
/// counts its snoozes; a queued task never snoozed has no mark.
async fn a_snoozed_task_is_marked_in_the_list_and_counted_on_its_page(db: &TestDb) {
    db.migrate().await;
    let key = |r: &str| TaskKey::new("u", "poll", r).expect("key");
    let snoozed = db
        .db
        .find_or_enqueue(NewTask::new(key("feed/1")))
        .await
        .expect("enqueue")
        .task()
        .id;
    let claimed = db
        .db
        .claim("w", &[], std::time::Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("a task");
    assert_eq!(claimed.id, snoozed);
    db.db
        .snooze(snoozed, "w", std::time::Duration::from_secs(600))
        .await
        .expect("snooze");
    let plain = db
        .db
        .find_or_enqueue(NewTask::new(key("feed/2")))
        .await
        .expect("enqueue")
        .task()
        .id;
    let mut browser = Browser::new(app(db, false));
    let list = browser.get(&format!("{PREFIX}/tasks")).await;
    assert_eq!(list.status, StatusCode::OK);
    let marked = list.one(&format!("tr[data-task-id='{snoozed}'] .snoozed"));
    assert_eq!(marked.text().collect::<String>(), "snoozed");
    assert_eq!(marked.value().attr("title"), Some("snoozes: 1"));
    assert!(
        list.all(&format!("tr[data-task-id='{plain}'] .snoozed"))
            .is_empty()
    );
    let page = browser.get(&format!("{PREFIX}/tasks/{snoozed}")).await;
    assert_eq!(page.text("#task-snoozes"), "1");
    assert_eq!(page.text("#task-attempts"), "0");
}

async fn actions_retry_cancel_delete_pause_and_resume(db: &TestDb) {
    db.migrate().await;
    let failed = insert(db, Seed::new("export", "a", TaskStatus::Failed, 0)).await;
    let queued = insert(db, Seed::new("export", "b", TaskStatus::Queued, 1)).await;
    let done = insert(db, Seed::new("export", "c", TaskStatus::Succeeded, 2)).await;
    let mut browser = Browser::new(app(db, false));

    let page = browser
        .act(&format!("{PREFIX}/tasks/{failed}/retry"), &[])
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.text("#task-status"), "queued");
    assert!(!page.flash().1);
    let task = db.db.get_task(failed).await.expect("get").expect("task");
    assert_eq!(task.status, TaskStatus::Queued);
    assert_eq!(task.attempts, 0);

    let page = browser
        .act(
            &format!("{PREFIX}/tasks/{queued}/cancel"),
            &[("reason", "not needed <any more>")],
        )
        .await;
    assert_eq!(page.text("#task-status"), "cancelled");
    assert_eq!(page.text("#error"), "not needed <any more>");
    let page = browser
        .act(
            &format!("{PREFIX}/tasks/{failed}/cancel"),
            &[("reason", "")],
        )
        .await;
    assert_eq!(page.text("#error"), "cancelled from the dashboard");

    let page = browser
        .act(&format!("{PREFIX}/tasks/{done}/delete"), &[])
        .await;
    assert_eq!(page.status, StatusCode::OK);
    page.one("table#tasks");
    assert!(!page.flash().1);
    assert!(db.db.get_task(done).await.expect("get").is_none());

    let page = browser
        .act(&format!("{PREFIX}/types/export/pause"), &[])
        .await;
    assert!(page.flash().0.contains("paused"));
    assert_eq!(
        page.one("#counts tr[data-task-type=export] button")
            .attr("data-action"),
        Some("resume")
    );
    let paused = db.db.paused().await.expect("paused");
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].task_type, "export");
    let page = browser
        .act(&format!("{PREFIX}/types/export/pause"), &[])
        .await;
    assert!(page.flash().0.contains("already"));
    let page = browser
        .act(&format!("{PREFIX}/types/export/resume"), &[])
        .await;
    assert!(page.flash().0.contains("resumed"));
    assert!(db.db.paused().await.expect("paused").is_empty());
    assert!(page.all("#paused-types li").is_empty());
}

/// The limits section: set through its form (stored as `TaskAdmin::set_limits` stores
/// them), the running tasks shown against the limit, bad input a 400 that changes
/// nothing, cleared with its row's button; no form and a 403 in read-only mode.
async fn limits_are_shown_set_and_cleared(db: &TestDb) {
    db.migrate().await;
    for key in ["a", "b"] {
        insert(db, Seed::new("export", key, TaskStatus::Queued, 0)).await;
    }
    let mut browser = Browser::new(app(db, false));
    let page = browser.get(PREFIX).await;
    assert_eq!(page.text("#limits-section p.empty"), "No type is limited.");

    let page = browser
        .act(
            &format!("{PREFIX}/limits"),
            &[
                ("task_type", "export"),
                ("max_running", "2"),
                ("per_user", ""),
                ("rate_starts", "10"),
                ("rate_per_seconds", "60"),
                ("fair", "on"),
                ("limits_action", "set"),
            ],
        )
        .await;
    assert!(page.flash().0.contains("Limits set"), "{}", page.body);
    let stored = db.db.limits().await.expect("limits");
    assert_eq!(stored.len(), 1);
    let limits = &stored[0].limits;
    assert_eq!(limits.max_running, Some(2));
    assert_eq!(limits.max_running_per_user, None);
    assert_eq!(
        limits.rate.map(|r| (r.starts, r.per.as_secs())),
        Some((10, 60))
    );
    assert!(limits.fair);

    db.db
        .claim_many("w", &[], std::time::Duration::from_secs(60), 1)
        .await
        .expect("claim");
    let page = browser.get(PREFIX).await;
    let row = "#limits tr[data-task-type=export]";
    assert_eq!(page.text(&format!("{row} td[data-limit=running]")), "1 / 2");
    assert_eq!(page.text(&format!("{row} td[data-limit=per-user]")), "—");
    assert_eq!(page.text(&format!("{row} td[data-limit=fair]")), "yes");
    assert!(
        page.text(&format!("{row} td[data-limit=rate]"))
            .contains("(1 used)")
    );

    // Refused input changes nothing.
    let token = browser.csrf_token().await;
    for (field, value) in [
        ("max_running", "two"),
        ("max_running", "0"),
        ("rate_starts", "5"),
    ] {
        let page = browser
            .post(
                &format!("{PREFIX}/limits"),
                &[
                    ("csrf_token", &token),
                    ("task_type", "export"),
                    (field, value),
                ],
            )
            .await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{field}={value}");
    }
    assert_eq!(db.db.limits().await.expect("limits")[0].limits, *limits);

    let page = browser
        .act(
            &format!("{PREFIX}/limits"),
            &[("task_type", "export"), ("limits_action", "clear")],
        )
        .await;
    assert!(page.flash().0.contains("cleared"));
    assert!(db.db.limits().await.expect("limits").is_empty());

    // The limit per user across all types: its own form and clear button.
    assert!(page.all("#user-limit").is_empty());
    let page = browser
        .act(
            &format!("{PREFIX}/limits"),
            &[("user_max_running", "2"), ("limits_action", "set-user")],
        )
        .await;
    assert!(page.flash().0.contains("Limit per user"), "{}", page.body);
    let stored = db.db.user_limit().await.expect("read").expect("set");
    assert_eq!((stored.max_running, stored.users_running), (2, 1));
    assert_eq!(page.text("#user-limit span[data-limit=user-max]"), "2");
    assert_eq!(page.text("#user-limit span[data-limit=users-running]"), "1");
    assert_eq!(
        page.text("#user-limit span[data-limit=users-at-limit]"),
        "0"
    );
    let token = browser.csrf_token().await;
    for value in ["0", "", "two"] {
        let page = browser
            .post(
                &format!("{PREFIX}/limits"),
                &[
                    ("csrf_token", &token),
                    ("user_max_running", value),
                    ("limits_action", "set-user"),
                ],
            )
            .await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{value:?}");
    }
    assert_eq!(db.db.user_limit().await.expect("read"), Some(stored));
    let page = browser
        .act(
            &format!("{PREFIX}/limits"),
            &[("limits_action", "clear-user")],
        )
        .await;
    assert!(page.flash().0.contains("cleared"), "{}", page.body);
    assert_eq!(db.db.user_limit().await.expect("read"), None);
    assert!(page.all("#user-limit").is_empty());

    let mut reader = Browser::new(app(db, true));
    let page = reader.get(PREFIX).await;
    assert!(page.all("#set-limits").is_empty());
    assert!(page.all("#set-user-limit").is_empty());
    let page = reader
        .post(&format!("{PREFIX}/limits"), &[("task_type", "export")])
        .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
}

async fn retry_of_a_held_key_is_409_naming_the_holder(db: &TestDb) {
    db.migrate().await;
    let failed = insert(db, Seed::new("export", "same", TaskStatus::Failed, 0)).await;
    let holder = insert(db, Seed::new("export", "same", TaskStatus::Queued, 1)).await;
    let mut browser = Browser::new(app(db, false));
    let token = browser.csrf_token().await;
    let page = browser
        .post(
            &format!("{PREFIX}/tasks/{failed}/retry"),
            &[("csrf_token", &token)],
        )
        .await;
    assert_eq!(page.status, StatusCode::CONFLICT);
    let (message, error) = page.flash();
    assert!(error);
    assert!(message.contains(&holder.to_string()), "{message}");
    assert_eq!(
        page.one("#flash a#holder").attr("href"),
        Some(format!("/admin/tasks/{holder}").as_str())
    );
    let task = db.db.get_task(failed).await.expect("get").expect("task");
    assert_eq!(task.status, TaskStatus::Failed);
}

async fn actions_on_tasks_in_the_wrong_state_are_409(db: &TestDb) {
    db.migrate().await;
    let queued = insert(db, Seed::new("export", "a", TaskStatus::Queued, 0)).await;
    let done = insert(db, Seed::new("export", "b", TaskStatus::Succeeded, 1)).await;
    let mut browser = Browser::new(app(db, false));
    let token = browser.csrf_token().await;
    for (id, action) in [
        (queued, "retry"),
        (queued, "delete"),
        (done, "cancel"),
        (done, "retry"),
    ] {
        let page = browser
            .post(
                &format!("{PREFIX}/tasks/{id}/{action}"),
                &[("csrf_token", &token)],
            )
            .await;
        assert_eq!(
            page.status,
            StatusCode::CONFLICT,
            "{action} {id}: {}",
            page.body
        );
        assert!(page.flash().1);
    }
    for (uri, status) in [
        (
            format!("{PREFIX}/tasks/{}/retry", Uuid::now_v7()),
            StatusCode::NOT_FOUND,
        ),
        (format!("{PREFIX}/tasks/nope/cancel"), StatusCode::NOT_FOUND),
        (
            format!("{PREFIX}/tasks/{queued}/explode"),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("{PREFIX}/types/export/explode"),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("{PREFIX}/types/{}/pause", "t".repeat(65)),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let page = browser.post(&uri, &[("csrf_token", &token)]).await;
        assert_eq!(page.status, status, "{uri}: {}", page.body);
    }
    assert_eq!(
        db.db
            .get_task(queued)
            .await
            .expect("get")
            .expect("task")
            .status,
        TaskStatus::Queued
    );
}

async fn actions_without_the_csrf_token_or_cross_site_are_403(db: &TestDb) {
    db.migrate().await;
    let queued = insert(db, Seed::new("export", "a", TaskStatus::Queued, 0)).await;
    let uri = format!("{PREFIX}/tasks/{queued}/cancel");
    let mut browser = Browser::new(app(db, false));
    let token = browser.csrf_token().await;
    let other_token = "ab".repeat(32);

    // No cookie at all (a forged form from another site that SameSite kept it from).
    let mut stranger = Browser::new(app(db, false));
    let mut refused = vec![
        stranger.post(&uri, &[("csrf_token", &token)]).await,
        browser.post(&uri, &[]).await,
        browser.post(&uri, &[("csrf_token", "")]).await,
        browser.post(&uri, &[("csrf_token", &other_token)]).await,
        browser
            .post(
                &format!("{PREFIX}/types/export/pause"),
                &[("csrf_token", &other_token)],
            )
            .await,
    ];
    // The right token, from another site.
    let elsewhere: [&[(&str, &str)]; 3] = [
        &[("sec-fetch-site", "cross-site")],
        &[("sec-fetch-site", "same-site")],
        &[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:3000"),
        ],
    ];
    for headers in elsewhere {
        refused.push(
            browser
                .post_with(&uri, &[("csrf_token", &token)], headers)
                .await,
        );
    }
    for page in refused {
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.body);
        let (message, error) = page.flash();
        assert!(error && message.contains("CSRF"), "{message}");
    }
    assert_eq!(
        db.db
            .get_task(queued)
            .await
            .expect("get")
            .expect("task")
            .status,
        TaskStatus::Queued
    );
    assert!(db.db.paused().await.expect("paused").is_empty());

    // Without fetch metadata, a matching Origin and the token pass.
    let page = browser
        .post_with(
            &uri,
            &[("csrf_token", &token)],
            &[
                ("origin", "http://127.0.0.1:3000"),
                ("host", "127.0.0.1:3000"),
            ],
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);

    // HTTP/2 has no Host header: the URI's authority is the host.
    let other = insert(db, Seed::new("export", "b", TaskStatus::Queued, 1)).await;
    let absolute = format!("http://127.0.0.1:3000{PREFIX}/tasks/{other}/cancel");
    let page = browser
        .post_with(
            &absolute,
            &[("csrf_token", &token)],
            &[("origin", "http://evil.example")],
        )
        .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.body);
    let page = browser
        .post_with(
            &absolute,
            &[("csrf_token", &token)],
            &[("origin", "http://127.0.0.1:3000")],
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
}

async fn read_only_hides_and_refuses_every_action(db: &TestDb) {
    db.migrate().await;
    let failed = insert(db, Seed::new("export", "a", TaskStatus::Failed, 0)).await;
    let queued = insert(db, Seed::new("export", "b", TaskStatus::Queued, 1)).await;
    let mut browser = Browser::new(app(db, true));
    for uri in [
        PREFIX.to_owned(),
        format!("{PREFIX}/tasks"),
        format!("{PREFIX}/tasks/{failed}"),
        format!("{PREFIX}/tasks/{queued}"),
    ] {
        let page = browser.get(&uri).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(page.all("form[method=post]").is_empty(), "{uri}");
        assert!(
            page.all("button[data-action], #retry, #cancel, #delete")
                .is_empty()
        );
    }
    let token = browser.csrf_token().await;
    for uri in [
        format!("{PREFIX}/tasks/{failed}/retry"),
        format!("{PREFIX}/tasks/{failed}/delete"),
        format!("{PREFIX}/tasks/{queued}/cancel"),
        format!("{PREFIX}/types/export/pause"),
        format!("{PREFIX}/types/export/resume"),
    ] {
        let page = browser.post(&uri, &[("csrf_token", &token)]).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{uri}");
        assert!(page.flash().0.contains("read-only"));
    }
    let tasks = db
        .db
        .list_tasks(&task_dedup::ListTasks::new(task_dedup::TaskFilter::new()))
        .await
        .expect("list");
    let statuses: HashSet<_> = tasks.tasks.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        HashSet::from([TaskStatus::Failed, TaskStatus::Queued])
    );
    assert!(db.db.paused().await.expect("paused").is_empty());
}

async fn hostile_strings_are_escaped_in_text_attributes_and_urls(db: &TestDb) {
    db.migrate().await;
    let script = "<script>alert(1)</script>";
    let task_type = "\"><script>alert(1)</script>/x?a=b&c#d";
    let user = "'\"><img src=x onerror=alert(2)>";
    let key = "</td><script>alert(3)</script>%2F..";
    let error = "</pre><script>alert(4)</script>";
    let mut seed = Seed::new(task_type, key, TaskStatus::Failed, 0);
    seed.user = user;
    seed.payload = Some(serde_json::json!({ "html": script, script: [script] }));
    seed.error = Some(error);
    let id = insert(db, seed).await;
    insert(db, Seed::new(task_type, "queued", TaskStatus::Queued, 1)).await;
    db.db.pause(task_type).await.expect("pause");

    let mut browser = Browser::new(app(db, false));
    let overview = browser.get(PREFIX).await;
    let list = browser.get(&format!("{PREFIX}/tasks")).await;
    let task = browser.get(&format!("{PREFIX}/tasks/{id}")).await;
    for page in [&overview, &list, &task] {
        assert_eq!(page.status, StatusCode::OK);
        // Only the page's own refresh script, and no element the strings would make.
        assert!(page.all("script").len() <= 1);
        for script in page.all("script") {
            assert!(script.attr("nonce").is_some());
            assert!(!script.inner_html().contains("alert"));
        }
        assert!(page.all("img").is_empty());
        assert!(!page.body.contains(script), "raw <script> in the page");
    }
    // In attributes: the value round-trips exactly.
    let row = overview.all("#counts tr[data-task-type]");
    assert_eq!(row.len(), 1);
    assert_eq!(row[0].attr("data-task-type"), Some(task_type));
    assert_eq!(
        overview.one("#paused-types li").attr("data-task-type"),
        Some(task_type)
    );
    // In text.
    assert_eq!(task.text("#task-key"), key);
    assert_eq!(task.text("#task-user"), user);
    assert_eq!(task.text("#error"), error);
    let payload: serde_json::Value = serde_json::from_str(&task.text("#payload")).expect("payload");
    assert_eq!(payload["html"], script);
    // In URLs: the type's link from the overview lists that type and no other.
    let link = overview
        .one("#counts tr[data-task-type] th a")
        .attr("href")
        .expect("href")
        .to_owned();
    assert!(
        !link.contains('<') && !link.contains('"') && !link.contains('#'),
        "{link}"
    );
    let filtered = browser.get(&link).await;
    assert_eq!(filtered.status, StatusCode::OK);
    assert_eq!(
        filtered.one("input[name=type]").attr("value"),
        Some(task_type)
    );
    assert_eq!(listed(&filtered).len(), 2);
    // And the resume form's action resumes exactly that type.
    let action = overview
        .one("#counts tr[data-task-type] form")
        .attr("action")
        .expect("action")
        .to_owned();
    assert!(
        action.starts_with("/admin/types/") && action.ends_with("/resume"),
        "{action}"
    );
    let page = browser.act(&action, &[]).await;
    assert!(page.flash().0.contains("resumed"), "{}", page.body);
    assert!(db.db.paused().await.expect("paused").is_empty());
}

async fn unknown_paths_are_404_and_the_style_sheet_is_served(db: &TestDb) {
    db.migrate().await;
    let mut browser = Browser::new(app(db, false));
    for uri in ["/admin/nope", "/admin/tasks/x/y/z", "/admin/types"] {
        let page = browser.get(uri).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{uri}");
        page.one("#nav-overview");
    }
    // An action's URL opened as a link: 405, the page says why.
    let queued = insert(db, Seed::new("export", "a", TaskStatus::Queued, 0)).await;
    let page = browser
        .get(&format!("{PREFIX}/tasks/{queued}/cancel"))
        .await;
    assert_eq!(page.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(page.flash().0.contains("POST"));
    let css = browser.get("/admin/style.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .expect("ascii")
            .starts_with("text/css")
    );
    // Elsewhere than /admin, links follow the prefix.
    let elsewhere = Router::new().nest("/ops/queue", Dashboard::new(db.db.clone()).router());
    let page = Browser::new(elsewhere).get("/ops/queue/tasks").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        page.one("#nav-tasks").attr("href"),
        Some("/ops/queue/tasks")
    );
    assert_eq!(
        page.one("#filters").attr("action"),
        Some("/ops/queue/tasks")
    );
}

async fn a_failing_database_is_the_one_500(db: &TestDb) {
    // No migration: every read fails.
    let mut browser = Browser::new(app(db, false));
    let response = browser
        .app
        .clone()
        .oneshot(
            Request::get(PREFIX.to_owned())
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("The database failed"), "{body}");
    assert!(!body.contains("task_run"), "database details leak: {body}");
    // Bad input is still refused before any SQL.
    let page = browser.get(&format!("{PREFIX}/tasks?limit=0")).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    let page = browser.get(&format!("{PREFIX}/tasks/nope")).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
}

/// One task a second going back from now on ten types; of every 100, 90 succeeded, 5
/// failed, 5 queued; each with a small payload, the failed ones with an error.
const MILLION_TASKS: &str = "INSERT INTO task_run (id, user_id, task_type, resource_key, \
    status, payload, error, attempts, created_at, updated_at, finished_at) \
    SELECT gen_random_uuid(), 'u' || (n % 1000), 't' || (n % 10), 'report/' || n, \
    CASE WHEN n % 100 < 90 THEN 'succeeded' WHEN n % 100 < 95 THEN 'failed' ELSE 'queued' END, \
    jsonb_build_object('report', n, 'pages', jsonb_build_array(1, 2, 3)), \
    CASE WHEN n % 100 BETWEEN 90 AND 94 THEN 'disk full' END, \
    1, now() - n * interval '1 second', now() - n * interval '1 second', \
    CASE WHEN n % 100 < 95 THEN now() - n * interval '1 second' + interval '200 ms' END \
    FROM generate_series(1, 1000000) AS n";

/// The text of the PostgreSQL admin statement `name`, as its snapshot pins it.
fn pinned_admin(name: &str) -> String {
    harness::pinned::statement(harness::Dialect::Postgres, name)
}

/// Server-side times of the dashboard's pages on PostgreSQL with 1,000,000 tasks (each
/// page through the router: its queries and its rendering), and the plans of the
/// statements they run that `tests/admin/plans.rs` does not show. Figures for
/// BENCHMARKS.md, not a timed test: it asserts only that each page is served.
///
/// `cargo test --test admin -- --ignored --nocapture dashboard_pages_on_a_million_tasks`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "seeds 1,000,000 rows; prints timings for BENCHMARKS.md"]
async fn dashboard_pages_on_a_million_tasks() {
    harness::run(
        harness::Dialect::Postgres,
        "dashboard_pages_on_a_million_tasks",
        async |db: &TestDb| {
            db.migrate().await;
            let started = std::time::Instant::now();
            db.exec(MILLION_TASKS).await;
            db.exec("ANALYZE task_run").await;
            println!("seeded in {:?}", started.elapsed());
            db.db.pause("t7").await.expect("pause");

            let task = db
                .db
                .list_tasks(
                    &task_dedup::ListTasks::new(
                        task_dedup::TaskFilter::new().status(TaskStatus::Failed),
                    )
                    .limit(1),
                )
                .await
                .expect("list")
                .tasks[0]
                .id;
            let mut browser = Browser::new(app(db, false));
            let second_page = browser
                .get(&format!("{PREFIX}/tasks"))
                .await
                .one("#next-page")
                .attr("href")
                .expect("href")
                .to_owned();
            let pages = [
                ("overview", PREFIX.to_owned()),
                ("list, first page", format!("{PREFIX}/tasks")),
                ("list, second page", second_page),
                (
                    "list, failed of one type",
                    format!("{PREFIX}/tasks?status=failed&type=t3"),
                ),
                (
                    "list, key prefix, oldest first",
                    format!("{PREFIX}/tasks?key_prefix=report%2F99&order=oldest"),
                ),
                ("task", format!("{PREFIX}/tasks/{task}")),
                // Filters no index serves, matching nothing: the whole table is read.
                (
                    "list, key prefix matching nothing",
                    format!("{PREFIX}/tasks?key_prefix=nothing"),
                ),
                (
                    "list, user matching nothing",
                    format!("{PREFIX}/tasks?user=nobody"),
                ),
            ];
            const ROUNDS: usize = 21;
            println!("| page | median (ms) | min (ms) | max (ms) |\n|---|--:|--:|--:|");
            for (name, uri) in &pages {
                let mut times = Vec::with_capacity(ROUNDS);
                for round in 0..ROUNDS + 2 {
                    // The router's answer and its whole body; not the test's parsing.
                    let request = Request::get(uri.as_str())
                        .header(header::COOKIE, browser.cookie.clone().unwrap_or_default())
                        .body(Body::empty())
                        .expect("request");
                    let started = std::time::Instant::now();
                    let response = browser
                        .app
                        .clone()
                        .oneshot(request)
                        .await
                        .expect("infallible");
                    let status = response.status();
                    axum::body::to_bytes(response.into_body(), usize::MAX)
                        .await
                        .expect("body");
                    let elapsed = started.elapsed();
                    assert_eq!(status, StatusCode::OK, "{uri}");
                    // Two rounds to warm the pool's connections and the caches.
                    if round >= 2 {
                        times.push(elapsed.as_secs_f64() * 1000.0);
                    }
                }
                times.sort_by(f64::total_cmp);
                println!(
                    "| {name} | {:.1} | {:.1} | {:.1} |",
                    times[ROUNDS / 2],
                    times[0],
                    times[ROUNDS - 1]
                );
            }

            // The overview's calls one by one.
            println!("\n| overview call | median (ms) |\n|---|--:|");
            macro_rules! time_call {
                ($name:literal, $call:expr) => {{
                    let mut times = Vec::with_capacity(ROUNDS);
                    for _ in 0..ROUNDS {
                        let started = std::time::Instant::now();
                        $call.await.expect($name);
                        times.push(started.elapsed().as_secs_f64() * 1000.0);
                    }
                    times.sort_by(f64::total_cmp);
                    println!("| `{}` | {:.1} |", $name, times[ROUNDS / 2]);
                }};
            }
            time_call!("counts (not on the page)", db.db.counts());
            time_call!(
                "counts_up_to(1,000)",
                db.db.counts_up_to(task_dedup::DEFAULT_COUNT_LIMIT)
            );
            time_call!("throughput", db.db.throughput());
            time_call!("oldest_queued", db.db.oldest_queued());
            time_call!("paused", db.db.paused());

            for (name, sql) in [
                (
                    "get_task",
                    format!(
                        "SELECT id, user_id, task_type, resource_key, status, payload, result, \
                         error, attempts, lease_owner, lease_expires_at, created_at, updated_at, \
                         started_at, finished_at, run_at, priority, scope, dedup_window_end, \
                         concurrent FROM task_run WHERE id = '{task}'"
                    ),
                ),
                ("throughput", pinned_admin("throughput")),
                (
                    "paused",
                    "SELECT task_type, paused_at FROM task_dedup_paused ORDER BY task_type"
                        .to_owned(),
                ),
            ] {
                let rows = db
                    .db
                    .query_all_raw(sea_orm::Statement::from_string(
                        sea_orm::DbBackend::Postgres,
                        format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"),
                    ))
                    .await
                    .expect("explain");
                println!("\n{name}:");
                for row in rows {
                    let line: String = row.try_get_by_index(0).expect("plan line");
                    println!("{line}");
                }
            }
        },
    )
    .await;
}
