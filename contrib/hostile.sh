#!/usr/bin/env bash
#
# The usnic transport on a hostile network: the UCP content check
# (test/ucp/ucp_check.c, every byte of tag, AM, put and get traffic checked)
# runs across two network namespaces while contrib/hostile.c, one instance
# on each side, sniffs the genuine datagrams and sends altered copies with
# the genuine source address and port. Three runs, each a test:
#
#   default   default settings (the checksum); blind alterations (replay,
#             bit flips, truncation, extension, random bytes) and off-path
#             forgeries (random tokens, a genuine stream taken over);
#   auth-key  UCX_USNIC_AUTH_KEY on both sides; the same, plus
#             protocol-aware forgeries with valid checksums (sequence
#             numbers ahead, payload altered, ACKs for what never arrived,
#             random selective ACKs);
#   flood     default settings; 1,000,000 datagrams that each open a stream
#             from a fresh identity (knowing the server's open key, as a
#             forger on the path does) at 200,000/s, starting 2 s after the
#             client's first stream opened: the server's peak RSS
#             may exceed that of a run without the flood by at most
#             HOSTILE_RSS_MB (default 20; the caps allow about 15 MB).
#
# Each fails on a mismatch, a hang (the check's own timeout) or, for the
# flood, memory beyond the caps. Ends with "N passed, N failed".
#
#   contrib/hostile.sh [--no-build]
#   HOSTILE_FLOOD=<count> HOSTILE_RATE=<per second> contrib/hostile.sh
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

build=1
case "${1:-}" in
--no-build) build=0 ;;
"")         ;;
*)          usnic_die "usage: $0 [--no-build]" ;;
esac

flood=${HOSTILE_FLOOD:-1000000}
rate=${HOSTILE_RATE:-200000}
rss_mb=${HOSTILE_RSS_MB:-20}

[ "${build}" -eq 0 ] || "${usnic_top}/contrib/build.sh"
usnic_env

check=${usnic_leg_dir}/bin/ucp_check
tool=${usnic_leg_dir}/bin/hostile
usnic_build_tool "${check}" "${usnic_top}/test/ucp/ucp_check.c" -- \
    -lucp -lucs
usnic_build_tool "${tool}" "${usnic_top}/contrib/hostile.c" \
    "${usnic_top}/src/uct/usnic/usnic_proto.h" -- \
    -I"${usnic_top}/src" -lxxhash -lm

logs=${usnic_leg_dir}/hostile
mkdir -p "${logs}"
trap usnic_pair_cleanup EXIT
usnic_pair_setup netns
server_addr=${usnic_pair_addr}
client_addr=198.18.0.2
port=$((20000 + $$ % 10000))
passed=0
failed=0

# The peak RSS of the child of <pid> (the server under timeout) while it
# runs, in kB, into <file>
watch_rss() {
    local parent=$1 file=$2 peak=0 pid= kb

    while [ -z "${pid}" ] && kill -0 "${parent}" 2>/dev/null; do
        pid=$(pgrep -P "${parent}" | head -n 1 || true)
        sleep 0.05
    done
    while [ -n "${pid}" ] && kill -0 "${pid}" 2>/dev/null; do
        kb=$(awk '/^VmHWM/ {print $2}' "/proc/${pid}/status" 2>/dev/null ||
             true)
        [ -z "${kb}" ] || [ "${kb}" -le "${peak}" ] || peak=${kb}
        sleep 0.2
    done
    echo "${peak}" >"${file}"
}

# run <name> <iterations> <hostile args, or "flood N"> [VAR=value...]
# One ucp_check across the namespaces with the attack on; sets rss (kB)
run() {
    local name=$1 iterations=$2 attack=$3 log=${logs}/$1 rc=0 src=0 pid
    local pids=()
    local env=(env UCX_TLS=usnic UCX_NET_DEVICES="${usnic_pair_dev}")
    shift 3
    env+=("$@")

    "${usnic_pair_server_pfx[@]}" timeout 400 "${env[@]}" "${check}" \
        -p "${port}" -l "${server_addr}" -n "${iterations}" -t 300 \
        >"${log}.server" 2>&1 &
    usnic_pair_server_pid=$!
    watch_rss "${usnic_pair_server_pid}" "${log}.rss" &
    if ! usnic_pair_wait_port t "${port}"; then
        usnic_log "${name}: the server did not start"
        rc=1
    fi

    if [ "${attack}" != none ]; then
        # Each side alters what is sent to it (the flood: to the server)
        "${usnic_pair_client_pfx[@]}" "${tool}" -i "${usnic_pair_dev}" \
            -a "${server_addr}" ${attack} >"${log}.hostile-c" 2>&1 &
        pids+=($!)
        if [[ "${attack}" != -f* ]]; then
            "${usnic_pair_server_pfx[@]}" "${tool}" -i "${usnic_pair_dev}" \
                -a "${client_addr}" ${attack} >"${log}.hostile-s" 2>&1 &
            pids+=($!)
        fi
        sleep 0.2
    fi

    [ "${rc}" -ne 0 ] ||
        "${usnic_pair_client_pfx[@]}" timeout 400 "${env[@]}" "${check}" \
            -p "${port}" -n "${iterations}" -t 300 "${server_addr}" \
            >"${log}.client" 2>&1 || rc=$?
    wait "${usnic_pair_server_pid}" || src=$?
    [ "${rc}" -ne 0 ] || rc=${src}
    usnic_pair_server_pid=
    for pid in "${pids[@]}"; do
        kill -INT "${pid}" 2>/dev/null || true
        wait "${pid}" || true
    done
    wait
    rss=$(cat "${log}.rss")

    grep -hs '^hostile: ' "${log}".hostile-* || true
    grep -hs '^ucp_check \(server\|client\): \(PASS\|FAIL\)' \
        "${log}.server" "${log}.client" || true
    return "${rc}"
}

result() {
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1))
        usnic_log "hostile $1: PASS"
    else
        failed=$((failed + 1))
        usnic_log "hostile $1: FAIL (logs: ${logs}/$1.*)"
    fi
}

alter=(-r 3000 -t 120)
rc=0
run default 300 "-m blind,offpath -l 4 ${alter[*]}" || rc=$?
result default "${rc}"

rc=0
if usnic_have_sodium; then
    usnic_make_key "${logs}/auth.key"
    run auth-key 300 "-m blind,offpath,aware -l 16 ${alter[*]}" \
        UCX_USNIC_AUTH_KEY="${logs}/auth.key" || rc=$?
    result auth-key "${rc}"
else
    usnic_log "hostile auth-key: skipped, UCX was configured without libsodium"
fi

rc=0
# Twice the iterations of the other runs: the genuine traffic must outlast
# the flood, whose tool sent only 950,000 opens in the 22 s of a
# 3,000-iteration run while CI's second lane shared the two cores
run flood-baseline 6000 none || rc=$?
baseline=${rss}
# The flood starts 2 s after the client's first stream opened: it hits
# streams in use (a stream opened during an on-path flood competes with it
# for slots: README, "Bounded state")
[ "${rc}" -ne 0 ] || run flood 6000 "-f ${flood} -w 2 -r ${rate} -l 4" ||
    rc=$?
# A flood that never started (no genuine open sniffed) proves nothing
if [ "${rc}" -eq 0 ] &&
   ! grep -qs "sent: stream opened ${flood}," "${logs}/flood.hostile-c"; then
    usnic_log "flood: the tool did not send ${flood} opens"
    rc=1
fi
usnic_log "flood: server peak RSS ${rss} kB with ${flood} forged opens," \
          "${baseline} kB without (at most ${rss_mb} MB more allowed)"
if [ "${rc}" -eq 0 ] && [ "${rss}" -gt $((baseline + rss_mb * 1024)) ]; then
    rc=1
fi
result flood "${rc}"

echo "${passed} passed, ${failed} failed"
[ "${failed}" -eq 0 ]
