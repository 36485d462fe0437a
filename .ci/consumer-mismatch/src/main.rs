//! Connects to the PostgreSQL URL given as the first argument with a task-dedup built
//! for SQLite only; succeeds when the error names the `postgres` feature.
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: task-dedup-consumer-mismatch <postgres-url>");
        return ExitCode::FAILURE;
    };
    match task_dedup::connect(&url).await {
        Ok(_) => {
            eprintln!("connected although task-dedup was built without `postgres`");
            ExitCode::FAILURE
        }
        Err(err) if err.to_string().contains("postgres") && err.to_string().contains("feature") => {
            println!("refused at connect, naming the feature: {err}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("an error that does not name the feature: {err}");
            ExitCode::FAILURE
        }
    }
}
