#!/usr/bin/env bash
# EpilogSlurmctld: one gpulse job report per Slurm job, written when the job ends.
#
# Each GPU node runs gpulse as a node agent writing its OTLP/JSON lines to shared storage, one
# file per node and day, e.g. in a systemd unit:
#   gpulse run --exporter stdout >> /shared/gpulse/$(hostname)/$(date +%F).jsonl
# (or a node Collector's file exporter writing there). gpulse books every GPU process of a job
# under gpulse.job.id = SLURM_JOB_ID, read from the process's environment.
#
# slurm.conf:  EpilogSlurmctld=/etc/slurm/gpulse-epilog.sh
# The controller runs it once per job with SLURM_JOB_ID and SLURM_JOB_NODELIST set. It reads the
# files of the job's nodes and writes job.html and job.json into GPULSE_REPORT_DIR/<job id>/.
# It never fails the job: a report that cannot be made is logged and the epilog exits 0.
set -uo pipefail
recordings="${GPULSE_RECORDINGS:-/shared/gpulse}"
reports="${GPULSE_REPORT_DIR:-/shared/gpulse-reports}"
gpulse="${GPULSE_BIN:-/usr/local/bin/gpulse}"
job="${SLURM_JOB_ID:?EpilogSlurmctld runs with SLURM_JOB_ID set}"

files=()
for node in $(scontrol show hostnames "${SLURM_JOB_NODELIST:-}"); do
    # Today's and yesterday's file: a job that ran over midnight is in both.
    for day in "$(date +%F)" "$(date -d yesterday +%F)"; do
        [ -s "$recordings/$node/$day.jsonl" ] && files+=("$recordings/$node/$day.jsonl")
    done
done
if [ "${#files[@]}" -eq 0 ]; then
    logger -t gpulse-epilog "job $job: no gpulse recording of its nodes under $recordings"
    exit 0
fi
mkdir -p "$reports/$job"
if ! "$gpulse" report "${files[@]}" --job "$job" ${GPULSE_COST_PER_GPU_HOUR:+--cost-per-gpu-hour "$GPULSE_COST_PER_GPU_HOUR"} \
    -o "$reports/$job/job.html" --json "$reports/$job/job.json" 2> "$reports/$job/summary.txt"; then
    logger -t gpulse-epilog "job $job: no report: $(tail -n 3 "$reports/$job/summary.txt")"
fi
exit 0
