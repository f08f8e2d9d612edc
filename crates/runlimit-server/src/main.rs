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
            eprintln!("runlimit-server: {}", runlimit_server::error_chain(&error));
            ExitCode::FAILURE
        }
    }
}
