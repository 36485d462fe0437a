//! Workspace root of task-dedup: owns the dialect-matrix integration tests (`tests/`)
//! and the examples (`examples/`). Not published.
//!
//! The README and the guide's chapters (`dedup/src/guide/*.md`, rendered by the
//! `task-dedup` crate's docs) are included below so that their Rust examples are
//! compiled and run by `cargo test --workspace`, with this package's dev-dependencies.
#![doc = include_str!("../README.md")]

/// The guide's chapters. Their links name `task_dedup::guide`, which exists only when
/// `task-dedup` itself is documented; `cargo doc` checks them there.
#[allow(rustdoc::broken_intra_doc_links)]
pub mod guide {
    #[doc = include_str!("../dedup/src/guide/getting_started.md")]
    pub mod getting_started {}

    #[doc = include_str!("../dedup/src/guide/scopes_and_policies.md")]
    pub mod scopes_and_policies {}

    #[doc = include_str!("../dedup/src/guide/typed_tasks_and_worker.md")]
    pub mod typed_tasks_and_worker {}

    #[doc = include_str!("../dedup/src/guide/periodic_and_maintenance.md")]
    pub mod periodic_and_maintenance {}

    #[doc = include_str!("../dedup/src/guide/flow_control.md")]
    pub mod flow_control {}

    #[doc = include_str!("../dedup/src/guide/operating.md")]
    pub mod operating {}

    #[doc = include_str!("../dedup/src/guide/upgrading.md")]
    pub mod upgrading {}

    #[doc = include_str!("../dedup/src/guide/failure_model.md")]
    pub mod failure_model {}
}
