#!/usr/bin/env bash
# CPU seconds (user + sys of the whole process), wall seconds and peak memory of the two
# `cbdp audit-training` examples of docs/guide/training_audit.md (formerly the README's), two source
# trees alternated, two repeats (the first run of a tree compiles what its program store lacks). One
# JSON line per process.
#
#   git worktree add /tmp/base0 0af88ae
#   bash benchmarks/readme_training_cost.sh /tmp/base0 "$PWD" > /tmp/cost.jsonl
set -u
PY=${PYTHON:-python}
EXAMPLES=(
  "--data synthetic --examples 63 --sampler shuffle --batch-size 8 --steps 16 --noise 0.5 --runs 20000"
  "--data worst-case --sampler shuffle --steps 100 --noise 0.8 --runs 20000"
)
for rep in 1 2; do
  for tree in "$@"; do
    for ex in "${EXAMPLES[@]}"; do
      cd "$tree" || exit 2
      start=$(date +%s.%N)
      # shellcheck disable=SC2086
      /usr/bin/time -f "%U %S %M" -o /tmp/cost_time.txt env PYTHONPATH="$tree" "$PY" -m cbdp_jax.cli \
        audit-training $ex > /tmp/cost_out.txt 2>/dev/null
      code=$?
      end=$(date +%s.%N)
      read -r u s m < <(tail -1 /tmp/cost_time.txt)
      eps=$(tr "\n" " " < /tmp/cost_out.txt | tr -s " " | grep -o "every eps below [0-9.]*" | tail -1)
      printf '{"rep": %s, "tree": "%s", "commit": "%s", "example": "%s", "exit": %s, "cpu_s": %s, ' \
        "$rep" "$tree" "$(git -C "$tree" rev-parse --short HEAD)" "$ex" "$code" "$(echo "$u + $s" | bc)"
      printf '"wall_s": %s, "peak_kib": %s, "load": "%s", "eps": "%s"}\n' \
        "$(echo "$end - $start" | bc)" "$m" "$(cut -d' ' -f1 /proc/loadavg)" "$eps"
    done
  done
done
