//! A kplug plugin that manages `DatabaseTable` objects (`myorg.org`) as
//! tables in MariaDB.
//!
//! - [`schema`]: the spec, the type map and the diff; no database needed.
//! - [`mariadb`]: connections, catalog queries and statements.
//! - [`MariaDbPlugin`]: Reconcile and Finalize in terms of those two.

pub mod mariadb;
mod plugin;
pub mod schema;

use kplug_sdk::{ApiRef, Extension, PluginInfo};

pub use plugin::MariaDbPlugin;

/// The name the plugin registers under unless `--name` says otherwise.
pub const NAME: &str = "database-table-mariadb-plugin";

/// What the plugin declares to kplug.
pub fn plugin_info() -> PluginInfo {
    PluginInfo::new(
        NAME,
        ApiRef::new(schema::GROUP, "databasetables", "v1alpha1"),
    )
    .version(env!("CARGO_PKG_VERSION"))
    .implementation("MariaDB")
    .extension(Extension::new(schema::GROUP, schema::EXTENSION_KIND))
}
