//! XID events: a thread that waits on an NVML event set for critical XID errors and hands them to
//! the sampler, so an XID is never missed between two ticks and waiting never delays a tick.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};

use super::model::XidEvent;

/// How long one wait on the event set may block before the stop flag is looked at again.
const WAIT_MS: u32 = 250;

/// Owns the XID thread; stops and joins it on drop.
pub struct XidWatcher {
    events: Receiver<XidEvent>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl XidWatcher {
    /// Registers every device that supports it for critical XID events and starts waiting.
    /// Devices (or libraries) without event support are skipped with one log line: the rest of
    /// sampling does not depend on events.
    pub fn start(nvml: Arc<Nvml>) -> Self {
        let (sender, events) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("gpulse-xid".into())
            .spawn(move || watch(&nvml, &sender, &stop_flag))
            .map_err(|e| tracing::warn!("could not start the XID event thread: {e}"))
            .ok();
        Self {
            events,
            stop,
            thread,
        }
    }

    /// Every event received since the last call, oldest first.
    pub fn drain(&self) -> Vec<XidEvent> {
        let mut out = Vec::new();
        loop {
            match self.events.try_recv() {
                Ok(event) => out.push(event),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(nvml: &Nvml, sender: &mpsc::Sender<XidEvent>, stop: &AtomicBool) {
    let Some(set) = register_all(nvml) else {
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(data) => {
                if !data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    continue;
                }
                let device_uuid = data.device.uuid().unwrap_or_default();
                let device_index = data.device.index().unwrap_or(u32::MAX);
                let event = XidEvent {
                    at: SystemTime::now(),
                    device_uuid,
                    device_index,
                    xid: match data.event_data {
                        Some(XidError::Value(xid)) => xid,
                        _ => 0,
                    },
                };
                if sender.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!("waiting for XID events failed ({e}); XID reporting stops");
                return;
            }
        }
    }
}

/// An event set with every device that supports critical XID events registered, or `None` when
/// no device does. A failed registration frees the set (NVML's rule), so the set is rebuilt
/// without that device.
fn register_all(nvml: &Nvml) -> Option<EventSet<'_>> {
    let count = nvml.device_count().unwrap_or(0);
    let capable: Vec<u32> = (0..count)
        .filter(|&index| {
            nvml.device_by_index(index)
                .and_then(|d| d.supported_event_types())
                .map(|types| types.contains(EventTypes::CRITICAL_XID_ERROR))
                .unwrap_or(false)
        })
        .collect();
    let mut failed: Vec<u32> = Vec::new();
    'rebuild: loop {
        let mut set = match nvml.create_event_set() {
            Ok(set) => set,
            Err(e) => {
                tracing::info!(
                    "NVML event sets are not available ({e}); XID errors will not be reported"
                );
                return None;
            }
        };
        let mut registered = 0;
        for &index in capable.iter().filter(|i| !failed.contains(i)) {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(back) => {
                    set = back;
                    registered += 1;
                }
                Err(e) => {
                    tracing::info!(
                        gpu.index = index,
                        "GPU {index} cannot report XID events ({}); its XID errors will not be seen",
                        e.error
                    );
                    failed.push(index);
                    continue 'rebuild;
                }
            }
        }
        return (registered > 0).then_some(set);
    }
}
