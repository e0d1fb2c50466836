#!/usr/bin/env bash
# One audit across a Slurm array: N array tasks each audit one shard, then a dependent job merges
# them into the audit a single run gives (docs/scaling.md, "Audits across machines").
#
#   bash scripts/audit_slurm.sh N WORK OUT IN.jsonl... [-- replay options]
#
# WORK (shard directories), OUT and the inputs must be on a filesystem every node sees. Each
# array task runs `envace-audit replay ... --shard $SLURM_ARRAY_TASK_ID/N --out WORK/shard_I`;
# a task that exits 3 (audit written, some records skipped: listed in its summary.json) is
# reported as 0 so that the merge job (afterok) still runs, and the merge exits 3 itself.
# ENVACE_AUDIT overrides the command (default: envace-audit on PATH); SBATCH_OPTS adds sbatch
# options (partition, time, account).
set -euo pipefail

if [[ $# -lt 4 ]]; then
  echo "usage: $0 N WORK OUT IN.jsonl... [-- replay options]" >&2
  exit 2
fi
n=$1 work=$2 out=$3
shift 3
inputs=() extra=()
while [[ $# -gt 0 && $1 != "--" ]]; do inputs+=("$1"); shift; done
if [[ $# -gt 0 ]]; then shift; extra=("$@"); fi
if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
  echo "$0: N must be a positive integer, got '$n'" >&2
  exit 2
fi
audit=${ENVACE_AUDIT:-envace-audit}
mkdir -p "$work"

q() {  # the arguments, each quoted for the job script, joined by spaces
  local out=() a
  for a in "$@"; do out+=("$(printf '%q' "$a")"); done
  echo "${out[*]-}"
}

array_id=$(sbatch --parsable ${SBATCH_OPTS:-} --array="0-$((n - 1))" \
  --job-name=envace-audit-shard --output="$work/shard_%a.log" --wrap "
    $(q "$audit") --quiet replay $(q "${inputs[@]}") --shard \${SLURM_ARRAY_TASK_ID}/$n \
      --out $(q "$work")/shard_\${SLURM_ARRAY_TASK_ID} $(q "${extra[@]+"${extra[@]}"}")
    code=\$?; [ \$code -eq 3 ] && exit 0; exit \$code")

dirs=()
for ((i = 0; i < n; i++)); do dirs+=("$work/shard_$i"); done
merge_id=$(sbatch --parsable ${SBATCH_OPTS:-} --dependency="afterok:$array_id" \
  --job-name=envace-audit-merge --output="$work/merge.log" \
  --wrap "$(q "$audit") --quiet merge $(q "${dirs[@]}") --out $(q "$out")")

echo "submitted shards $array_id (array 0-$((n - 1))) and merge $merge_id -> $out"
