//! `gpulse top`: the live view's loop. It runs the same stages as `gpulse run` — the sampler
//! thread and the [`WindowLoop`] (aggregator, attribution and diagnosis) — with one window per
//! `--interval`, and hands each analysed [`View`](crate::pipeline::View) to the view state in
//! [`crate::top`] instead of the exporter.
//!
//! The loop waits on one channel fed by two threads, the snapshot forwarder and the key reader,
//! so it sleeps until a sample or a key arrives: no polling, nothing redrawn between them.
//!
//! With `--otlp-receiver-grpc/-http` top also runs `run`'s OTLP receiver, on a local intake
//! that forwards nothing ([`IntakePlan`] without upstream): the PyTorch companion's step spans
//! feed the same framework evidence `run`'s rules read, so the view shows each rank's step
//! figures and marks the straggler `rank_straggler` names.

use std::sync::mpsc;
use std::time::Duration;

use super::receivers::{self, IntakePlan};
use crate::cli::TopArgs;
use crate::config::{InspectConfig, LogSettings, MIN_SAMPLE_INTERVAL};
use crate::pipeline::{SamplerSettings, SamplerThread, WindowLoop};
use crate::sampling::{SessionError, Snapshot};
use crate::top::input::{action, Action};
use crate::top::logs::LogLines;
use crate::top::procinfo::{OwnCpu, ProcessTrees};
use crate::top::terminal::{check_terminal, NotATerminal, TerminalGuard};
use crate::top::{ui, App};
use crate::values;

/// The refresh interval when `--interval` is not given.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Why `gpulse top` could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopError {
    #[error(
        "gpulse top draws a live view and needs a terminal, but standard {0} is not one. For one \
         reading as text use `gpulse snapshot`, for scripts `gpulse snapshot --format json`"
    )]
    NotATerminal(&'static str),
    #[error("--interval {given}: {reason}")]
    Interval { given: String, reason: String },
    #[error(transparent)]
    Nvml(#[from] SessionError),
    #[error("the terminal failed: {0}. Try another terminal, or `gpulse snapshot` for plain text")]
    Terminal(#[from] std::io::Error),
    #[error(
        "{0}. On a node where `gpulse run` already receives on that port, its /status and \
         exported findings have the ranks; top hears only what is sent to its own address"
    )]
    Receiver(#[from] crate::enrich::ReceiverError),
}

/// What the loop wakes up for.
enum Event {
    Snapshot(Box<Snapshot>),
    Key(crossterm::event::KeyEvent),
    Resize,
    InputClosed(std::io::Error),
    /// SIGTERM, SIGHUP or SIGINT: leave as `q` does, so the terminal is restored.
    Signal(&'static str),
}

/// Log lines go to memory while the view owns the terminal (see [`LogLines`]).
pub fn init_logging(settings: &LogSettings) -> LogLines {
    let logs = LogLines::new();
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let writer_logs = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .with_writer(move || writer_logs.writer())
        .init();
    logs
}

/// The refresh interval from `--interval`.
///
/// # Errors
/// Not a duration, or below [`MIN_SAMPLE_INTERVAL`].
pub(crate) fn interval(args: &TopArgs) -> Result<Duration, TopError> {
    let Some(given) = &args.interval else {
        return Ok(DEFAULT_INTERVAL);
    };
    let interval = values::parse_duration(given).map_err(|reason| TopError::Interval {
        given: given.clone(),
        reason,
    })?;
    if interval < MIN_SAMPLE_INTERVAL {
        return Err(TopError::Interval {
            given: given.clone(),
            reason: format!(
                "below the minimum of {}; NVML counters do not refresh faster. Try 1s",
                values::format_duration(MIN_SAMPLE_INTERVAL)
            ),
        });
    }
    Ok(interval)
}

/// Runs the live view until `q`, Ctrl-C, SIGTERM or SIGHUP.
///
/// # Errors
/// Not a terminal, a bad `--interval`, NVML cannot be opened, or the terminal fails.
pub fn top(config: &InspectConfig, args: &TopArgs, logs: LogLines) -> Result<(), TopError> {
    let interval = interval(args)?;
    check_terminal().map_err(|which| {
        TopError::NotATerminal(match which {
            NotATerminal::Stdout => "output",
            NotATerminal::Stdin => "input",
        })
    })?;
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());

    // The kubelet pod list is refreshed by a task on this runtime (see `Attributor::new`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gpulse-top-rt")
        .enable_all()
        .build()?;
    let mut windows = {
        let _entered = runtime.enter();
        WindowLoop::new(&config.common.analysis)
    };
    let views = windows.subscribe();
    let receivers = if config.otlp_receiver.enabled() {
        let plan = IntakePlan::local(
            config.otlp_receiver,
            interval,
            config.common.analysis.proc_root.clone(),
        );
        Some(runtime.block_on(receivers::start(plan, &mut windows))?)
    } else {
        None
    };

    let (snapshot_tx, mut snapshot_rx) = tokio::sync::mpsc::channel(4);
    let sampler = SamplerThread::spawn(
        SamplerSettings {
            nvml_lib: config.common.nvml_lib.clone(),
            interval,
            wait_for_gpu: false,
            // Every field: it keeps (or shows) them all, whatever the switches.
            unread_fields: Default::default(),
        },
        snapshot_tx,
    )?;

    let (events, next_event) = mpsc::channel();
    let forward = events.clone();
    std::thread::Builder::new()
        .name("gpulse-top-snapshots".into())
        .spawn(move || {
            while let Some(snapshot) = snapshot_rx.blocking_recv() {
                if forward.send(Event::Snapshot(Box::new(snapshot))).is_err() {
                    break;
                }
            }
        })?;

    // Without this a `kill` or a closed SSH session would leave the terminal in raw mode.
    let on_signal = events.clone();
    runtime.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut hup), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!("could not listen for SIGTERM/SIGHUP; use q to leave the view");
            return;
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = hup.recv() => "SIGHUP",
            _ = int.recv() => "SIGINT",
        };
        let _ = on_signal.send(Event::Signal(name));
    });

    let mut guard = TerminalGuard::enter()?;
    // Reading keys only once raw mode is on: before it, the terminal would echo them.
    std::thread::Builder::new()
        .name("gpulse-top-keys".into())
        .spawn(move || read_keys(&events))?;

    let mut app = App::new(interval, host_name(), color);
    app.process_trees = ProcessTrees::new(&config.common.analysis.proc_root);
    let mut own_cpu = OwnCpu::new();
    let outcome = loop {
        app.last_log = logs.last();
        if let Err(e) = guard.terminal.draw(|frame| ui::draw(frame, &app)) {
            break Err(TopError::Terminal(e));
        }
        match next_event.recv() {
            Ok(Event::Snapshot(snapshot)) => {
                windows.add(&snapshot);
                if windows.close_window().is_none() {
                    continue;
                }
                let Some(view) = views.borrow().clone() else {
                    continue;
                };
                if app.wants_process_trees() {
                    app.process_trees.refresh(&view.attributed.visible_pids());
                }
                app.observe(view, own_cpu.sample());
            }
            Ok(Event::Key(key)) => {
                let Some(action) = action(key, app.mode) else {
                    continue;
                };
                app.apply(action);
                if app.quit {
                    break Ok(());
                }
                // The tree and the detail pane need the process trees now, not at the next window.
                if matches!(action, Action::ToggleTree | Action::ToggleDetail)
                    && app.wants_process_trees()
                {
                    if let Some(view) = views.borrow().clone() {
                        app.process_trees.refresh(&view.attributed.visible_pids());
                        app.rebuild();
                    }
                }
            }
            Ok(Event::Resize) => {}
            Ok(Event::InputClosed(e)) => break Err(TopError::Terminal(e)),
            Ok(Event::Signal(name)) => {
                tracing::info!("{name} received: leaving the live view");
                break Ok(());
            }
            Err(_) => break Ok(()),
        }
    };
    drop(guard);
    if let Some(receivers) = &receivers {
        runtime.block_on(receivers.stop());
    }
    // The thread finishes its current tick; a hung NVML call is left behind, we are exiting.
    sampler.stop(Duration::from_secs(1));
    runtime.shutdown_background();
    for line in logs.drain() {
        eprintln!("{line}");
    }
    outcome
}

/// Forwards key presses and resizes until the loop is gone or the terminal closes.
fn read_keys(events: &mpsc::Sender<Event>) {
    use crossterm::event::{read, Event as Term};
    loop {
        let event = match read() {
            Ok(Term::Key(key)) => Event::Key(key),
            Ok(Term::Resize(..)) => Event::Resize,
            Ok(_) => continue,
            Err(e) => {
                let _ = events.send(Event::InputClosed(e));
                return;
            }
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

/// The host name, as the kernel has it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_defaults_to_one_second_and_refuses_what_nvml_cannot_do() {
        assert_eq!(interval(&TopArgs::default()).unwrap(), DEFAULT_INTERVAL);
        let ok = TopArgs {
            interval: Some("500ms".into()),
            ..TopArgs::default()
        };
        assert_eq!(interval(&ok).unwrap(), Duration::from_millis(500));
        let fast = TopArgs {
            interval: Some("10ms".into()),
            ..TopArgs::default()
        };
        let message = interval(&fast).unwrap_err().to_string();
        assert!(
            message.contains("--interval 10ms") && message.contains("minimum"),
            "{message}"
        );
    }
}
