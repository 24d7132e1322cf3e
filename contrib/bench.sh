#!/usr/bin/env bash
#
# Benchmark usnic beside its peers on the same link in the same run, and
# print the tables with ratios:
#   latency, 8-byte messages: raw libfabric datagram ping-pong (fi_pingpong
#     -p udp -e dgram), ucx_perftest am_lat over usnic and over tcp;
#   message rate, 8-byte messages: raw datagrams (contrib/dgram_rate.c, no
#     reliability), ucx_perftest am_bw short over usnic and over tcp;
#   bandwidth, 8 KiB messages: am_bw bcopy over usnic and over tcp, and
#     raw datagrams of the largest size the provider sends;
#   memory: RSS of a usnic am_bw client at start and end of a long stream.
#
#   contrib/bench.sh [--lo] [-n ITERATIONS] [-r REPEAT] [--rss-messages N]
#
# Default: across two network namespaces joined by a veth pair; --lo: this
# host's loopback. Every measurement runs REPEAT times (default 3), the
# tools taking turns, and the tables show the medians: this machine is
# noisy, so only ratios from one run mean something. Logs go to
# build/<leg>/bench/.
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

mode=netns
iters=1000000
repeat=3
rss_messages=10000000
while [ $# -gt 0 ]; do
    case $1 in
    --lo)           mode=lo ;;
    -n)             iters=$2; shift ;;
    -r)             repeat=$2; shift ;;
    --rss-messages) rss_messages=$2; shift ;;
    *)  usnic_die "usage: $0 [--lo] [-n ITERATIONS] [-r REPEAT]" \
                  "[--rss-messages N]" ;;
    esac
    shift
done

"${usnic_top}/contrib/build.sh"
usnic_env

logs=${usnic_leg_dir}/bench
mkdir -p "${logs}"
cc -O2 -Wall -o "${logs}/dgram_rate" "${usnic_top}/contrib/dgram_rate.c" \
    ${LIBFABRIC_SRC:+-I"${usnic_fabric_prefix}/include"} \
    ${LIBFABRIC_SRC:+-L"${usnic_fabric_prefix}/lib"} -lfabric ||
    usnic_die "cannot build contrib/dgram_rate.c"
cc -O2 -Wall -o "${logs}/ep_memory" "${usnic_top}/contrib/ep_memory.c" \
    -I"${usnic_prefix}/include" -L"${usnic_prefix}/lib" \
    -Wl,-rpath,"${usnic_prefix}/lib" -luct -lucs ||
    usnic_die "cannot build contrib/ep_memory.c"

trap usnic_pair_cleanup EXIT
usnic_pair_setup "${mode}"
dev=${usnic_pair_dev}
port=$((20000 + $$ % 10000))

# perftest <log> <tl> <ucx_perftest test arguments...>
# Prints the "Final:" line's fields: overall latency (usec), overall
# bandwidth (MB/s), overall message rate (msg/s).
perftest() {
    local log=$1 tl=$2 pt
    shift 2
    pt=("${usnic_bin}/ucx_perftest" -x "${tl}" -d "${dev}" -p "${port}")
    usnic_pair_run "${log}" t "${port}" "${pt[@]}" -- \
        "${pt[@]}" @ADDR@ "$@" >/dev/null
    awk '/Final:/ { print $5, $7, $9 }' "${log}.client"
}

pingpong_lat() {
    usnic_pair_run "${logs}/fi_pingpong" t "${port}" \
        fi_pingpong -p udp -e dgram -d "${dev}" -S 8 -I "${iters}" \
        -B "${port}" -- \
        fi_pingpong -p udp -e dgram -d "${dev}" -S 8 -I "${iters}" \
        -P "${port}" @ADDR@ >/dev/null
    # columns: bytes iters total time MB/sec usec/xfer Mxfers/sec
    awk '$1 == "8" { print $7 }' "${logs}/fi_pingpong.client"
}

# dgram_rate <size> <count>: datagrams per second received
dgram_rate() {
    usnic_pair_run "${logs}/dgram_rate" u "${port}" \
        "${logs}/dgram_rate" -s "$1" -b "${usnic_pair_addr}" -P "${port}" -- \
        "${logs}/dgram_rate" -s "$1" -n "$2" -P "${port}" @ADDR@ \
        >/dev/null
    awk '/^received/ { print $7 }' "${logs}/dgram_rate.server"
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'
}

median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
        END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# table <title> <unit> <baseline row> <rows...>, a row being "name|value";
# every value is compared with the baseline row's
table() {
    local title=$1 unit=$2 base=${3#*|} row
    shift 2
    echo
    echo "${title}"
    printf '| %-46s | %10s | %8s |\n' "what" "${unit}" "ratio"
    printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "------------" \
        "----------"
    for row in "$@"; do
        printf '| %-46s | %10s | %8s |\n' "${row%|*}" "${row#*|}" \
            "$(ratio "${row#*|}" "${base}")"
    done
}

usnic_log "benchmarking over ${dev} (${mode}), ${iters} iterations," \
          "median of ${repeat} runs each"

# measure <array> <field> <log> <tl> <ucx_perftest test arguments...>:
# appends field 1 (latency), 2 (bandwidth) or 3 (message rate) of a run
measure() {
    local -n values=$1
    local field=$2 log=$3 tl=$4 result
    shift 4
    result=$(perftest "${logs}/${log}" "${tl}" "$@")
    values+=("$(echo "${result}" | cut -d' ' -f"${field}")")
}

raw_lat=() usnic_lat=() tcp_lat=() raw_rate=() usnic_rate=() tcp_rate=()
raw_bw=() usnic_bw=() tcp_bw=()
# The largest datagram the provider sends; 8 KiB messages travel as six
max_dgram=1472
bw_iters=$((iters / 4))
for run in $(seq "${repeat}"); do
    usnic_log "run ${run} of ${repeat}"
    raw_lat+=("$(pingpong_lat)")
    raw_rate+=("$(dgram_rate 8 "${iters}")")
    raw_bw+=("$(dgram_rate "${max_dgram}" "$((bw_iters * 6))" |
                awk -v s="${max_dgram}" '{ printf "%.2f", $1 * s / 1048576 }')")
    for tl in usnic tcp; do
        measure "${tl}_lat" 1 "${tl}_am_lat" "${tl}" \
            -t am_lat -D short -s 8 -n "${iters}"
        measure "${tl}_rate" 3 "${tl}_am_bw" "${tl}" \
            -t am_bw -D short -s 8 -n "${iters}"
        measure "${tl}_bw" 2 "${tl}_am_bw_8k" "${tl}" \
            -t am_bw -D bcopy -s 8192 -n "${bw_iters}"
    done
done

raw="raw datagrams (fi_pingpong -p udp -e dgram)"
table "Latency, 8-byte messages, one way (usec; lower is better; vs raw)" \
    usec \
    "${raw}|$(median "${raw_lat[@]}")" \
    "usnic (ucx_perftest -t am_lat -D short -s 8)|$(median "${usnic_lat[@]}")" \
    "tcp (ucx_perftest -t am_lat -D short -s 8)|$(median "${tcp_lat[@]}")"

raw="raw datagrams received (contrib/dgram_rate.c)"
table "Message rate, 8-byte messages (msg/s; higher is better; vs raw)" \
    msg/s \
    "${raw}|$(median "${raw_rate[@]}")" \
    "usnic (ucx_perftest -t am_bw -D short -s 8)|$(median "${usnic_rate[@]}")" \
    "tcp (ucx_perftest -t am_bw -D short -s 8)|$(median "${tcp_rate[@]}")"

tcp="tcp (ucx_perftest -t am_bw -D bcopy -s 8192)"
table "Bandwidth, 8 KiB messages, ${bw_iters} each (MB/s; higher is better; vs tcp)" \
    MB/s \
    "${tcp}|$(median "${tcp_bw[@]}")" \
    "usnic (ucx_perftest -t am_bw -D bcopy -s 8192)|$(median "${usnic_bw[@]}")" \
    "raw ${max_dgram}-byte datagrams (dgram_rate.c)|$(median "${raw_bw[@]}")"

# RSS of the usnic client, sampled every second while it streams
rss_log=${logs}/usnic_rss.samples
rm -f "${rss_log}"
# shellcheck disable=SC2016 # expanded by the inner shell
sampler='log=$1; shift; "$@" & p=$!
while kill -0 "$p" 2>/dev/null; do
    awk "/^VmRSS/ { print \$2 }" "/proc/$p/status" >>"$log" 2>/dev/null
    sleep 1
done
wait "$p"'
pt=("${usnic_bin}/ucx_perftest" -x usnic -d "${dev}" -p "${port}")
usnic_pair_run "${logs}/usnic_rss" t "${port}" "${pt[@]}" -- \
    bash -c "${sampler}" sampler "${rss_log}" "${pt[@]}" @ADDR@ \
    -t am_bw -D short -s 8 -n "${rss_messages}" >/dev/null
read -r rss_start rss_end rss_peak samples < <(awk '
    NR == 2 { start = $1 } { end = $1; if ($1 > peak) peak = $1 }
    END { print start, end, peak, NR }' "${rss_log}")

echo
echo "Memory: usnic am_bw client streaming ${rss_messages} 8-byte messages (${samples} samples, one per second)"
printf '| %-20s | %-20s | %-20s |\n' "RSS after 1 s (KiB)" "RSS at end (KiB)" "peak RSS (KiB)"
printf '|%s|%s|%s|\n' "----------------------" "----------------------" "----------------------"
printf '| %-20s | %-20s | %-20s |\n' "${rss_start}" "${rss_end}" "${rss_peak}"

# Heap per endpoint, on loopback: the ep alone, then with the stream it
# opens at the receiver
"${usnic_pair_server_pfx[@]}" "${logs}/ep_memory" -d lo -n 10000 \
    >"${logs}/ep_memory.out" || usnic_die "ep_memory failed"
echo
echo "Memory per endpoint (10000 endpoints between two ifaces on lo, heap in use)"
printf '| %-46s | %10s |\n' "what" "bytes"
printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "------------"
awk -F': ' '/ bytes$/ { sub(/ bytes$/, "", $2);
    printf "| %-46s | %10s |\n", $1, $2 }' "${logs}/ep_memory.out"
