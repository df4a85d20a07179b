#!/usr/bin/env bash
# The early-stopped τ sweep of tiny-d80 (README.md beside this file). Every setting is trained to the end
# so that the early decisions can be checked against the truth; the main grid is swept with two seeds
# (references and targets alike) to measure seed noise. About 10 minutes of training on 2 CPU cores;
# each sweep holds the machine's shared CPU lock while it trains.
#   experiments/early_stop_sweep/run.sh [WORKDIR]      (default runs/early_stop_sweep)
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-runs/early_stop_sweep}
EXP=experiments/early_stop_sweep

sweep() {  # sweep WORKDIR TAUS SEED
    flock /tmp/celerity_cpu.lock .venv/bin/celerity sweep --workdir "$1" \
        --model experiments/tiny/d80.gin \
        --reference-model experiments/tiny/d48.gin --reference-model experiments/tiny/d64.gin \
        --gin-file $EXP/recipe.gin --gin-param "TrainConfig.seed = $3" \
        --sweep "RecipeConfig.tau=$2" --fractions 0.1,0.2,0.3 --keep 1
}

sweep "$WORK/first_seed0" 0.05,0.1,0.2,0.4,0.8 0   # the first grid: its best τ was its largest
sweep "$WORK/main_seed0" 0.2,0.4,0.8,1.6,3.2 0     # the main grid, centred on that optimum
sweep "$WORK/main_seed1" 0.2,0.4,0.8,1.6,3.2 1

.venv/bin/python $EXP/report.py --out $EXP --section 'Main grid: τ 0.2–3.2, two seeds' "$WORK/main_seed0" \
    "$WORK/main_seed1" --section 'First grid: τ 0.05–0.8, one seed' "$WORK/first_seed0"
cp "$WORK/main_seed0/sweep.md" $EXP/sweep_main_seed0.md
