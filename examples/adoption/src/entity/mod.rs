//! The application's entities.

pub mod post;
