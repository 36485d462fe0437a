//! Child processes of a test binary: another OS process running one of the binary's
//! ignored tests (a worker, say), for what must hold across processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Starts this test binary running only the ignored test `test`, with `envs`, and
/// returns once the child printed a line with `ready`. Its later output is drained by a
/// thread of its own.
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
