#!/usr/bin/env bash
#
# Benchmark usnic beside its peers on the same link in the same run, and
# print the tables with ratios. usnic runs over its built-in kernel provider
# and over libfabric's udp provider:
#   latency, 8-byte messages: raw kernel UDP ping-pong (contrib/udp_raw.c),
#     raw libfabric datagram ping-pong (fi_pingpong -p udp -e dgram),
#     ucx_perftest am_lat over usnic and over tcp;
#   message rate, 8-byte messages: raw datagrams (udp_raw.c with
#     sendmmsg/recvmmsg, contrib/dgram_rate.c over libfabric; no
#     reliability), ucx_perftest am_bw short over usnic and over tcp;
#   bandwidth, 8 KiB messages: am_bw bcopy over usnic and over tcp, raw
#     kernel UDP with segmentation offload and raw libfabric datagrams;
#   goodput of the same stream when an nft rule drops 1% of the packets
#     arriving at the receiver, against the lossless figure (not with --lo);
#   UCP tag_bw at 64 KiB and 1 MiB over usnic and tcp, on one rail and
#     (not with --lo) striped over two veth pairs;
#   user-space cycles per datagram sent and received (am_bw, 8 bytes: user
#     CPU time of each side times the CPU clock, over the datagrams);
#   memory: RSS of a usnic am_bw client at start and end of a long stream,
#     heap per endpoint; time per message on 1 ep and on 1,000 active eps;
#   a plot (gnuplot, PNG) of UCP latency and bandwidth against message
#     size (tag_lat, tag_bw);
#   Open MPI ping-pong (contrib/mpi.sh) over usnic and tcp.
#
#   contrib/bench.sh [--lo] [-n ITERATIONS] [-r REPEAT] [--rss-messages N]
#                    [--no-mpi]
#
# Default: across two network namespaces joined by a veth pair; --lo: this
# host's loopback (then without Open MPI). Every measurement runs REPEAT
# times (default 3), the tools taking turns, and the tables show the
# medians: this machine is noisy, so only ratios from one run mean
# something. Logs and the plot go to build/<leg>/bench/.
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

mode=netns
iters=1000000
repeat=3
rss_messages=10000000
mpi=1
while [ $# -gt 0 ]; do
    case $1 in
    --lo)           mode=lo; mpi=0 ;;
    -n)             iters=$2; shift ;;
    -r)             repeat=$2; shift ;;
    --rss-messages) rss_messages=$2; shift ;;
    --no-mpi)       mpi=0 ;;
    *)  usnic_die "usage: $0 [--lo] [-n ITERATIONS] [-r REPEAT]" \
                  "[--rss-messages N] [--no-mpi]" ;;
    esac
    shift
done

"${usnic_top}/contrib/build.sh"
usnic_env
usnic_apt_install gnuplot-nox nftables

logs=${usnic_leg_dir}/bench
mkdir -p "${logs}"
cc -O2 -Wall -o "${logs}/dgram_rate" "${usnic_top}/contrib/dgram_rate.c" \
    ${LIBFABRIC_SRC:+-I"${usnic_fabric_prefix}/include"} \
    ${LIBFABRIC_SRC:+-L"${usnic_fabric_prefix}/lib"} -lfabric ||
    usnic_die "cannot build contrib/dgram_rate.c"
cc -O2 -Wall -o "${logs}/udp_raw" "${usnic_top}/contrib/udp_raw.c" ||
    usnic_die "cannot build contrib/udp_raw.c"
cc -O2 -Wall -o "${logs}/ep_scale" "${usnic_top}/contrib/ep_scale.c" \
    -I"${usnic_prefix}/include" -L"${usnic_prefix}/lib" \
    -Wl,-rpath,"${usnic_prefix}/lib" -luct -lucs ||
    usnic_die "cannot build contrib/ep_scale.c"

trap usnic_pair_cleanup EXIT
# Two rails between the namespaces: the second only for the two-rail rows
if [ "${mode}" = netns ]; then
    usnic_pair_setup netns2
else
    usnic_pair_setup lo
fi
dev=${usnic_pair_devs[0]}
port=$((20000 + $$ % 10000))

# What is measured: usnic over each provider, and tcp
variants=(kernel udp tcp)
declare -A variant_name=([kernel]="usnic, kernel provider"
                         [udp]="usnic, libfabric udp" [tcp]="tcp")

# Two-rail variants, for the UCP bandwidth rows: UCP stripes messages over
# both veth pairs
rail_variants=()
[ "${mode}" = lo ] || rail_variants=(kernel2 tcp2)
variant_name+=([kernel2]="usnic, kernel provider, 2 rails"
               [tcp2]="tcp, 2 rails")
rails_env="UCX_NET_DEVICES=${usnic_pair_dev} UCX_MAX_EAGER_RAILS=2"
rails_env+=" UCX_MAX_RNDV_RAILS=2"

# The environment and UCT transport of a variant
variant_env() {
    case $1 in
    tcp)     echo "UCX_TLS=tcp" ;;
    tcp2)    echo "UCX_TLS=tcp ${rails_env}" ;;
    kernel2) echo "UCX_TLS=usnic UCX_USNIC_PROVIDER=kernel ${rails_env}" ;;
    *)       echo "UCX_TLS=usnic UCX_USNIC_PROVIDER=$1" ;;
    esac
}

variant_tl() {
    [ "$1" = tcp ] && echo tcp || echo usnic
}

# perftest <log> <variant> <ucx_perftest test arguments...>
# Prints the "Final:" line's fields: overall latency (usec), overall
# bandwidth (MB/s), overall message rate (msg/s). UCT tests (-t am_*) get
# the variant's transport and device; UCP tests its UCX_TLS and
# UCX_NET_DEVICES.
perftest() {
    local log=$1 variant=$2 pt
    shift 2
    # shellcheck disable=SC2046 # the environment is words on purpose
    pt=(env UCX_NET_DEVICES="${dev}" $(variant_env "${variant}")
        "${usnic_bin}/ucx_perftest" -p "${port}")
    case $* in
    *"-t am_"*) pt+=(-x "$(variant_tl "${variant}")" -d "${dev}") ;;
    esac
    usnic_pair_run "${log}" t "${port}" "${pt[@]}" -- \
        "${pt[@]}" @ADDR@ "$@" >/dev/null
    awk '/Final:/ { print $5, $7, $9 }' "${log}.client"
}

# udp_raw <mode> <count>: the raw kernel UDP figure of that mode
udp_raw() {
    usnic_pair_run "${logs}/udp_raw_$1" u "${port}" \
        "${logs}/udp_raw" -m "$1" -b "${usnic_pair_addr}" -P "${port}" -- \
        "${logs}/udp_raw" -m "$1" -n "$2" -P "${port}" @ADDR@ >/dev/null
    case $1 in
    lat) awk '/^latency/ { print $2 }' "${logs}/udp_raw_lat.client" ;;
    *)   awk '/^received/ { print $(NF - 1) }' "${logs}/udp_raw_$1.server" ;;
    esac
}

# User-space CPU seconds of each side of an am_bw run, times the clock, per
# datagram: "<sender cycles> <receiver cycles>"; bundling is off, so every
# 8-byte message is one datagram
cpu_hz=$(awk -F: '/^cpu MHz/ { print $2 * 1e6; exit }' /proc/cpuinfo)
cycles_per_dgram() {
    local variant=$1 count=$2 log=${logs}/cycles_$1 pt
    # shellcheck disable=SC2016 # expanded by the inner shell
    local timed='"$@"; rc=$?; times; exit $rc'
    # shellcheck disable=SC2046
    pt=(env $(variant_env "${variant}") UCX_USNIC_BUNDLE_DELAY=0
        "${usnic_bin}/ucx_perftest"
        -x "$(variant_tl "${variant}")" -d "${dev}" -p "${port}")
    usnic_pair_run "${log}" t "${port}" bash -c "${timed}" timed "${pt[@]}" \
        -- bash -c "${timed}" timed "${pt[@]}" @ADDR@ -t am_bw -D short \
        -s 8 -n "${count}" >/dev/null
    # times: the shell's own line, then its children's "user sys"
    for side in client server; do
        tail -n 1 "${log}.${side}" | awk -v hz="${cpu_hz}" -v n="${count}" '
            { split($1, t, /[ms]/); printf "%.0f ", (t[1] * 60 + t[2]) * hz / n }'
    done
    echo
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
# every row's value is compared with the baseline row's, which is printed
# among the rows where it is one of them
table() {
    local title=$1 unit=$2 base=${3#*|} row name width=4
    shift 3
    for row in "$@"; do
        name=${row%|*}
        (( ${#name} > width )) && width=${#name}
    done
    echo
    echo "${title}"
    printf '| %-*s | %10s | %8s |\n' "${width}" "what" "${unit}" "ratio"
    printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' $(seq $((width + 2))))" \
        "------------" "----------"
    for row in "$@"; do
        printf '| %-*s | %10s | %8s |\n' "${width}" "${row%|*}" \
            "${row#*|}" "$(ratio "${row#*|}" "${base}")"
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

declare -A lat rate bw bw_loss tag64k tag1m
raw_lat=() fi_lat=() raw_rate=() fi_rate=() raw_bw=() fi_bw=()
send_cycles=() recv_cycles=()
# The largest datagram libfabric's udp provider sends; 8 KiB messages
# travel as six
max_dgram=1472
bw_iters=$((iters / 4))
# Percent of the packets dropped for the goodput under loss
loss=1
tag_iters=$((iters / 1000 + 100))
for run in $(seq "${repeat}"); do
    usnic_log "run ${run} of ${repeat}"
    raw_lat+=("$(udp_raw lat "$((iters / 4))")")
    fi_lat+=("$(pingpong_lat)")
    raw_rate+=("$(udp_raw rate "${iters}")")
    fi_rate+=("$(dgram_rate 8 "${iters}")")
    raw_bw+=("$(udp_raw bw "$((bw_iters * 6))")")
    fi_bw+=("$(dgram_rate "${max_dgram}" "$((bw_iters * 6))" |
               awk -v s="${max_dgram}" '{ printf "%.2f", $1 * s / 1048576 }')")
    for v in "${variants[@]}"; do
        r=$(perftest "${logs}/${v}_am_lat" "${v}" -t am_lat -D short -s 8 \
                     -n "${iters}")
        lat[${v}]+=" ${r%% *}"
        r=$(perftest "${logs}/${v}_am_bw" "${v}" -t am_bw -D short -s 8 \
                     -n "${iters}")
        rate[${v}]+=" ${r##* }"
        r=$(perftest "${logs}/${v}_am_bw_8k" "${v}" -t am_bw -D bcopy \
                     -s 8192 -n "${bw_iters}")
        r=${r#* }
        bw[${v}]+=" ${r%% *}"
        if [ "${mode}" = netns ]; then
            usnic_pair_set_loss "${loss}"
            r=$(perftest "${logs}/${v}_am_bw_8k_loss" "${v}" -t am_bw \
                         -D bcopy -s 8192 -n "${bw_iters}")
            usnic_pair_set_loss 0
            r=${r#* }
            bw_loss[${v}]+=" ${r%% *}"
        fi
    done
    for v in "${variants[@]}" "${rail_variants[@]}"; do
        r=$(perftest "${logs}/${v}_tag_bw_64k" "${v}" -t tag_bw -s 65536 \
                     -n "$((tag_iters * 16))")
        r=${r#* }
        tag64k[${v}]+=" ${r%% *}"
        r=$(perftest "${logs}/${v}_tag_bw_1m" "${v}" -t tag_bw -s 1048576 \
                     -n "${tag_iters}")
        r=${r#* }
        tag1m[${v}]+=" ${r%% *}"
    done
    for v in kernel udp; do
        read -r c_send c_recv < <(cycles_per_dgram "${v}" "${bw_iters}")
        send_cycles+=("${v}:${c_send}")
        recv_cycles+=("${v}:${c_recv}")
    done
done

# rows <associative array name> <label suffix>: one row per variant that
# has values (the three single-rail ones first)
rows() {
    local -n values=$1
    local v
    for v in "${variants[@]}" "${rail_variants[@]}"; do
        [ -n "${values[${v}]:-}" ] || continue
        # shellcheck disable=SC2086 # a list of values
        echo "${variant_name[${v}]} $2|$(median ${values[${v}]})"
    done
}

# cycles <kernel|udp> <array>: median of that provider's samples
cycles() {
    local v=$1 sample values=()
    local -n samples=$2
    for sample in "${samples[@]}"; do
        [ "${sample%%:*}" = "${v}" ] && values+=("${sample#*:}")
    done
    median "${values[@]}"
}

mapfile -t r < <(rows lat "(am_lat -D short -s 8)")
raw="raw kernel UDP ping-pong (contrib/udp_raw.c)|$(median "${raw_lat[@]}")"
table "Latency, 8-byte messages, one way (usec; lower is better; vs raw kernel UDP)" \
    usec "${raw}" "${raw}" \
    "raw libfabric udp datagrams (fi_pingpong)|$(median "${fi_lat[@]}")" \
    "${r[@]}"

mapfile -t r < <(rows rate "(am_bw -D short -s 8)")
table "Message rate, 8-byte messages (msg/s; higher is better; vs tcp)" \
    msg/s "${r[2]}" \
    "raw kernel UDP, sendmmsg/recvmmsg (udp_raw.c)|$(median "${raw_rate[@]}")" \
    "raw libfabric udp datagrams (dgram_rate.c)|$(median "${fi_rate[@]}")" \
    "${r[@]}"

mapfile -t r < <(rows bw "(am_bw -D bcopy -s 8192)")
table "Bandwidth, 8 KiB messages, ${bw_iters} each (MB/s; higher is better; vs tcp)" \
    MB/s "${r[2]}" \
    "raw kernel UDP, 64 KiB segmentation offload|$(median "${raw_bw[@]}")" \
    "raw libfabric udp ${max_dgram}-byte datagrams|$(median "${fi_bw[@]}")" \
    "${r[@]}"

if [ "${mode}" = netns ]; then
    echo
    echo "Goodput under loss, 8 KiB am_bw -D bcopy, ${loss}% of the packets" \
         "arriving at the receiver dropped (nft) (MB/s; vs lossless)"
    printf '| %-28s | %10s | %10s | %8s |\n' "what" "lossless" \
        "${loss}% drop" "ratio"
    printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..30})" "------------" \
        "------------" "----------"
    for v in "${variants[@]}"; do
        # shellcheck disable=SC2086 # lists of values
        a=$(median ${bw[${v}]}) b=$(median ${bw_loss[${v}]})
        printf '| %-28s | %10s | %10s | %8s |\n' "${variant_name[${v}]}" \
            "${a}" "${b}" "$(ratio "${b}" "${a}")"
    done
fi

mapfile -t r < <(rows tag64k "(UCP tag_bw -s 65536)")
table "UCP tag_bw, 64 KiB messages (MB/s; higher is better; vs tcp)" \
    MB/s "${r[2]}" "${r[@]}"
mapfile -t r < <(rows tag1m "(UCP tag_bw -s 1048576)")
table "UCP tag_bw, 1 MiB messages (MB/s; higher is better; vs tcp)" \
    MB/s "${r[2]}" "${r[@]}"

echo
echo "User-space cycles per datagram, am_bw 8-byte messages, bundling off" \
     "(user CPU time of each side x ${cpu_hz} Hz / datagrams; both sides" \
     "poll, so idle polling counts too)"
printf '| %-28s | %10s | %10s |\n' "provider" "sending" "receiving"
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..30})" "------------" \
    "------------"
for v in kernel udp; do
    printf '| %-28s | %10s | %10s |\n' "${variant_name[${v}]}" \
        "$(cycles "${v}" send_cycles)" "$(cycles "${v}" recv_cycles)"
done

# Latency and bandwidth against message size, one run each, for the plot;
# through UCP, which takes every size over every transport
sizes=(8 64 512 4096 32768 262144 1048576)
plot_data=${logs}/by_size.dat
{
    echo "# size, then latency (usec) and bandwidth (MB/s) of: ${variants[*]}"
    for size in "${sizes[@]}"; do
        line=${size}
        for v in "${variants[@]}"; do
            r=$(perftest "${logs}/${v}_lat_${size}" "${v}" -t tag_lat \
                         -s "${size}" -n "$((iters / 100 + 100))")
            line+=" ${r%% *}"
            r=$(perftest "${logs}/${v}_bw_${size}" "${v}" -t tag_bw \
                         -s "${size}" -n "$((iters / 100 + 100))")
            r=${r#* }
            line+=" ${r%% *}"
        done
        echo "${line}"
    done
} >"${plot_data}"
gnuplot <<GNUPLOT || usnic_die "gnuplot failed"
set terminal pngcairo size 1100,450 font ",10" noenhanced
set output "${logs}/bench.png"
set multiplot layout 1,2 title "usnic and tcp: ucx_perftest tag_lat and tag_bw (UCP, ${mode})"
set logscale x 2
set format x "%.0s%cB"
set xlabel "message size"
set key top left
set logscale y 10
set ylabel "one-way latency (usec, log scale)"
plot for [i=0:2] "${plot_data}" using 1:(column(2 + 2 * i)) \
     with linespoints title word("usnic-kernel usnic-udp tcp", i + 1)
unset logscale y
set ylabel "bandwidth (MB/s)"
plot for [i=0:2] "${plot_data}" using 1:(column(3 + 2 * i)) \
     with linespoints title word("usnic-kernel usnic-udp tcp", i + 1)
unset multiplot
GNUPLOT
echo
echo "Plot of latency and bandwidth against message size:" \
     "${logs}/bench.png (data: ${plot_data})"

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
    END { if (NR < 2) { start = "-" } print start, end, peak, NR }' \
    "${rss_log}")
[ "${samples}" -ge 2 ] ||
    echo "RSS: the stream ended within a second: give --rss-messages more"

echo
echo "Memory: usnic am_bw client streaming ${rss_messages} 8-byte messages (${samples} samples, one per second)"
printf '| %-20s | %-20s | %-20s |\n' "RSS after 1 s (KiB)" "RSS at end (KiB)" "peak RSS (KiB)"
printf '|%s|%s|%s|\n' "----------------------" "----------------------" "----------------------"
printf '| %-20s | %-20s | %-20s |\n' "${rss_start}" "${rss_end}" "${rss_peak}"

# Heap per endpoint, on loopback: the ep alone, then with the stream it
# opens at the receiver
"${usnic_pair_server_pfx[@]}" "${logs}/ep_scale" -d lo -n 10000 \
    >"${logs}/ep_memory.out" || usnic_die "ep_scale failed"
echo
echo "Memory per endpoint (10000 endpoints between two ifaces on lo, heap in use)"
printf '| %-46s | %10s |\n' "what" "bytes"
printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "------------"
awk -F': ' '/ bytes$/ { sub(/ bytes$/, "", $2);
    printf "| %-46s | %10s |\n", $1, $2 }' "${logs}/ep_memory.out"

# Cost per message with 1,000 eps active at once against one ep, bundling
# off (one ep would gain from it), on loopback
"${usnic_pair_server_pfx[@]}" env UCX_USNIC_BUNDLE_DELAY=0 \
    "${logs}/ep_scale" -d lo -n 1000 -m "${iters}" >"${logs}/ep_scale.out" ||
    usnic_die "ep_scale -m failed"
echo
echo "Time per short message, round robin on 1 ep and on 1000 eps (lo, BUNDLE_DELAY=0)"
printf '| %-46s | %10s |\n' "what" "ns"
printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "------------"
awk '/ ns per message/ { split($0, f, ": "); sub(/ ns per message.*/, "",
    f[2]); printf "| %-46s | %10s |\n", f[1], f[2] }' "${logs}/ep_scale.out"

if [ "${mpi}" = 1 ]; then
    usnic_pair_cleanup
    trap - EXIT
    echo
    echo "Open MPI ping-pong (contrib/mpi.sh): usnic (kernel provider) and tcp"
    "${usnic_top}/contrib/mpi.sh" --no-build -u 4194304 -n 50
fi
