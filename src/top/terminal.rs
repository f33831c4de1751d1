//! The terminal while the live view runs: raw mode and the alternate screen, entered only when
//! both standard input and output are terminals, and restored on every way out — a normal return,
//! an error (the guard's `Drop`) and a panic (a hook that restores before the panic message is
//! printed, so the message is readable and the shell is usable). A terminal left in raw mode is
//! the bug users remember.

use std::io::{self, IsTerminal, Stdout};

use crossterm::cursor::{Hide, Show};
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

/// Which standard stream is not a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotATerminal {
    Stdin,
    Stdout,
}

/// `Err` naming the first standard stream that is not a terminal.
pub(crate) fn check_terminal() -> Result<(), NotATerminal> {
    if !io::stdout().is_terminal() {
        return Err(NotATerminal::Stdout);
    }
    if !io::stdin().is_terminal() {
        return Err(NotATerminal::Stdin);
    }
    Ok(())
}

/// Owns the terminal in raw mode on the alternate screen; dropping it restores the terminal.
pub(crate) struct TerminalGuard {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl TerminalGuard {
    /// Enters raw mode and the alternate screen, and installs the panic hook.
    ///
    /// # Errors
    /// The terminal refused a mode change; whatever was changed is restored first.
    pub(crate) fn enter() -> io::Result<Self> {
        install_panic_hook();
        enable_raw_mode()?;
        if let Err(e) = execute!(io::stdout(), EnterAlternateScreen, Hide) {
            restore();
            return Err(e);
        }
        match Terminal::new(CrosstermBackend::new(io::stdout())) {
            Ok(terminal) => Ok(Self { terminal }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves the alternate screen and raw mode and shows the cursor; safe to call twice.
pub(crate) fn restore() {
    let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
    let _ = disable_raw_mode();
}

/// Restores the terminal before the previous hook prints the panic, once per process.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}
