//! The per-process files of a procfs root (`stat`, `status`, `cmdline`, the `exe` link) and the
//! `passwd` database: pure parsers over their text, plus the small readers that fetch them.
//!
//! Readers return `Option`/`io::Result` and never panic: a process can exit between two reads,
//! and then a file that existed a moment ago is `NotFound` (or reads empty, or `ESRCH`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

/// The fields of `/proc/<pid>/stat` attribution and usage need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// `comm` (field 2), at most 15 bytes, as the kernel truncates it.
    pub comm: String,
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: char,
    /// Field 4.
    pub ppid: u32,
    /// Fields 14 and 15, in clock ticks.
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    /// Fields 16 and 17: CPU time of children this process has waited for, in clock ticks.
    pub cutime_ticks: u64,
    pub cstime_ticks: u64,
    /// Field 22: start time after boot, in clock ticks. With the PID, the identity of a process:
    /// a reused PID has a different start time.
    pub start_time_ticks: u64,
    /// Field 20: number of threads. With 1, the process's only thread is its main thread, whose
    /// task ID is the PID: descendants can be found without listing `task/`.
    pub num_threads: u32,
    /// Field 24: resident set size, in pages. The same counter as `VmRSS` in `status` (the
    /// kernel's `get_mm_rss`), so usage reads it here instead of rendering all of `status`.
    pub rss_pages: u64,
}

/// Parses the text of `/proc/<pid>/stat`. `None` when it is not shaped like one.
pub(crate) fn parse_stat(content: &str) -> Option<Stat> {
    // `comm` is in parentheses and may itself contain spaces and `)`, so it ends at the last `)`.
    let open = content.find('(')?;
    let close = content.rfind(')')?;
    if close < open {
        return None;
    }
    let comm = content[open + 1..close].to_string();
    // Fields 3 to 24, the last one read; `rest[0]` is field 3, field N is `rest[N - 3]`. An
    // array, not a Vec: this runs for every process every window. A field the line lacks stays
    // empty, which reads as absent (whitespace splitting never yields an empty field).
    let mut rest = [""; 22];
    for (slot, value) in rest
        .iter_mut()
        .zip(content[close + 1..].split_ascii_whitespace())
    {
        *slot = value;
    }
    let field = |n: usize| rest.get(n - 3).copied().filter(|f| !f.is_empty());
    let number = |n: usize| field(n).and_then(|f| f.parse::<u64>().ok());
    Some(Stat {
        comm,
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        utime_ticks: number(14)?,
        stime_ticks: number(15)?,
        // Kernel docs type these as signed; a negative value would be a kernel bug, read as 0.
        cutime_ticks: number(16).unwrap_or(0),
        cstime_ticks: number(17).unwrap_or(0),
        start_time_ticks: number(22)?,
        num_threads: number(20).and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
        rss_pages: number(24).unwrap_or(0),
    })
}

/// The boot time from the `btime` line of `/proc/stat`, in seconds since the Unix epoch: with a
/// process's start time (field 22 of its `stat`, ticks after boot) it dates the process
/// (`process.creation.time`). `None` when the line is missing or malformed.
pub(crate) fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|secs| secs.trim().parse().ok())
}

/// When a process started, from the boot time (`btime`, seconds since the epoch) and its start
/// time in clock ticks after boot.
pub(crate) fn creation_time(
    boot_time_secs: u64,
    start_time_ticks: u64,
    ticks_per_second: u64,
) -> Option<std::time::SystemTime> {
    if ticks_per_second == 0 {
        return None;
    }
    // `ticks % ticks_per_second` is below `ticks_per_second`, so widened the product fits.
    let fraction_ns = u128::from(start_time_ticks % ticks_per_second) * 1_000_000_000
        / u128::from(ticks_per_second);
    let after_boot = std::time::Duration::from_secs(start_time_ticks / ticks_per_second)
        + std::time::Duration::from_nanos(u64::try_from(fraction_ns).ok()?);
    // A procfs root other than the kernel's (`--proc-root`) can hold any numbers: a time past
    // what `SystemTime` holds is no time, not a panic.
    std::time::Duration::from_secs(boot_time_secs)
        .checked_add(after_boot)
        .and_then(|since_epoch| std::time::UNIX_EPOCH.checked_add(since_epoch))
}

/// The fields of `/proc/<pid>/status` attribution and usage need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// `Name:`, the same as `comm`.
    pub name: Option<String>,
    /// `NSpid:`: the PID in each PID namespace the process is in, outermost first.
    pub nspid: Vec<u32>,
    /// First value of `Uid:` (real uid).
    pub real_uid: Option<u32>,
    /// `VmRSS:`, converted from kB to bytes. Absent for kernel threads and zombies.
    pub vm_rss_bytes: Option<u64>,
}

impl Status {
    /// The PID the process sees for itself: the innermost `NSpid` entry.
    pub fn vpid(&self) -> Option<u32> {
        self.nspid.last().copied()
    }
}

/// Parses the text of `/proc/<pid>/status`. Lines it does not know or cannot read are skipped.
pub(crate) fn parse_status(content: &str) -> Status {
    let mut status = Status::default();
    for line in content.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Name" => status.name = Some(value.to_string()),
            "NSpid" => {
                // All or nothing: a half-parsed list would put the wrong PID last.
                status.nspid = value
                    .split_ascii_whitespace()
                    .map(str::parse)
                    .collect::<Result<Vec<u32>, _>>()
                    .unwrap_or_default();
            }
            "Uid" => {
                status.real_uid = value
                    .split_ascii_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
            }
            "VmRSS" => {
                status.vm_rss_bytes = value
                    .strip_suffix("kB")
                    .and_then(|kb| kb.trim().parse::<u64>().ok())
                    .and_then(|kb| kb.checked_mul(1024));
            }
            _ => {}
        }
    }
    status
}

/// `/proc/<pid>/cmdline` (NUL-separated arguments) as one space-joined line; `None` when empty
/// (kernel threads, zombies).
pub(crate) fn parse_cmdline(content: &[u8]) -> Option<String> {
    let args: Vec<String> = content
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    (!args.is_empty()).then(|| args.join(" "))
}

/// The executable name from the target of the `exe` link: its file name, without the
/// ` (deleted)` the kernel appends once the file was replaced (common after an upgrade).
pub fn executable_name(exe_target: &Path) -> Option<String> {
    let name = exe_target.file_name()?.to_string_lossy();
    let name = name.strip_suffix(" (deleted)").unwrap_or(&name);
    (!name.is_empty()).then(|| name.to_string())
}

/// uid → user name from the text of a `passwd` file. Malformed lines are skipped; the first
/// entry for a uid wins, as `getpwuid` does.
pub(crate) fn parse_passwd(content: &str) -> HashMap<u32, String> {
    let mut users = HashMap::new();
    for line in content.lines() {
        if line.starts_with('#') {
            continue;
        }
        let mut fields = line.split(':');
        let (Some(name), Some(_password), Some(uid)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(uid) = uid.parse::<u32>() else {
            continue;
        };
        if !name.is_empty() {
            users.entry(uid).or_insert_with(|| name.to_string());
        }
    }
    users
}

/// Paths of one process's files under a procfs root.
#[derive(Debug, Clone)]
pub(crate) struct ProcDir {
    dir: PathBuf,
}

impl ProcDir {
    pub fn new(proc_root: &Path, pid: u32) -> Self {
        Self {
            dir: proc_root.join(pid.to_string()),
        }
    }

    pub fn file(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.dir.join(name.as_ref())
    }

    /// `stat`, parsed. `Ok(None)` when it read but did not parse (a truncated read at exit).
    pub fn stat(&self) -> io::Result<Option<Stat>> {
        Ok(parse_stat(&read_to_string(&self.file("stat"))?))
    }

    pub fn status(&self) -> io::Result<Status> {
        Ok(parse_status(&read_to_string(&self.file("status"))?))
    }

    pub fn read_to_string(&self, name: &str) -> io::Result<String> {
        read_to_string(&self.file(name))
    }

    pub fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        read(&self.file(name))
    }

    pub(crate) fn exe_target(&self) -> io::Result<PathBuf> {
        std::fs::read_link(self.file("exe"))
    }
}

/// A procfs file's whole content. `std::fs::read` first asks the file's size (`statx`) and its
/// position (`lseek`) to size the buffer, but procfs files report size 0: two system calls
/// wasted on every read, and attribution reads a few hundred of these files each window.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut content = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return Ok(content),
            Ok(n) => content.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// [`read`], as UTF-8 (`InvalidData` otherwise, as `std::fs::read_to_string`).
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The PIDs (numeric directory names) under a procfs root.
pub(crate) fn list_pids(proc_root: &Path) -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else {
            continue;
        };
        if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (python3) S 4200 4242 4200 34816 4242 4194304 12000 0 3 0 \
        1500 250 7 3 20 0 12 0 987654 8589934592 32768 18446744073709551615 1 1 0 0 0 0 0 \
        16781312 16386 0 0 0 17 3 0 0 0 0 0\n";

    #[test]
    fn stat_fields_by_number() {
        let stat = parse_stat(STAT).expect("a well-formed stat line");
        assert_eq!(
            stat,
            Stat {
                comm: "python3".into(),
                state: 'S',
                ppid: 4200,
                utime_ticks: 1500,
                stime_ticks: 250,
                cutime_ticks: 7,
                cstime_ticks: 3,
                start_time_ticks: 987654,
                num_threads: 12,
                rss_pages: 32768,
            }
        );
    }

    #[test]
    fn stat_comm_with_spaces_and_parentheses() {
        let line = STAT.replace("(python3)", "(pt ) (worker)");
        let stat = parse_stat(&line).expect("comm ends at the last parenthesis");
        assert_eq!(stat.comm, "pt ) (worker");
        assert_eq!(stat.start_time_ticks, 987654);
    }

    #[test]
    fn stat_malformed() {
        for bad in [
            "",
            "4242",
            "4242 (python3",
            ") 4242 (x",
            "4242 (python3) S",
            "4242 (python3) S 4200 1 2 3",
            "4242 (python3) S x 4242 4200 34816 4242 4194304 12000 0 3 0 1 2 3 4 5 6 7 8 9",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn status_fields() {
        let status = parse_status(
            "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\n\
             Pid:\t4242\nPPid:\t4200\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n\
             NSpid:\t4242\t17\t1\nVmRSS:\t  204800 kB\n",
        );
        assert_eq!(status.name.as_deref(), Some("python3"));
        assert_eq!(status.nspid, vec![4242, 17, 1]);
        assert_eq!(status.vpid(), Some(1));
        assert_eq!(status.real_uid, Some(1000));
        assert_eq!(status.vm_rss_bytes, Some(204800 * 1024));
    }

    #[test]
    fn status_malformed_fields_are_absent() {
        let status = parse_status("Name\nNSpid:\t12\tx\nUid:\troot\nVmRSS:\t12 MB\n:::\n");
        assert_eq!(status, Status::default());
        // A kernel without NSpid (before 4.1) has no line at all.
        assert_eq!(parse_status("Name:\tx\n").vpid(), None);
    }

    #[test]
    fn cmdline_joins_arguments() {
        assert_eq!(
            parse_cmdline(b"python3\0train.py\0--lr\x000.1\0").as_deref(),
            Some("python3 train.py --lr 0.1")
        );
        assert_eq!(parse_cmdline(b""), None);
        assert_eq!(parse_cmdline(b"\0\0"), None);
        assert_eq!(parse_cmdline(b"a\xffb\0").as_deref(), Some("a\u{fffd}b"));
    }

    #[test]
    fn boot_time_and_creation_time() {
        let proc_stat = "cpu  1 2 3 4\nintr 5\nbtime 1700000000\nprocesses 42\n";
        assert_eq!(parse_boot_time(proc_stat), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1 2 3\nbtime x\n"), None);
        assert_eq!(parse_boot_time(""), None);
        let started = creation_time(1_700_000_000, 12_345, 100).expect("a time");
        assert_eq!(
            started.duration_since(std::time::UNIX_EPOCH).unwrap(),
            std::time::Duration::from_millis(1_700_000_123_450)
        );
        assert_eq!(creation_time(1, 2, 0), None);
        // Found by reading what the proc_files fuzz target drives: numbers no kernel writes.
        assert_eq!(creation_time(u64::MAX, u64::MAX, 100), None);
        assert_eq!(
            creation_time(0, u64::MAX, u64::MAX - 1),
            std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(1, 0))
        );
    }

    #[test]
    fn executable_name_from_link_target() {
        assert_eq!(
            executable_name(Path::new("/usr/bin/python3.11")).as_deref(),
            Some("python3.11")
        );
        assert_eq!(
            executable_name(Path::new("/opt/app/server (deleted)")).as_deref(),
            Some("server")
        );
        assert_eq!(executable_name(Path::new("/")), None);
    }

    #[test]
    fn passwd_lookup() {
        let users = parse_passwd(
            "root:x:0:0:root:/root:/bin/bash\n# comment\nbroken\nalice:x:1000:1000::/home/alice:/bin/sh\n\
             dup:x:1000:1000::/:/bin/sh\nbad:x:notanumber:0::/:/bin/sh\n:x:5:5::/:/bin/sh\n",
        );
        assert_eq!(users.get(&0).map(String::as_str), Some("root"));
        assert_eq!(users.get(&1000).map(String::as_str), Some("alice"));
        assert_eq!(users.len(), 2);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(content in "\\PC*") {
            let _ = parse_stat(&content);
            let _ = parse_status(&content);
            let _ = parse_passwd(&content);
            let _ = parse_cmdline(content.as_bytes());
        }
    }

    proptest::proptest! {
        /// Any `comm` (spaces, parentheses, `)` included, as the kernel allows) and any field
        /// values come back exactly from a line shaped like the kernel's.
        #[test]
        fn stat_fields_round_trip(
            comm in "[^\n]{0,15}",
            state in proptest::sample::select(vec!['R', 'S', 'D', 'Z', 'T', 'I']),
            ppid in 0u32..=4_194_304,
            utime in proptest::num::u64::ANY,
            stime in proptest::num::u64::ANY,
            start in proptest::num::u64::ANY,
            rss in proptest::num::u64::ANY,
        ) {
            let mut fields: Vec<String> = (4..=52).map(|n| format!("{n}")).collect();
            // `fields[i]` is field i + 4.
            fields[0] = ppid.to_string();
            fields[10] = utime.to_string();
            fields[11] = stime.to_string();
            fields[18] = start.to_string();
            fields[20] = rss.to_string();
            let line = format!("4242 ({comm}) {state} {}\n", fields.join(" "));
            let stat = parse_stat(&line).expect("a well-formed stat line");
            proptest::prop_assert_eq!(stat.comm, comm);
            proptest::prop_assert_eq!(stat.state, state);
            proptest::prop_assert_eq!(stat.ppid, ppid);
            proptest::prop_assert_eq!(stat.utime_ticks, utime);
            proptest::prop_assert_eq!(stat.stime_ticks, stime);
            proptest::prop_assert_eq!(stat.start_time_ticks, start);
            proptest::prop_assert_eq!(stat.rss_pages, rss);
        }

        /// The fields attribution needs survive any other lines around them, in any order.
        #[test]
        fn status_fields_survive_unknown_lines(
            nspid in proptest::collection::vec(1u32..=4_194_304, 1..5),
            uid in proptest::num::u32::ANY,
            rss_kb in 0u64..(u64::MAX / 1024),
            noise in proptest::collection::vec("[A-Za-z_]{1,12}:[^\n]{0,40}", 0..8),
            seed in proptest::num::u64::ANY,
        ) {
            let nspid_text: Vec<String> = nspid.iter().map(u32::to_string).collect();
            let mut lines: Vec<String> = noise
                .into_iter()
                // The keys under test only from the lines this test writes.
                .filter(|l| !["Name:", "NSpid:", "Uid:", "VmRSS:"].iter().any(|k| l.starts_with(k)))
                .collect();
            let known = [
                "Name:\tpython3".to_string(),
                format!("NSpid:\t{}", nspid_text.join("\t")),
                format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}"),
                format!("VmRSS:\t{rss_kb:>8} kB"),
            ];
            for (i, line) in known.into_iter().enumerate() {
                let at = (seed as usize).wrapping_add(i * 7) % (lines.len() + 1);
                lines.insert(at, line);
            }
            let status = parse_status(&lines.join("\n"));
            proptest::prop_assert_eq!(status.name.as_deref(), Some("python3"));
            proptest::prop_assert_eq!(status.vpid(), nspid.last().copied());
            proptest::prop_assert_eq!(status.nspid, nspid);
            proptest::prop_assert_eq!(status.real_uid, Some(uid));
            proptest::prop_assert_eq!(status.vm_rss_bytes, Some(rss_kb * 1024));
        }
    }
}
