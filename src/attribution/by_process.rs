//! State kept per GPU process and device (host PID and device UUID) from one window to the next,
//! as the accountant and the ledger keep their totals: found by the window's borrowed UUID, so
//! a window's lookups copy no string (a UUID is copied once, when its process is first seen),
//! and forgotten with the first window that does not touch it.

use crate::fast_map::FastMap;

/// Values by host PID and device UUID, each stamped with the last window that touched it.
#[derive(Debug)]
pub(crate) struct ByProcess<T> {
    /// By PID, the process's devices: nearly always one, so a short list beats a second map.
    by_pid: FastMap<u32, Vec<Kept<T>>>,
    window: u64,
}

#[derive(Debug)]
struct Kept<T> {
    device_uuid: String,
    touched_in: u64,
    value: T,
}

impl<T> Default for ByProcess<T> {
    fn default() -> Self {
        Self {
            by_pid: FastMap::default(),
            window: 0,
        }
    }
}

impl<T> ByProcess<T> {
    /// Starts a window: what it does not [`Self::touch`] is dropped at [`Self::end_window`].
    pub(crate) fn begin_window(&mut self) {
        self.window += 1;
    }

    /// The value of `pid` on `device_uuid`, made by `new` when there is none, and marked as
    /// touched in this window.
    pub(crate) fn touch(&mut self, pid: u32, device_uuid: &str, new: impl FnOnce() -> T) -> &mut T {
        let window = self.window;
        let devices = self.by_pid.entry(pid).or_default();
        let at = match devices.iter().position(|k| k.device_uuid == device_uuid) {
            Some(at) => at,
            None => {
                devices.push(Kept {
                    device_uuid: device_uuid.to_owned(),
                    touched_in: window,
                    value: new(),
                });
                devices.len() - 1
            }
        };
        let kept = &mut devices[at];
        kept.touched_in = window;
        &mut kept.value
    }

    /// Drops every value the window since [`Self::begin_window`] did not touch.
    pub(crate) fn end_window(&mut self) {
        let window = self.window;
        self.by_pid.retain(|_, devices| {
            devices.retain(|k| k.touched_in == window);
            !devices.is_empty()
        });
    }

    /// Number of (process, device) values kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_pid.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_live_while_touched_and_are_told_apart_by_device() {
        let mut kept: ByProcess<u32> = ByProcess::default();
        kept.begin_window();
        *kept.touch(10, "GPU-a", || 0) += 1;
        *kept.touch(10, "GPU-b", || 100) += 1;
        *kept.touch(11, "GPU-a", || 0) += 5;
        kept.end_window();
        assert_eq!(kept.len(), 3);

        kept.begin_window();
        assert_eq!(
            *kept.touch(10, "GPU-b", || 0),
            101,
            "kept from the last window"
        );
        assert_eq!(*kept.touch(11, "GPU-a", || 0), 5);
        kept.end_window();
        assert_eq!(kept.len(), 2, "10 on GPU-a was not touched: forgotten");

        kept.begin_window();
        assert_eq!(
            *kept.touch(10, "GPU-a", || 7),
            7,
            "made anew once forgotten"
        );
        kept.end_window();
        assert_eq!(kept.len(), 1);
    }
}
