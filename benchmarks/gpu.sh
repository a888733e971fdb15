#!/usr/bin/env bash
# benchmarks/gpu.sh -- set up and run opregistry's GPU suite (issue 30) from the working tree.
#
#   bash benchmarks/gpu.sh [--dry-run] [--skip suite|gpu-tests|bench]...   (repository root)
#
# Made for the lent GPU machine (no network; python3 is Python 3.12 with a CUDA build of
# torch 2.11 and Triton 3.6), in ONE device call: run(command="bash benchmarks/gpu.sh",
# carry=[".whl"], timeout_s=590).  It also runs on a CPU machine: it says "no GPU", skips
# the benchmark and runs the rest (the cuda tests skip); --dry-run only prints the steps.
#
# Steps: the GPU (nvidia-smi); the carried wheels (.whl -> $SITE); the requirements check;
# the monorepo install (one pip call); `opregistry list` (the cuda backend must be
# available where there is a GPU); `pytest -m cuda` over tests/ plugins/ examples/;
# `pytest tests/test_gpu.py`; `benchmarks/bench_call.py --device cuda --reps 5`; a
# summary (passed/failed/skipped per step, python, torch, triton, GPU).  Everything is
# teed into $OUT/gpu.log when OUT is set (the device tool brings $OUT back), with the
# pytest junit files and the benchmark's JSON beside it.  The steps share a time budget
# (GPU_SH_BUDGET seconds, default 540, under the device's 600-second command limit);
# a step with too little time left is reported as not run.
#
# Why `pip install --target $SITE` (with PYTHONPATH=$SITE) rather than a venv with
# --system-site-packages: python3 there is itself a venv (/opt/torch/.venv), and a venv
# made from a venv with --system-site-packages sees the *base* interpreter's site-packages,
# not /opt/torch/.venv's -- torch would be missing.  --target adds our distributions
# (dist-info and entry points included, which opregistry and torch's autoload read) in
# front of the machine's own packages without touching them, so the machine's CUDA torch
# is the one used and can never be replaced (--no-deps: pip resolves nothing, --no-index:
# it fetches nothing).  --no-build-isolation: the builds use the setuptools on PYTHONPATH
# (carried, see below) and extension_cpp's setup.py sees the installed torch and compiles
# csrc/muladd.cu with nvcc for this GPU (TORCH_CUDA_ARCH_LIST is set to its capability).
# The distributions installed are the ones requirements-dev.txt installs (its `-e` lines):
# the core, every plugin, the example op packages.  examples/int8kit is left out as in the
# dev environment and CI: the tests load it through a temporary dist-info, and an
# installed copy would clash with that (the int8kit namespace defined twice).
#
# The wheels to carry, built on a machine with network, in the repository root
# (.whl is ignored by git: /.whl/ in .gitignore).  What a bare Python 3.12 + torch 2.11
# image lacks of opregistry's requirements (pyproject.toml; every plugin and example only
# adds opregistry, torch and numpy), read from the packages' metadata:
#   structlog>=24.1        (opregistry)                 pure Python, no requirement on 3.12
#   importlib-metadata>=6  (opregistry)                 10.2.0 requires zipp>=3.20 and
#   zipp, lazy-importer    (importlib-metadata 10.2.0)  lazy-importer>=0.1 (python < 3.15)
#   setuptools>=77.0.3     (building: every pyproject.toml has a PEP 639 license string;
#                           older setuptools refuse it, and the image's version is unknown)
#   expecttest             (opregistry[test])
# attrs>=23.1, pluggy>=1.5, numpy, packaging, pytest, hypothesis, typing-extensions are in
# the image (device KINDS.md); the requirements step below checks every version anyway
# and names what is missing.  tomli is only for Python < 3.11.
#
#   echo /.whl/ >> .git/info/exclude   # (already in .gitignore)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl \
#     structlog==26.1.0 importlib-metadata==10.2.0 zipp==4.1.2 lazy-importer==0.1.0 \
#     setuptools==84.2.1 expecttest==0.3.0
#   # only if the requirements step reports them missing or too old:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl attrs==26.1.0 pluggy==1.7.0
#
# (All of these are py3-none-any wheels; the --platform flags are the device README's and
# harmless.  Keep one version of each in .whl: two stop the whole install.)

set -u
set -o pipefail

DRY=0
SKIP=" "
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --skip)  # a rerun on a warm machine: --skip suite, --skip gpu-tests, --skip bench
            shift
            case "${1:-}" in
                suite|gpu-tests|bench) SKIP="$SKIP$1 " ;;
                *) echo "gpu.sh: --skip takes suite, gpu-tests or bench" >&2; exit 2 ;;
            esac ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "gpu.sh: unknown argument: $1 (try --dry-run)" >&2; exit 2 ;;
    esac
    shift
done
skipped() { case "$SKIP" in *" $1 "*) return 0 ;; esac; return 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
SITE=${GPU_SH_SITE:-/tmp/site}
BUDGET=${GPU_SH_BUDGET:-540}
START=$SECONDS
OUTDIR=${OUT:-}
LOG=/dev/null
if [ -n "$OUTDIR" ] && [ "$DRY" = 0 ]; then
    mkdir -p "$OUTDIR"
    LOG=$OUTDIR/gpu.log
    : >"$LOG"
fi
export PYTHONUNBUFFERED=1

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# -- the GPU -----------------------------------------------------------------------------
GPU=""
CAP=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
    CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
fi

# -- the distributions to install: requirements-dev.txt's editable lines ------------------
DISTS=()
while read -r path; do
    DISTS+=("$path")
done < <(sed -n 's/^-e \([^[ ]*\).*$/\1/p' requirements-dev.txt)
if [ "${#DISTS[@]}" -lt 3 ]; then
    echo "gpu.sh: found no '-e PATH' lines in requirements-dev.txt" >&2
    exit 2
fi
# every plugin and example with a pyproject.toml must be among them, except int8kit (see top)
for d in plugins/*/ examples/*/; do
    d=${d%/}
    [ -f "$d/pyproject.toml" ] || continue
    [ "$d" = examples/int8kit ] && continue
    case " ${DISTS[*]} " in *" $d "*) ;; *) DISTS+=("$d") ;; esac
done

WHEELS=0
compgen -G ".whl/*.whl" >/dev/null && WHEELS=1

INSTALL_WHEELS=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
                --upgrade --target "$SITE" .whl/*.whl)
INSTALL_REPO=("$PY" -m pip install -q --no-index --no-deps --no-build-isolation
              --no-cache-dir --upgrade --target "$SITE" "${DISTS[@]}")
CUDA_SUITE=("$PY" -m pytest -m cuda -q -rs -p no:cacheprovider tests plugins examples
            --ignore=tests/test_gpu.py)
GPU_TESTS=("$PY" -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider)
BENCH=("$PY" benchmarks/bench_call.py --device cuda --reps 5)
if [ -n "$OUTDIR" ]; then
    CUDA_SUITE+=("--junitxml=$OUTDIR/cuda-suite.xml")
    GPU_TESTS+=("--junitxml=$OUTDIR/test-gpu.xml")
    BENCH+=(--json "$OUTDIR/bench_call.json")
fi

if [ "$DRY" = 1 ]; then
    echo "gpu.sh --dry-run: the steps, not run"
    if [ -n "$GPU" ]; then echo "GPU: $GPU (compute capability $CAP)"; else echo "GPU: none found (no GPU): the cuda tests will skip, the benchmark will not run"; fi
    echo "0. nvidia-smi  (print the GPU)"
    if [ "$WHEELS" = 1 ]; then
        echo "1. ${INSTALL_WHEELS[*]}"
    else
        echo "1. (no .whl folder: no carried wheels to install)"
    fi
    echo "   export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
    echo "2. requirements check: every requirement of the distributions below (and theirs) installed"
    echo "3. ${INSTALL_REPO[*]}"
    echo "   (skipped where opregistry is already installed: a dev environment)"
    [ -n "$GPU" ] && echo "   with EXTENSION_CPP_CUDA=1 TORCH_CUDA_ARCH_LIST=$CAP MAX_JOBS=\$(nproc)"
    echo "4. $PY -m opregistry list   (then --json: the cuda backend available iff a GPU)"
    echo "5. ${CUDA_SUITE[*]}$(skipped suite && echo '   (skipped: --skip suite)')"
    echo "6. ${GPU_TESTS[*]}$(skipped gpu-tests && echo '   (skipped: --skip gpu-tests)')"
    echo "7. ${BENCH[*]}   (only with a GPU)$(skipped bench && echo ' (skipped: --skip bench)')"
    echo "8. summary"
    echo "time budget: ${BUDGET}s; log: ${OUTDIR:-(OUT not set: stdout only)}${OUTDIR:+/gpu.log}"
    exit 0
fi

# -- running the steps -------------------------------------------------------------------
declare -a NAMES RESULTS
record() { NAMES+=("$1"); RESULTS+=("$2"); say ">>> $1: $2"; }

left() { echo $((BUDGET - (SECONDS - START))); }

# run NAME CAP CMD...: run CMD with at most CAP seconds (less if the budget is short),
# output to the terminal and the log; sets RC (124: timed out, 125: not run) and STEPLOG
run() {
    local name=$1 cap=$2
    shift 2
    local limit
    limit=$(left)
    [ "$limit" -gt "$cap" ] && limit=$cap
    STEPLOG=$(mktemp)
    if [ "$limit" -lt 15 ]; then
        say ">>> $name: not run (${limit}s of the ${BUDGET}s budget left)"
        RC=125
        return
    fi
    say ""
    say "=== $name (at most ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$STEPLOG" | tee -a "$LOG"
    RC=${PIPESTATUS[0]}
}

# the counts of pytest's last summary line: "passed=N failed=N skipped=N errors=N"
pytest_counts() {
    local line
    line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)' "$1" | tail -1)
    local p f s e
    p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
    s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+'); e=$(grep -oE '[0-9]+ errors?' <<<"$line" | grep -oE '[0-9]+')
    echo "passed=${p:-0} failed=${f:-0} skipped=${s:-0} errors=${e:-0}"
}

pytest_result() {  # NAME: record a pytest step from RC and its log
    local counts
    counts=$(pytest_counts "$STEPLOG")
    case $RC in
        0) record "$1" "ok ($counts)" ;;
        5) record "$1" "no tests ran ($counts)" ;;
        124|137) record "$1" "TIMED OUT ($counts so far)" ;;
        125) record "$1" "not run (time)" ;;
        *) record "$1" "FAILED rc=$RC ($counts)" ;;
    esac
}

say "gpu.sh $(date -u '+%Y-%m-%dT%H:%M:%SZ') in $ROOT (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
if [ -n "$GPU" ]; then
    say "GPU: $GPU, compute capability $CAP"
    nvidia-smi 2>&1 | tee -a "$LOG"
else
    say "GPU: none (no GPU: nvidia-smi missing or finds no device); the cuda tests will skip"
fi

# 1. the carried wheels
if [ "$WHEELS" = 1 ]; then
    run "wheels" 120 "${INSTALL_WHEELS[@]}"
    if [ "$RC" = 0 ]; then record "wheels" "ok ($(ls .whl/*.whl | wc -l) wheels into $SITE)"; else record "wheels" "FAILED rc=$RC"; fi
else
    record "wheels" "none carried (no .whl folder)"
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SITE/bin:$PATH

# 2. the requirements of every distribution to install, and of what they require, one level
REQCHECK='
import sys, tomllib, importlib.metadata as md
from packaging.requirements import Requirement
own = set()
reqs = []
for path in sys.argv[1:]:
    project = tomllib.load(open(f"{path}/pyproject.toml", "rb"))["project"]
    own.add(project["name"].lower().replace("_", "-"))
    reqs += [(project["name"], r) for r in project.get("dependencies", [])]
    reqs += [(project["name"] + "[test]", r)
             for r in project.get("optional-dependencies", {}).get("test", [])]
    reqs += [(project["name"] + " build", r)
             for r in tomllib.load(open(f"{path}/pyproject.toml", "rb"))["build-system"]["requires"]]
# PEP 639 license strings (license = "BSD-3-Clause") need setuptools 77.0.3
reqs.append(("pyproject license strings", "setuptools>=77.0.3"))
reqs.append(("the Triton kernels", "triton>=3.2,<4"))
missing, seen = [], set()
def check(who, text, depth):
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return
    name = req.name.lower().replace("_", "-")
    if name in own or (name, str(req.specifier)) in seen:
        return
    seen.add((name, str(req.specifier)))
    try:
        dist = md.distribution(req.name)
    except md.PackageNotFoundError:
        missing.append(f"{req} (for {who}): not installed")
        return
    if not req.specifier.contains(dist.version, prereleases=True):
        missing.append(f"{req} (for {who}): {dist.version} installed")
        return
    print(f"  {req.name} {dist.version}  ({who}: {req})")
    if depth < 2 and name not in ("torch", "numpy"):  # the machine stack: not ours to check
        for sub in dist.requires or []:
            check(req.name, sub, depth + 1)
for who, text in reqs:
    check(who, text, 0)
for line in missing:
    print("  MISSING", line)
sys.exit(1 if missing else 0)
'
REQFILE=$(mktemp --suffix=.py)
printf '%s\n' "$REQCHECK" >"$REQFILE"
run "requirements" 60 "$PY" "$REQFILE" "${DISTS[@]}"
if [ "$RC" = 0 ]; then record "requirements" "ok"; else record "requirements" "MISSING (see above: carry them in .whl, top of this script)"; fi

# 3. the monorepo, one pip call (not where opregistry is installed already: a dev environment,
#    whose editable installs a second copy on PYTHONPATH would duplicate)
#    (asked from /: a checkout's own opregistry.egg-info, in the working directory, is no install)
if (cd / && "$PY" -c "import importlib.metadata as m; m.distribution('opregistry')" 2>/dev/null) \
        && [ ! -d "$SITE/opregistry" ]; then
    record "install" "skipped: opregistry is already installed in this environment (a dev venv)"
else
    if [ -n "$GPU" ]; then
        # extension_cpp: compile csrc/muladd.cu, for this GPU only (faster)
        export EXTENSION_CPP_CUDA=1 TORCH_CUDA_ARCH_LIST=${CAP:-9.0} MAX_JOBS=$(nproc)
    fi
    run "install" 240 "${INSTALL_REPO[@]}"
    if [ "$RC" = 0 ]; then
        record "install" "ok (${#DISTS[@]} distributions into $SITE: ${DISTS[*]})"
        built=$(ls "$SITE"/extension_cpp/_C*.so 2>/dev/null | head -1)
        say "extension_cpp: ${built:-no prebuilt library (built at first load)}; $(cat "$SITE/extension_cpp/_build.json" 2>/dev/null)"
    else
        record "install" "FAILED rc=$RC"
    fi
fi

# 4. opregistry list: the cuda backend available where there is a GPU (asked without torch)
run "list" 60 "$PY" -m opregistry list
LIST_RC=$RC
CUDA_AVAILABLE=$("$PY" -m opregistry list --json 2>/dev/null | "$PY" -c '
import json, sys
print(next((b["available"] for b in json.load(sys.stdin)["backends"] if b["name"] == "cuda"), "missing"))' 2>/dev/null)
if [ "$LIST_RC" != 0 ]; then
    record "list" "FAILED rc=$LIST_RC"
elif [ -n "$GPU" ] && [ "$CUDA_AVAILABLE" = True ]; then
    record "list" "ok (cuda backend available)"
elif [ -z "$GPU" ] && [ "$CUDA_AVAILABLE" = False ]; then
    record "list" "ok (cuda backend unavailable: no GPU)"
else
    record "list" "FAILED (GPU: ${GPU:-none}, cuda backend available: ${CUDA_AVAILABLE:-?})"
fi

# 5. every cuda-marked test of the repository (test_gpu.py is step 6)
if skipped suite; then
    record "pytest -m cuda" "skipped (--skip suite)"
else
    run "pytest -m cuda" 210 "${CUDA_SUITE[@]}"
    pytest_result "pytest -m cuda"
fi

# 6. the GPU suite
if skipped gpu-tests; then
    record "test_gpu.py" "skipped (--skip gpu-tests)"
else
    run "test_gpu.py" 210 "${GPU_TESTS[@]}"
    pytest_result "test_gpu.py"
fi

# 7. per-call overhead with CUDA tensors
if skipped bench; then
    record "bench_call" "skipped (--skip bench)"
elif [ -n "$GPU" ]; then
    run "bench_call" 180 "${BENCH[@]}"
    case $RC in
        0) record "bench_call" "ok ($(grep -c 'NOT MET' "$STEPLOG") target(s) not met)" ;;
        124|137) record "bench_call" "TIMED OUT" ;;
        125) record "bench_call" "not run (time)" ;;
        *) record "bench_call" "FAILED rc=$RC" ;;
    esac
else
    record "bench_call" "skipped (no GPU)"
fi

# 8. summary
VERSIONS=$("$PY" -c '
import sys, platform
import torch
try:
    import triton; tv = triton.__version__
except Exception as exc:
    tv = f"none ({type(exc).__name__})"
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {tv}, torch sees GPU: {gpu}")' 2>&1 | tail -1)
say ""
say "==================== gpu.sh summary ===================="
say "GPU:      ${GPU:-none (no GPU)}${CAP:+, compute capability $CAP}"
say "versions: $VERSIONS"
FAILED=0
for i in "${!NAMES[@]}"; do
    say "$(printf '  %-16s %s' "${NAMES[$i]}" "${RESULTS[$i]}")"
    case "${RESULTS[$i]}" in FAILED*|MISSING*|TIMED*) FAILED=1 ;; esac
done
say "elapsed:  $((SECONDS - START))s of a ${BUDGET}s budget; log: ${OUTDIR:+$OUTDIR/gpu.log}${OUTDIR:+, junit xml and bench_call.json beside it}"
exit $FAILED
