//! `runlimit-demo`: see the library documentation (`runlimit_demo`) and `--help`.

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let args = runlimit_demo::Args::parse();
    runlimit_demo::init_tracing();
    match runlimit_demo::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = format!("runlimit-demo: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                // Some errors repeat their source's text in their own message: say it once.
                let text = cause.to_string();
                if !message.ends_with(&text) {
                    message.push_str(&format!(": {text}"));
                }
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}
