//! Log lines of `gpulse top`, kept in memory: a line written to standard error while the view owns
//! the terminal would tear the screen, so the newest lines are shown in the footer instead, and
//! printed to standard error once the terminal is restored.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};

/// How many lines are kept; older ones are dropped.
const KEPT_LINES: usize = 50;

/// A shared buffer of the newest log lines; clones share it.
#[derive(Debug, Clone, Default)]
pub struct LogLines {
    lines: Arc<Mutex<VecDeque<String>>>,
}

impl LogLines {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The newest line, if any.
    pub(crate) fn last(&self) -> Option<String> {
        self.lock().back().cloned()
    }

    /// Every kept line, oldest first, emptying the buffer.
    pub(crate) fn drain(&self) -> Vec<String> {
        self.lock().drain(..).collect()
    }

    fn push(&self, line: &str) {
        let mut lines = self.lock();
        if lines.len() == KEPT_LINES {
            lines.pop_front();
        }
        lines.push_back(line.to_string());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A writer for `tracing_subscriber::fmt().with_writer(..)`: each event is written whole by
    /// one writer, which stores its lines when dropped.
    pub(crate) fn writer(&self) -> LineWriter {
        LineWriter {
            lines: self.clone(),
            buffer: Vec::new(),
        }
    }
}

/// Collects one log event's bytes; see [`LogLines::writer`].
pub(crate) struct LineWriter {
    lines: LogLines,
    buffer: Vec<u8>,
}

impl io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buffer);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.lines.push(line.trim_end());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn keeps_the_newest_lines_whole() {
        let logs = LogLines::new();
        for i in 0..(KEPT_LINES + 3) {
            let mut w = logs.writer();
            write!(w, "WARN line ").unwrap();
            writeln!(w, "{i}").unwrap();
        }
        assert_eq!(logs.last().as_deref(), Some("WARN line 52"));
        let all = logs.drain();
        assert_eq!(all.len(), KEPT_LINES);
        assert_eq!(all[0], "WARN line 3");
        assert!(logs.last().is_none());
    }
}
