pub mod _entities;
pub mod users;
