# Sourced by the 8 GPUs x 64 real processes benchmarks (record_cost.sh, top_cost.sh):
# write_8x64_scenario FILE starts 64 real sleeping processes, 8 per GPU, appends their PIDs to
# the caller's SLEEPERS (for its cleanup), sets ENV_ARGS to the GPULSE_BENCH_PIDS_<gpu>=... the
# scenario reads, and writes nvml-sim's scenario to FILE.
write_8x64_scenario() {
    SCENARIO=$1
    cat > "$SCENARIO" <<'TOML'
[driver]
version = "570.124.06"
nvml_version = "12.570.124.06"
cuda_version = "12.8"
TOML
    ENV_ARGS=()
    for gpu in $(seq 0 7); do
        pids=()
        for _ in $(seq 1 8); do
            sleep 100000 &
            SLEEPERS+=($!)
            pids+=($!)
        done
        ENV_ARGS+=("GPULSE_BENCH_PIDS_$gpu=$(IFS=,; echo "${pids[*]}")")
        cat >> "$SCENARIO" <<TOML

[[device]]
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
power_limit_w = 700

[device.signals]
gpu_util = { mean = 75, amplitude = 20, period = 30, stddev = 3, seed = $((gpu + 1)), min = 0, max = 100 }
mem_util = { mean = 40, stddev = 5, seed = 2, min = 0, max = 100 }
temperature_c = { mean = 62, amplitude = 5, period = 120 }
power_w = { mean = 450, amplitude = 150, period = 30 }
clock_sm_mhz = { mean = 1700, stddev = 40, seed = 3 }
clock_mem_mhz = 2619
throttle_reasons = { steps = [[0, 0], [20, 4], [40, 0]] }

[[device.process]]
pids_env = "GPULSE_BENCH_PIDS_$gpu"
kind = "compute"
    memory_used_mib = { mean = 8750, stddev = 64, seed = 6, min = 0 }
sm_util = { mean = 12, stddev = 1, seed = 7, min = 0, max = 100 }
mem_util = { mean = 6, stddev = 1, seed = 8, min = 0, max = 100 }
TOML
    done
}
