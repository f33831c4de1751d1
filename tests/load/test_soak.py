"""The few-minute CI version of the real-time soak (scripts/soak --real-time): every fault of
the hour-long run, compressed: the Collector restarted every 30 s, GPU 1 lost 10 s of every 40 s,
a wave of new GPU processes every 15 s, spans at 200/s throughout. Fails when the soak does
(gpulse died, memory grew, an accepted span lost uncounted, the receiver left a request
unanswered), with the soak's own output."""

import subprocess
import sys

import otlp_load


def test_the_real_time_soak_compressed(binaries):
    gpulse, lib = binaries
    argv = [sys.executable, str(otlp_load.REPO / "scripts" / "soak"), "--real-time", "--duration", "100",
            "--every", "5", "--restart-every", "30", "--down-for", "8", "--gpu-lost-every", "40",
            "--gpu-lost-for", "10", "--churn-every", "15", "--drain", "40", "--export-interval", "2s", "--enrich-history", "20s",
            "--gpulse", str(gpulse), "--sim-lib", str(lib),
            # 100 s is mostly warm-up (the debug build's RSS settles over the first minutes);
            # flatness is the hour-long run's to show, this one catches a leak of megabytes.
            "--max-growth-mib", "8"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    print(run.stdout)
    assert run.returncode == 0, f"the soak failed ({run.returncode}):\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    assert "soak: PASS" in run.stdout, run.stdout[-4000:]
