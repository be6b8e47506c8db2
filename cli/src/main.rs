//! The `holdfast` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = holdfast_cli::config::Cli::parse();
    holdfast_cli::telemetry::init(&cli.global.log, cli.global.log_format);
    match holdfast_cli::commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<holdfast_cli::commands::Exit>() {
            // The command printed its outcome already; only the code is left to give.
            Some(exit) => ExitCode::from(exit.0),
            None => {
                // One line an operator can act on; details were logged where they arose.
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
