#!/usr/bin/env bash
#
# Build if needed, then run the usnic test suites in network namespaces that
# hold only the loopback device (UCX's generic tests use every device the MD
# lists, so nothing can reach a real network from there), in two lanes at
# once (see USNIC_TEST_LANES):
#   1. the module's own gtests (test/gtest/uct/usnic), over the default
#      provider (the built-in kernel one here), again with a
#      UCX_USNIC_AUTH_KEY MAC on every datagram (when UCX was configured
#      with libsodium), and over libfabric's udp;
#   2. UCX's generic UCT gtests instantiated for usnic (usnic/*), over
#      both providers too (test_uct_pending with bundling off over the
#      default provider);
#   1-2 again over libfabric's udp provider with the usnic provider's
#      demands forced on it (UCX_USNIC_FORCE_MSG_PREFIX, _FORCE_MR_LOCAL,
#      _FORCE_AV_MAP: the Cisco VIC code paths);
#   3. UCX's UCP gtests instantiated for usnic (usnic/test_ucp_*), the
#      suites named in USNIC_UCP_SUITES;
#   4. a UCP matrix: ucx_perftest server and client over lo with
#      UCX_TLS=usnic, each test within a time bound;
#   5. the UCP content check (contrib/ucp_check.sh) over lo;
#   6. the hostile-network test (contrib/hostile.sh): the content check
#      across two namespaces while datagrams are altered and forged.
# Ends with one line "N passed, N failed" and fails if any test failed.
#
#   contrib/test.sh                  default leg (Debian's UCX + libfabric)
#   UCX_SRC=... [LIBFABRIC_SRC=...] contrib/test.sh   another leg
#   GTEST_FILTER=<pattern> contrib/test.sh            a subset of usnic/*
#   USNIC_UDP_SUITES="own" contrib/test.sh  which of the own and generic
#                                    suites run again over libfabric's udp
#                                    provider (default: "own generic"; 0 or
#                                    "": none)
#   USNIC_VIC_SUITES="own" contrib/test.sh  which of them run again with
#                                    the VIC's demands forced (default:
#                                    "own generic")
#   USNIC_UCP_SUITES="tag_xfer am" contrib/test.sh    UCP suites to run
#                                    (default: all of them; .ci/run splits
#                                    them between its two legs)
#   USNIC_TEST_LANES=1 contrib/test.sh  run the suites one after another
#                                    (default 2: the udp suites, the UCP
#                                    matrix and the content check in a
#                                    second namespace, meanwhile)
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
. "$(dirname "$0")/pair.sh"

# UCX's UCP suites for usnic: usnic/test_ucp_<name>*
ucp_suites=(${USNIC_UCP_SUITES:-tag_xfer am rma stream wireup peer_failure})
udp_suites=" ${USNIC_UDP_SUITES-own generic} "
vic_suites=" ${USNIC_VIC_SUITES-own generic} "
# What the usnic provider demands, forced on libfabric's udp provider
vic_env=(UCX_USNIC_PROVIDER=udp UCX_USNIC_FORCE_MSG_PREFIX=64
         UCX_USNIC_FORCE_MR_LOCAL=y UCX_USNIC_FORCE_AV_MAP=y)

"${usnic_top}/contrib/build.sh"
usnic_env

[ -x "${usnic_gtest}" ] || usnic_die "no gtest binary at ${usnic_gtest}"

netns=usnic-test-$$
lane_netns=usnic-test2-$$
lane_pid=
results=${usnic_leg_dir}/test-results
mkdir -p "${results}"
rm -f "${results}/lane.count"

cleanup() {
    if [ -n "${lane_pid}" ]; then
        pkill -P "${lane_pid}" 2>/dev/null || true
        kill "${lane_pid}" 2>/dev/null || true
    fi
    usnic_pair_cleanup
    ip netns delete "${netns}" 2>/dev/null || true
    ip netns delete "${lane_netns}" 2>/dev/null || true
}
trap cleanup EXIT

for ns in "${netns}" "${lane_netns}"; do
    ip netns add "${ns}" ||
        usnic_die "cannot create network namespace ${ns} (needs root)"
    ip -n "${ns}" link set lo up
done

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
        # crashed or timed out before gtest could count: name the test
        failed=1
        tail -n 30 "${log}" >&2
        grep '^\[ RUN      \]' "${log}" | tail -n 1 |
            sed 's/^/[usnic] the test running when it ended: /' >&2
    fi
    grep '^\[  FAILED  \] usnic' "${log}" >&2 || true

    usnic_log "${name}: ${passed} passed (${skipped} of them skipped for" \
              "missing capabilities), ${failed} failed; log: ${log}"
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
}

# count <name> <exit status>: one more test passed or failed
count() {
    if [ "$2" -eq 0 ]; then
        total_passed=$((total_passed + 1))
    else
        usnic_log "FAILED: $1"
        total_failed=$((total_failed + 1))
    fi
}

# ucx_perftest's UCP tests over lo with UCX_TLS=usnic, server and client in
# the test namespace. Each must finish within its bound: a stall fails it.
run_ucp_matrix() {
    local bound=120 port=$((30000 + $$ % 10000)) log rc test
    local tests=("tag_lat -s 8 -n 20000"
                 "tag_bw -s 8 -n 100000"
                 "tag_bw -s 65536 -n 3000"
                 "tag_bw -s 1048576 -n 300"
                 "tag_sync_lat -s 8 -n 20000"
                 "stream_bw -s 65536 -n 3000"
                 "ucp_am_lat -s 8 -n 20000"
                 "ucp_am_bw -s 65536 -n 3000"
                 "ucp_put_lat -s 8 -n 20000"
                 "ucp_put_bw -s 8192 -n 20000"
                 "ucp_put_bw -s 1048576 -n 300"
                 "ucp_get -s 8 -n 2000"
                 "ucp_add -s 8 -n 2000")

    mkdir -p "${results}/ucp-matrix"
    usnic_pair_server_pfx=(ip netns exec "${netns}")
    usnic_pair_client_pfx=(ip netns exec "${netns}")
    usnic_pair_addr=127.0.0.1
    usnic_pair_timeout=${bound}
    for test in "${tests[@]}"; do
        log=${results}/ucp-matrix/${test// /_}
        rc=0
        usnic_pair_run "${log}" t "${port}" \
            env UCX_TLS=usnic UCX_NET_DEVICES=lo \
            "${usnic_bin}/ucx_perftest" -p "${port}" -- \
            env UCX_TLS=usnic UCX_NET_DEVICES=lo \
            "${usnic_bin}/ucx_perftest" -p "${port}" @ADDR@ -t ${test} \
            || rc=$?
        usnic_log "ucp matrix: ${test}: $( [ "${rc}" -eq 0 ] &&
                   grep -h '^Final:' "${log}.client" | tr -s ' ' ||
                   echo "failed (exit ${rc}, bound ${bound} s)")"
        count "ucp matrix: ${test}" "${rc}"
    done
}

own='usnic/test_usnic_*'
ucp='usnic/test_ucp_*'
# UCX's pending tests fill an ep with 10,000 short AMs posted without
# progress; bundles carry them in about 143 datagrams, within the kernel
# provider's window, so the tests skip, and one (send_ooo_with_comp) leaves
# an am_zcopy completion on its unwound stack for the ep's destroy to
# complete. With bundling off the window fills and the tests run.
pending='usnic/test_uct_pending*'
# UCX 1.22's protocol reset tests (UCP's, in the generic set) restart a
# request caught between two of its fragments, found by posting 1,000
# requests until the transport refuses one. Reads of 70 KB are two
# get_bcopy fragments of one datagram each, and the congestion window
# opens by even numbers of datagrams (slow start grows it by as many as
# were acknowledged): the refusal fell between two requests, and now and
# then no request was ever caught halfway. UCX gives IB 65 send queue
# entries for these tests; 65 send buffers do the same here.
proto_reset='usnic/test_proto_reset*'

# run_generic <name> <filter> [VAR=value...]: UCX's generic suites in the
# filter, the protocol reset tests among them run apart
run_generic() {
    local name=$1 filter=$2
    shift 2

    run_suite "${name}" "${filter}:${proto_reset}" "$@"
    run_suite "${name}-proto-reset" "${proto_reset}" \
        UCX_USNIC_TX_MAX_BUFS=65 "$@"
}

# UCX's UCP suites named, each in a gtest run of its own
run_ucp_suites() {
    local suite

    for suite in "$@"; do
        # A shorter peer timeout keeps the peer failure suites brief; the
        # others keep the default, so that a loaded machine cannot fail
        # their eps
        if [ "${suite}" = peer_failure ]; then
            run_suite usnic-ucp-peer-failure 'usnic/test_ucp_peer_failure*' \
                UCX_USNIC_TIMEOUT=3s
        else
            run_suite "usnic-ucp-${suite}" "usnic/test_ucp_${suite}*"
        fi
    done
}

# The suites over libfabric's udp provider, as far as USNIC_UDP_SUITES asks,
# UCX's event tests (which need the event fd, off by default), the UCP
# suites after the first, the UCP matrix, the content check over lo and
# the hostile-network test
second_lane() {
    if [[ "${udp_suites}" == *" own "* ]]; then
        run_suite usnic-own-udp "${own}" UCX_USNIC_PROVIDER=udp
    fi
    if [[ "${udp_suites}" == *" generic "* ]]; then
        run_generic usnic-generic-udp "usnic/*-${own}:${ucp}" \
            UCX_USNIC_PROVIDER=udp
    fi
    if [[ "${vic_suites}" == *" generic "* ]]; then
        run_generic usnic-generic-vic "usnic/*-${own}:${ucp}" "${vic_env[@]}"
    fi
    run_suite usnic-generic-event-fd 'usnic/test_uct_event*' \
        UCX_USNIC_EVENT_FD=y
    run_ucp_suites "${ucp_suites[@]:1}"
    run_ucp_matrix
    rc=0
    ip netns exec "${netns}" "${usnic_top}/contrib/ucp_check.sh" --lo \
        --no-build || rc=$?
    count "ucp_check over lo" "${rc}"
    run_hostile
}

# contrib/hostile.sh: its own two namespaces, three tests
run_hostile() {
    local log=${results}/hostile.log counts

    usnic_log "running contrib/hostile.sh; log: ${log}"
    "${usnic_top}/contrib/hostile.sh" --no-build >"${log}" 2>&1 || true
    grep '^\[usnic\] \(hostile\|flood\)' "${log}" || true
    counts=($(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' \
              "${log}"))
    if [ ${#counts[@]} -ne 2 ]; then
        tail -n 20 "${log}" >&2
        counts=(0 1)
    fi
    total_passed=$((total_passed + counts[0]))
    total_failed=$((total_failed + counts[1]))
}

# The second lane in its own namespace, at the same time as the first: the
# suites are mostly one busy thread each, and the machine has two cores
start_second_lane() {
    if [ "${USNIC_TEST_LANES:-2}" -lt 2 ]; then
        return 0
    fi

    (
        trap usnic_pair_cleanup EXIT
        netns=${lane_netns}
        total_passed=0
        total_failed=0
        second_lane
        echo "${total_passed} ${total_failed}" >"${results}/lane.count"
    ) &
    lane_pid=$!
}

join_second_lane() {
    local counts

    if [ -z "${lane_pid}" ]; then
        second_lane
        return 0
    fi

    wait "${lane_pid}" || true
    lane_pid=
    counts=($(cat "${results}/lane.count" 2>/dev/null || echo "0 1"))
    total_passed=$((total_passed + counts[0]))
    total_failed=$((total_failed + counts[1]))
}

if [ -n "${GTEST_FILTER:-}" ]; then
    run_suite selected "${GTEST_FILTER}"
else
    start_second_lane
    run_suite usnic-own "${own}"
    if usnic_have_sodium; then
        usnic_make_key "${results}/auth.key"
        run_suite usnic-own-mac "${own}" \
            UCX_USNIC_AUTH_KEY="${results}/auth.key"
    fi
    if [[ "${vic_suites}" == *" own "* ]]; then
        run_suite usnic-own-vic "${own}" "${vic_env[@]}"
    fi
    run_generic usnic-generic "usnic/*-${own}:${ucp}:${pending}"
    run_suite usnic-generic-pending "${pending}" UCX_USNIC_BUNDLE_DELAY=0
    run_ucp_suites "${ucp_suites[0]}"
    join_second_lane
fi

echo "${total_passed} passed, ${total_failed} failed"
[ "${total_failed}" -eq 0 ]
