//! The process resources kept between export windows.

use std::collections::HashMap;
use std::sync::Arc;

use crate::attribution::Workload;
use crate::export::metrics::encoding::EncodedResource;
use crate::export::resource::{process_resource, NodeIdentity};

/// The encoded `Resource` of each GPU process of the last window, so that a process that stays
/// is neither rebuilt (about 15 attributes, each a key and a value copied) nor encoded again:
/// its bytes are copied into the request. Owned by whoever builds one request per window (the
/// exporter) and passed to [`metrics_batch_cached`](super::metrics_batch_cached).
///
/// What it owns: per host PID, the [`Workload`] the resource was built from and the resource
/// with its bytes. When it is invalidated:
/// - a process whose workload differs in any field from the one its resource was built from
///   (its `service.name` learned later, its pod named, a PID reused by another process) gets a
///   new resource;
/// - a process absent from a window is forgotten at the end of that window;
/// - everything is forgotten when the node identity differs from the last window's.
#[derive(Debug, Default)]
pub struct ProcessResources {
    node: Option<NodeIdentity>,
    by_pid: HashMap<u32, Kept>,
    /// Counts windows; a process's entry holds the last window that used it.
    window: u64,
}

#[derive(Debug)]
struct Kept {
    workload: Workload,
    resource: Arc<EncodedResource>,
    used_in: u64,
}

impl ProcessResources {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of processes whose resource is kept.
    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    /// Whether no resource is kept.
    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }

    /// Starts a window built for `node`.
    pub(super) fn begin(&mut self, node: &NodeIdentity) {
        self.window += 1;
        if self.node.as_ref() != Some(node) {
            self.by_pid.clear();
            self.node = Some(node.clone());
        }
    }

    /// The resource of `workload` (see [`process_resource`]), kept from an earlier window when
    /// the workload is the same.
    pub(super) fn resource(
        &mut self,
        workload: &Workload,
        node: &NodeIdentity,
    ) -> Arc<EncodedResource> {
        let window = self.window;
        match self.by_pid.get_mut(&workload.pid) {
            Some(kept) if kept.workload == *workload => {
                kept.used_in = window;
                Arc::clone(&kept.resource)
            }
            _ => {
                let resource = Arc::new(EncodedResource::new(process_resource(workload, node)));
                self.by_pid.insert(
                    workload.pid,
                    Kept {
                        workload: workload.clone(),
                        resource: Arc::clone(&resource),
                        used_in: window,
                    },
                );
                resource
            }
        }
    }

    /// Ends the window: forgets the processes it did not have.
    pub(super) fn end(&mut self) {
        let window = self.window;
        self.by_pid.retain(|_, kept| kept.used_in == window);
    }
}
