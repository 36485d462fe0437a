pub mod user_create;
pub mod user_delete;
