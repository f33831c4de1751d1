//! The `gpulse` binary: parse the command line, resolve the configuration, set up logging and
//! dispatch. Errors reach the user as one message saying what is wrong and what to do.

use std::process::ExitCode;

use clap::Parser;

use gpulse::cli::{Cli, Command};
use gpulse::commands;
use gpulse::config::{self, Config, InspectConfig, LogFormat, LogSettings};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}` prints the chain on one line: the message, then each cause.
            eprintln!("gpulse: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Run(args) => {
            let config = Config::resolve(&cli.global, args, &config::process_env)?;
            init_logging(&config.common.log);
            for warning in &config.warnings {
                tracing::warn!("{warning}");
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("gpulse-rt")
                .enable_all()
                .build()?;
            runtime.block_on(commands::run::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot(args) => {
            let config = InspectConfig::resolve_with_prices(
                &cli.global,
                &args.inspect,
                &args.cost,
                &config::process_env,
            )?;
            let window = commands::snapshot::window(args)?;
            init_logging(&quiet_by_default(&config.common.log));
            print!("{}", commands::snapshot::snapshot(&config, window)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Top(args) => {
            let config = InspectConfig::resolve_for_top(&cli.global, args, &config::process_env)?;
            let logs = commands::top::init_logging(&quiet_by_default(&config.common.log));
            commands::top::top(&config, args, logs)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(args) => {
            let config = InspectConfig::resolve(&cli.global, &args.inspect, &config::process_env)?;
            init_logging(&quiet_by_default(&config.common.log));
            let (text, code) = commands::check::check(&config, args.agent.as_deref());
            print!("{text}");
            Ok(ExitCode::from(code))
        }
        Command::Record(args) => {
            let config = Config::resolve(&cli.global, &args.run, &config::process_env)?;
            // gpulse shares the terminal with the command: warnings only, unless asked.
            init_logging(&quiet_by_default(&config.common.log));
            for warning in &config.warnings {
                tracing::warn!("{warning}");
            }
            Ok(ExitCode::from(commands::record::record(&config, args)?))
        }
        Command::Report(args) => {
            init_logging(&LogSettings {
                filter: "warn".into(),
                format: LogFormat::Text,
            });
            eprint!("{}", commands::record::report(args)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One-shot commands print their answer; routine start-up notes (no kubelet socket on a
/// workstation, say) would only bury it, so unless a level was asked for they log warnings only.
fn quiet_by_default(settings: &LogSettings) -> LogSettings {
    let mut quiet = settings.clone();
    if quiet.filter == config::DEFAULT_LOG_LEVEL {
        quiet.filter = "warn".into();
    }
    quiet
}

/// Logs go to standard error so that standard output stays the data (`--exporter stdout`,
/// `snapshot --format json`).
fn init_logging(settings: &LogSettings) {
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(config::DEFAULT_LOG_LEVEL));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: log files and `kubectl logs` get plain text.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .with_target(false);
    match settings.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
