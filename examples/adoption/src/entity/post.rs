//! A blog post, with the revision its search index last saw.

use sea_orm::entity::prelude::*;

/// A post.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "post")]
pub struct Model {
    /// The post's id.
    #[sea_orm(primary_key)]
    pub id: i32,
    /// Its title.
    pub title: String,
    /// Bumped by every edit.
    pub revision: i32,
    /// The revision the reindex task last indexed.
    pub indexed_revision: i32,
}

/// Posts have no relations here.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
