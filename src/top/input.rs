//! Keys to actions, and the vocabulary they speak: the sort keys and the input modes the view's
//! state holds. Everything works from a plain keyboard over SSH (no mouse, no function keys
//! needed): arrows or j/k move, letters sort, `/` filters, `t` toggles the tree, `r` the roll-ups
//! panel, Enter opens the detail pane, `q` or Ctrl-C quits.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// What the process table is ordered by (largest first, except the PID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SortKey {
    GpuMemory,
    Sm,
    Cpu,
    Pid,
}

impl SortKey {
    pub(crate) fn label(self) -> &'static str {
        match self {
            SortKey::GpuMemory => "GPU mem",
            SortKey::Sm => "SM",
            SortKey::Cpu => "CPU",
            SortKey::Pid => "PID",
        }
    }
}

/// Whether keys edit the filter text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Normal,
    Filtering,
}

/// What a key asks the view to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Quit,
    Sort(SortKey),
    StartFilter,
    FilterChar(char),
    FilterBackspace,
    /// Keep the filter and go back to normal keys.
    FilterDone,
    /// Clear the filter.
    FilterCancel,
    ToggleTree,
    /// Show or hide the roll-ups by job, pod and container.
    ToggleRollups,
    ToggleDetail,
    CloseDetail,
    /// Move the selection by this many rows.
    Move(isize),
    Home,
    End,
}

/// The action of `key` in `mode`; `None` for keys that mean nothing there.
pub(crate) fn action(key: KeyEvent, mode: Mode) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('C')) {
        return Some(Action::Quit);
    }
    match mode {
        Mode::Filtering => match key.code {
            KeyCode::Enter => Some(Action::FilterDone),
            KeyCode::Esc => Some(Action::FilterCancel),
            KeyCode::Backspace => Some(Action::FilterBackspace),
            KeyCode::Char(c) if !ctrl => Some(Action::FilterChar(c)),
            KeyCode::Up => Some(Action::Move(-1)),
            KeyCode::Down => Some(Action::Move(1)),
            _ => None,
        },
        Mode::Normal => match key.code {
            KeyCode::Char('q') => Some(Action::Quit),
            KeyCode::Char('m') => Some(Action::Sort(SortKey::GpuMemory)),
            KeyCode::Char('s') => Some(Action::Sort(SortKey::Sm)),
            KeyCode::Char('c') => Some(Action::Sort(SortKey::Cpu)),
            KeyCode::Char('p') => Some(Action::Sort(SortKey::Pid)),
            KeyCode::Char('/') => Some(Action::StartFilter),
            KeyCode::Char('t') => Some(Action::ToggleTree),
            KeyCode::Char('r') => Some(Action::ToggleRollups),
            KeyCode::Enter => Some(Action::ToggleDetail),
            KeyCode::Esc => Some(Action::CloseDetail),
            KeyCode::Up | KeyCode::Char('k') => Some(Action::Move(-1)),
            KeyCode::Down | KeyCode::Char('j') => Some(Action::Move(1)),
            KeyCode::PageUp => Some(Action::Move(-10)),
            KeyCode::PageDown => Some(Action::Move(10)),
            KeyCode::Home | KeyCode::Char('g') => Some(Action::Home),
            KeyCode::End | KeyCode::Char('G') => Some(Action::End),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn letters_sort_in_normal_mode_and_type_in_the_filter() {
        assert_eq!(
            action(key(KeyCode::Char('s')), Mode::Normal),
            Some(Action::Sort(SortKey::Sm))
        );
        assert_eq!(
            action(key(KeyCode::Char('s')), Mode::Filtering),
            Some(Action::FilterChar('s'))
        );
        assert_eq!(
            action(key(KeyCode::Char('q')), Mode::Filtering),
            Some(Action::FilterChar('q')),
            "q is text while filtering"
        );
    }

    #[test]
    fn ctrl_c_quits_in_every_mode() {
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action(ctrl_c, Mode::Normal), Some(Action::Quit));
        assert_eq!(action(ctrl_c, Mode::Filtering), Some(Action::Quit));
    }
}
