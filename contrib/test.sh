#!/usr/bin/env bash
#
# Build if needed, then run the usnic test suites in a network namespace that
# holds only the loopback device (UCX's generic tests use every device the MD
# lists, so nothing can reach a real network from there):
#   1. the module's own gtests (test/gtest/uct/usnic);
#   2. UCX's generic UCT gtests instantiated for usnic (usnic/*).
# Ends with one line "N passed, N failed" and fails if any test failed.
#
#   contrib/test.sh                  default leg (Debian's UCX + libfabric)
#   UCX_SRC=... [LIBFABRIC_SRC=...] contrib/test.sh   another leg
#   GTEST_FILTER=<pattern> contrib/test.sh            a subset of usnic/*
#   contrib/test.sh --asan           everything built with AddressSanitizer
#                                    (its own leg, build/<leg>-asan)
#
set -euo pipefail

case "${1:-}" in
--asan) export USNIC_ASAN=1 ;;
"")     ;;
*)      echo "usage: $0 [--asan]" >&2; exit 2 ;;
esac

. "$(dirname "$0")/common.sh"

"${usnic_top}/contrib/build.sh"
usnic_env

[ -x "${usnic_gtest}" ] || usnic_die "no gtest binary at ${usnic_gtest}"

netns=usnic-test-$$
results=${usnic_leg_dir}/test-results
mkdir -p "${results}"

cleanup() {
    ip netns delete "${netns}" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "${netns}" ||
    usnic_die "cannot create network namespace ${netns} (needs root)"
ip -n "${netns}" link set lo up

total_passed=0
total_failed=0

# Any AddressSanitizer report fails the run; UCX's own signal handling would
# hide the report
sanitizer_env=()
if [ "${USNIC_ASAN:-0}" = 1 ]; then
    sanitizer_env=(ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1
                   UCX_HANDLE_ERRORS=none)
fi

# run_suite <name> <gtest filter> [VAR=value...]
run_suite() {
    local name=$1 filter=$2 log=${results}/$1.log rc=0 passed failed skipped
    shift 2

    usnic_log "running ${name}: --gtest_filter='${filter}'"
    ip netns exec "${netns}" env \
        UCX_HANDLE_ERRORS=bt UCX_LOG_LEVEL=warn UCX_LOG_PRINT_ENABLE=y \
        "${sanitizer_env[@]}" "$@" \
        timeout 2400 "${usnic_gtest}" --gtest_filter="${filter}" \
        --gtest_color=no >"${log}" 2>&1 || rc=$?

    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "${log}")
    failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "${log}")
    skipped=$(grep -c '^\[     SKIP \]' "${log}" || true)
    passed=${passed:-0}
    failed=${failed:-0}
    if [ "${rc}" -ne 0 ] && [ "${failed}" -eq 0 ]; then
        # crashed or timed out before gtest could count
        failed=1
        tail -n 30 "${log}" >&2
    fi
    grep '^\[  FAILED  \] usnic' "${log}" >&2 || true

    usnic_log "${name}: ${passed} passed (${skipped} of them skipped for" \
              "missing capabilities), ${failed} failed; log: ${log}"
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
}

own='usnic/test_usnic_*'
if [ -n "${GTEST_FILTER:-}" ]; then
    run_suite selected "${GTEST_FILTER}"
else
    run_suite usnic-own "${own}"
    run_suite usnic-generic "usnic/*-${own}"
    # UCX's event tests need the event fd, which is off by default
    run_suite usnic-generic-event-fd 'usnic/test_uct_event*' \
        UCX_USNIC_EVENT_FD=y
fi

echo "${total_passed} passed, ${total_failed} failed"
[ "${total_failed}" -eq 0 ]
