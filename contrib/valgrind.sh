#!/usr/bin/env bash
#
# valgrind memcheck of the module's tests, inside a network namespace that
# holds only lo: by default a 60-second stream under light faults
# (test_usnic_faults.timed_stream), then every iface closed. Fails on any
# memcheck error or on memory definitely or indirectly lost at exit.
#
#   contrib/valgrind.sh [-t SECONDS] [-f GTEST_FILTER]
#
set -euo pipefail

. "$(dirname "$0")/common.sh"

seconds=60
filter='usnic/test_usnic_faults.timed_stream/*'
while [ $# -gt 0 ]; do
    case $1 in
    -t) seconds=$2; shift ;;
    -f) filter=$2; shift ;;
    *)  usnic_die "usage: $0 [-t SECONDS] [-f GTEST_FILTER]" ;;
    esac
    shift
done

usnic_apt_install valgrind
"${usnic_top}/contrib/build.sh"
usnic_env

ucx=$(usnic_ucx_src)
log=${usnic_leg_dir}/logs/valgrind.log
netns=usnic-vg-$$
trap 'ip netns delete "${netns}" 2>/dev/null || true' EXIT
ip netns add "${netns}"
ip -n "${netns}" link set lo up

usnic_log "valgrind on ${filter} (${seconds} s of streaming); log: ${log}"
rc=0
ip netns exec "${netns}" env USNIC_TEST_STREAM_SECONDS="${seconds}" \
    UCX_LOG_LEVEL=warn UCX_HANDLE_ERRORS=none \
    valgrind --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=3 \
    --suppressions="${ucx}/contrib/valgrind.supp" \
    "${usnic_gtest}" --gtest_filter="${filter}" --gtest_color=no \
    >"${log}" 2>&1 || rc=$?

grep -E '^\[ *(OK|FAILED|PASSED|INFO) *\].*(messages|test)|ERROR SUMMARY|definitely lost|indirectly lost' \
    "${log}" | sed 's/^==[0-9]*== *//' || true
[ "${rc}" -eq 0 ] || usnic_die "valgrind run failed (exit ${rc}); see ${log}"
