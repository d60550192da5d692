//! `kubectl kplug`: a kubectl plugin (kubectl runs any `kubectl-*` on the
//! PATH) to reconcile one object through kplug by hand and to see which
//! plugin serves which API. It uses the user's kubeconfig and rights, and
//! the operator library's own request building, so that what it sends is
//! what kplug-operator sends.

mod children;
mod cli;
mod connect;
mod create;
mod error;
mod output;
mod plugins;
mod reconcile;
mod render;
mod resource;
mod shadow;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command, CreateCommand};
use crate::error::Error;

async fn run(cli: Cli) -> Result<(), Error> {
    match &cli.command {
        Command::Reconcile(args) => {
            // A malformed TYPE/NAME is said before any connection is tried.
            let target = resource::parse_target(&args.target, args.name.as_deref())?;
            let connection = connect::connect(&cli.connection).await?;
            reconcile::run(&connection.client, &connection.namespace, &target, args).await
        }
        Command::Plugins(args) => {
            let connection = connect::connect(&cli.connection).await?;
            plugins::run(&connection.client, args).await
        }
        Command::Shadow(args) => {
            let connection = connect::connect(&cli.connection).await?;
            shadow::run(&connection.client, args).await
        }
        Command::Render(args) => render::run(args).await,
        Command::Create(CreateCommand::Plugin(args)) => {
            let namespace = connect::namespace(&cli.connection).await;
            let objects = create::plugin::manifests(args, &namespace)?;
            print_manifests(create::plugin::preamble(args, &namespace), &objects)
        }
        Command::Create(CreateCommand::Operator(args)) => {
            let namespace = connect::namespace(&cli.connection).await;
            let objects = create::operator::manifests(args, &namespace)?;
            print_manifests(create::operator::preamble(args, &namespace), &objects)
        }
        Command::Completion { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "kubectl-kplug", &mut out);
            std::io::stdout()
                .write_all(&out)
                .map_err(|e| Error::Output(e.to_string()))
        }
        Command::Version => {
            println!("kubectl-kplug version {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    }
}

/// `preamble`, then each of `objects` as a YAML document.
fn print_manifests(mut text: String, objects: &[serde_json::Value]) -> Result<(), Error> {
    for object in objects {
        text.push_str("---\n");
        text.push_str(&output::yaml(object)?);
    }
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One request at a time: a current-thread runtime is all a CLI needs.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
