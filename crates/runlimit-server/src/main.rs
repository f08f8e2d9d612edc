//! `runlimit-server`: see the library documentation (`runlimit_server`) and `--help`.

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let args = runlimit_server::Args::parse();
    if let Some(runlimit_server::Command::CheckConfig { path, previous }) = &args.command {
        return runlimit_server::check_config(path, previous.as_deref());
    }
    runlimit_server::init_tracing(args.log_format);
    match runlimit_server::run(&args).await {
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
