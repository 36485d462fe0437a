pub mod queue;
pub mod report;
