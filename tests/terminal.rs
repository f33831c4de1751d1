//! A real terminal for tests: a tmux server of its own (its own socket) with one session, read
//! with `capture-pane` and driven with `send-keys`, as a person at a terminal would. `gpulse top`
//! (its screen and keys) and `gpulse record` (Ctrl-C typed at the terminal) use it.
//!
//! Needs Debian's `tmux` (/usr/bin/tmux); without it the test fails and says what to install.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const TMUX: &str = "/usr/bin/tmux";

/// A tmux server of its own, killed (with what runs in it) on drop.
pub struct Tmux {
    socket: String,
    session: &'static str,
}

impl Tmux {
    /// A server whose session (created by the test with `new-session -s <session>`) is
    /// `session`.
    pub fn new(session: &'static str) -> Self {
        assert!(
            Path::new(TMUX).exists(),
            "{TMUX} is missing: install Debian's tmux (apt-get install tmux)"
        );
        // Tests run in parallel: each server needs a socket of its own.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            socket: format!("gpulse-test-{session}-{}-{n}", std::process::id()),
            session,
        }
    }

    pub fn run(&self, args: &[&str]) -> Output {
        let output = Command::new(TMUX)
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("run tmux");
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// The visible screen, one line per row.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", self.session]).stdout)
            .into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", self.session];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Polls the screen until `done` holds; panics with the last screen after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new(TMUX)
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}
