//! `runlimit-server`: see the library documentation (`runlimit_server`) and `--help`.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args = runlimit_server::Args::parse();
    if let Some(runlimit_server::Command::CheckConfig { path, previous }) = &args.command {
        return runlimit_server::check_config(path, previous.as_deref());
    }
    runlimit_server::init_tracing(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("runlimit-server: cannot start the Tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(runlimit_server::run(&args));
    // Once `run` returns the service has stopped. A reload may still be reading and compiling
    // rule files on the blocking pool (a large set takes seconds); it changes nothing outside
    // the process, so it is not waited for: dropping the runtime would wait for it, and hold
    // the exit past the shutdown's promised bound.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let message = runlimit_server::error_chain(&error);
            match args.log_format {
                runlimit_server::LogFormat::Text => eprintln!("runlimit-server: {message}"),
                // One JSON object per line, like every other line on stderr.
                runlimit_server::LogFormat::Json => {
                    tracing::error!(error = %message, "runlimit-server stopped")
                }
            }
            ExitCode::FAILURE
        }
    }
}
