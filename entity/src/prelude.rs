//! Re-exports in the shape `sea-orm-cli` generates.

pub use crate::task_run::Entity as TaskRun;
