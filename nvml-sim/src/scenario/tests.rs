use super::schema::CudaVersion;
use super::*;
use crate::api::Api;
use crate::model::{InitFault, KIND_GRAPHICS};
use std::collections::HashMap;

struct MapEnv(HashMap<&'static str, &'static str>);
impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|s| s.to_string())
    }
}
fn env(pairs: &[(&'static str, &'static str)]) -> MapEnv {
    MapEnv(pairs.iter().copied().collect())
}

fn compile_err(text: &str) -> (usize, usize, String) {
    match compile("test.toml", text, &env(&[])) {
        Err(ScenarioError::Invalid {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("scenario unexpectedly valid:\n{text}"),
    }
}

#[test]
fn bar1_used_defaults_to_a_64th_and_cannot_exceed_the_aperture() {
    let sim = compile("t", "[[device]]\nbar1_total_mib = 256\n", &env(&[])).unwrap();
    assert_eq!(sim.devices[0].bar1_used, 4 << 20);
    let (_, _, msg) = compile_err("[[device]]\nbar1_total_mib = 256\nbar1_used_mib = 300\n");
    assert!(
        msg.contains("bar1_used_mib (300)") && msg.contains("bar1_total_mib (256)"),
        "{msg}"
    );
}

#[test]
fn builtin_default_compiles_to_two_gpus_with_processes() {
    let sim = compile("built-in default", DEFAULT_SCENARIO, &env(&[])).unwrap();
    assert_eq!(sim.devices.len(), 2);
    assert!(sim.devices.iter().all(|d| !d.processes.is_empty()));
    assert_ne!(sim.devices[0].uuid, sim.devices[1].uuid);
}

#[test]
fn shipped_scenarios_all_compile_with_expected_sizes() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
    let e = env(&[]);
    for (file, gpus, procs) in [
        ("default.toml", 2, None),
        ("training-node-8gpu.toml", 8, Some(8)),
        ("faulty-node.toml", 4, None),
        ("bench-8x64.toml", 8, Some(64)),
        ("bench-64x1024.toml", 64, Some(1024)),
    ] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let sim = compile(file, &text, &e).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sim.devices.len(), gpus, "{file}");
        if let Some(p) = procs {
            let total: usize = sim.devices.iter().map(|d| d.processes.len()).sum();
            assert_eq!(total, p, "{file}");
            let mut pids: Vec<u32> = sim
                .devices
                .iter()
                .flat_map(|d| d.processes.iter().map(|p| p.pid))
                .collect();
            pids.sort_unstable();
            pids.dedup();
            assert_eq!(pids.len(), p, "{file}: PIDs must be unique");
        }
    }
    assert_eq!(
        std::fs::read_to_string(format!("{dir}/default.toml")).unwrap(),
        DEFAULT_SCENARIO
    );
}

#[test]
fn hardware_scenarios_compile_with_their_gpm_mig_and_nvlink() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
    let e = env(&[("GPULSE_TRAINER_PID", "4242")]);
    let load = |file: &str| {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        compile(file, &text, &e).unwrap_or_else(|e| panic!("{e}"))
    };
    let idle = load("gpm-tensor-idle.toml");
    let busy = load("gpm-tensor-busy.toml");
    for (sim, tensor) in [(&idle, 0.0), (&busy, 0.4)] {
        let g = &sim.devices[0].hw;
        assert!(g.gpm_supported);
        assert_eq!(g.gpm.sm_activity.value(1.0), 0.8);
        assert_eq!(g.gpm.tensor_activity.value(1.0), tensor);
        assert_eq!(sim.devices[0].processes[0].pid, 4242);
    }
    let old = load("gpm-unsupported.toml");
    assert!(old.devices.iter().all(|d| !d.hw.gpm_supported));
    let denied = load("gpm-permission-denied.toml");
    assert!(!denied.devices[0].faults.is_empty());
    let mig = load("mig-2-instances.toml");
    assert_eq!(mig.devices[0].hw.mig.len(), 2);
    assert_eq!(mig.devices[1].hw.mig.len(), 0);
    let nv = load("nvlink-4-links.toml");
    let links: Vec<u32> = nv
        .devices
        .iter()
        .map(|d| d.hw.nvlink.as_ref().unwrap().active())
        .collect();
    assert_eq!(links, [4, 3]);
    let remap = load("remapped-rows-pending.toml");
    assert!(remap.devices[0].health.remap_pending);
    assert_eq!(remap.devices[0].hw.pcie_replays.value(0.0), 12.0);
}

#[test]
fn hardware_keys_are_checked_with_a_reason() {
    for (text, needle) in [
        (
            "[[device]]\n[[device.mig_instance]]\nprofile = \"1g.10gb\"\ngpu_instance_id = 1\nmemory_total_mib = 9856\n",
            "needs `mig = true`",
        ),
        (
            "[[device]]\nmig = true\n[[device.mig_instance]]\nprofile = \"1g.10gb\"\ngpu_instance_id = 1\nmemory_total_mib = 9856\n[[device.process]]\npid = 5\ngpu_instance_id = 2\n",
            "no [[device.mig_instance]] of this GPU has that id",
        ),
        ("[[device]]\n[device.nvlink]\nlinks = 19\n", "out of range"),
        ("[[device]]\n[device.nvlink]\nlinks = 4\ndown = [4]\n", "links 0 to 3"),
        ("[[device]]\n[device.gpm]\nsm_activty = 0.5\n", "unknown field `sm_activty`"),
        (
            "[[device]]\n[device.violation]\npower = { mean = 0, amplitude = 0.1, period = 10 }\n",
            "below 0",
        ),
    ] {
        let (line, _, msg) = compile_err(text);
        assert!(msg.contains(needle), "{msg:?} should say {needle:?}");
        assert!(line > 0, "{msg}: the error points at a line");
    }
}

#[test]
fn templates_derive_distinct_identities_and_pid_ranges() {
    let sim = compile(
        "t",
        r#"
        [[device]]
        count = 3
        [[device.process]]
        pid = 1000
        count = 4
        [[device.process]]
        pid = 5000
        "#,
        &env(&[]),
    )
    .unwrap();
    let d = &sim.devices;
    assert_eq!(d.len(), 3);
    assert_eq!(d[2].minor, 2);
    assert_eq!(d[1].bus_id, "00000000:13:00.0");
    assert_eq!(d[1].bus_id_legacy, "0000:13:00.0");
    let pids: Vec<Vec<u32>> = d
        .iter()
        .map(|d| d.processes.iter().map(|p| p.pid).collect())
        .collect();
    assert_eq!(pids[0], vec![1000, 1001, 1002, 1003, 5000]);
    assert_eq!(pids[1], vec![1005, 1006, 1007, 1008, 5005]);
    assert!(d[0].uuid.starts_with("GPU-") && d[0].uuid.len() == 40);
}

#[test]
fn pids_come_from_the_environment() {
    let e = env(&[("ONE", "4242"), ("MANY", "10, 11,12")]);
    let sim = compile(
        "t",
        r#"
        [[device]]
        [[device.process]]
        pid_env = "ONE"
        [[device.process]]
        pids_env = "MANY"
        kind = "graphics"
        "#,
        &e,
    )
    .unwrap();
    let pids: Vec<u32> = sim.devices[0].processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![4242, 10, 11, 12]);
    assert_eq!(sim.devices[0].processes[1].kinds, KIND_GRAPHICS);
}

#[test]
fn a_process_listed_while_alive_goes_when_its_pid_exits() {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid: &'static str = Box::leak(child.id().to_string().into_boxed_str());
    let own: &'static str = Box::leak(std::process::id().to_string().into_boxed_str());
    let e = env(&[("CHILD", pid), ("OWN", own)]);
    let sim = compile(
        "t",
        r#"
        [[device]]
        [[device.process]]
        pid_env = "CHILD"
        while_alive = true
        [[device.process]]
        pid_env = "OWN"
        while_alive = true
        "#,
        &e,
    )
    .unwrap();
    let listed = |sim: &crate::model::Sim| -> Vec<bool> {
        sim.devices[0]
            .processes
            .iter()
            .map(|p| p.listed_at(1.0))
            .collect()
    };
    assert_eq!(listed(&sim), vec![true, true]);
    child.kill().expect("kill sleep");
    // Not yet reaped: a zombie holds no GPU context either.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(listed(&sim), vec![false, true]);
    child.wait().expect("reap sleep");
    assert_eq!(listed(&sim), vec![false, true]);
}

#[test]
fn errors_point_at_line_and_column_and_say_what_is_wrong() {
    let (line, col, msg) = compile_err("[[device]]\nname = \"x\"\nfans = \"two\"\n");
    assert_eq!((line, col), (3, 8), "{msg}");
    assert!(msg.contains("invalid type"), "{msg}");

    let (line, _, msg) =
        compile_err("[[device]]\n[device.signals]\ngpu_util = { from = 1, to = 5 }\n");
    assert_eq!(line, 3, "{msg}");
    assert!(
        msg.contains("needs all of `from`, `to` and `over`"),
        "{msg}"
    );

    let (line, _, msg) = compile_err("[[device]]\nnmae = \"x\"\n");
    assert_eq!(line, 2);
    assert!(msg.contains("unknown field `nmae`"), "{msg}");

    let (line, _, msg) = compile_err(
        "[[device]]\n\n[[fault]]\nkind = \"error\"\ndevice = 3\nfield = \"fan_speed\"\n",
    );
    assert_eq!(line, 3, "{msg}");
    assert!(msg.contains("there is no device 3"), "{msg}");

    let (_, _, msg) = compile_err("[[device]]\n[[fault]]\nkind = \"error\"\nfield = \"fan\"\n");
    assert!(
        msg.contains("unknown field \"fan\"") && msg.contains("fan_speed"),
        "{msg}"
    );

    let (_, _, msg) = compile_err("[[device]]\n[[fault]]\nkind = \"melt\"\n");
    assert!(msg.contains("unknown variant `melt`"), "{msg}");

    let (_, _, msg) = compile_err("[[device]]\ncount = 2\nuuid = \"GPU-1\"\n");
    assert!(
        msg.contains("`uuid` cannot be set on a device template"),
        "{msg}"
    );

    let (_, _, msg) = compile_err("[[device]]\n[[device.process]]\npid_env = \"NOPE\"\n");
    assert!(msg.contains("NOPE is not set"), "{msg}");

    let (_, _, msg) = compile_err(
        "[[device]]\n[device.signals]\npower_w = { mean = 10, amplitude = 50, period = 5 }\n",
    );
    assert!(msg.contains("below 0 W"), "{msg}");

    let (_, _, msg) = compile_err("[[device]]\n[[device]]\nminor = 0\n");
    assert!(msg.contains("same minor number"), "{msg}");
}

#[test]
fn error_display_names_file_line_column_and_shows_the_line() {
    let e = compile("/tmp/s.toml", "[driver]\nversion = 5\n", &env(&[])).unwrap_err();
    let s = e.to_string();
    assert!(
        s.starts_with("nvml-sim: scenario /tmp/s.toml line 2, column 11:"),
        "{s}"
    );
    assert!(s.contains("| version = 5"), "{s}");
}

#[test]
fn faults_resolve_to_devices_and_system_calls() {
    let sim = compile(
        "t",
        r#"
        [[device]]
        count = 2
        [[fault]]
        kind = "error"
        device = 1
        field = "fan_speed"
        error = "no_permission"
        [[fault]]
        kind = "gpu_lost"
        device = 0
        from_s = 10
        until_s = 20
        [[fault]]
        kind = "slow"
        function = "nvmlSystemGetDriverVersion"
        delay_ms = 1
        [[fault]]
        kind = "init_error"
        error = "driver_not_loaded"
        attempts = 2
        [[fault]]
        kind = "driver_gone"
        from_s = 100
        until_s = 150
        "#,
        &env(&[]),
    )
    .unwrap();
    assert!(sim.devices[0].faults.is_empty());
    assert_eq!(
        sim.devices[1]
            .faults
            .check(Api::nvmlDeviceGetFanSpeed_v2, 0.0),
        Err(4)
    );
    assert!(sim.devices[0].is_lost(15.0) && !sim.devices[0].is_lost(20.0));
    assert!(!sim.system_faults.is_empty());
    assert_eq!(
        sim.init_fault,
        Some(InitFault {
            error: abi::DRIVER_NOT_LOADED,
            attempts: 2
        })
    );
    assert!(sim.driver_gone_at(120.0) && !sim.driver_gone_at(150.0));
}

#[test]
fn mixed_fields_with_a_device_pick_only_that_devices_calls() {
    let sim = compile(
        "t",
        "[[device]]\ncount = 2\n[[fault]]\nkind = \"error\"\ndevice = 1\nfield = \"events\"\n",
        &env(&[]),
    )
    .unwrap();
    assert!(sim.system_faults.is_empty());
    assert!(sim.devices[0].faults.is_empty());
    assert_eq!(
        sim.devices[1]
            .faults
            .check(Api::nvmlDeviceRegisterEvents, 0.0),
        Err(abi::NOT_SUPPORTED)
    );
    let (_, _, msg) = compile_err(
        "[[device]]\n[[fault]]\nkind = \"error\"\ndevice = 0\nfield = \"driver_version\"\n",
    );
    assert!(msg.contains("not a device call"), "{msg}");
}

#[test]
fn slow_faults_sleep_only_inside_their_window() {
    let sim = compile(
        "t",
        "[[device]]\n[[fault]]\nkind = \"slow\"\nfield = \"power_usage\"\ndelay_ms = 30\nfrom_s = 10\nuntil_s = 20\n",
        &env(&[]),
    )
    .unwrap();
    let f = &sim.devices[0].faults;
    let t0 = std::time::Instant::now();
    assert_eq!(f.check(Api::nvmlDeviceGetPowerUsage, 5.0), Ok(()));
    assert!(
        t0.elapsed().as_millis() < 25,
        "outside the window: no delay"
    );
    let t0 = std::time::Instant::now();
    assert_eq!(f.check(Api::nvmlDeviceGetPowerUsage, 15.0), Ok(()));
    assert!(t0.elapsed().as_millis() >= 30, "inside the window: delayed");
    let t0 = std::time::Instant::now();
    assert_eq!(f.check(Api::nvmlDeviceGetTemperature, 15.0), Ok(()));
    assert!(t0.elapsed().as_millis() < 25, "other calls are not delayed");
}

#[test]
fn environment_overrides_scenario_clock_and_rejects_garbage() {
    let text = "[clock]\ntime_scale = 2.0\nstart_offset_s = 5\n";
    let sim = compile("t", text, &env(&[])).unwrap();
    assert_eq!((sim.clock.scale, sim.clock.offset), (2.0, 5.0));
    let sim = compile(
        "t",
        text,
        &env(&[(ENV_TIME_SCALE, "60"), (ENV_START_OFFSET, "100")]),
    )
    .unwrap();
    assert_eq!((sim.clock.scale, sim.clock.offset), (60.0, 100.0));
    let e = compile("t", text, &env(&[(ENV_TIME_SCALE, "fast")])).unwrap_err();
    assert!(e.to_string().contains("NVML_SIM_TIME_SCALE"), "{e}");
    let e = compile("t", text, &env(&[(ENV_TIME_SCALE, "0")])).unwrap_err();
    assert!(e.to_string().contains("must be > 0"), "{e}");
}

#[test]
fn cuda_versions_parse_from_text_or_number() {
    assert_eq!(
        parse_cuda_version(&CudaVersion::Text("12.8".into())),
        Ok(12080)
    );
    assert_eq!(
        parse_cuda_version(&CudaVersion::Text("13".into())),
        Ok(13000)
    );
    assert_eq!(parse_cuda_version(&CudaVersion::Number(12040)), Ok(12040));
    assert!(parse_cuda_version(&CudaVersion::Text("twelve".into())).is_err());
    assert!(parse_cuda_version(&CudaVersion::Number(12)).is_err());
}

#[test]
fn bus_ids_parse_in_every_spelling() {
    assert_eq!(parse_bus_id("00000000:18:00.0"), Some((0, 0x18, 0, 0)));
    assert_eq!(parse_bus_id("0000:9a:00.0"), Some((0, 0x9a, 0, 0)));
    assert_eq!(parse_bus_id("1B:00.0"), Some((0, 0x1b, 0, 0)));
    assert_eq!(parse_bus_id("zz:00.0"), None);
    assert_eq!(parse_bus_id("0:0:0:0"), None);
}
