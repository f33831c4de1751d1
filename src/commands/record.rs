//! `gpulse record -- CMD` and `gpulse report`: thin wiring. `record` starts the command, runs
//! the same sampler, window and [`Analyzer`] as `gpulse run` while it lives, feeds a
//! [`Recorder`], and when the command exits prints the summary, writes the report and returns
//! the command's exit status. The recording's stages live in [`crate::record`].

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, MissedTickBehavior};

use crate::cli::{RecordArgs, ReportArgs};
use crate::config::Config;
use crate::pipeline::Analyzer;
use crate::pipeline::{SamplerSettings, SamplerThread};
use crate::record::child::{CommandExit, RunningCommand};
use crate::record::model::Recording;
use crate::record::recorder::Recorder;
use crate::record::summary::Summary;
use crate::record::{html, otlp_json};
use crate::sampling::WindowAggregator;

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
    Recording(#[from] otlp_json::ReadError),
    #[error("the stdout exporter (--exporter stdout/console, or console in OTEL_METRICS_EXPORTER or OTEL_LOGS_EXPORTER) would mix OTLP lines into the command's standard output, which `gpulse record` passes through untouched. Unset it for this command; the run is kept by --report and --json")]
    StdoutExporter,
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
    if config.sinks.uses_stdout() {
        return Err(RecordError::StdoutExporter);
    }
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
        config.proc_root.clone(),
        config.sample_interval,
    );
    let exit = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gpulse-record-rt")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(watch(config, child, &mut recorder)),
        Err(e) => {
            recorder.no_gpu(format!("gpulse could not start its runtime: {e}"));
            child.wait()
        }
    };
    let recording = recorder.finish(SystemTime::now(), Some(exit));
    write_outputs(&recording, outputs);
    Ok(exit.exit_code())
}

/// Samples and analyses until the command exits.
async fn watch(config: &Config, child: RunningCommand, recorder: &mut Recorder) -> CommandExit {
    let mut exited = child.into_exit_channel();
    let capacity = (config.export_interval.as_nanos() / config.sample_interval.as_nanos())
        .clamp(4, 4096) as usize
        * 2;
    let (tx, mut snapshots) = tokio::sync::mpsc::channel(capacity);
    let sampler = match SamplerThread::spawn(
        SamplerSettings {
            nvml_lib: config.nvml_lib.clone(),
            interval: config.sample_interval,
            wait_for_gpu: false,
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
        return (&mut exited).await.unwrap_or(CommandExit::Code(1));
    };
    let mut analyzer = Analyzer::new(config);
    let (receivers, spans) = start_receivers(config, &analyzer).await;
    let mut aggregator = WindowAggregator::new();
    let mut tick = tokio::time::interval_at(
        Instant::now() + config.export_interval,
        config.export_interval,
    );
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let exit = loop {
        tokio::select! {
            biased;
            exit = &mut exited => break exit.unwrap_or(CommandExit::Code(1)),
            Some(snapshot) = snapshots.recv() => {
                if let Some(receivers) = &receivers {
                    receivers.intake.history().record(&snapshot);
                }
                recorder.add(&snapshot);
                aggregator.add(&snapshot);
            }
            _ = tick.tick() => {
                if let Some(window) = aggregator.take() {
                    let analysis = analyzer.analyze(window);
                    if let Some(receivers) = &receivers {
                        receivers.intake.history().note_window(&analysis.attributed);
                    }
                    recorder.observe_findings(&analysis.events);
                }
            }
        }
    };
    if !sampler.stop(Duration::from_secs(2)) {
        tracing::warn!("the sampler thread is stuck in an NVML call; leaving it behind");
    }
    while let Ok(snapshot) = snapshots.try_recv() {
        recorder.add(&snapshot);
        aggregator.add(&snapshot);
    }
    if let Some(window) = aggregator.take() {
        recorder.observe_findings(&analyzer.analyze(window).events);
    }
    if let Some(receivers) = &receivers {
        receivers.stop();
    }
    if let Some(spans) = spans {
        spans.try_iter().for_each(|span| recorder.add_span(span));
    }
    exit
}

/// The local OTLP receiver, when `--otlp-receiver-grpc/-http` asks for one: the companion's
/// spans join the report. It cannot start (a port taken): said, and the recording goes on.
async fn start_receivers(
    config: &Config,
    analyzer: &Analyzer,
) -> (
    Option<crate::enrich::Receivers>,
    Option<std::sync::mpsc::Receiver<crate::record::spans::ReceivedSpan>>,
) {
    if !config.otlp_receiver.enabled() {
        return (None, None);
    }
    let limits = crate::export::queue::QueueLimits {
        max_bytes: usize::try_from(config.queue.max_bytes).unwrap_or(usize::MAX),
        max_age: config.queue.max_age,
    };
    let (queue, sender) = crate::export::queue::DeliveryQueue::new(
        limits,
        crate::export::queue::BackoffPolicy::default(),
        crate::record::spans::Discard,
    );
    tokio::spawn(sender.run());
    let (observer, spans) = crate::record::spans::collector();
    let intake = crate::enrich::Intake::new(
        queue,
        crate::enrich::HistoryHandle::new(config.otlp_receiver.history, config.sample_interval),
        crate::enrich::IntakeSettings {
            proc_root: config.proc_root.clone(),
            max_queue_bytes: limits.max_bytes,
            max_wait: config.sample_interval,
        },
    )
    .with_framework(analyzer.framework())
    .with_span_observer(observer);
    match crate::enrich::Receivers::start(
        config.otlp_receiver.grpc,
        config.otlp_receiver.http,
        std::sync::Arc::new(intake),
    )
    .await
    {
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
fn write_outputs(recording: &Recording, outputs: Outputs) {
    let mut summary = Summary::of(recording);
    let mut notes = String::new();
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
    let recording = otlp_json::read_path(&args.recording)?;
    let mut file = create(&args.output, "the HTML report", "-o")?;
    file.write_all(html::render(&recording).as_bytes())
        .map_err(|source| RecordError::Output {
            what: "the HTML report",
            path: args.output.clone(),
            flag: "-o",
            source,
        })?;
    let mut summary = Summary::of(&recording);
    summary.report = Some(absolute(args.output.clone()).display().to_string());
    if let Some(path) = &args.json {
        let mut json = create(path, "the JSON summary", "--json")?;
        serde_json::to_writer_pretty(&mut json, &summary)
            .map_err(std::io::Error::from)
            .map_err(|source| RecordError::Output {
                what: "the JSON summary",
                path: path.clone(),
                flag: "--json",
                source,
            })?;
    }
    let mut text = summary.render_text();
    if let Some(report) = &summary.report {
        text.push_str(&format!("  report: {report}\n"));
    }
    Ok(text)
}
