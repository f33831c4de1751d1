//! The floor for `benches/peers`: a process that makes only the NVML calls `gpulse run` makes
//! on a healthy device, every sample interval, and only the `/proc` reads its attribution makes
//! for every GPU process, every export interval, and nothing else (no aggregation, no
//! diagnosis, no OTLP). gpulse's whole-process CPU is reported as a multiple of this one's.
//!
//! ```text
//! cargo build --release --example bench_floor
//! target/release/examples/bench_floor --nvml-lib PATH [--sample-interval-ms 100]
//!     [--export-interval-ms 1000] [--proc-root /proc]
//! ```
//!
//! Per sample, every NVML call `Sampler::sample` makes, made by `gpulse::sampling::floor::Floor`:
//! the schema's field calls (derived from `src/schema`, so a new field is in the floor with no
//! change here), throttle, remapper, violations, GPM, NVLink, MIG and the process lists; a call
//! that once answered NOT_SUPPORTED is not made again, as in gpulse. Beside them, gpulse's own
//! XID event thread (`gpulse::sampling::events::XidWatcher`: the same event set and the same
//! timed `nvmlEventSetWait`): on a real driver the wait sleeps in the kernel, but on nvml-sim each
//! wake-up polls the scenario inside the library, about as much CPU as a tick's calls, and that
//! is NVML's cost, which gpulse pays and so must the floor. tests/floor.rs counts the per-tick
//! calls of the floor and of the sampler per NVML function in nvml-sim and fails when they
//! differ. Per export window: the GPU PIDs of the last sample, and for each of them the files
//! gpulse's attribution reads for a process it has seen before, through gpulse's own reader
//! (`stat` for its identity, CPU ticks and RSS, the `children` files that find its descendants,
//! whose CPU is counted in the process tree's, their `stat`, and its parent's), the files kept
//! open between windows as gpulse keeps them. Runs until killed (SIGTERM).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

use gpulse::attribution::procfiles::ProcFiles;
use gpulse::attribution::usage::ProcessTable;
use gpulse::sampling::events::XidWatcher;
use gpulse::sampling::floor::Floor;

struct Args {
    nvml_lib: PathBuf,
    sample_interval: Duration,
    export_interval: Duration,
    proc_root: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut nvml_lib = None;
    let mut sample_ms = 100u64;
    let mut export_ms = 1000u64;
    let mut proc_root = PathBuf::from("/proc");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let ms = |v: String| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} takes milliseconds (a positive integer), not {v:?}"))
        };
        match flag.as_str() {
            "--nvml-lib" => nvml_lib = Some(PathBuf::from(value()?)),
            "--sample-interval-ms" => sample_ms = ms(value()?)?,
            "--export-interval-ms" => export_ms = ms(value()?)?,
            "--proc-root" => proc_root = PathBuf::from(value()?),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: bench_floor --nvml-lib PATH \
                     [--sample-interval-ms N] [--export-interval-ms N] [--proc-root DIR]"
                ))
            }
        }
    }
    Ok(Args {
        nvml_lib: nvml_lib.ok_or("--nvml-lib PATH is required (the libnvidia-ml.so to load)")?,
        sample_interval: Duration::from_millis(sample_ms),
        export_interval: Duration::from_millis(export_ms),
        proc_root,
    })
}

/// The per-window `/proc` reads, made by gpulse's own reader: `ProcessTable::scan_with` over
/// files kept open between windows (each GPU PID's `stat`, its main thread's `children` or,
/// when it has several threads, its `task/` listing and each thread's `children`, the `stat`
/// of each descendant found, and of each parent). Returns a checksum of what was read.
fn proc_window(files: &mut ProcFiles, pids: &BTreeSet<u32>) -> u64 {
    let pids: Vec<u32> = pids.iter().copied().collect();
    files.begin_window();
    let table = ProcessTable::scan_with(files, &pids).unwrap_or_default();
    files.end_window();
    pids.iter()
        .filter_map(|&pid| table.stat(pid))
        .map(|stat| stat.utime_ticks + stat.rss_pages)
        .fold(0, u64::wrapping_add)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("bench_floor: {e}");
            std::process::exit(2);
        }
    };
    let nvml = match Nvml::builder().lib_path(args.nvml_lib.as_os_str()).init() {
        Ok(nvml) => nvml,
        Err(e) => {
            eprintln!(
                "bench_floor: cannot open NVML from {}: {e}",
                args.nvml_lib.display()
            );
            std::process::exit(1);
        }
    };
    let nvml = Arc::new(nvml);
    let xid = XidWatcher::start(Arc::clone(&nvml));
    let mut floor = Floor::new(nvml);
    let mut pids = BTreeSet::new();
    let mut checksum = 0u64;
    let mut files = ProcFiles::for_root(&args.proc_root);
    let start = Instant::now();
    let mut next_sample = start;
    let mut next_window = start + args.export_interval;
    loop {
        let now = Instant::now();
        if now >= next_sample {
            checksum = checksum.wrapping_add(floor.tick());
            checksum = checksum.wrapping_add(xid.drain().len() as u64);
            pids.clear();
            pids.extend(floor.pids());
            next_sample += args.sample_interval;
            if next_sample < now {
                next_sample = now + args.sample_interval;
            }
        }
        if now >= next_window {
            checksum = checksum.wrapping_add(proc_window(&mut files, &pids));
            next_window += args.export_interval;
        }
        // Keeps the calls and reads from being optimised away.
        std::hint::black_box(checksum);
        let wake = next_sample.min(next_window);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
}
