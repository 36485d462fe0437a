//! Workspace root of task-dedup: owns the dialect-matrix integration tests (`tests/`)
//! and the examples (`examples/`). Not published.
//!
//! The README is included below so that its Rust examples are compiled and run by
//! `cargo test --workspace`.
#![doc = include_str!("../README.md")]
