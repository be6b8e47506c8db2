//! The `holdfast` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

/// The server allocates small, short-lived buffers on every request from
/// several threads at once; glibc's allocator spent about a third of the
/// server's CPU in a profile of the reserve path under load (locks between
/// threads' arenas included). mimalloc keeps per-thread free lists.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A reader that stops early (`holdfast split SKU | head -1`) closes the
/// pipe, and the next line printed panics: the command ends quietly instead,
/// with 141 as a Unix tool killed by SIGPIPE would.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = holdfast_cli::config::Cli::parse();
    // Before the runtime: the trace exporter's HTTP client is a blocking one.
    let telemetry = match holdfast_cli::telemetry::init(&cli.global.log, cli.global.log_format) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.global.runtime_workers())
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    drop(runtime);
    // After the runtime: sends the spans still buffered (SIGTERM included).
    telemetry.shutdown();
    code
}

/// Runs the command and turns its outcome into the exit code.
async fn run(cli: holdfast_cli::config::Cli) -> ExitCode {
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
