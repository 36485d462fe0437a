pub mod report;
pub mod queue;
