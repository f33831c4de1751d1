//! The recorded command, run as gpulse's child: standard input, output and error are inherited
//! untouched, signals sent to gpulse are forwarded to it, and its exit becomes gpulse's.
//!
//! Forwarding follows what the sender meant. A signal some process sent to gpulse alone
//! (`kill -TERM`, a scheduler stopping the job) is passed on. A signal the kernel raised for the
//! terminal's whole foreground process group (Ctrl-C, Ctrl-\, a closed SSH session) already
//! reached the child, which shares gpulse's process group; forwarding it too would interrupt the
//! command twice (a second KeyboardInterrupt in the middle of Python's cleanup). The siginfo
//! origin tells the two apart.
//!
//! The child is reaped in two steps (`waitid` with `WNOWAIT`, then `wait`) under the same lock
//! the forwarder holds while signalling, so a signal can never reach a process that reused the
//! child's PID.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::exfiltrator::origin::WithOrigin;
use signal_hook::iterator::{Handle, SignalsInfo};

/// Signals gpulse passes on to the command.
pub(crate) const FORWARDED: [i32; 6] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// Why the command could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SpawnError {
    #[error(
        "{program}: command not found (neither a path nor a name on PATH). Check the spelling, \
         or give the program's path"
    )]
    NotFound { program: String },
    #[error("{program}: cannot be executed ({source}). Check its permissions (chmod +x) and that it is a program or a script with a #! line")]
    NotExecutable {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program}: could not be started: {source}")]
    Other {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not install the signal handlers that forward signals to the command: {0}")]
    Signals(#[source] std::io::Error),
    #[error("no command given: write it after `--`, e.g. gpulse record -- python train.py")]
    Empty,
}

impl SpawnError {
    /// The exit status a shell gives for the same failure: 127 not found, 126 not executable.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            SpawnError::NotFound { .. } => 127,
            SpawnError::NotExecutable { .. } => 126,
            SpawnError::Other { .. } | SpawnError::Signals(_) | SpawnError::Empty => 125,
        }
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "by", content = "value")]
pub(crate) enum CommandExit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl CommandExit {
    pub(crate) fn of(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => CommandExit::Code(code),
            (None, Some(signal)) => CommandExit::Signal(signal),
            // Neither: only for a stopped or continued child, which `wait` does not return.
            (None, None) => CommandExit::Code(1),
        }
    }

    /// gpulse's own exit status: the command's, or 128 + N when signal N killed it (as a shell
    /// reports it).
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            CommandExit::Code(code) => (code & 0xff) as u8,
            CommandExit::Signal(signal) => (128 + signal).clamp(0, 255) as u8,
        }
    }
}

/// "SIGTERM" for 15; "signal 42" for what has no name here.
pub(crate) fn signal_name(signal: i32) -> String {
    signal_hook::low_level::signal_name(signal)
        .map(str::to_string)
        .unwrap_or_else(|| format!("signal {signal}"))
}

/// The command while it runs.
pub(crate) struct RunningCommand {
    pid: u32,
    exited: std::sync::mpsc::Receiver<CommandExit>,
    signals: Handle,
    forwarder: Option<JoinHandle<()>>,
}

/// Whether the child has been reaped; the forwarder signals only while it has not.
type Reaped = Arc<Mutex<bool>>;

impl RunningCommand {
    /// Starts `command` (program and arguments) with gpulse's standard streams and environment.
    ///
    /// # Errors
    /// The program is missing or not executable, or the signal handlers cannot be installed.
    pub(crate) fn spawn(command: &[OsString]) -> Result<Self, SpawnError> {
        let (program, args) = command.split_first().ok_or(SpawnError::Empty)?;
        // Installed before the child exists, so a signal in between neither kills gpulse (leaving
        // an orphan) nor gets lost.
        let mut signals = SignalsInfo::<WithOrigin>::new(FORWARDED).map_err(SpawnError::Signals)?;
        let name = program.to_string_lossy().into_owned();
        let child =
            Command::new(program)
                .args(args)
                .spawn()
                .map_err(|source| match source.kind() {
                    std::io::ErrorKind::NotFound => SpawnError::NotFound {
                        program: name.clone(),
                    },
                    std::io::ErrorKind::PermissionDenied => SpawnError::NotExecutable {
                        program: name.clone(),
                        source,
                    },
                    _ if source.raw_os_error() == Some(libc::ENOEXEC) => {
                        SpawnError::NotExecutable {
                            program: name.clone(),
                            source,
                        }
                    }
                    _ => SpawnError::Other {
                        program: name.clone(),
                        source,
                    },
                })?;
        let pid = child.id();
        let reaped: Reaped = Arc::new(Mutex::new(false));
        let handle = signals.handle();
        let forward_reaped = Arc::clone(&reaped);
        let forwarder = std::thread::Builder::new()
            .name("gpulse-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    forward(pid, &origin, &forward_reaped);
                }
            })
            .map_err(SpawnError::Signals)?;
        let (tx, exited) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("gpulse-child".into())
            .spawn(move || {
                let exit = reap(child, &reaped);
                let _ = tx.send(exit);
            })
            .map_err(SpawnError::Signals)?;
        Ok(Self {
            pid,
            exited,
            signals: handle,
            forwarder: Some(forwarder),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Blocks until the command has exited (`gpulse record` waits through
    /// [`into_exit_channel`](Self::into_exit_channel); the tests wait here).
    #[cfg(test)]
    pub(crate) fn wait(mut self) -> CommandExit {
        let exit = self.exited.recv().unwrap_or(CommandExit::Code(1));
        self.stop_forwarding();
        exit
    }

    /// A receiver-less wait for an async caller: hands the blocking wait to a thread.
    pub(crate) fn into_exit_channel(mut self) -> tokio::sync::oneshot::Receiver<CommandExit> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let exited = std::mem::replace(&mut self.exited, std::sync::mpsc::channel().1);
        std::thread::spawn(move || {
            let exit = exited.recv().unwrap_or(CommandExit::Code(1));
            self.stop_forwarding();
            let _ = tx.send(exit);
        });
        rx
    }

    fn stop_forwarding(&mut self) {
        self.signals.close();
        if let Some(forwarder) = self.forwarder.take() {
            let _ = forwarder.join();
        }
    }
}

fn forward(pid: u32, origin: &signal_hook::low_level::siginfo::Origin, reaped: &Reaped) {
    // No sending process: the kernel raised it for the terminal's foreground process group,
    // which the child is in; it has it already.
    if origin.process.is_none() {
        tracing::debug!(
            "{} from the terminal reached the command directly",
            signal_name(origin.signal)
        );
        return;
    }
    let reaped = reaped.lock().unwrap_or_else(|p| p.into_inner());
    if *reaped {
        return;
    }
    tracing::debug!(
        "forwarding {} to the command (pid {pid})",
        signal_name(origin.signal)
    );
    // SAFETY: kill has no memory-safety preconditions; the PID is our unreaped child.
    unsafe {
        libc::kill(pid as libc::pid_t, origin.signal);
    }
}

/// Waits for the child to exit without reaping it, then reaps it under the lock, so the
/// forwarder never signals a PID the kernel may have given to another process.
fn reap(mut child: Child, reaped: &Reaped) -> CommandExit {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                child.id() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    let mut reaped = reaped.lock().unwrap_or_else(|p| p.into_inner());
    let status = child.wait();
    *reaped = true;
    match status {
        Ok(status) => CommandExit::of(status),
        Err(e) => {
            tracing::error!("could not read the command's exit status: {e}");
            CommandExit::Code(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(CommandExit::Code(3).exit_code(), 3);
        assert_eq!(CommandExit::Signal(15).exit_code(), 143);
    }

    #[test]
    fn a_real_child_exit_status_is_returned() {
        let child = RunningCommand::spawn(&cmd(&["sh", "-c", "exit 7"])).unwrap();
        assert_eq!(child.wait(), CommandExit::Code(7));
        let child = RunningCommand::spawn(&cmd(&["sh", "-c", "kill -KILL $$"])).unwrap();
        assert_eq!(child.wait(), CommandExit::Signal(libc::SIGKILL));
    }

    #[test]
    fn a_missing_program_is_named_with_127() {
        let Err(e) = RunningCommand::spawn(&cmd(&["gpulse-no-such-program-xyz"])) else {
            panic!("a missing program must not start");
        };
        assert_eq!(e.exit_code(), 127);
        assert!(
            e.to_string()
                .contains("gpulse-no-such-program-xyz: command not found"),
            "{e}"
        );
    }
}
