mod models;
mod requests;
mod tasks;
mod workers;
