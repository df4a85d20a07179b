#!/usr/bin/env bash
# The early-stopped sweeps in the short-run regime (README.md beside this file), each with seeds 0 and 1 (references
# and targets alike) to measure seed noise; every setting is trained to the end so that the early decisions can be
# checked against the truth. About 55 minutes of training on 2 CPU cores; each sweep holds the machine's shared
# CPU lock while it trains.
#   1. τ 0.2–3.2 of tiny-d80, with d48 and d64 trained as references;
#   2. the same τ of tiny-d96, with those d48, d64 and d80 runs given as references (3 sizes);
#   3. the batch at the seed-mean best τ of 1 (1.6), d80 again, with that τ's d48 and d64 given as references.
#   experiments/early_stop_sweep/run.sh [WORKDIR]      (default runs/early_stop_sweep)
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-runs/early_stop_sweep}
EXP=experiments/early_stop_sweep
TAUS=0.2,0.4,0.8,1.6,3.2

sweep() {  # sweep WORKDIR SEED ARGS...
    local workdir=$1 seed=$2
    shift 2
    flock /tmp/celerity_cpu.lock .venv/bin/celerity sweep --workdir "$workdir" \
        --gin-file $EXP/recipe.gin --gin-param "TrainConfig.seed = $seed" --fractions 0.1,0.2,0.3,0.5 --keep 1 "$@"
}

for seed in 0 1; do
    sweep "$WORK/regime_seed$seed" $seed --model experiments/tiny/d80.gin --sweep "RecipeConfig.tau=$TAUS" \
        --reference-model experiments/tiny/d48.gin --reference-model experiments/tiny/d64.gin
done
for seed in 0 1; do
    given=()
    for tau in ${TAUS//,/ }; do
        runs="$WORK/regime_seed$seed/tau_$tau"
        given+=(--reference-for "$tau=$runs/d48,$runs/d64,$runs/d80")
    done
    sweep "$WORK/regime_d96_seed$seed" $seed --model experiments/tiny/d96.gin --sweep "RecipeConfig.tau=$TAUS" \
        "${given[@]}"
done
for seed in 0 1; do
    runs="$WORK/regime_seed$seed/tau_1.6"
    sweep "$WORK/regime_batch_seed$seed" $seed --model experiments/tiny/d80.gin --gin-param "RecipeConfig.tau = 1.6" \
        --sweep "RecipeConfig.batch_seqs=4,8,16" --reference "$runs/d48,$runs/d64"
done

.venv/bin/python $EXP/report.py --out $EXP \
    --section 'τ 0.2–3.2 of d80, references d48 and d64' "$WORK/regime_seed0" "$WORK/regime_seed1" \
    --section 'τ 0.2–3.2 of d96, references d48, d64 and d80' "$WORK/regime_d96_seed0" "$WORK/regime_d96_seed1" \
    --section 'batch 4–16 of d80 at τ 1.6, references d48 and d64' "$WORK/regime_batch_seed0" \
    "$WORK/regime_batch_seed1"
cp "$WORK/regime_seed0/sweep.md" $EXP/sweep_regime_seed0.md
