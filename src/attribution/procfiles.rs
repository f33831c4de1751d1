//! The `stat` and main-thread `children` files of the processes attribution reads every window,
//! kept open from one window to the next and re-read in place.
//!
//! Opening a procfs file walks its path (`/proc/<pid>/stat`: three lookups, a permission check,
//! a new file) and closing it frees it again; a profile of `gpulse run` with 64 real GPU
//! processes put a fifth of its samples in `openat` and `close`. A procfs `stat` or `children`
//! file is a `seq_file`: `pread` at offset 0 renders it afresh, so a file kept open reads the
//! current values at about a third of the cost. An open file stays bound to the process it was
//! opened for, not to its number: once that process is gone, reading fails with `ESRCH`, and
//! the file is dropped and the path opened again (a reused PID is then a new process, told
//! apart by its start time as everywhere else).
//!
//! Files not read during a window are closed at its end, so what stays open is bounded by the
//! processes of the last window, and by a share of the open-file limit
//! ([`ProcFiles::for_root`]); past that, files are opened and closed per read as before.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::procfs::{parse_stat, Stat};
use crate::fast_map::FastMap;

/// Open files per process and their window of last use.
#[derive(Debug, Default)]
struct Open {
    stat: Option<File>,
    children: Option<File>,
    used_in: u64,
}

/// Open procfs files, by PID. See the module documentation.
#[derive(Debug)]
pub struct ProcFiles {
    root: PathBuf,
    open: FastMap<u32, Open>,
    /// How many processes may have files kept open (0: none, every read opens its file).
    max_processes: usize,
    window: u64,
    /// The bytes of the last file read (at its start), kept so a window's reads reuse one
    /// buffer instead of allocating and growing one per file.
    buffer: Vec<u8>,
}

/// The most processes whose files are kept open, whatever the open-file limit.
const MAX_PROCESSES: usize = 1024;

impl ProcFiles {
    /// Files under `proc_root`, keeping those of at most [`MAX_PROCESSES`] processes open, and
    /// at most a quarter of the soft open-file limit (two files per process): with the common
    /// default of 1024, 128 processes and 256 files, the rest left to sockets and NVML.
    pub fn for_root(proc_root: &Path) -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            0
        };
        Self::with_limit(proc_root, (soft / 8).min(MAX_PROCESSES))
    }

    /// Files under `proc_root`, none kept open: every read opens and closes its file.
    pub(crate) fn uncached(proc_root: &Path) -> Self {
        Self::with_limit(proc_root, 0)
    }

    fn with_limit(proc_root: &Path, max_processes: usize) -> Self {
        Self {
            root: proc_root.to_path_buf(),
            open: FastMap::default(),
            max_processes,
            window: 0,
            buffer: Vec::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Starts a window: files not read from now until [`Self::end_window`] are closed then.
    pub fn begin_window(&mut self) {
        self.window += 1;
    }

    /// Closes the files of the processes not read since [`Self::begin_window`].
    pub fn end_window(&mut self) {
        let window = self.window;
        self.open.retain(|_, open| open.used_in == window);
    }

    /// Number of processes with a file kept open.
    pub fn open_processes(&self) -> usize {
        self.open.len()
    }

    /// `<root>/<pid>/stat`, parsed; `Ok(None)` when it read but did not parse.
    pub fn stat(&mut self, pid: u32) -> io::Result<Option<Stat>> {
        Ok(parse_stat(self.read(pid, Which::Stat)?))
    }

    /// `<root>/<pid>/task/<pid>/children`: the children of the process's main thread, written
    /// into `children` (cleared first) as the PIDs the file lists.
    pub(crate) fn main_thread_children(
        &mut self,
        pid: u32,
        children: &mut Vec<u32>,
    ) -> io::Result<()> {
        let text = self.read(pid, Which::Children)?;
        children.clear();
        children.extend(parse_children(text));
        Ok(())
    }

    /// The file's text, in the reader's buffer until the next read.
    fn read(&mut self, pid: u32, which: Which) -> io::Result<&str> {
        let window = self.window;
        if let Some(open) = self.open.get_mut(&pid) {
            open.used_in = window;
            if let Some(file) = which.slot(open) {
                match read_from_start(file, &mut self.buffer) {
                    Ok(len) => return as_text(&self.buffer[..len]),
                    // Gone (ESRCH), or anything else: open the path again, which says what
                    // the caller should see (the same error, or a new process).
                    Err(_) => *which.slot(open) = None,
                }
            }
        }
        let file = File::open(which.path(&self.root, pid))?;
        let len = read_from_start(&file, &mut self.buffer)?;
        let keep = self.open.contains_key(&pid) || self.open.len() < self.max_processes;
        if keep {
            let open = self.open.entry(pid).or_default();
            open.used_in = window;
            *which.slot(open) = Some(file);
        }
        as_text(&self.buffer[..len])
    }
}

/// The PIDs a `children` file lists (space-separated); anything else in it is skipped.
pub(crate) fn parse_children(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.split_ascii_whitespace()
        .filter_map(|child| child.parse::<u32>().ok())
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Stat,
    Children,
}

impl Which {
    fn path(self, root: &Path, pid: u32) -> PathBuf {
        let dir = root.join(pid.to_string());
        match self {
            Which::Stat => dir.join("stat"),
            Which::Children => dir.join("task").join(pid.to_string()).join("children"),
        }
    }

    fn slot(self, open: &mut Open) -> &mut Option<File> {
        match self {
            Which::Stat => &mut open.stat,
            Which::Children => &mut open.children,
        }
    }
}

/// How much one `pread` asks for.
const CHUNK: usize = 4096;

/// The whole file into `buffer`, read with `pread` from offset 0 (which makes a procfs
/// `seq_file` render its content afresh); returns its length. A read shorter than asked is the
/// end: a `seq_file` read fills the buffer until its content ends, and a regular file (a copied
/// procfs tree in tests) is read the same. The buffer only grows, so it is zeroed once, not
/// per read.
fn read_from_start(file: &File, buffer: &mut Vec<u8>) -> io::Result<usize> {
    let mut len = 0;
    loop {
        if buffer.len() < len + CHUNK {
            buffer.resize(len + CHUNK, 0);
        }
        let n = match file.read_at(&mut buffer[len..len + CHUNK], len as u64) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        len += n;
        if n < CHUNK {
            return Ok(len);
        }
    }
}

/// The bytes read as UTF-8, as `std::fs::read_to_string` would (`InvalidData` otherwise).
fn as_text(content: &[u8]) -> io::Result<&str> {
    std::str::from_utf8(content).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn utime(files: &mut ProcFiles, pid: u32) -> u64 {
        files
            .stat(pid)
            .expect("read stat")
            .expect("parse stat")
            .utime_ticks
    }

    /// A file kept open reads the process's current counters, not those of when it was opened.
    #[test]
    fn a_kept_file_reads_fresh_values_and_an_exited_process_reads_as_gone() {
        let mut busy = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("spawn a busy shell");
        let pid = busy.id();
        let mut files = ProcFiles::with_limit(Path::new("/proc"), 8);
        files.begin_window();
        let first = utime(&mut files, pid);
        assert_eq!(files.open_processes(), 1, "the file is kept");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut later = first;
        while later == first && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            later = utime(&mut files, pid);
        }
        assert!(
            later > first,
            "utime moved from {first} while the shell spun"
        );

        busy.kill().expect("kill");
        busy.wait().expect("reap");
        let gone = files.stat(pid);
        assert!(
            gone.is_err(),
            "a reaped process's kept stat must not read as alive: {gone:?}"
        );
        files.end_window();
    }

    /// The reader's one buffer: a file longer than a read chunk comes whole, and a shorter one
    /// read after it carries nothing of it (a copied procfs tree: regular files).
    #[test]
    fn one_buffer_reads_long_and_short_files_whole_and_apart() {
        let root = tempfile::tempdir().expect("temp dir");
        let stat_line = |pid: u32, comm: &str| {
            let mut fields: Vec<String> = (4..=52).map(|n| n.to_string()).collect();
            fields[0] = "1".into(); // ppid
            format!("{pid} ({comm}) S {}\n", fields.join(" "))
        };
        let long_comm = "x".repeat(3 * CHUNK);
        for (pid, comm) in [(10, long_comm.as_str()), (11, "short")] {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).expect("pid dir");
            std::fs::write(dir.join("stat"), stat_line(pid, comm)).expect("stat");
        }
        let mut files = ProcFiles::with_limit(root.path(), 8);
        files.begin_window();
        for _ in 0..2 {
            let long = files.stat(10).expect("read").expect("parse");
            assert_eq!(
                long.comm, long_comm,
                "the whole of a file over {CHUNK} bytes"
            );
            assert_eq!((long.ppid, long.utime_ticks), (1, 14));
            let short = files.stat(11).expect("read").expect("parse");
            assert_eq!(short.comm, "short");
            assert_eq!((short.ppid, short.start_time_ticks), (1, 22));
        }
        files.end_window();
    }

    #[test]
    fn files_not_read_in_a_window_are_closed_and_the_limit_holds() {
        let own = std::process::id();
        let mut files = ProcFiles::with_limit(Path::new("/proc"), 1);
        files.begin_window();
        assert!(files.stat(own).expect("own stat").is_some());
        let mut children = vec![u32::MAX];
        files
            .main_thread_children(own, &mut children)
            .expect("own children file");
        assert!(
            !children.contains(&u32::MAX),
            "the list is replaced, not added to"
        );
        assert!(files.stat(1).is_ok_and(|s| s.is_some()), "init, read");
        assert_eq!(files.open_processes(), 1, "one process at most");
        files.end_window();
        assert_eq!(files.open_processes(), 1);
        files.begin_window();
        files.end_window();
        assert_eq!(files.open_processes(), 0, "not read in the window: closed");

        let mut uncached = ProcFiles::uncached(Path::new("/proc"));
        assert!(uncached.stat(own).expect("own stat").is_some());
        assert_eq!(uncached.open_processes(), 0);
    }
}
