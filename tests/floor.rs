//! The benchmark floor (`gpulse::sampling::floor::Floor`, which examples/bench_floor.rs and the
//! hot-path benchmarks run) must make exactly the NVML calls `Sampler::sample` makes, function
//! by function, or gpulse's cost "as a multiple of the floor" means nothing. Both run in this
//! process against one nvml-sim instance, a tick each in turn, and the simulator's own counter
//! (`nvmlSimGetCallCount`) says what each asked. The scenario has what changes the calls: fans
//! (one call per fan), a GPU without ECC and without GPM (calls it says "not supported" to,
//! which neither asks again), a field id one GPU gives and two answer "not supported" for, GPM,
//! NVLink, MIG instances with their processes, and compute and graphics processes (per-process
//! utilisation is asked only when some process runs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpulse::sampling::floor::Floor;

use crate::sampling::{call_counts, made, sampler_in_process};

const SCENARIO: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-aaaaaaaa-1111-4111-8111-111111111111"
fans = 2
[device.signals]
gpu_util = 70
power_w = 400
memory_temperature_c = 64
[device.gpm]
sm_activity = 0.5
[device.nvlink]
links = 4
tx_kibps = 1024
rx_kibps = 2048
[[device.process]]
pid = 7001
name = "python3"
memory_used_mib = 1024
[[device.process]]
pid = 7002
name = "Xorg"
kind = "graphics"
memory_used_mib = 64

[[device]]
name = "NVIDIA A10"
uuid = "GPU-bbbbbbbb-2222-4222-8222-222222222222"
architecture = "ampere"
ecc = false

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-cccccccc-3333-4333-8333-333333333333"
mig = true
[device.gpm]
sm_activity = 0.4
[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 1
compute_instance_id = 0
uuid = "MIG-dddddddd-4444-5444-8444-444444444444"
memory_total_mib = 40192
[device.mig_instance.gpm]
sm_activity = 0.8
[[device.process]]
pid = 7003
name = "python3"
memory_used_mib = 2048
gpu_instance_id = 1
compute_instance_id = 0
"#;

#[test]
fn the_floor_makes_exactly_the_samplers_nvml_calls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut sampler, lib) = sampler_in_process(dir.path(), SCENARIO);
    let mut floor = Floor::new(Arc::clone(sampler.nvml()));

    // The first tick of each reads what is read once per device (identity, fan and link
    // counts, GPM support); from the second on, each tick asks the same.
    let mut sampled = BTreeMap::new();
    let mut floored = BTreeMap::new();
    for tick in 0..4 {
        let start = call_counts(&lib);
        let snapshot = sampler.sample().expect("the sampler reads nvml-sim");
        let between = call_counts(&lib);
        floor.tick();
        let end = call_counts(&lib);
        if tick == 0 {
            assert_eq!(snapshot.devices.len(), 3);
            assert_eq!(snapshot.processes.len(), 3, "{:?}", snapshot.processes);
            continue;
        }
        let (s, f) = (made(&start, &between), made(&between, &end));
        assert!(!s.is_empty(), "the sampler made no call");
        assert_eq!(
            s, f,
            "tick {tick}: the sampler's calls (left) and the floor's (right) differ: make \
             gpulse::sampling::floor make every call Sampler::sample makes"
        );
        sampled = s;
        floored = f;
        // GPM rates need samples at least 100 ms apart.
        std::thread::sleep(Duration::from_millis(120));
    }
    // The scenario reaches what it is there for.
    for (call, per_tick) in [
        // Every schema field's call, BAR1 included, on each of the three GPUs.
        ("nvmlDeviceGetBAR1MemoryInfo", 3),
        ("nvmlDeviceGetPcieReplayCounter", 3),
        // Two fans on GPU 0 only.
        ("nvmlDeviceGetFanSpeed_v2", 2),
        // Not asked of the MIG GPU, which said "not supported".
        ("nvmlDeviceGetUtilizationRates", 2),
        // The A10 said "not supported" once and is not asked again.
        ("nvmlDeviceGetTotalEccErrors", 4),
        // GPU 0, the MIG GPU and its GPU instance; nothing on the A10.
        ("nvmlGpmMetricsGet", 3),
        ("nvmlGpmMigSampleGet", 1),
        // GPU 0's NVLink counters and its field-id rows (the HBM temperature) in one call
        // each; the other two GPUs said their memory temperature is not supported on the first
        // tick, which leaves their batches empty: no call.
        ("nvmlDeviceGetFieldValues", 2),
        ("nvmlDeviceGetMigDeviceHandleByIndex", 7),
        // Asked only of the GPUs running a process (not of the A10).
        ("nvmlDeviceGetProcessUtilization", 2),
        // nvml-wrapper asks for a list twice when it is not empty (its size, then the list):
        // GPU 0's graphics list, then once each of the others.
        ("nvmlDeviceGetGraphicsRunningProcesses_v3", 4),
        // The MIG device's memory, beside the three GPUs'.
        ("nvmlDeviceGetMemoryInfo_v2", 4),
    ] {
        assert_eq!(
            sampled.get(call).copied(),
            Some(per_tick),
            "{call} per tick: {sampled:?}"
        );
    }
    assert_eq!(sampled, floored);
}
