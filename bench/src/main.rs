//! `task-dedup-bench`: one benchmark run of one strategy on one workload.
//!
//! ```text
//! cargo run --release -p task-dedup-bench -- --url postgres://postgres@127.0.0.1/test \
//!     --strategy find-or-enqueue --workload dup --clients 16 --pool 16 --ops 20000
//! ```
//!
//! It creates its schema with task-dedup's migrations, warms up (untimed), empties the
//! table, runs, checks the table with SQL and prints one line:
//! `<strategy> <workload> <ops> <seconds> <ops_per_sec> <duplicates_active> <active_jobs> <created> <errors>`
//! and a `#` line with latency percentiles and client CPU per call (`--json`: one JSON
//! object instead). `bench/run.sh` runs the whole matrix.

mod args;
mod bulk;
mod check;
mod cost;
mod history;
mod run;
mod strategy;
mod worker;
mod workload;

use clap::Parser;

use crate::args::Args;

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.workload == args::Workload::Prune {
        if let Err(error) = history::run_prune(&args).await {
            eprintln!("task-dedup-bench: {error}");
            std::process::exit(1);
        }
        return;
    }
    if args.workload == args::Workload::Cost {
        if let Err(error) = cost::run(&args).await {
            eprintln!("task-dedup-bench: {error}");
            std::process::exit(1);
        }
        return;
    }
    if args.workload.is_worker() {
        if let Err(error) = worker::run(&args).await {
            eprintln!("task-dedup-bench: {error}");
            std::process::exit(1);
        }
        return;
    }
    match run::run(&args).await {
        Ok(report) => report.print(&args),
        Err(error) => {
            eprintln!("task-dedup-bench: {error}");
            std::process::exit(1);
        }
    }
}
