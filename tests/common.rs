//! Helpers shared by the integration-test modules: a real OTLP receiver process
//! (`tests/receiver/otlp_receiver.py`, on the official `opentelemetry-proto` Python package) that
//! records every request it gets, a throwaway TLS CA for it, and the nvml-sim scenario most
//! tests start from (one H100, [`h100_scenario`]); a `gpulse run` against another NVML library
//! until the receiver has its windows ([`run_against`]), and the points of one metric picked by
//! an attribute ([`points_where`]).
//!
//! The receiver runs under `$GPULSE_TEST_PYTHON` (default `python3`), which needs the packages
//! of `tests/receiver/requirements.txt`; without them the tests fail and say what to install.
//! Not every area uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::run::{attr_str, metrics_of, points, window_requests};
use crate::sampling::gpulse_bin;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/receiver/otlp_receiver.py"
);
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/receiver/requirements.txt"
);
/// Importing grpc and the protobuf modules takes a second or two on a loaded CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The UUID of GPU 0 in [`h100_scenario`].
pub const H100_UUID: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";

/// An nvml-sim scenario: a 550 driver (CUDA 12.4) and one H100 80GB ([`H100_UUID`], PCI
/// `00000000:18:00.0`, 700 W limit), then `rest`, which goes on describing that GPU (its
/// `[device.signals]`, `[device.gpm]`, `[[device.process]]` tables) and may add more
/// `[[device]]`s after it.
pub fn h100_scenario(rest: &str) -> String {
    format!(
        r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "{H100_UUID}"
pci_bus_id = "00000000:18:00.0"
memory_total_mib = 81559
power_limit_w = 700
{rest}"#
    )
}

/// `gpulse run` (100 ms samples, 1 s windows) on the NVML library `lib`, exporting to a real
/// receiver until `windows` export windows arrived (at most `timeout`), then stopped with
/// SIGTERM, which it must exit cleanly from. `pids` is the library's `OTHER_NVML_PIDS`. Returns
/// every request the receiver got and gpulse's stderr.
pub fn run_against(
    lib: &Path,
    pids: &str,
    windows: usize,
    timeout: Duration,
) -> (Vec<Value>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let receiver = Receiver::start(ReceiverOptions::default());
    let stderr_path = dir.path().join("stderr.log");
    let mut gpulse = Command::new(gpulse_bin())
        .args([
            "run",
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
        ])
        .arg("--nvml-lib")
        .arg(lib)
        .env("OTHER_NVML_PIDS", pids)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base())
        .env("GPULSE_KUBELET_SOCKET", "none")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("start gpulse run");
    let requests = receiver.wait_for(|r| window_requests(r).len() >= windows, timeout);
    // SAFETY: kill has no memory-safety preconditions; the PID is our child.
    unsafe { libc::kill(gpulse.id() as libc::pid_t, libc::SIGTERM) };
    let status = gpulse.wait().expect("wait for gpulse");
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    (requests, stderr)
}

/// The points of metric `name` in one resource's metrics whose attribute `key` is `want` (every
/// point when `key` is empty).
pub fn points_where<'a>(resource: &'a Value, name: &str, key: &str, want: &str) -> Vec<&'a Value> {
    metrics_of(resource)
        .into_iter()
        .filter(|m| m["name"] == name)
        .flat_map(points)
        .filter(|p| key.is_empty() || attr_str(&p["attributes"], key).as_deref() == Some(want))
        .collect()
}

/// A server certificate for the receiver, with the CA a client must trust.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, the receiver demands client certificates signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// How the receiver behaves. `Default` accepts everything.
#[derive(Debug, Clone, Default)]
pub struct ReceiverOptions {
    /// `unavailable`, `resource_exhausted_retry_info`, `invalid_argument`,
    /// `http_429_retry_after`.
    pub fail_status: Option<&'static str>,
    /// Fail while this file exists.
    pub fail_until_file: Option<PathBuf>,
    /// Fail the first N requests.
    pub fail_count: Option<u32>,
    /// Seconds sent as `Retry-After` / `RetryInfo` (the receiver's default is 1).
    pub retry_after: Option<u32>,
    /// Accept, reporting this many rejected points.
    pub partial_success: Option<u32>,
    /// Apply the faults above to this signal only (`metrics`, `logs`, `traces`); the others
    /// are accepted.
    pub fail_signal: Option<&'static str>,
    pub tls: Option<ServerTls>,
}

/// A running receiver; killed when dropped.
pub struct Receiver {
    child: Option<Child>,
    pub grpc_port: u16,
    pub http_port: u16,
    tls: bool,
    output: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

/// The test Python interpreter: `$GPULSE_TEST_PYTHON`, default `python3`.
pub fn python() -> String {
    std::env::var("GPULSE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn install_hint() -> String {
    format!(
        "the OTLP test receiver needs Python with its packages: run \
         `pip install -r {REQUIREMENTS}` (in a venv if you like) and set GPULSE_TEST_PYTHON to \
         that interpreter if it is not `python3`"
    )
}

impl Receiver {
    /// Starts the receiver on free loopback ports and waits until it listens.
    ///
    /// # Panics
    /// When Python or its packages are missing (with what to install), or the receiver does
    /// not come up.
    pub fn start(options: ReceiverOptions) -> Receiver {
        let dir = tempfile::tempdir().expect("temporary directory for the receiver");
        let output = dir.path().join("requests.jsonl");
        let stderr = dir.path().join("stderr.txt");
        let mut command = Command::new(python());
        command.arg(SCRIPT).arg("--output").arg(&output).args([
            "--grpc-port",
            "0",
            "--http-port",
            "0",
        ]);
        if let Some(status) = options.fail_status {
            command.args(["--fail-status", status]);
        }
        if let Some(path) = &options.fail_until_file {
            command.arg("--fail-until-file").arg(path);
        }
        if let Some(n) = options.fail_count {
            command.args(["--fail-count", &n.to_string()]);
        }
        if let Some(s) = options.retry_after {
            command.args(["--retry-after", &s.to_string()]);
        }
        if let Some(n) = options.partial_success {
            command.args(["--partial-success", &n.to_string()]);
        }
        if let Some(signal) = options.fail_signal {
            command.args(["--fail-signal", signal]);
        }
        if let Some(tls) = &options.tls {
            command.arg("--tls-cert").arg(&tls.cert);
            command.arg("--tls-key").arg(&tls.key);
            if let Some(ca) = &tls.client_ca {
                command.arg("--tls-client-ca").arg(ca);
            }
        }
        let stderr_file = std::fs::File::create(&stderr).expect("receiver stderr file");
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run `{}`: {e}; {}", python(), install_hint()));

        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(read.map(|_| line));
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) if !line.trim().is_empty() => line,
            other => {
                let _ = child.kill();
                let status = child.wait().ok();
                let err = std::fs::read_to_string(&stderr).unwrap_or_default();
                let why = match other {
                    Err(_) => format!("no ports line within {START_TIMEOUT:?}"),
                    _ => format!("it exited ({status:?}) before printing its ports"),
                };
                panic!(
                    "the OTLP test receiver did not start: {why}\nstderr:\n{err}\n{}",
                    install_hint()
                );
            }
        };
        let ports: Value = serde_json::from_str(line.trim())
            .unwrap_or_else(|e| panic!("the receiver's ports line {line:?} is not JSON: {e}"));
        let port = |key: &str| -> u16 {
            ports[key]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or_else(|| panic!("no {key} port in {line:?}"))
        };
        Receiver {
            grpc_port: port("grpc"),
            http_port: port("http"),
            child: Some(child),
            tls: options.tls.is_some(),
            output,
            stderr,
            _dir: dir,
        }
    }

    fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    /// The gRPC endpoint, e.g. `http://127.0.0.1:41234`.
    pub fn grpc_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.grpc_port)
    }

    /// The OTLP/HTTP base, e.g. `http://127.0.0.1:41235` (append `/v1/metrics`).
    pub fn http_base(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.http_port)
    }

    /// Every request recorded so far, failed answers included, in arrival order. Each is
    /// `{signal, transport, headers, content_encoding, received_at, answer, request}`.
    pub fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        text.lines()
            // The receiver writes whole lines; a torn last line is one still being written.
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The requests that were answered with success.
    pub fn accepted(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["answer"] == "ok")
            .collect()
    }

    /// Polls until `done(requests)` holds and returns the requests; for tests without an async
    /// runtime of their own (one driving a gpulse child process, say).
    ///
    /// # Panics
    /// After `timeout`, showing what did arrive.
    pub fn wait_for(&self, done: impl Fn(&[Value]) -> bool, timeout: Duration) -> Vec<Value> {
        let until = Instant::now() + timeout;
        loop {
            let got = self.requests();
            if done(&got) {
                return got;
            }
            if Instant::now() >= until {
                self.give_up(&got, timeout);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`Receiver::wait_for`] for async tests: it sleeps on the runtime, so a sender task on
    /// the same (current-thread) runtime keeps running.
    pub async fn wait_for_async(
        &self,
        done: impl Fn(&[Value]) -> bool,
        timeout: Duration,
    ) -> Vec<Value> {
        let until = Instant::now() + timeout;
        loop {
            let got = self.requests();
            if done(&got) {
                return got;
            }
            if Instant::now() >= until {
                self.give_up(&got, timeout);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn give_up(&self, got: &[Value], timeout: Duration) -> ! {
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        panic!(
            "the receiver did not get what was expected within {timeout:?}; it got {} \
             request(s):\n{}\nreceiver stderr:\n{err}",
            got.len(),
            got.iter().map(summary).collect::<Vec<_>>().join("\n")
        );
    }

    /// Stops the receiver with SIGTERM and returns its exit status.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running receiver");
        let pid = i32::try_from(child.id()).expect("pid fits i32");
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("wait for the receiver") {
                return status;
            }
            if Instant::now() >= until {
                let _ = child.kill();
                panic!("the receiver ignored SIGTERM for 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One line per recorded request for failure messages: no bodies, they can be long.
fn summary(r: &Value) -> String {
    format!(
        "  {} over {} answered {} at {}",
        r["signal"], r["transport"], r["answer"], r["received_at"]
    )
}

/// A throwaway CA and a server certificate for 127.0.0.1 and localhost, written as PEM files.
pub struct TestCa {
    pub ca_cert: PathBuf,
    pub server: ServerTls,
    /// A client certificate and key signed by the same CA, for mutual TLS.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _dir: tempfile::TempDir,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    pub fn new() -> TestCa {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::tempdir().expect("temporary directory for TLS files");
        let write = |name: &str, text: String| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };

        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "gpulse test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, &ca_key);

        let leaf = |name: &str| {
            let key = KeyPair::generate().expect("leaf key");
            let mut params =
                CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                    .expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, name);
            let cert = params.signed_by(&key, &issuer).expect("leaf certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf("otlp receiver");
        let (client_cert, client_key) = leaf("gpulse client");
        let ca_path = write("ca.pem", ca_cert.pem());
        TestCa {
            server: ServerTls {
                cert: write("server.pem", server_cert),
                key: write("server-key.pem", server_key),
                client_ca: None,
            },
            client_cert: write("client.pem", client_cert),
            client_key: write("client-key.pem", client_key),
            ca_cert: ca_path,
            _dir: dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self._dir.path()
    }
}
