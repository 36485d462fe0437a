mod auth;
mod prepare_data;

pub mod reports;
