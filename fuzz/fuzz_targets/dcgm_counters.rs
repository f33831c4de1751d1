//! Fuzz target: see `gpulse::fuzzing::dcgm_counters` for what the input is and which code it
//! drives.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpulse::fuzzing::dcgm_counters(data));
