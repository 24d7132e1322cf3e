#!/usr/bin/env bash
#
# Peer failure end to end: an ucx_perftest client streams am_bw to a server
# in another network namespace; the server is killed with SIGKILL mid-run.
# The client must report the error (UCS_ERR_ENDPOINT_TIMEOUT) within
# UCX_USNIC_TIMEOUT plus a second, not hang. ucx_perftest then keeps
# reporting failed sends, so the script stops it once it has seen the
# first report. Prints that report and how long after the kill it came.
#
#   contrib/peer_kill.sh [-t TIMEOUT]      (default 2s)
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

timeout=2s
while [ $# -gt 0 ]; do
    case $1 in
    -t) timeout=$2; shift ;;
    *)  usnic_die "usage: $0 [-t TIMEOUT]" ;;
    esac
    shift
done

"${usnic_top}/contrib/build.sh"
usnic_env

usnic_pair_perftest peer_kill

# ip netns exec replaces itself with the command: $! is the server's pid
"${usnic_pair_server_pfx[@]}" "${perftest[@]}" >"${logs}/server" 2>&1 &
usnic_pair_server_pid=$!
usnic_pair_wait_port t "${port}" || usnic_die "server did not start"

"${usnic_pair_client_pfx[@]}" env UCX_USNIC_TIMEOUT="${timeout}" \
    timeout -s KILL 120 "${perftest[@]}" "${usnic_pair_addr}" -t am_bw \
    -D bcopy -s 8192 -n 1000000000 >"${logs}/client" 2>&1 &
client_pid=$!

sleep 2
kill -KILL "${usnic_pair_server_pid}"
killed=$(date +%s.%N)
wait "${usnic_pair_server_pid}" 2>/dev/null || true
usnic_pair_server_pid=

# The first report, stamped by UCX's logger in seconds since the epoch
first=
for _ in $(seq 200); do
    first=$(grep -m 1 'Endpoint timeout' "${logs}/client" || true)
    [ -n "${first}" ] && break
    sleep 0.1
done
# The client's pid is timeout's, whose child is ucx_perftest
pkill -KILL -P "${client_pid}" 2>/dev/null || true
kill -KILL "${client_pid}" 2>/dev/null || true
wait "${client_pid}" 2>/dev/null || true

echo "== client (UCX_USNIC_TIMEOUT=${timeout}), server killed with SIGKILL"
[ -n "${first}" ] || usnic_die "no error reported within 20 s of the kill"
echo "${first}"
delay=$(echo "${first}" |
        awk -v k="${killed}" -F'[][]' '{ printf "%.2f", $2 - k }')
echo "first error ${delay} s after the kill"
awk -v d="${delay}" -v t="${timeout%s}" 'BEGIN { exit !(d <= t + 1) }' ||
    usnic_die "later than the timeout plus a second"
