#!/usr/bin/env bash
# train_compare.sh: tandem train beside PyTorch DDP (gloo) on one experiment,
# in one run, as the trainer's benchmark figures are measured:
#
#   1. one host: tandem and DDP at 1 and 2 slots (`tandem train --scaling 1,2 --anchor`);
#   2. two network namespaces over a tbf-limited veth (bench/netns_run.sh):
#      tandem with overlap and fp16 gradients, DDP-gloo, DDP with its fp16
#      hook, all on the same model; and, when --layer-slices computes the
#      hidden layers in blocks, DDP-gloo and its fp16 hook on the model
#      rewritten into that many separate layers (ddp_anchor.py
#      --separate-slices: DDP reduces whole parameters only);
#   3. one table over all of them (`tandem-train --compare`): samples/s,
#      speed-up and scaling efficiency against the same system's 1-slot run,
#      time to the target validation accuracy, final accuracy.
#
# Both systems train the same trajectory (the same initial values, epoch
# order and dropout draws; trainer/ddp_anchor.py), yet rounding (blocked fc1,
# reduction order, fp16) grows over hundreds of steps into accuracies a point
# apart, so one seed's time to the target is a draw: --seeds repeats the
# 2-slot rows for each seed and gives every ratio's median (seeds.md).
#
# Every rank trains the same per-slot batch (--per-slot-batch, weak scaling:
# the global batch grows with the slots) for the same number of records
# (--records), so every run sees the same data and time to accuracy compares.
# Needs root for the namespaces (step 2 is skipped otherwise, with a message).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/train_compare.sh [options]
  --config FILE        experiment (default trainer/examples/fashion_mnist.yaml)
  --per-slot-batch N   samples per slot per batch (default 32)
  --records N          training records per run (default 38400)
  --validate N         validate every N records (default 12800)
  --rate RATE          link rate between the namespaces (default 1gbit)
  --bind auto|none     each namespace on its own CPUs, or not (bench/netns_run.sh --bind; default auto)
  --target ACC         target validation accuracy (default 0.85)
  --layer-slices K     hyperparameters.layer_slices for every run (default: the config's)
  --fusion-threshold M optimizations.tensor_fusion_threshold in MB (tandem's largest bucket, DDP's bucket_cap_mb)
  --error-feedback     tandem's fp16 link row with optimizations.error_feedback (what rounding dropped is sent next step)
  --rounding-control   also DDP on one host with the convolutions channels-last, as tandem-train keeps them (tandem's
                       trajectory bit for bit, in every seed with --seeds); with --layer-slices, also DDP with each
                       sliced layer as separate layers (fc1 computed in blocks as tandem does): how far rounding
                       alone moves DDP
  --output DIR         results (default build/train-compare)
  --seed N             reproducibility.experiment_seed for every run (default: the config's)
  --seeds N,N,...      every run for the first seed (with --core, only its rows), the 2-slot rows for the others, each into DIR/seed-N;
                       then DIR/seeds.md: time to the target and final accuracy per seed, ratios, medians
  --core               only the 2-slot rows (one host, and the link without --separate-slices runs)
  --skip-local         only the namespace runs (still compared against 1-slot runs in DIR, if any)
  -h, --help           this text
EOF
}

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="$repo/trainer/examples/fashion_mnist.yaml" per_slot=32 records=38400 validate=12800 rate=1gbit
target=0.85 out="$repo/build/train-compare" skip_local=0 slices="" fusion="" bind=auto seed="" seeds="" core=0 feedback=0 control=0
args_in=("$@")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --per-slot-batch) per_slot="$2"; shift 2 ;;
    --records) records="$2"; shift 2 ;;
    --validate) validate="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --bind) bind="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --layer-slices) slices="$2"; shift 2 ;;
    --fusion-threshold) fusion="$2"; shift 2 ;;
    --output) out="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --core) core=1; shift ;;
    --error-feedback) feedback=1; shift ;;
    --rounding-control) control=1; shift ;;
    --skip-local) skip_local=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "train_compare: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
train="$repo/build/bin/tandem-train"
[[ -x "$train" ]] || { echo "train_compare: $train not built (needs libtorch-dev)" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [[ -n "$seeds" ]]; then
  # This script once per seed (without --seeds/--output), then the medians.
  pass=() skip=0
  for a in "${args_in[@]}"; do
    if (( skip )); then skip=0; continue; fi
    case "$a" in --seeds|--output|--seed) skip=1 ;; *) pass+=("$a") ;; esac
  done
  IFS=, read -ra list <<< "$seeds"
  first=1
  for s in "${list[@]}"; do
    echo "==== seed $s"
    extra=(); (( first )) || extra=(--core)
    "$0" "${pass[@]}" --seed "$s" --output "$out/seed-$s" "${extra[@]}"
    first=0
  done
  exec /usr/bin/python3 "$repo/bench/train_seeds.py" --target "$target" --rate "$rate" --output "$out/seeds.md" "$out"/seed-*
fi

# The experiment with the lengths in records (the same data at every slot count)
# and, for tandem over the link, fp16 gradients.
/usr/bin/python3 - "$config" "$out" "$records" "$validate" "$slices" "$fusion" "$seed" "$feedback" <<'EOF'
import sys, yaml
src, out, records, validate, slices, fusion, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
feedback = sys.argv[8] == "1"
cfg = yaml.safe_load(open(src))
if seed:
    cfg.setdefault("reproducibility", {})["experiment_seed"] = int(seed)
if slices:
    cfg["hyperparameters"]["layer_slices"] = int(slices)
if fusion:
    cfg.setdefault("optimizations", {})["tensor_fusion_threshold"] = int(fusion)
cfg["searcher"]["max_length"] = {"records": records}
cfg["min_validation_period"] = {"records": validate}
cfg.pop("min_checkpoint_period", None)
cfg.pop("checkpoint_storage", None)  # checkpoints into each run's own directory
cfg.setdefault("optimizations", {})["gradient_compression"] = False
yaml.safe_dump(cfg, open(f"{out}/exp.yaml", "w"), sort_keys=False)
cfg["optimizations"]["gradient_compression"] = "fp16"
if feedback:
    cfg["optimizations"]["error_feedback"] = True
yaml.safe_dump(cfg, open(f"{out}/exp-fp16.yaml", "w"), sort_keys=False)
EOF

common=(--per-slot-batch "$per_slot" --target-accuracy "$target")
if (( ! skip_local )); then
  echo "== one host: tandem and DDP (gloo), 1 and 2 slots"
  "$train" "$out/exp.yaml" --scaling "$( (( core )) && echo 2 || echo 1,2)" --anchor "${common[@]}" --output "$out/local"
fi

compare=()
for c in "tandem=$out/local/slots-1" "tandem, one host=$out/local/slots-2" \
         "DDP gloo=$out/local/ddp-slots-1" "DDP gloo, one host=$out/local/ddp-slots-2"; do
  [[ -f "${c#*=}/metrics.jsonl" ]] && compare+=("$c")
done
ddp_local() {  # directory under local/, system, [ddp_anchor.py flags]: DDP at 2 ranks on this host
  echo "== one host: $2, 2 ranks"
  /usr/bin/python3 "$repo/trainer/ddp_anchor.py" "$out/exp.yaml" --slots 2 --per-slot-batch "$per_slot" \
    --output "$out/local/$1" "${@:3}"
}
# tandem-train keeps the convnet's convolutions channels-last; DDP on the same layout, for reference.
if (( ! skip_local && (! core || control) )); then ddp_local ddp-cl-slots-2 "DDP gloo channels-last" --channels-last; fi
if (( control && ! skip_local )) && [[ -n "$slices" && "$slices" != 1 ]]; then
  ddp_local ddp-separate-slots-2 "DDP gloo, $slices separate slices (rounding control)" --separate-slices
fi
[[ -f "$out/local/ddp-cl-slots-2/metrics.jsonl" ]] && compare+=("DDP gloo channels-last, one host=$out/local/ddp-cl-slots-2")
[[ -f "$out/local/ddp-separate-slots-2/metrics.jsonl" ]] &&
  compare+=("DDP gloo, separate slices, one host=$out/local/ddp-separate-slots-2")
if (( EUID != 0 )); then
  echo "train_compare: not root: skipping the runs between network namespaces" >&2
else
  netns=("$repo/bench/netns_run.sh" -n 2 --rate "$rate" --bind "$bind" --timeout 1800)
  fp16_label="overlap + fp16$( (( feedback )) && echo " + error feedback" || true)"
  echo "== two namespaces over a $rate link: tandem ($fp16_label)"
  rm -rf "$out/link-tandem-fp16"
  "${netns[@]}" -- "$train" --worker "$out/exp-fp16.yaml" --slots 2 --per-slot-batch "$per_slot" \
    --output "$out/link-tandem-fp16" --checkpoint-dir "$out/link-tandem-fp16/checkpoints"
  compare+=("tandem $fp16_label, $rate=$out/link-tandem-fp16")
  ddp_link() {  # directory, system, [ddp_anchor.py flags]
    echo "== two namespaces over a $rate link: $2"
    rm -rf "$out/$1"
    "${netns[@]}" --env GLOO_SOCKET_IFNAME=eth0 -- /usr/bin/python3 "$repo/trainer/ddp_anchor.py" "$out/exp.yaml" \
      --from-env --per-slot-batch "$per_slot" --output "$out/$1" "${@:3}"
    compare+=("$2, $rate=$out/$1")
  }
  ddp_link link-ddp "DDP gloo"
  ddp_link link-ddp-fp16 "DDP gloo + fp16 hook" --fp16-hook
  if [[ -n "$slices" && "$slices" != 1 ]] && (( ! core )); then
    ddp_link link-ddp-separate "DDP gloo, $slices separate slices" --separate-slices
    ddp_link link-ddp-separate-fp16 "DDP gloo + fp16 hook, $slices separate slices" --separate-slices --fp16-hook
  fi
fi

args=()
for c in "${compare[@]}"; do args+=(--compare "$c"); done
"$train" "$out/exp.yaml" "${args[@]}" --target-accuracy "$target" --output "$out"
