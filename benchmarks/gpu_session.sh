#!/usr/bin/env bash
# The GPU checks on the device machine (no uv, no network), one stage per call so
# that each stays under a call's 10-minute limit; logs and results go to $OUT.
#
# Here, once (the wheels the machine lacks, uv.lock's versions, and the CIFAR-10 JPEG folder, ~20 MB packed;
# the machine's image has no pydantic, which the config schema imports, and an older typing-extensions):
#   printf '/.whl/\n/cifar10.tar.gz\n' >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl hydra-core==1.3.8 omegaconf==2.3.1 pydantic==2.14.3 \
#       pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
#   tar czf cifar10.tar.gz -C ../shared/datasets cifar10
#   git show 0cfef3a^:hvp_lightning/data/batched.py > .whl/batched_every_op.py  # blur: every op on every view
# There, one call per stage, carrying .whl (and cifar10.tar.gz for the cifar stage):
#   bash benchmarks/gpu_session.sh tests-parallel  # all of the below at once (pytest-xdist, 12 workers)
#   bash benchmarks/gpu_session.sh tests-runs   # test_run_on_one_gpu: the paper's methods x precision x HVP
#   bash benchmarks/gpu_session.sh tests-runs-more  # the same for BYOL, MoCo v3, VICReg, Barlow Twins
#   bash benchmarks/gpu_session.sh tests-compile  # compiled HVP steps (inductor compiles: minutes)
#   bash benchmarks/gpu_session.sh tests-rest   # the rest of pytest -m gpu, but for the four below
#   bash benchmarks/gpu_session.sh tests-rest-more  # the rest for BYOL, MoCo v3, VICReg, Barlow Twins
#   bash benchmarks/gpu_session.sh simsiam      # SimSiam R50 224 px HVP N=4 bf16 compiled: >= 1,300 images/s
#   bash benchmarks/gpu_session.sh dino         # DINO ViT-S/16 HVP 4+16 crops bf16: >= 500 images/s
#   bash benchmarks/gpu_session.sh steady       # the steps alone (~3-5 min): baseline, HVP and the cheaper selections'
#                                               # steps, 100 timed rounds interleaved (benchmarks/overhead.py: no loader,
#                                               # no teardown), images/s, MFU, step time against FLOPs; DINO ViT-S/16
#                                               # and SimSiam R50 at 224 px, bf16
#   bash benchmarks/gpu_session.sh blur         # the colour step and its blur per batch (benchmarks/view_cost.py batch),
#                                               # and the step that ran every op on every view, where .whl has it (above)
#   bash benchmarks/gpu_session.sh profile      # that DINO step taken apart (benchmarks/step_profile.py, ~2-3 min):
#                                               # images/s with/without HVP and loader, time per hook and range,
#                                               # top ops by GPU and CPU time, host syncs by source line
#   bash benchmarks/gpu_session.sh cifar        # CIFAR-10 SimCLR R18 HVP N=4 bf16, 100 epochs: <= 10 min
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?"stage: tests-parallel, tests-runs, tests-runs-more, tests-compile, tests-rest, tests-rest-more, simsiam, dino, steady, profile, blur or cifar"}
out=${OUT:-/tmp/gpu_session}
limit=${LIMIT:-570}  # seconds for the stage (LIMIT=300 to chain stages in one call)
mkdir -p "$out"
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site WANDB_MODE=disabled
{ date -u; nvidia-smi -L || true; python3 -c "import torch, torchvision, lightning; print(torch.__version__, \
torchvision.__version__, lightning.__version__)"; git log --oneline -1 2>/dev/null || true; } > "$out/$stage.env.txt"

more="byol or mocov3 or vicreg or barlow_twins"  # the methods beyond the paper's: stages of their own

# Generated JPEGs (benchmarks/.cache, made once per machine, ~15 ms each): a fit runs one epoch,
# so a round's (2 + 20) batches must fit in them (of 512, only 6 DINO steps of 64 and 2 SimSiam
# steps of 128 would be timed, with the fit's teardown).
loader() {  # benchmarks/loader.py with the GPU targets' loader settings; table appended to results.md
    timeout -k 10 "$limit" python3 benchmarks/loader.py --crop 224 --views 4 --workers 14 --batches 20 --device cuda \
        --step --out "$out/results.md" "$@" 2>&1 | tee "$out/$stage.txt"
}

case "$stage" in
    tests-runs) timeout -k 10 "$limit" python3 -m pytest -m gpu -n 0 -q -rfEs --durations=15 tests/test_gpu.py \
                    -k "test_run_on_one_gpu and not ($more)" 2>&1 | tee "$out/$stage.txt" ;;
    tests-runs-more) timeout -k 10 "$limit" python3 -m pytest -m gpu -n 0 -q -rfEs --durations=15 tests/test_gpu.py \
                    -k "test_run_on_one_gpu and ($more)" 2>&1 | tee "$out/$stage.txt" ;;
    tests-parallel) timeout -k 10 "$limit" python3 -m pytest -m gpu -n 12 --dist load -q -rfEs --durations=30 --timeout 300 \
                    tests/ 2>&1 | tee "$out/$stage.txt" ;;  # all of -m gpu over 12 xdist workers (16 cores)
    tests-compile) timeout -k 10 "$limit" python3 -m pytest -m gpu -n 0 -q -rfEs --durations=15 tests/test_gpu.py \
                    -k compiled 2>&1 | tee "$out/$stage.txt" ;;
    tests-rest) timeout -k 10 "$limit" python3 -m pytest -m gpu -n 0 -q -rfEs --durations=15 \
                    -k "not test_run_on_one_gpu and not compiled and not ($more)" 2>&1 | tee "$out/$stage.txt" ;;  # every file
    tests-rest-more) timeout -k 10 "$limit" python3 -m pytest -m gpu -n 0 -q -rfEs --durations=15 \
                    -k "not test_run_on_one_gpu and not compiled and ($more)" 2>&1 | tee "$out/$stage.txt" ;;
    simsiam) loader --method simsiam --batch-size 128 --images 2816 --backbone resnet50 \
                 --override trainer.precision=bf16-mixed method.compile=true ;;
    dino) loader --method dino --batch-size 64 --images 1408 --backbone vit_small --override trainer.precision=bf16-mixed ;;
    profile) timeout -k 10 "$limit" python3 benchmarks/step_profile.py --method dino --backbone vit_small \
                 --batch-size 64 --images 1408 --crop 224 --views 4 --workers 14 --warmup 5 --batches 10 --device cuda \
                 --override trainer.precision=bf16-mixed --out "$out/results.md" 2>&1 | tee "$out/$stage.txt" ;;
    steady)  # each model's step alone, in rounds that alternate them; half the stage's limit per method
        steady() {  # a method cut by its time limit (timeout's 124, with its report) or failing: the next still runs
            timeout -k 10 $(( limit / 2 )) python3 benchmarks/overhead.py "$@" --crop 224 --num-views 4 --device cuda \
                --precision bf16-mixed --iters 100 --warmup 10 --out "$out/results.md" 2>&1 | tee -a "$out/$stage.txt" \
                || echo "overhead.py $1 $2: exit $?" | tee -a "$out/$stage.txt"
        }
        steady --method dino --preset dino --backbone vit_small --batch-size 64 \
            --variant scale50:hvp.selection_scale=0.5 min_iou:hvp.mode=min_iou
        steady --method simsiam --preset simsiam --backbone resnet50 --batch-size 128 \
            --variant scale50:hvp.selection_scale=0.5 fraction25:hvp.selection_fraction=0.25 \
            scale50_fraction50:hvp.selection_scale=0.5,hvp.selection_fraction=0.5 min_iou:hvp.mode=min_iou ;;
    blur) before=(); [ -f .whl/batched_every_op.py ] && before=(--baseline .whl/batched_every_op.py)
          timeout -k 10 "$limit" python3 benchmarks/view_cost.py batch --device cuda "${before[@]}" --out "$out/results.md" \
              2>&1 | tee "$out/$stage.txt" ;;
    cifar)
        tar xzf cifar10.tar.gz -C /tmp
        run=/tmp/cifar_run  # checkpoints stay here; summary and log go back
        # train.py as a user runs it (progress bar on: it reads the step's loss from the GPU each
        # step). The call's own limit is 600 s, setup included: train.py is stopped before it.
        start=$(date +%s)
        timeout -k 10 "$limit" python3 train.py data=imagefolder data.root=/tmp/cifar10 data.on_device=true \
            method=simclr_cifar backbone=resnet18_cifar +hvp=on trainer=gpu trainer.max_epochs=100 logger=csv \
            hydra.run.dir="$run" > "$out/$stage.log" 2>&1 \
            || echo "train.py failed or ran out of time (exit $?)" >> "$out/$stage.log"
        tail -40 "$out/$stage.log" | tee "$out/$stage.txt"
        echo "wall time: $(( $(date +%s) - start )) s (target <= 600 s)" | tee -a "$out/$stage.txt"
        cp "$run/summary.json" "$run/train.log" "$out/" 2>/dev/null || true ;;
    *) echo "unknown stage: $stage" >&2; exit 2 ;;
esac
