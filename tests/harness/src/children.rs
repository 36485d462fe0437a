//! Child processes of a test binary: another OS process running one of the binary's
//! ignored tests (a worker, say), for what must hold across processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use task_dedup::{CancellationToken, Retention, Worker, task_run};

/// The body of a child worker process: when the parent set `url_var` and `id_var`, a
/// `Worker` of every type, `concurrency` at a time, polling within `poll`, each task
/// taking `task_time`, until it is killed (it says `ready` first). Nothing otherwise
/// (the test runs on its own as an ignored one).
pub async fn run_worker(
    (url_var, id_var): (&str, &str),
    concurrency: usize,
    poll: (Duration, Duration),
    fallback_poll: Duration,
    task_time: Duration,
) {
    let (Ok(url), Ok(id)) = (std::env::var(url_var), std::env::var(id_var)) else {
        return;
    };
    let db = task_dedup::connect(&url).await.expect("connect");
    let worker = Worker::builder(db)
        .id(id)
        .concurrency(concurrency)
        .poll_interval(poll.0, poll.1)
        .fallback_poll(fallback_poll)
        .retention(Retention::off())
        .handler(move |_: task_run::Model, _: CancellationToken| async move {
            tokio::time::sleep(task_time).await;
            Ok(None)
        })
        .build()
        .expect("worker");
    println!("ready");
    worker.run(CancellationToken::new()).await.expect("run");
}

/// The name libtest gives the test function `name` of the module `module` (the caller's
/// `module_path!()`): its path below the test binary's crate, as `--exact` wants it
/// (`runtime::child_worker_process` in the `worker` binary).
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_binary, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// Starts this test binary running only the ignored test `test` (its whole name:
/// [`test_name`]), with `envs`, and returns once the child printed a line with `ready`.
/// Its later output is drained by a thread of its own.
pub fn spawn_ready(test: &str, envs: &[(&str, &str)]) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            test,
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child process");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines.next().expect("the child started").expect("utf-8");
        if line.contains("ready") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

/// Child processes, killed when dropped (the test ended, or failed).
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
