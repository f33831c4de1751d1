//! `gpulse record -- CMD` and `gpulse report`: thin wiring. `record` starts the command, runs
//! the same sampler and [`WindowLoop`] as `gpulse run` while it lives, feeds a
//! [`Recorder`] and, when an OTLP endpoint was set, the same [`Exporter`] as `run`; when the
//! command exits it flushes the export for a few seconds at most, prints the summary, writes the
//! report and returns the command's exit status. The recording's stages live in
//! [`crate::record`].

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, MissedTickBehavior};

use super::receivers::{self, IntakePlan};
use crate::cli::{RecordArgs, ReportArgs};
use crate::config::otlp::ExporterKind;
use crate::config::{Config, ExportSettings, SignalSinks, Sink};
use crate::enrich::Receivers;
use crate::export::metrics::Extremes;
use crate::export::transport::{SignalTransports, TransportBuildError};
use crate::export::{ExportOutcome, Exporter};
use crate::pipeline::{snapshot_channel, SamplerSettings, SamplerThread, WindowLoop};
use crate::record::child::{CommandExit, RunningCommand};
use crate::record::recorder::Recorder;
use crate::record::recording::Recording;
use crate::record::summary::{ExportSummary, Summary};
use crate::record::{html, job, otlp_json_reader};
use crate::values::{parse_price, Prices};

/// Why a recording's outputs could not be written, or a report not made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("cannot write {what} to {path}: {source}. Pick a writable path with {flag}")]
    Output {
        what: &'static str,
        path: PathBuf,
        flag: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Recording(#[from] otlp_json_reader::ReadError),
    #[error(transparent)]
    Job(#[from] job::JobError),
    #[error("{flag} {text:?}: {reason}")]
    Price {
        flag: &'static str,
        text: String,
        reason: String,
    },
    #[error("the stdout exporter (--exporter stdout/console, or console in OTEL_METRICS_EXPORTER or OTEL_LOGS_EXPORTER) would mix OTLP lines into the command's standard output, which `gpulse record` passes through untouched. Unset it for this command; the run is kept by --report and --json")]
    StdoutExporter,
    #[error(transparent)]
    Transport(#[from] TransportBuildError),
    #[error("gpulse could not start its runtime: {0}")]
    Runtime(std::io::Error),
}

/// How long `record` waits at exit for the backend to take what is still queued: someone is
/// waiting for their prompt, and a dead endpoint must not hold it for the 10 s `run` allows.
pub(crate) const EXPORT_FLUSH: Duration = Duration::from_secs(3);

/// The settings the exporter gets: `run`'s when an OTLP endpoint was set explicitly, else
/// every sink off, so that recording a job never sends anything to a default `localhost:4318`
/// nobody asked for (and the receiver forwards nothing).
fn export_settings(settings: &ExportSettings) -> ExportSettings {
    let mut settings = settings.clone();
    if !settings.otlp_endpoint_explicit {
        settings.sinks = SignalSinks {
            metrics: Sink::Off,
            prometheus: false,
            logs: Sink::Off,
            forward: Sink::Off,
        };
        settings.exporter = ExporterKind::Off;
    }
    settings
}

/// The report's and the JSON summary's files, opened before the command starts so a bad path
/// fails at once, not after a three-hour run.
struct Outputs {
    report: Option<(PathBuf, File)>,
    json: Option<(PathBuf, File)>,
}

fn create(path: &Path, what: &'static str, flag: &'static str) -> Result<File, RecordError> {
    File::create(path).map_err(|source| RecordError::Output {
        what,
        path: path.to_path_buf(),
        flag,
        source,
    })
}

impl Outputs {
    fn open(args: &RecordArgs, started: SystemTime) -> Result<Self, RecordError> {
        let report = match &args.report {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p.clone()),
            None => Some(default_report_path(started)),
        };
        Ok(Self {
            report: report
                .map(|p| {
                    let p = absolute(p);
                    create(&p, "the HTML report", "--report").map(|f| (p, f))
                })
                .transpose()?,
            json: args
                .json
                .as_ref()
                .map(|p| {
                    let p = absolute(p.clone());
                    create(&p, "the JSON summary", "--json").map(|f| (p, f))
                })
                .transpose()?,
        })
    }
}

/// The path as the summary prints it: absolute, so it can be copied off the machine as it is
/// (`scp host:PATH .`) whatever directory the command was started from.
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// `gpulse-record-20260102-150405.html`: sortable, and no `:` (awkward in shells and on scp).
fn default_report_path(at: SystemTime) -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(at).to_string();
    let compact: String = stamp
        .trim_end_matches('Z')
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect::<String>()
        .replace('T', "-");
    PathBuf::from(format!("gpulse-record-{compact}.html"))
}

/// Runs the command, records it, and returns the exit status gpulse should exit with.
///
/// # Errors
/// Only before the command starts: an output file cannot be created, or a setting is refused.
pub fn record(config: &Config, args: &RecordArgs) -> Result<u8, RecordError> {
    if config.export.sinks.uses_stdout() {
        return Err(RecordError::StdoutExporter);
    }
    let export = export_settings(&config.export);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gpulse-record-rt")
        .enable_all()
        .build()
        .map_err(RecordError::Runtime)?;
    // A refused endpoint fails now, not after the run (gRPC transports need the runtime).
    let transports = runtime
        .block_on(async { SignalTransports::from_exporter(&export.exporter, &export.sinks) })?;
    let started = SystemTime::now();
    let outputs = Outputs::open(args, started)?;
    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // The command starts first: whatever happens to NVML, the job runs.
    let child = match RunningCommand::spawn(&args.command) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("gpulse record: {e}");
            return Ok(e.exit_code());
        }
    };
    let mut recorder = Recorder::new(
        command,
        Some(child.pid()),
        config.common.analysis.proc_root.clone(),
        config.sample_interval,
    )
    .with_prices(config.common.analysis.prices);
    let watched = runtime.block_on(watch(config, &export, transports, child, &mut recorder));
    let recording = recorder.finish(watched.ended, Some(watched.exit));
    write_outputs(&recording, outputs, watched.export.as_ref());
    Ok(watched.exit.exit_code())
}

/// How the watch ended.
struct Watched {
    exit: CommandExit,
    /// When the command exited: the recording's end (the export's flush comes after it).
    ended: SystemTime,
    /// `None` when nothing was exported.
    export: Option<ExportOutcome>,
}

/// Samples, analyses and exports until the command exits, then flushes the export (when there
/// is one) for [`EXPORT_FLUSH`] at most.
async fn watch(
    config: &Config,
    export: &ExportSettings,
    transports: SignalTransports,
    child: RunningCommand,
    recorder: &mut Recorder,
) -> Watched {
    let mut exited = child.into_exit_channel();
    let (tx, mut snapshots) = snapshot_channel(config.sample_interval, config.export_interval);
    let sampler = match SamplerThread::spawn(
        SamplerSettings {
            nvml_lib: config.common.nvml_lib.clone(),
            interval: config.sample_interval,
            wait_for_gpu: false,
            // Every field: it keeps (or shows) them all, whatever the switches.
            unread_fields: Default::default(),
        },
        tx,
    ) {
        Ok(sampler) => Some(sampler),
        Err(e) => {
            recorder.no_gpu(e.to_string());
            None
        }
    };
    let Some(sampler) = sampler else {
        let exit = (&mut exited).await.unwrap_or(CommandExit::Code(1));
        return Watched {
            exit,
            ended: SystemTime::now(),
            export: None,
        };
    };
    let mut windows = WindowLoop::new(&config.common.analysis);
    let mut exporter = Exporter::with_transports(
        export,
        (
            Extremes::for_intervals(config.sample_interval, config.export_interval),
            config.common.metrics,
        ),
        transports,
        Arc::clone(&sampler.health),
        windows.subscribe(),
    );
    let (receivers, spans) = start_receivers(config, &mut windows, &exporter).await;
    let mut tick = tokio::time::interval_at(
        Instant::now() + config.export_interval,
        config.export_interval,
    );
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (exit, ended) = loop {
        tokio::select! {
            biased;
            exit = &mut exited => break (exit.unwrap_or(CommandExit::Code(1)), SystemTime::now()),
            Some(snapshot) = snapshots.recv() => {
                recorder.add(&snapshot);
                windows.add(&snapshot);
            }
            _ = tick.tick() => close_window(&mut windows, recorder, &mut exporter),
        }
    };
    if !sampler.stop(Duration::from_secs(2)) {
        tracing::warn!("the sampler thread is stuck in an NVML call; leaving it behind");
    }
    while let Ok(snapshot) = snapshots.try_recv() {
        recorder.add(&snapshot);
        windows.add(&snapshot);
    }
    close_window(&mut windows, recorder, &mut exporter);
    if let Some(receivers) = &receivers {
        receivers.stop().await;
    }
    if let Some(spans) = spans {
        spans.try_iter().for_each(|span| recorder.add_span(span));
    }
    let exports = exporter.sends_anything();
    let outcome = exporter.shutdown(EXPORT_FLUSH).await;
    Watched {
        exit,
        ended,
        export: exports.then_some(outcome),
    }
}

/// Closes the window: the recorder keeps its findings and workloads, the exporter sends it.
fn close_window(windows: &mut WindowLoop, recorder: &mut Recorder, exporter: &mut Exporter) {
    let analysis = windows.close_window();
    if let Some(analysis) = &analysis {
        recorder.observe_findings(&analysis.events);
        recorder.observe_workloads(&analysis.attributed);
        recorder.observe_causes(&analysis.attributed);
    }
    exporter.export(analysis.as_ref());
}

/// The local OTLP receiver, when `--otlp-receiver-grpc/-http` asks for one: the companion's
/// spans join the report, and what it accepts is forwarded through the exporter's queue when an
/// endpoint carries its signal. It cannot start (a port taken): said, and the recording goes on.
async fn start_receivers(
    config: &Config,
    windows: &mut WindowLoop,
    exporter: &Exporter,
) -> (
    Option<Receivers>,
    Option<std::sync::mpsc::Receiver<crate::record::training_spans::ReceivedSpan>>,
) {
    if !config.otlp_receiver.enabled() {
        return (None, None);
    }
    let (observer, spans) = crate::record::training_spans::collector();
    let plan = IntakePlan::forwarding(config, exporter, Some(observer));
    match receivers::start(plan, windows).await {
        Ok(receivers) => (Some(receivers), Some(spans)),
        Err(e) => {
            tracing::error!("{e}; recording without the companion's spans");
            (None, None)
        }
    }
}

/// Writes the report, then prints the summary and writes it as JSON (naming the report); a
/// failure to write one file is said and does not stop the others (the summary on standard
/// error always comes).
fn write_outputs(recording: &Recording, outputs: Outputs, exported: Option<&ExportOutcome>) {
    let mut summary = Summary::of(recording);
    summary.export = exported.map(ExportSummary::of);
    let mut notes = String::new();
    if let Some(outcome) = exported {
        for (n, line) in outcome.describe().lines().enumerate() {
            let indent = if n == 0 { "  " } else { "    " };
            notes.push_str(&format!("{indent}{line}\n"));
        }
    }
    if let Some((path, mut file)) = outputs.report {
        match file.write_all(html::render(recording).as_bytes()) {
            Ok(()) => {
                notes.push_str(&format!("  report: {}\n", path.display()));
                summary.report = Some(path.display().to_string());
            }
            Err(e) => notes.push_str(&format!(
                "  could not write the report to {}: {e}\n",
                path.display()
            )),
        }
    }
    if let Some((path, mut file)) = outputs.json {
        let written = serde_json::to_writer_pretty(&mut file, &summary)
            .map_err(std::io::Error::from)
            .and_then(|()| file.write_all(b"\n"));
        match written {
            Ok(()) => notes.push_str(&format!("  summary JSON: {}\n", path.display())),
            Err(e) => notes.push_str(&format!(
                "  could not write the JSON summary to {}: {e}\n",
                path.display()
            )),
        }
    }
    eprint!("{}{notes}", summary.render_text());
}

/// `gpulse report RECORDING -o FILE.html`.
///
/// # Errors
/// The recording cannot be read or holds no OTLP metrics, or an output cannot be written.
pub fn report(args: &ReportArgs) -> Result<String, RecordError> {
    let prices = report_prices(args)?;
    let single = match args.recordings.as_slice() {
        [one] if args.job.is_none() => one,
        _ => return job_report(args, &prices),
    };
    let mut recording = otlp_json_reader::read_path(single)?;
    recording.prices = prices;
    let mut summary = Summary::of(&recording);
    summary.report = Some(absolute(args.output.clone()).display().to_string());
    write_report(
        args,
        &html::render(&recording),
        &summary,
        "the JSON summary",
    )?;
    let mut text = summary.render_text();
    if let Some(report) = &summary.report {
        text.push_str(&format!("  report: {report}\n"));
    }
    Ok(text)
}

/// `--cost-per-gpu-hour` and `--cost-per-kwh` of `gpulse report` (flags only: a report is made
/// where the recordings are, not where gpulse runs).
fn report_prices(args: &ReportArgs) -> Result<Prices, RecordError> {
    let parse = |flag: &'static str, raw: &Option<String>| {
        raw.as_deref()
            .map(|text| {
                parse_price(text).map_err(|reason| RecordError::Price {
                    flag,
                    text: text.to_string(),
                    reason,
                })
            })
            .transpose()
    };
    Ok(Prices {
        per_gpu_hour: parse("--cost-per-gpu-hour", &args.cost.cost_per_gpu_hour)?,
        per_kwh: parse("--cost-per-kwh", &args.cost.cost_per_kwh)?,
    })
}

/// `gpulse report FILE... [--job ID]`: one report for the job over every node's recording.
fn job_report(args: &ReportArgs, prices: &Prices) -> Result<String, RecordError> {
    let mut report = job::build(&args.recordings, args.job.as_deref(), prices)?;
    report.report = Some(absolute(args.output.clone()).display().to_string());
    write_report(
        args,
        &job::page::render(&report),
        &report,
        "the JSON report",
    )?;
    let mut text = report.render_text();
    if let Some(path) = &report.report {
        text.push_str(&format!("  report: {path}\n"));
    }
    Ok(text)
}

/// `gpulse report`'s outputs: the page to `-o`, and `json` (`what`, as errors name it) to
/// `--json` when asked for.
fn write_report(
    args: &ReportArgs,
    page: &str,
    json: &impl serde::Serialize,
    what: &'static str,
) -> Result<(), RecordError> {
    let mut file = create(&args.output, "the HTML report", "-o")?;
    file.write_all(page.as_bytes())
        .map_err(|source| RecordError::Output {
            what: "the HTML report",
            path: args.output.clone(),
            flag: "-o",
            source,
        })?;
    if let Some(path) = &args.json {
        let mut out = create(path, what, "--json")?;
        serde_json::to_writer_pretty(&mut out, json)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|source| RecordError::Output {
                what,
                path: path.clone(),
                flag: "--json",
                source,
            })?;
    }
    Ok(())
}
