//! The live view's state: the latest analysed window (a [`View`] from the analyzer), the history
//! behind the sparklines, and what the person at the keyboard chose (sort order, filter, tree,
//! roll-ups panel, selection, detail pane). New windows arrive through [`App::observe`], keys through
//! [`App::apply`]; drawing (`ui`) only reads.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::input::{Action, Mode, SortKey};
use super::procinfo::ProcessTrees;
use crate::diagnosis::{Finding, RuleId, Subject};
use crate::pipeline::View;
use crate::sampling::MigInstanceInfo;
use crate::schema::{DeviceField, GpmField};

/// Points kept per sparkline: five minutes at the default 1 s interval.
pub(crate) const HISTORY_LEN: usize = 300;

/// A bounded series of recent values, newest last.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series(VecDeque<u64>);

impl Series {
    fn push(&mut self, value: u64) {
        if self.0.len() == HISTORY_LEN {
            self.0.pop_front();
        }
        self.0.push_back(value);
    }

    /// The newest `n` values, oldest first.
    pub(crate) fn last(&self, n: usize) -> Vec<u64> {
        self.0
            .iter()
            .skip(self.0.len().saturating_sub(n))
            .copied()
            .collect()
    }
}

/// A device's history: utilisation and memory used, in percent.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceHistory {
    pub utilization: Series,
    pub memory: Series,
}

/// A process's history (summed over its devices): SM utilisation in percent, GPU memory in MiB.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessHistory {
    pub sm: Series,
    pub memory_mib: Series,
}

/// What a row of the process table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowKind {
    /// A GPU process on one device (a process on two GPUs has two rows).
    Gpu { device_index: u32 },
    /// A descendant that NVML does not list (a DataLoader worker), shown in the tree view.
    Descendant,
}

/// One row of the process table, as shown (before truncation to the column widths).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub kind: RowKind,
    pub pid: u32,
    /// Depth in the tree view; 0 in the flat view.
    pub depth: usize,
    pub vpid: Option<u32>,
    pub user: Option<String>,
    /// First 12 characters, as `docker ps` shows them.
    pub container: Option<String>,
    /// `namespace/pod`, or the pod UID when the kubelet gave no name.
    pub pod: Option<String>,
    pub service: Option<String>,
    pub gpu_memory_bytes: Option<u64>,
    /// Percent. On MIG (no per-process figures there): the instance's graphics-engine activity
    /// for a process alone in its GPU instance, else unknown.
    pub sm: Option<f64>,
    /// The MIG instance the process runs in, e.g. `GI1 3g.40gb`; `None` on a whole GPU.
    pub mig: Option<String>,
    /// Percent of one core.
    pub cpu: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub command: String,
    /// `job/rank` of a torch.distributed rank (see [`rank_label`]).
    pub rank: Option<String>,
    /// What the rank rules say of this rank now: the straggler, the rank a hung job waits
    /// for, or one of the ranks that wait.
    pub mark: Option<RankMark>,
}

/// What a rank rule says of a rank, as the table marks it after `JOB/RANK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RankMark {
    /// `rank_straggler` names it.
    Slow,
    /// `distributed_hang` names it: its job is stuck on it.
    Hung,
    /// Its job is stuck (`distributed_hang`) and it waits in a collective.
    Waiting,
}

impl RankMark {
    pub(crate) fn label(self) -> &'static str {
        match self {
            RankMark::Slow => "SLOW",
            RankMark::Hung => "HUNG",
            RankMark::Waiting => "WAIT",
        }
    }
}

impl Row {
    /// The text the filter looks in.
    fn matches(&self, needle: &str) -> bool {
        let fields = [
            Some(self.pid.to_string()),
            self.vpid.map(|v| v.to_string()),
            self.user.clone(),
            self.container.clone(),
            self.pod.clone(),
            self.service.clone(),
            Some(self.command.clone()),
            self.rank.clone(),
        ];
        fields
            .iter()
            .flatten()
            .any(|f| f.to_lowercase().contains(needle))
    }
}

/// The whole state of the live view.
#[derive(Debug)]
pub(crate) struct App {
    pub interval: Duration,
    pub host: String,
    /// `NO_COLOR` honoured: no colours, only bold and reverse video.
    pub color: bool,
    pub view: Option<Arc<View>>,
    pub own_cpu: Option<f64>,
    pub devices: HashMap<String, DeviceHistory>,
    pub processes: HashMap<u32, ProcessHistory>,
    pub process_trees: ProcessTrees,
    pub sort: SortKey,
    pub mode: Mode,
    pub filter: String,
    pub tree: bool,
    /// The roll-ups panel (GPU-hours, energy and cost by job, pod and container) is shown.
    pub rollups: bool,
    pub detail: bool,
    /// The selected row's PID and kind: the selection follows the process when rows move.
    pub selected: Option<(u32, RowKind)>,
    pub rows: Vec<Row>,
    /// The newest log line, shown in the footer.
    pub last_log: Option<String>,
    pub quit: bool,
}

impl App {
    pub(crate) fn new(interval: Duration, host: String, color: bool) -> Self {
        Self {
            interval,
            host,
            color,
            view: None,
            own_cpu: None,
            devices: HashMap::new(),
            processes: HashMap::new(),
            process_trees: ProcessTrees::default(),
            sort: SortKey::GpuMemory,
            mode: Mode::Normal,
            filter: String::new(),
            tree: false,
            rollups: false,
            detail: false,
            selected: None,
            rows: Vec::new(),
            last_log: None,
            quit: false,
        }
    }

    /// Whether the next refresh should read the process tree from `/proc` (`ProcessTrees`).
    pub(crate) fn wants_process_trees(&self) -> bool {
        self.tree || self.detail
    }

    /// Takes in a newly analysed window.
    pub(crate) fn observe(&mut self, view: Arc<View>, own_cpu: Option<f64>) {
        let window = &view.attributed.window;
        for device in &window.devices {
            let history = self.devices.entry(device.info.uuid.clone()).or_default();
            if let Some(util) = &device.gauge(DeviceField::UtilizationGpu) {
                history.utilization.push(percent(util.last));
            }
            if let (Some(used), Some(total)) = (
                device.last_u64(DeviceField::MemoryUsed),
                device.last_u64(DeviceField::MemoryTotal),
            ) {
                if total > 0 {
                    history.memory.push(percent(used as f64 / total as f64));
                }
            }
        }
        let mut seen: HashMap<u32, (u64, f64, bool)> = HashMap::new();
        for p in &window.processes {
            let entry = seen.entry(p.pid).or_insert((0, 0.0, false));
            if let Some(mem) = &p.gpu_memory_bytes {
                entry.0 += mem.last as u64;
            }
            if let Some(sm) = &p.sm_utilization {
                entry.1 += sm.last;
                entry.2 = true;
            }
        }
        self.processes.retain(|pid, _| seen.contains_key(pid));
        for (pid, (mem, sm, sm_known)) in seen {
            let history = self.processes.entry(pid).or_default();
            history.memory_mib.push(mem >> 20);
            if sm_known {
                history.sm.push(percent(sm));
            }
        }
        self.view = Some(view);
        self.own_cpu = own_cpu;
        self.rebuild();
    }

    /// Applies one key's action.
    pub(crate) fn apply(&mut self, action: Action) {
        match action {
            Action::Quit => self.quit = true,
            Action::Sort(key) => self.sort = key,
            Action::StartFilter => self.mode = Mode::Filtering,
            Action::FilterChar(c) => self.filter.push(c),
            Action::FilterBackspace => {
                self.filter.pop();
            }
            Action::FilterDone => self.mode = Mode::Normal,
            Action::FilterCancel => {
                self.filter.clear();
                self.mode = Mode::Normal;
            }
            Action::ToggleTree => self.tree = !self.tree,
            Action::ToggleRollups => self.rollups = !self.rollups,
            Action::ToggleDetail => self.detail = !self.detail && self.selected.is_some(),
            Action::CloseDetail => self.detail = false,
            Action::Move(delta) => self.move_selection(delta),
            Action::Home => self.select_index(0),
            Action::End => self.select_index(self.rows.len().saturating_sub(1)),
        }
        self.rebuild();
    }

    /// Index of the selected row in `rows`.
    pub(crate) fn selected_index(&self) -> Option<usize> {
        let (pid, kind) = self.selected?;
        self.rows
            .iter()
            .position(|r| r.pid == pid && r.kind == kind)
    }

    /// Active findings about `pid` (its own, and those of the jobs it belongs to).
    pub(crate) fn findings_of(&self, pid: u32) -> Vec<&Finding> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        view.findings
            .iter()
            .filter(|f| match &f.subject {
                Subject::Workload { pid: p, .. } => *p == pid,
                Subject::Job { pids, .. } => pids.contains(&pid),
                Subject::Device(_) => false,
            })
            .collect()
    }

    fn move_selection(&mut self, delta: isize) {
        let current = self.selected_index().unwrap_or(0);
        let next = current.saturating_add_signed(delta);
        self.select_index(next.min(self.rows.len().saturating_sub(1)));
    }

    fn select_index(&mut self, index: usize) {
        self.selected = self.rows.get(index).map(|r| (r.pid, r.kind));
    }

    /// Recomputes the rows from the view, the sort, the filter and the tree setting, keeping the
    /// selection on the same process when it is still shown.
    pub(crate) fn rebuild(&mut self) {
        let Some(view) = self.view.clone() else {
            self.rows.clear();
            return;
        };
        let mut gpu_rows = gpu_rows(&view);
        let needle = self.filter.to_lowercase();
        if !needle.is_empty() {
            gpu_rows.retain(|r| r.matches(&needle));
        }
        sort_rows(&mut gpu_rows, self.sort);
        self.rows = if self.tree && !self.process_trees.is_empty() {
            tree_rows(gpu_rows, &self.process_trees)
        } else {
            gpu_rows
        };
        if self.selected_index().is_none() {
            self.select_index(0);
        }
        if self.selected.is_none() {
            self.detail = false;
        }
    }
}

/// A ratio (0..1, as NVML values are kept) as a whole percent for a sparkline.
fn percent(ratio: f64) -> u64 {
    (ratio * 100.0).clamp(0.0, 100.0).round() as u64
}

/// One row per GPU process and device.
fn gpu_rows(view: &View) -> Vec<Row> {
    let attributed = &view.attributed;
    let window = &attributed.window;
    window
        .processes
        .iter()
        .map(|p| {
            let process = attributed.process(p.pid);
            let workload = process.map(|a| a.workload);
            let usage = process.and_then(|a| a.usage);
            Row {
                kind: RowKind::Gpu {
                    device_index: p.device_index,
                },
                pid: p.pid,
                depth: 0,
                vpid: workload.and_then(|w| w.vpid),
                user: workload.and_then(|w| w.owner.clone()),
                container: workload
                    .and_then(|w| w.container_id.as_deref())
                    .map(|id| id.get(..12).unwrap_or(id).to_string()),
                pod: workload.and_then(|w| match (&w.namespace_name, &w.pod_name, &w.pod_uid) {
                    (Some(ns), Some(name), _) => Some(format!("{ns}/{name}")),
                    (None, Some(name), _) => Some(name.clone()),
                    (_, None, Some(uid)) => Some(uid.clone()),
                    _ => None,
                }),
                service: workload.map(|w| w.effective_service_name()),
                gpu_memory_bytes: p.gpu_memory_bytes.as_ref().map(|g| g.last as u64),
                sm: p
                    .sm_utilization
                    .or_else(|| {
                        let alone = window.mig_instance_held_alone(p.pid, &p.device_uuid)?;
                        alone.gpm.gauge(GpmField::GraphicsActivity)
                    })
                    .map(|g| g.last * 100.0),
                mig: window
                    .mig_instance_of(p.pid, &p.device_uuid)
                    .map(|m| mig_label(&m.info)),
                cpu: usage.and_then(|u| u.cpu_utilization).map(|c| c * 100.0),
                rss_bytes: usage.and_then(|u| u.memory_rss_bytes),
                command: workload
                    .and_then(|w| w.command_line.clone().or_else(|| w.executable_name.clone()))
                    .unwrap_or_default(),
                rank: rank_label(view, p.pid),
                mark: rank_mark(view, p.pid),
            }
        })
        .collect()
}

/// `GI<id> <profile>` (with `.CI<id>` when the GPU instance is split into compute instances).
fn mig_label(info: &MigInstanceInfo) -> String {
    match info.compute_instance_id {
        0 => format!("GI{} {}", info.gpu_instance_id, info.profile()),
        ci => format!("GI{}.CI{ci} {}", info.gpu_instance_id, info.profile()),
    }
}

/// `job/rank` from the rank's own spans (the companion's resource, heard by a receiver), else
/// from its environment (the launcher's job and rank variables, `attribution::environ`): `?`
/// stands for the half the environment does not give.
pub(crate) fn rank_label(view: &View, pid: u32) -> Option<String> {
    view.training
        .process(pid)
        .and_then(|t| t.rank_label())
        .or_else(|| {
            let workload = &view.attributed.process(pid)?.workload;
            let rank = workload.rank.map(|r| r.rank.to_string());
            if workload.job_id.is_none() && rank.is_none() {
                return None;
            }
            Some(format!(
                "{}/{}",
                workload.job_id.as_deref().unwrap_or("?"),
                rank.as_deref().unwrap_or("?")
            ))
        })
}

/// What the view's active rank findings say of `pid`: a hang first (it is the costlier), then a
/// straggler.
pub(crate) fn rank_mark(view: &View, pid: u32) -> Option<RankMark> {
    let names = |f: &Finding| matches!(&f.subject, Subject::Workload { pid: p, .. } if *p == pid);
    let hangs = || {
        view.findings
            .iter()
            .filter(|f| f.rule == RuleId::DistributedHang)
    };
    if hangs().any(names) {
        return Some(RankMark::Hung);
    }
    // Its job and rank as the rank label gives them (its spans first, else its environment).
    let job_and_rank = view
        .training
        .process(pid)
        .and_then(|t| t.distributed.as_ref())
        .and_then(|d| Some((d.job_id.clone()?, d.rank)))
        .or_else(|| {
            let w = view.attributed.process(pid)?.workload;
            Some((w.job_id.clone()?, w.rank?.rank))
        });
    if let Some(rank) = job_and_rank {
        let waits = hangs().any(|f| {
            let text = |name: &str| {
                f.values.iter().find_map(|(n, v)| match v {
                    crate::diagnosis::Value::Text(t) if n == name => Some(t.as_str()),
                    _ => None,
                })
            };
            text("job_id") == Some(rank.0.as_str())
                && text("waiting_ranks")
                    .is_some_and(|list| list.split(',').any(|r| r == rank.1.to_string()))
        });
        if waits {
            return Some(RankMark::Waiting);
        }
    }
    view.findings
        .iter()
        .any(|f| f.rule == RuleId::RankStraggler && names(f))
        .then_some(RankMark::Slow)
}

fn sort_rows(rows: &mut [Row], key: SortKey) {
    let desc = |a: Option<f64>, b: Option<f64>| {
        b.unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&a.unwrap_or(f64::NEG_INFINITY))
    };
    rows.sort_by(|a, b| {
        let primary = match key {
            SortKey::GpuMemory => desc(
                a.gpu_memory_bytes.map(|v| v as f64),
                b.gpu_memory_bytes.map(|v| v as f64),
            ),
            SortKey::Sm => desc(a.sm, b.sm),
            SortKey::Cpu => desc(a.cpu, b.cpu),
            SortKey::Pid => std::cmp::Ordering::Equal,
        };
        primary
            .then(a.pid.cmp(&b.pid))
            .then(row_device(a).cmp(&row_device(b)))
    });
}

fn row_device(row: &Row) -> Option<u32> {
    match row.kind {
        RowKind::Gpu { device_index } => Some(device_index),
        RowKind::Descendant => None,
    }
}

/// The tree view: each GPU process that has no GPU ancestor, in sort order, followed by its
/// descendants depth first (GPU processes among them with their own rows, other processes as
/// descendant rows).
fn tree_rows(gpu_rows: Vec<Row>, process_trees: &ProcessTrees) -> Vec<Row> {
    let mut by_pid: HashMap<u32, Vec<Row>> = HashMap::new();
    let mut order = Vec::new();
    for row in gpu_rows {
        if !by_pid.contains_key(&row.pid) {
            order.push(row.pid);
        }
        by_pid.entry(row.pid).or_default().push(row);
    }
    let mut out = Vec::new();
    let roots: Vec<u32> = order
        .iter()
        .copied()
        .filter(|&pid| {
            !process_trees.has_gpu_ancestor(pid) || !ancestor_shown(pid, &by_pid, process_trees)
        })
        .collect();
    for root in roots {
        push_subtree(root, 0, &mut by_pid, process_trees, &mut out);
    }
    out
}

/// Whether a GPU ancestor of `pid` is among the rows (else `pid` is shown as a root).
fn ancestor_shown(pid: u32, rows: &HashMap<u32, Vec<Row>>, process_trees: &ProcessTrees) -> bool {
    rows.keys()
        .any(|&other| other != pid && process_trees.descendants(other).contains(&pid))
}

fn push_subtree(
    pid: u32,
    depth: usize,
    gpu: &mut HashMap<u32, Vec<Row>>,
    process_trees: &ProcessTrees,
    out: &mut Vec<Row>,
) {
    match gpu.remove(&pid) {
        Some(rows) => out.extend(rows.into_iter().map(|mut r| {
            r.depth = depth;
            r
        })),
        None => {
            let Some(member) = process_trees.member(pid) else {
                return;
            };
            out.push(Row {
                kind: RowKind::Descendant,
                pid,
                depth,
                vpid: None,
                user: None,
                container: None,
                pod: None,
                service: None,
                gpu_memory_bytes: None,
                sm: None,
                mig: None,
                cpu: member.cpu.map(|c| c * 100.0),
                rss_bytes: member.rss_bytes,
                command: member.comm.clone(),
                rank: None,
                mark: None,
            });
        }
    }
    if depth > 64 {
        return; // a malformed tree must not recurse without end
    }
    for child in process_trees.children(pid) {
        push_subtree(child, depth + 1, gpu, process_trees, out);
    }
}
