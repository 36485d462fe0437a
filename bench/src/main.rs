//! Benchmark harness (placeholder until the benchmark issue lands).

fn main() {}
