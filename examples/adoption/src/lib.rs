//! A blog on SeaORM that adopts task-dedup: every edit of a post asks for the post to be
//! reindexed, and however many edits arrive together, one reindex runs at a time and the
//! last edit is never lost (`Scope::Queued`: a follow-up queues behind a running
//! reindex). The application's own code stays SeaORM code: its services return `DbErr`.

pub mod entity;
pub mod migration;
pub mod service;
pub mod worker;
