//! Marks the cdylib `-z nodelete`: `dlclose` then leaves it loaded, so its state (the loaded
//! scenario, the clock started at the first init, the "already reported" flag of a bad
//! scenario) lives as long as the process. nvml-wrapper unloads the library whenever an init
//! fails or an `Nvml` is dropped; without this, a client re-initialising after a driver fault
//! would restart the scenario from t=0 and a bad scenario would be reported on every retry.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
