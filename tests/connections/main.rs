//! What task-dedup does on the connections it is given, on every dialect where it
//! applies: through PgBouncer in transaction mode (`pgbouncer.rs`), in
//! `PoolerMode::NoPreparedStatements` per handle on a direct server
//! (`no_prepared_statements.rs`), under faults (`faults.rs`: sessions killed, processes
//! killed, timeouts, servers restarted), and what only SQLite files need (`sqlite.rs`).
//!
//! One test binary of the modules below. The server restarts are ignored tests that
//! `.ci/run` runs alone, at the end:
//! `cargo test --test connections -- --ignored --test-threads=1 server_restart_under_load`.

mod faults;
mod no_prepared_statements;
mod pgbouncer;
mod sqlite;
