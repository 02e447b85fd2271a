#!/bin/bash
# docs/doctor.md, worked example: bash benchmarks/doctor_oversubscribed.sh [OUT_DIR]
# Oversubscribed vs the doctor's fix vs one process on all cores, alternating, 3 rounds.
P=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/paratrain
OUT=${1:-runs/doctor-example}; mkdir -p "$OUT" && cd "$OUT" && rm -rf over-* fixed-* all-*
for r in 1 2 3; do
  $P train --workers 2 --threads-per-worker 2 --allow-oversubscribe --epochs 3 --limit-train 2000 --run-dir over-$r --quiet
  $P doctor over-$r > over-$r.doctor.txt
  $P train --limit-train 2000 --workers 2 --threads-per-worker 1 --run-dir fixed-$r --quiet
  $P train --workers 1 --epochs 3 --limit-train 2000 --run-dir all-$r --quiet
done
python3 - <<'PY'
import json
for kind in ("over","fixed","all"):
    rows=[json.load(open(f"{kind}-{r}/summary.json")) for r in (1,2,3)]
    print(kind, [round(s["epoch_time_s"],2) for s in rows], [round(s["samples_per_s"]) for s in rows],
          [round(s["breakdown"]["compute_s"]*1000,1) for s in rows], [round(s["machine_load"]["other_fraction"],2) for s in rows])
PY
grep -h "predicted" over-*.doctor.txt | head -6
