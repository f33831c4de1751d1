//! Fuzz target: see `gpulse::fuzzing::pod_resources` for what the input is and which code it drives.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpulse::fuzzing::pod_resources(data));
