//! The dashboard (`task-dedup-web`) in a real browser: headless Chromium driven over
//! WebDriver (chromedriver, fantoccini), on SQLite and PostgreSQL. Each test serves the
//! dashboard nested under `/admin` on 127.0.0.1, clicks through it as an operator would
//! and checks the database through the library after every action: retry from the
//! failed-task filter (and the 409 when another task holds the key), cancel and delete,
//! pause and resume from the overview, a `<script>` payload rendered inert, a POST
//! without its CSRF token refused, and the self-refresh bringing in a new task.
//!
//! Needs `chromium` and `chromedriver` (Debian's `chromium`, `chromium-driver`; or the
//! paths in `TASK_DEDUP_CHROMIUM` / `TASK_DEDUP_CHROMEDRIVER`). Without them the tests
//! print a `skipped` line, and fail under `CI=true` (`.ci/run` installs them). The
//! overview, the filtered list and a task page are saved as
//! `target/screenshots/overview.png`, `tasks.png` and `task.png` for review.
//!
//! A test binary of its own (`[[test]] browser` in Cargo.toml, not a module of
//! `admin/main.rs`): what it needs beyond the databases is a browser, and
//! `cargo test --test browser` runs it alone.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator, elements::Element};
use harness::{Dialect, TestDb, run};
use sea_orm::DatabaseConnection;
use serde_json::{Value, json};
use task_dedup::{
    NewTask, Retry, TaskAdmin, TaskDedup, TaskKey, TaskLifecycle, TaskStatus, task_run,
};
use task_dedup_web::Dashboard;
use uuid::Uuid;

/// Runs each named `async fn(&TestDb, &Browser)` on SQLite and PostgreSQL (MySQL adds
/// nothing the dashboard does differently: `tests/admin/dashboard.rs` covers it over
/// HTTP), each with a browser of its own. chromedriver and a Chromium session start in 1
/// to 2 s here, about 10 s of wall time for the 12 tests on 2 cores; one session shared by
/// the tests would have to outlive each test's runtime and carry state from test to test.
macro_rules! browser_matrix {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::{Dialect, with_browser};

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    with_browser(Dialect::Sqlite, stringify!($name), super::$name).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    with_browser(Dialect::Postgres, stringify!($name), super::$name).await;
                }
            }
        )*
    };
}

browser_matrix!(
    retry_a_failed_task_found_through_the_filters,
    cancel_then_delete_a_queued_task,
    pause_and_resume_a_type_from_the_overview,
    a_script_payload_renders_inert,
    a_post_without_the_csrf_token_is_refused,
    the_self_refresh_brings_in_a_new_task,
);

/// How long any page, element or condition may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(15);

const WORKER: &str = "seed-worker";

// ---------------------------------------------------------------------------------------
// The tests

async fn retry_a_failed_task_found_through_the_filters(db: &TestDb, browser: &Browser) {
    let export_failed = failed(&db.db, ("u1", "export", "report/1"), "disk full").await;
    let mail_failed = failed(&db.db, ("u2", "mail", "welcome/1"), "smtp down").await;
    let succeeded = succeeded(&db.db, ("u1", "export", "report/2")).await;
    let queued = enqueue(&db.db, ("u1", "export", "report/3"), json!({"pages": 3})).await;
    let app = serve(db, None).await;

    browser.goto(&app.overview()).await;
    let cell =
        |status: &str| format!(r#"#counts tr[data-task-type="export"] td[data-status="{status}"]"#);
    assert_eq!(browser.text(&cell("failed")).await, "1");
    assert_eq!(browser.text(&cell("succeeded")).await, "1");
    assert_eq!(browser.text(&cell("queued")).await, "1");
    browser.find("svg#throughput").await;
    browser.find("table#oldest-queued").await;
    browser.screenshot(db, "overview").await;

    // The list, filtered to failed tasks by the form.
    browser.click_and_load("#nav-tasks").await;
    browser
        .find(r#"#filters select[name="status"]"#)
        .await
        .select_by_value("failed")
        .await
        .expect("select failed");
    browser.click_and_load("#apply-filters").await;
    assert_eq!(
        browser.listed().await,
        sorted(vec![
            (export_failed.id, "failed".to_owned()),
            (mail_failed.id, "failed".to_owned()),
        ]),
        "status=failed lists the two failed tasks, not {succeeded:?} or {queued:?}",
    );
    // Narrowed to one type by typing it in.
    browser
        .find(r#"#filters input[name="type"]"#)
        .await
        .send_keys("export")
        .await
        .expect("type a type");
    browser.click_and_load("#apply-filters").await;
    assert_eq!(
        browser.listed().await,
        vec![(export_failed.id, "failed".to_owned())]
    );
    browser.screenshot(db, "tasks").await;

    // Its page, then retry.
    browser
        .click_and_load(&format!(
            r#"#tasks tr[data-task-id="{}"] a.task-link"#,
            export_failed.id
        ))
        .await;
    assert_eq!(browser.text("#task-status").await, "failed");
    assert!(browser.text("#error").await.contains("disk full"));
    browser.screenshot(db, "task").await;
    assert!(
        browser.absent("#cancel").await,
        "a failed task cannot be cancelled"
    );
    browser.click_and_load("#retry").await;
    browser.flash_ok().await;
    assert_eq!(browser.text("#task-status").await, "queued");
    let row = get(&db.db, export_failed.id).await;
    assert_eq!(row.status, TaskStatus::Queued);
    assert_eq!(row.attempts, 0);

    // A key taken meanwhile: 409 with the holder named and linked; nothing changes.
    let holder = enqueue(&db.db, ("u2", "mail", "welcome/1"), json!({})).await;
    browser.goto(&app.task(mail_failed.id)).await;
    browser.click_and_load("#retry").await;
    assert_eq!(browser.status().await, 409);
    let flash = browser.find("#flash.error").await;
    let flash_text = flash.text().await.expect("flash text");
    assert!(
        flash_text.contains(&holder.id.to_string()),
        "the refusal names the holder: {flash_text}"
    );
    let mut links = Vec::new();
    for link in flash.find_all(Locator::Css("a")).await.expect("links") {
        links.extend(link.attr("href").await.expect("href"));
    }
    assert!(
        links
            .iter()
            .any(|href| href.ends_with(&format!("/tasks/{}", holder.id))),
        "the refusal links the holder: {links:?}"
    );
    assert_eq!(get(&db.db, mail_failed.id).await.status, TaskStatus::Failed);
    assert_eq!(get(&db.db, holder.id).await.status, TaskStatus::Queued);
}

async fn cancel_then_delete_a_queued_task(db: &TestDb, browser: &Browser) {
    let task = enqueue(&db.db, ("u1", "export", "report/9"), json!({"pages": 9})).await;
    let app = serve(db, None).await;

    browser.goto(&app.task(task.id)).await;
    assert_eq!(browser.text("#task-status").await, "queued");
    assert!(
        browser.absent("#retry").await,
        "a queued task cannot be retried"
    );
    assert!(
        browser.absent("#delete").await,
        "an active task cannot be deleted"
    );
    browser
        .find(r#"input[name="reason"]"#)
        .await
        .send_keys("not needed any more")
        .await
        .expect("type a reason");
    browser.click_and_load("#cancel").await;
    browser.flash_ok().await;
    assert_eq!(browser.text("#task-status").await, "cancelled");
    let row = get(&db.db, task.id).await;
    assert_eq!(row.status, TaskStatus::Cancelled);
    assert!(
        row.error
            .as_deref()
            .unwrap_or("")
            .contains("not needed any more"),
        "the reason is stored: {:?}",
        row.error
    );

    browser.click_and_load("#delete").await;
    browser.flash_ok().await;
    browser.find("table#tasks").await;
    assert!(
        db.db.get_task(task.id).await.expect("get_task").is_none(),
        "deleted from the database"
    );
}

async fn pause_and_resume_a_type_from_the_overview(db: &TestDb, browser: &Browser) {
    enqueue(&db.db, ("u1", "export", "report/1"), json!({})).await;
    enqueue(&db.db, ("u1", "mail", "welcome/1"), json!({})).await;
    let app = serve(db, None).await;

    // In from the list, through the navigation's link.
    browser.goto(&app.list()).await;
    browser.click_and_load("#nav-overview").await;
    assert!(browser.absent("#paused-types li").await);
    browser
        .click_and_load(r#"button[data-action="pause"][data-task-type="export"]"#)
        .await;
    browser.flash_ok().await;
    browser
        .find(r#"#paused-types li[data-task-type="export"]"#)
        .await;
    browser
        .find(r#"button[data-action="resume"][data-task-type="export"]"#)
        .await;
    browser
        .find(r#"button[data-action="pause"][data-task-type="mail"]"#)
        .await;
    assert_eq!(harness::paused_types(&db.db).await, ["export"]);
    assert!(
        db.db
            .claim(WORKER, &["export"], Duration::from_secs(60))
            .await
            .expect("claim")
            .is_none(),
        "a paused type is not claimed"
    );

    browser
        .click_and_load(r#"button[data-action="resume"][data-task-type="export"]"#)
        .await;
    browser.flash_ok().await;
    assert!(browser.absent("#paused-types li").await);
    browser
        .find(r#"button[data-action="pause"][data-task-type="export"]"#)
        .await;
    assert!(harness::paused_types(&db.db).await.is_empty());
}

async fn a_script_payload_renders_inert(db: &TestDb, browser: &Browser) {
    // Every user string the pages show carries markup that would set `window.__pwned` or
    // open an alert if it were rendered as HTML; a slash-free type so that it stays one
    // path segment in the pause form's URL.
    let script = "</pre><script>window.__pwned = true; alert('pwned')</script>";
    let task_type = r#"<img src=x onerror="window.__pwned=true">"#;
    let task = enqueue(
        &db.db,
        ("<b>mallory</b>", task_type, "<svg onload=alert(1)>"),
        json!({ "note": script }),
    )
    .await;
    let app = serve(db, None).await;

    for url in [app.overview(), app.list(), app.task(task.id)] {
        browser.goto(&url).await;
        browser.assert_not_pwned(&url).await;
        if url == app.list() {
            let row = browser
                .text(&format!(r#"tr[data-task-id="{}"]"#, task.id))
                .await;
            assert!(row.contains("<b>mallory</b>"), "the user as text: {row}");
            assert_eq!(
                browser
                    .js("return document.querySelectorAll('#tasks b, #tasks svg').length")
                    .await,
                json!(0),
                "no element made from the user or the key"
            );
            assert!(
                row.contains("<svg onload=alert(1)>"),
                "the key as text: {row}"
            );
        }
    }
    // On the task page: the payload is visible as text, and no element came of it.
    let payload = browser.text("#payload").await;
    assert!(
        payload.contains("<script>window.__pwned = true"),
        "{payload}"
    );
    assert!(browser.text("body").await.contains("<svg onload=alert(1)>"));
    assert_eq!(
        browser
            .js(
                "return document.querySelectorAll('#payload *, img[src=\"x\"], svg[onload]').length"
            )
            .await,
        json!(0),
        "no element made from a user string"
    );

    // The type, on the overview: its row carries it as data, and its pause button works.
    browser.goto(&app.overview()).await;
    let rows = browser
        .js(&format!(
            "return [...document.querySelectorAll('#counts tr[data-task-type]')]\
             .filter(row => row.dataset.taskType === {}).length",
            json!(task_type)
        ))
        .await;
    assert_eq!(
        rows,
        json!(1),
        "one counts row whose data-task-type is the type"
    );
    browser
        .click_and_load(&format!(
            r#"#counts button[data-action="pause"][data-task-type="{}"]"#,
            task_type.replace('"', "\\\"")
        ))
        .await;
    browser.flash_ok().await;
    browser.assert_not_pwned("the overview after pausing").await;
    assert_eq!(harness::paused_types(&db.db).await, [task_type]);
}

async fn a_post_without_the_csrf_token_is_refused(db: &TestDb, browser: &Browser) {
    let task = failed(&db.db, ("u1", "export", "report/1"), "disk full").await;
    let app = serve(db, None).await;

    // The retry form submitted by a click after its hidden token was removed, then with
    // a wrong one. (A `fetch` POST would not even leave the page: the dashboard's
    // Content-Security-Policy allows no `connect-src`.)
    for (what, change) in [
        ("no token", "field.remove()"),
        ("a wrong token", "field.value = 'forged' + field.value"),
    ] {
        browser.goto(&app.task(task.id)).await;
        assert_eq!(
            browser
                .js(&format!(
                    "const field = document.getElementById('retry').form\
                     .querySelector('input[type=hidden][name=csrf_token]'); \
                     {change}; return true"
                ))
                .await,
            json!(true),
            "{what}: the retry form carries its token"
        );
        browser.click_and_load("#retry").await;
        assert_eq!(browser.status().await, 403, "{what}");
        let body = browser.text("body").await;
        assert!(
            body.contains("CSRF"),
            "{what}: the refusal says why: {body}"
        );
        assert_eq!(
            get(&db.db, task.id).await.status,
            TaskStatus::Failed,
            "{what}"
        );
    }

    // With its token the same form retries: the refusals above were the token's.
    browser.goto(&app.task(task.id)).await;
    browser.click_and_load("#retry").await;
    assert_eq!(browser.status().await, 200);
    browser.flash_ok().await;
    assert_eq!(get(&db.db, task.id).await.status, TaskStatus::Queued);
}

async fn the_self_refresh_brings_in_a_new_task(db: &TestDb, browser: &Browser) {
    enqueue(&db.db, ("u1", "export", "report/1"), json!({})).await;
    let app = serve(db, Some(Duration::from_secs(1))).await;

    browser.goto(&app.overview()).await;
    browser.find(r#"#counts tr[data-task-type="export"]"#).await;
    assert!(browser.absent(r#"#counts tr[data-task-type="late"]"#).await);
    enqueue(&db.db, ("u1", "late", "report/2"), json!({})).await;
    browser
        .wait_for(r#"#counts tr[data-task-type="late"] td[data-status="queued"]"#)
        .await;

    // The list reloads with its filters.
    browser
        .goto(&format!("{}?status=queued&type=late", app.list()))
        .await;
    let late = enqueue(&db.db, ("u1", "late", "report/3"), json!({})).await;
    browser
        .wait_for(&format!(r#"#tasks tr[data-task-id="{}"]"#, late.id))
        .await;
    assert_eq!(
        browser.listed().await.len(),
        2,
        "still filtered to the queued lates"
    );

    // Not while the operator types in a field: nothing to wait for but the time of two
    // refreshes, after which the typing is still there and the new task is not.
    let field = browser.find(r#"#filters input[name="user"]"#).await;
    field.click().await.expect("focus the field");
    field.send_keys("u").await.expect("type");
    let held = enqueue(&db.db, ("u1", "late", "report/4"), json!({})).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let row = format!(r#"#tasks tr[data-task-id="{}"]"#, held.id);
    assert!(
        browser.absent(&row).await,
        "reloaded under the operator's typing"
    );
    assert_eq!(
        browser
            .js("return document.querySelector('#filters input[name=user]').value")
            .await,
        json!("u")
    );
    browser
        .js("document.activeElement.blur(); return null")
        .await;
    browser.wait_for(&row).await;
}

// ---------------------------------------------------------------------------------------
// Seeding and reading through the library

async fn enqueue(
    db: &DatabaseConnection,
    (user, task_type, key): (&str, &str, &str),
    payload: Value,
) -> task_run::Model {
    let key = TaskKey::new(user, task_type, key).expect("valid key");
    let enqueued = db
        .find_or_enqueue(NewTask::new(key).with_payload(payload))
        .await
        .expect("enqueue");
    assert!(enqueued.is_created(), "seeded once");
    enqueued.into_task()
}

/// Enqueues and claims a task of a type of its own (no other task of the type may be
/// queued then).
async fn claimed(db: &DatabaseConnection, key: (&str, &str, &str)) -> task_run::Model {
    let task = enqueue(db, key, json!({"seeded": true})).await;
    let claimed = db
        .claim(WORKER, &[key.1], Duration::from_secs(60))
        .await
        .expect("claim")
        .expect("the task is due");
    assert_eq!(claimed.id, task.id, "claimed the task just enqueued");
    claimed
}

async fn failed(db: &DatabaseConnection, key: (&str, &str, &str), error: &str) -> task_run::Model {
    let task = claimed(db, key).await;
    db.fail(task.id, WORKER, error, Retry::Never)
        .await
        .expect("fail")
}

async fn succeeded(db: &DatabaseConnection, key: (&str, &str, &str)) -> task_run::Model {
    let task = claimed(db, key).await;
    db.complete(task.id, WORKER, Some(json!({"ok": true})))
        .await
        .expect("complete")
}

async fn get(db: &DatabaseConnection, id: Uuid) -> task_run::Model {
    db.get_task(id)
        .await
        .expect("get_task")
        .expect("the task exists")
}

fn sorted(mut rows: Vec<(Uuid, String)>) -> Vec<(Uuid, String)> {
    rows.sort();
    rows
}

// ---------------------------------------------------------------------------------------
// The dashboard, served

/// The dashboard nested under `/admin` on an ephemeral port of 127.0.0.1.
struct App {
    base: String,
    serve: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

impl App {
    /// The overview: the prefix itself, the one URL a router nested there answers at
    /// its root (axum 0.8's `nest` leaves `/admin/` to the outer router, a 404).
    fn overview(&self) -> String {
        self.base.clone()
    }

    fn list(&self) -> String {
        format!("{}/tasks", self.base)
    }

    fn task(&self, id: Uuid) -> String {
        format!("{}/tasks/{id}", self.base)
    }
}

/// `refresh`: the dashboard's self-refresh; `None` in tests that click, so that no
/// reload lands between a look and a click.
async fn serve(db: &TestDb, refresh: Option<Duration>) -> App {
    let dashboard = Dashboard::new(db.db.clone()).refresh_interval(refresh);
    let app = axum::Router::new().nest("/admin", dashboard.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let serve = tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    App {
        base: format!("http://{address}/admin"),
        serve,
    }
}

// ---------------------------------------------------------------------------------------
// The browser

/// Where Chromium and chromedriver are.
struct Tools {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

/// The tools, or `None` after saying once that the browser tests are skipped (a panic
/// under `CI=true`, where `.ci/run` installs them).
fn tools() -> Option<Tools> {
    let found = (|| {
        Ok::<_, String>(Tools {
            chromium: executable("TASK_DEDUP_CHROMIUM", "chromium")?,
            chromedriver: executable("TASK_DEDUP_CHROMEDRIVER", "chromedriver")?,
        })
    })();
    match found {
        Ok(tools) => Some(tools),
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the browser tests are required under CI=true: {why}")
        }
        Err(why) => {
            static SAID: OnceLock<()> = OnceLock::new();
            SAID.get_or_init(|| {
                // Written to the handle directly: libtest captures `eprintln!`.
                let _ = writeln!(
                    std::io::stderr(),
                    "\n[task-dedup tests] skipped the browser tests: {why} \
                     (apt-get install chromium chromium-driver)"
                );
            });
            None
        }
    }
}

/// `$var` if set, else `name` looked up in `PATH`.
fn executable(var: &str, name: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{var}={} is not a file", path.display()))
        };
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| format!("no {name} in PATH (or set {var})"))
}

/// Runs `test` on a fresh, migrated database of `dialect` with a browser of its own.
async fn with_browser(dialect: Dialect, test: &str, body: impl AsyncFnOnce(&TestDb, &Browser)) {
    let Some(tools) = tools() else { return };
    run(dialect, test, async move |db: &TestDb| {
        db.migrate().await;
        let browser = Browser::start(&tools).await;
        body(db, &browser).await;
        browser.close().await;
    })
    .await;
}

/// A chromedriver child process in a process group of its own, with the Chromium it
/// starts: the whole group is killed on drop, so a failed test leaves no browser behind
/// (killing chromedriver alone orphans Chromium).
struct Driver {
    child: Child,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // procps' kill takes a negative id for the group; without it, chromedriver alone.
        let group = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        if !group.is_ok_and(|status| status.success()) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Driver {
    /// Starts chromedriver on a port the system picks and returns it with that port,
    /// read from its start-up line.
    fn start(path: &Path) -> (Driver, u16) {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(path)
            .arg("--port=0")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", path.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let driver = Driver { child };
        let mut lines = BufReader::new(stdout).lines();
        let mut said = Vec::new();
        let port = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("chromedriver exited before listening: {said:?}")
            };
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest
                    .trim_end_matches('.')
                    .parse::<u16>()
                    .unwrap_or_else(|e| panic!("{line}: {e}"));
            }
            said.push(line);
        };
        // Drained, so that its later lines never block it on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        (driver, port)
    }
}

/// A headless Chromium session; its chromedriver is killed when it drops.
struct Browser {
    client: Client,
    _driver: Driver,
}

impl Browser {
    async fn start(tools: &Tools) -> Browser {
        let path = tools.chromedriver.clone();
        let (driver, port) = tokio::task::spawn_blocking(move || Driver::start(&path))
            .await
            .expect("chromedriver start");
        // As root in a container: no sandbox, no GPU, /tmp instead of a small /dev/shm;
        // a fixed window so that screenshots compare.
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": tools.chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1000",
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("an object")
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session");
        Browser {
            client,
            _driver: driver,
        }
    }

    /// Ends the session, which quits Chromium; the drop then stops chromedriver.
    async fn close(self) {
        let _ = self.client.clone().close().await;
    }

    async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }

    /// The element `css` selects on the page as loaded (no waiting: pages are rendered
    /// on the server).
    async fn find(&self, css: &str) -> Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) => {
                let url = self.client.current_url().await.map(String::from);
                let text = match self.client.find(Locator::Css("body")).await {
                    Ok(body) => body.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                panic!("{css} not found on {url:?}: {e}\npage text: {text}")
            }
        }
    }

    /// Waits up to [`PATIENCE`] for `css` to appear (the page may reload meanwhile).
    async fn wait_for(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(PATIENCE)
            .every(Duration::from_millis(50))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
    }

    async fn absent(&self, css: &str) -> bool {
        self.client
            .find_all(Locator::Css(css))
            .await
            .expect("find_all")
            .is_empty()
    }

    async fn text(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .trim()
            .to_owned()
    }

    async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Clicks `css` and waits until the page it leads to has loaded: a mark left on the
    /// old page's `window` is gone with it.
    async fn click_and_load(&self, css: &str) {
        self.js("window.__taskDedupOldPage = true; return null")
            .await;
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
        let started = Instant::now();
        loop {
            let loaded = self
                .client
                .execute(
                    "return window.__taskDedupOldPage === undefined \
                     && document.readyState === 'complete'",
                    Vec::new(),
                )
                .await;
            // An error while the old page unloads is the navigation under way.
            if matches!(loaded, Ok(Value::Bool(true))) {
                return;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "clicking {css} loaded no page"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The HTTP status of the page's document (after redirects).
    async fn status(&self) -> u64 {
        let status = self
            .js("return performance.getEntriesByType('navigation')[0].responseStatus")
            .await;
        status
            .as_u64()
            .unwrap_or_else(|| panic!("no response status: {status}"))
    }

    /// The page shows a flash message that is not a refusal.
    async fn flash_ok(&self) {
        let flash = self.find("#flash").await;
        let class = flash
            .attr("class")
            .await
            .expect("class")
            .unwrap_or_default();
        let text = flash.text().await.expect("flash text");
        assert!(
            !class.split_whitespace().any(|c| c == "error"),
            "an error flash: {text}"
        );
        assert!(!text.trim().is_empty(), "an empty flash");
    }

    /// `(id, status)` of each row of `#tasks`, sorted.
    async fn listed(&self) -> Vec<(Uuid, String)> {
        let mut rows = Vec::new();
        for row in self
            .client
            .find_all(Locator::Css("#tasks tr[data-task-id]"))
            .await
            .expect("rows")
        {
            let id = row
                .attr("data-task-id")
                .await
                .expect("attr")
                .expect("an id");
            let status = row
                .attr("data-status")
                .await
                .expect("attr")
                .expect("a status");
            rows.push((id.parse().expect("a UUID"), status));
        }
        sorted(rows)
    }

    /// No script from user data ran: `window.__pwned` unset and no alert open.
    async fn assert_not_pwned(&self, page: &str) {
        match self.client.get_alert_text().await {
            Err(e) if e.is_no_such_alert() => {}
            Err(e) => panic!("{page}: {e}"),
            Ok(text) => panic!("{page}: an alert is open: {text}"),
        }
        assert_eq!(
            self.js("return typeof window.__pwned").await,
            json!("undefined"),
            "{page}: a user string ran as script"
        );
    }

    /// Saves the page as `target/screenshots/<name>.png` (from the SQLite run; the
    /// PostgreSQL run shows the same).
    async fn screenshot(&self, db: &TestDb, name: &str) {
        if db.dialect != Dialect::Sqlite {
            return;
        }
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target directory")
            .join("screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot directory");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("screenshot written");
    }
}
