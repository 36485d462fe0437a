pub mod auth;

pub mod reports;
