//! The DatabaseTable operator written with the kplug-operator library: the
//! walkthrough's resource as a Rust type, and the library does the rest
//! (extensions, delegation through kplug, binding, status, Events,
//! finalization, backoff, leader election). The zero-code `kplug-operator`
//! does the same from flags; write your own when you want the types.

use clap::Parser;
use kplug_operator::{ExtensionRef, Operator, OperatorArgs, shutdown_signal};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// A table in a relational database; its CRD is crds/databasetables.yaml.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize)]
#[kube(
    group = "myorg.org",
    version = "v1alpha1",
    kind = "DatabaseTable",
    namespaced
)]
#[kube(schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct DatabaseTableSpec {
    pub server_name: String,
    pub preferred_implementation: Option<String>,
    pub columns: Vec<Column>,
    #[serde(default)]
    pub extensions: Vec<ExtensionRef>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
}

// The operator.

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    operator: OperatorArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.operator.init_logging()?;
    // ANCHOR: run
    let mut options = cli.operator.options("databasetables.myorg.org");
    // An edited extension re-reconciles the tables that use it.
    options.watched_extensions = ["mariadb", "postgresql"]
        .map(|db| format!("databasetable{db}extensions.myorg.org"))
        .to_vec();
    Operator::for_resource::<DatabaseTable>(cli.operator.kube_config().await?, options)?
        .extensions(|table: &DatabaseTable| table.spec.extensions.clone())
        .preferred_implementation(|table: &DatabaseTable| {
            table.spec.preferred_implementation.clone()
        })
        .run(shutdown_signal())
        .await?;
    // ANCHOR_END: run
    Ok(())
}
