//! Workspace root: owns the dialect-matrix integration tests (`tests/`) and the examples (`examples/`). Not published.
