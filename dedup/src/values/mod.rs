//! The values every layer passes around, which run no SQL: keys and their checks, the
//! task a caller asks for, typed tasks, retry policies, the error type, and the handles
//! an operation runs on.

pub(crate) mod backoff;
pub(crate) mod connection;
pub(crate) mod error;
pub(crate) mod key;
pub(crate) mod task;
pub(crate) mod typed;
pub(crate) mod validate;
