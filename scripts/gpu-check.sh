#!/usr/bin/env bash
# The whole CUDA check on a GPU machine that has nvcc, cuBLAS and PyTorch but no package registry and
# none of headlab's other libraries. Two halves:
#
#   scripts/gpu-check.sh pack          here (Debian 12, nvcc 13): builds build-gpu/ (Release, CUDA for sm_90,
#                                      -march=x86-64-v3, no MPI) and packs its programs, every shared library
#                                      they need that is neither glibc nor CUDA's, and the PyTorch peers into
#                                      .gpu/headlab-gpu.tar.gz (ignored by git; the programs find the libraries
#                                      through an RPATH of $ORIGIN/../lib, so nothing else on that machine changes;
#                                      the CUDA plugin libheadlab_cuda.so goes to lib/, and bin/ gets a link to it,
#                                      as headlab looks for it beside itself)
#   scripts/gpu-check.sh run [STEP..]  there, in the repository root, with .gpu carried: unpacks it into
#                                      /tmp/headlab-gpu and runs the steps (default env tests sanitize train cli
#                                      speed profile); also sweep_attention (the fused attention against the
#                                      composite path over T and D, for the automatic choice), attention_variants
#                                      (the backward's atomic and deterministic forms against torch) and
#                                      profile_attention (ncu over the tensor-core kernels) (speed = speed_train
#                                      speed_infer speed_attention; ROUNDS rounds each, default 3; STEP_SECONDS
#                                      limits a step, DEADLINE_SECONDS the run; SANITIZE_TOOLS picks among
#                                      memcheck racecheck initcheck, and GTEST_FILTER narrows the suites).
#                                      Each step's output goes to gpu-check.log and a PASS/FAIL line to
#                                      summary.txt, in $OUT when it is set (the device tool brings it back), else in
#                                      /tmp/headlab-gpu/out; runs and checkpoints stay in /tmp/headlab-gpu/work.
#
# From the device tool: run(command="bash scripts/gpu-check.sh run", carry=[".gpu"]), or a few steps per call
# to stay inside one call's time (on an H100: env tests sanitize ~80 s, train cli ~15 s, speed ~6 min).
set -uo pipefail
cd "$(dirname "$0")/.."
here=$PWD
pack_file=.gpu/headlab-gpu.tar.gz
programs=(headlab test_cuda_backend test_cuda_parity gpt_step decoder_infer sdpa_step)

pack() {
  set -e
  ./scripts/install-deps.sh
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "gpu-check pack: needs nvcc" >&2; exit 1; }
  # x86-64-v3 (AVX2, FMA): what any H100 host has; this machine's -march=native may not run there.
  # --disable-new-dtags makes the RPATH apply to the libraries' own dependencies too (RUNPATH does not).
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DHEADLAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DHEADLAB_NATIVE=OFF -DHEADLAB_MPI=OFF -DHEADLAB_EXAMPLES=OFF "-DCMAKE_CXX_FLAGS=-march=x86-64-v3" \
        "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags" "-DCMAKE_BUILD_RPATH=\$ORIGIN/../lib" >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target headlab_cli headlab_cuda test_cuda_backend test_cuda_parity gpt_step decoder_infer sdpa_step
  local stage=build-gpu/stage
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib" "$stage/peers" "$stage/plplot/drivers" "$stage/plplot/data" .gpu
  cp build-gpu/headlab build-gpu/tests/test_cuda_backend build-gpu/tests/test_cuda_parity build-gpu/bench/gpt_step \
     build-gpu/bench/decoder_infer build-gpu/bench/sdpa_step "$stage/bin/"
  # PLplot loads its output drivers and reads its colour maps and fonts at run time (PLPLOT_DRV_DIR,
  # PLPLOT_LIB, set by run below).
  local pl_drivers pl_data
  pl_drivers=$(ls -d /usr/lib/x86_64-linux-gnu/plplot*/drivers | head -1)
  pl_data=$(ls -d /usr/share/plplot[0-9]* | head -1)
  cp "$pl_drivers"/{cairo,svg,null,mem}.{so,driver_info} "$stage/plplot/drivers/"
  cp "$pl_data"/*.pal "$pl_data"/*.fnt "$stage/plplot/data/"
  # The CUDA backend, a plugin: the suites and gpt_step link it (RPATH: lib/), headlab dlopens it from
  # beside itself on first use of a GPU.
  cp build-gpu/libheadlab_cuda.so "$stage/lib/"
  ln -s ../lib/libheadlab_cuda.so "$stage/bin/libheadlab_cuda.so"
  cp ../shared/peers/*.py bench/torch_mha_peer.py bench/torch_sdpa_peer.py "$stage/peers/"
  # Every library the programs load, but glibc's (the GPU machine's own must be >= this one's) and
  # CUDA's (that machine's toolkit and driver provide them).
  for p in "$stage"/bin/* "$stage"/plplot/drivers/*.so; do ldd "$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64)\.so|/libcu(da|dart|blas|blasLt)\.so' |
    grep -v /libheadlab_cuda\.so |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  find "$stage/bin" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true  # not through the link
  tar -czf "$pack_file" -C "$stage" .
  echo "gpu-check pack: $(ls "$stage/lib" | wc -l) libraries, $(du -sh "$stage" | cut -f1) unpacked, $pack_file $(du -h "$pack_file" | cut -f1)"
  echo "glibc here: $(ldd --version | head -1)"
  local mib=$(( $(stat -c %s "$pack_file") / 1048576 ))
  # The device tool carries 64 MiB with the tree (about 6 MiB of it).
  if ((mib > 56)); then echo "gpu-check pack: $pack_file is $mib MiB; the device tool carries 64 MiB with the tree" >&2; exit 1; fi
}

# ---- the GPU machine ----
scratch=/tmp/headlab-gpu  # outside the tree, so that nothing unpacked here travels back with the next call
out=${OUT:-$scratch/out}
log=$out/gpu-check.log
summary=$out/summary.txt
root=$scratch/stage
work=$scratch/work
bin=$root/bin
status=0

say() { echo "$*" | tee -a "$log"; }
# step NAME COMMAND...: runs it, its output into the log, PASS/FAIL (exit code, seconds) into the summary.
# A GoogleTest program that skipped tests (no GPU visible) fails its step: a skip proves nothing here.
step() {
  local name=$1; shift
  say "==== $name: $*"
  local t0=$SECONDS output=$scratch/step.out
  # Every step has a limit (STEP_SECONDS, default 150), and none starts past DEADLINE_SECONDS from the
  # start of the run, so that one call of the device tool brings back every result it had time for.
  if ((SECONDS > ${DEADLINE_SECONDS:-100000})); then
    echo "SKIP $name (past the deadline of ${DEADLINE_SECONDS}s)" | tee -a "$summary" "$log"; status=1; return 1
  fi
  timeout "${STEP_SECONDS:-150}" "$@" >"$output" 2>&1
  local rc=$?
  cat "$output" >>"$log"
  local skipped
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests*[.,].*/\1/p' "$output" | head -1)
  skipped=${skipped:-0}
  ((rc == 0 && skipped > 0)) && rc=77
  local line
  line=$(printf '%-4s %-40s rc=%d %ds%s' "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "$name" "$rc" $((SECONDS - t0)) \
    "$( ((skipped > 0)) && echo " ($skipped tests skipped)")")
  echo "$line" | tee -a "$summary" "$log"
  ((rc == 0)) || status=1
  return $rc
}

step_env() {
  say "date: $(date -u +%FT%TZ)  host: $(uname -srm)"
  step nvidia-smi nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  step nvcc nvcc --version
  say "glibc there: $(ldd --version | head -1)"
  step python-torch python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0), 'tf32 matmul', torch.backends.cuda.matmul.allow_tf32)"
  # A library that does not resolve names itself here, before any test runs.
  step libraries-resolve bash -c "! ldd $bin/* | grep 'not found'"
}

step_tests() {
  step test_cuda_backend "$bin/test_cuda_backend" --gtest_brief=1
  step test_cuda_parity "$bin/test_cuda_parity" --gtest_brief=1
}

step_sanitize() {
  local tool
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
    step "compute-sanitizer $tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$bin/test_cuda_parity" --gtest_brief=1
  done
  step_leaks
}

step_leaks() {
  # The out-of-memory test makes cudaMalloc fail on purpose, which memcheck reports as an API error.
  step "compute-sanitizer memcheck (leaks)" compute-sanitizer --tool memcheck --leak-check full \
    --error-exitcode 1 "$bin/test_cuda_backend" --gtest_brief=1 --gtest_filter=-*OutOfMemory*
}

# 20 steps on the CPU and on the GPU from the same seed: the losses must agree (float32, TF32 off).
step_train() {
  local w=$work
  rm -rf "$w" && mkdir -p "$w"
  local args=(train --task reverse --emb-dim 64 --n-heads 4 --n-layers 2 --batch-size 32 --steps 20 --eval-every 10
              --eval-batches 2 --save-every 10 --log-every 1 --threads 4)
  step "train 20 steps cpu" "$bin/headlab" "${args[@]}" --device cpu --out "$w/cpu"
  step "train 20 steps cuda" "$bin/headlab" "${args[@]}" --device cuda --out "$w/cuda"
  step "cuda losses track cpu (1e-3 rel)" python3 - "$log" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
runs = text.split("==== train 20 steps ")[1:]
losses = [dict((int(s), float(l)) for s, l in re.findall(r"step (\d+)/20  loss ([0-9.]+)", r)) for r in runs[-2:]]
cpu, gpu = losses
assert len(cpu) == len(gpu) == 20, (len(cpu), len(gpu))
worst = max(abs(cpu[k] - gpu[k]) / cpu[k] for k in cpu)
print("steps", len(cpu), "largest relative difference", worst, "step 20:", cpu[20], gpu[20])
sys.exit(0 if worst < 1e-3 else 1)
EOF
}

step_cli() {
  local w=$work
  [[ -f $w/cuda/checkpoint.h5 ]] || step_train
  step "eval cuda" "$bin/headlab" eval "$w/cuda/checkpoint.h5" --device cuda
  step "eval cuda checkpoint on cpu" "$bin/headlab" eval "$w/cuda/checkpoint.h5" --device cpu
  step "eval cpu checkpoint on cuda" "$bin/headlab" eval "$w/cpu/checkpoint.h5" --device cuda
  step "resume cpu checkpoint on cuda" "$bin/headlab" train --task reverse --emb-dim 64 --n-heads 4 --n-layers 2 \
    --batch-size 32 --steps 30 --eval-every 10 --eval-batches 2 --save-every 10 --out "$w/cpu" --resume --device cuda
  step "generate cuda" "$bin/headlab" generate "$w/cuda/checkpoint.h5" --device cuda --prompt "1234>"
  step "ablate cuda" "$bin/headlab" ablate "$w/cuda/checkpoint.h5" --device cuda --out "$w/ablate" --prune 2
  step "heads cuda" "$bin/headlab" heads "$w/cuda/checkpoint.h5" --device cuda --out "$w/heads"
  step "compare cuda" "$bin/headlab" compare --device cuda --torch-peer off
}

# Interleaved rounds (ROUNDS, default 3), headlab and PyTorch eager on the same GPU, TF32 off for both
# (torch's default): training steps (toy and GPT-2 small), GPT-2 inference (prefill and decoding),
# attention (the fused kernel at T = 1024, head size 64; the two multi-head forms). `speed` runs all three.
step_speed_train() {
  local r
  local toy=(--vocab-size 64 --context-length 64 --emb-dim 128 --n-heads 4 --n-layers 2 --batch-size 32)
  local gpt2=(--vocab-size 50257 --context-length 1024 --emb-dim 768 --n-heads 12 --n-layers 12 --batch-size 8)
  for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
    step "speed toy headlab r$r" "$bin/gpt_step" "${toy[@]}" --device cuda --seconds 3
    step "speed toy torch r$r" python3 "$root/peers/torch_gpt_cpu.py" "${toy[@]}" --device cuda --seconds 3
    step "speed gpt2-small headlab r$r" "$bin/gpt_step" "${gpt2[@]}" --device cuda --seconds 5
    step "speed gpt2-small torch r$r" python3 "$root/peers/torch_gpt_cpu.py" "${gpt2[@]}" --device cuda --seconds 5
  done
  grep -hE "ms/step" "$log" | tee -a "$summary"
}

step_speed_infer() {
  local r
  for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
    step "speed gpt2 inference headlab r$r" "$bin/decoder_infer" --arch gpt --device cuda --prefill 960 --decode 64 --repeats 3
    step "speed gpt2 inference torch r$r" python3 "$root/peers/torch_gpt2_infer.py" --device cuda --prefill 960 \
      --decode 64 --repeats 3
  done
  grep -hE "^prefill|^decode|generate's prefill" "$log" | tee -a "$summary"
}

step_speed_attention() {
  local r
  for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
    step "speed sdpa fused r$r" "$bin/sdpa_step" --device cuda --form fused
    step "speed sdpa composite r$r" "$bin/sdpa_step" --device cuda --form composite
    step "speed sdpa auto r$r" "$bin/sdpa_step" --device cuda --form auto
    step "speed sdpa torch r$r" python3 "$root/peers/torch_sdpa_peer.py" --device cuda
  done
  step "speed mha headlab" "$bin/headlab" compare --device cuda --torch-peer off
  step "speed mha torch" python3 "$root/peers/torch_mha_cpu.py" --device cuda
  grep -hE " sdpa " "$log" | tee -a "$summary"
}

# The automatic choice's evidence: the fused kernels against the composite path, forward + backward, causal,
# B 8, H 12, over sequence lengths and head sizes (one run each).
step_sweep_attention() {
  local T D form
  for D in 32 64 128; do
    for T in 64 256 1024 2048; do
      for form in fused composite; do
        step "sweep sdpa $form T$T D$D" "$bin/sdpa_step" --device cuda --form "$form" --T "$T" --D "$D" --repeats 10
      done
    done
  done
  grep -hE "^headlab sdpa (fused|composite)" "$log" | sed -E 's/ device=cuda B=8 H=12//; s/ causal float32//' |
    tail -24 | tee -a "$summary"
}

# The tensor-core backward's two forms at the speed shape, interleaved with torch (ROUNDS rounds): dQ with
# atomics (the default) and deterministic (dQ in its own kernel).
step_attention_variants() {
  local r
  for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
    step "variant sdpa atomic r$r" "$bin/sdpa_step" --device cuda --form fused
    step "variant sdpa deterministic r$r" "$bin/sdpa_step" --device cuda --form fused --deterministic 1
    step "variant sdpa torch r$r" python3 "$root/peers/torch_sdpa_peer.py" --device cuda
  done
  awk '/^==== variant/ {name = $0; sub(/^==== /, "", name); sub(/: .*/, "", name)}
       /^(headlab|torch) .*sdpa/ && name != "" {print name ": " $0; name = ""}' "$log" | tee -a "$summary"
}

# Nsight Compute over one forward + backward of the tensor-core kernels at the speed shape: throughput, occupancy,
# and where the warps stall (the next step's evidence).
step_profile_attention() {
  step "ncu attention" ncu --kernel-name regex:mma_attention --launch-skip 6 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    "$bin/sdpa_step" --device cuda --form fused --repeats 2
}

step_speed() {
  step_speed_train
  step_speed_infer
  step_speed_attention
}

# Where the toy step's time goes: forward, backward and optimizer each to a synchronisation, and the
# host's time to issue a step (the GPU image has no Nsight Systems; ncu would serialise every kernel).
step_profile() {
  local toy=(--vocab-size 64 --context-length 64 --emb-dim 128 --n-heads 4 --n-layers 2 --batch-size 32)
  step "toy step phases" "$bin/gpt_step" "${toy[@]}" --device cuda --seconds 1 --phases 1
  grep -h "^phases" "$log" | tee -a "$summary"
}

run() {
  mkdir -p "$out"
  if [[ ! -x $bin/headlab ]]; then
    [[ -f $pack_file ]] || { echo "gpu-check run: no $pack_file (run scripts/gpu-check.sh pack first and carry .gpu)" >&2; exit 1; }
    mkdir -p "$root" && tar -xzf "$pack_file" -C "$root"
  fi
  # cuBLAS from the machine's toolkit, or from PyTorch's wheels where the toolkit has none.
  local cublas
  cublas=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -1)
  [[ -n $cublas ]] && export LD_LIBRARY_PATH=$cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The packed libraries for PLplot's drivers too (they are loaded by path, outside the programs' RPATH).
  export LD_LIBRARY_PATH=$root/lib:$LD_LIBRARY_PATH PLPLOT_DRV_DIR=$root/plplot/drivers PLPLOT_LIB=$root/plplot/data
  export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
  local steps=("$@")
  ((${#steps[@]})) || steps=(env tests sanitize train cli speed profile)
  local s
  for s in "${steps[@]}"; do
    case $s in
      env|tests|sanitize|leaks|train|cli|speed|speed_train|speed_infer|speed_attention|sweep_attention|profile|\
      attention_variants|profile_attention) "step_$s" ;;
      *) echo "gpu-check run: unknown step $s (env tests sanitize train cli speed[_train|_infer|_attention]" \
              "sweep_attention profile attention_variants profile_attention)" >&2; exit 2 ;;
    esac
  done
  echo "---- summary ($summary)"
  cat "$summary"
  exit $status
}

case ${1:-} in
  pack) pack ;;
  run) shift; run "$@" ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 2 ;;
esac
