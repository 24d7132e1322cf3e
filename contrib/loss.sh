#!/usr/bin/env bash
#
# Goodput under kernel-level loss: ucx_perftest am_bw with 8 KiB am_bcopy
# messages across two network namespaces, first lossless, then with an nft
# rule in the receiving (server) namespace that drops N% of the UDP
# datagrams (and TCP segments) arriving there: usnic's data; its ACKs
# travel the other way.
# Prints one table: loss, overall MB/s, share of the lossless run.
#
#   contrib/loss.sh [-n ITERATIONS] [-l "1 10"]
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

iters=200000
losses="1 10"
while [ $# -gt 0 ]; do
    case $1 in
    -n) iters=$2; shift ;;
    -l) losses=$2; shift ;;
    *)  usnic_die "usage: $0 [-n ITERATIONS] [-l \"PERCENT...\"]" ;;
    esac
    shift
done

usnic_apt_install nftables
"${usnic_top}/contrib/build.sh"
usnic_env

usnic_pair_perftest loss

# goodput <percent>: overall MB/s of one run
goodput() {
    local log=${logs}/am_bw_loss_$1
    usnic_pair_set_loss "$1"
    usnic_pair_run "${log}" t "${port}" "${perftest[@]}" -- \
        "${perftest[@]}" @ADDR@ -t am_bw -D bcopy -s 8192 -n "${iters}" \
        >/dev/null
    awk '/^Final:/ { print $7 }' "${log}.client"
}

base=$(goodput 0)
printf '\n| loss | am_bw 8 KiB bcopy, MB/s | share of lossless |\n'
printf '|---|---|---|\n'
printf '| 0%% | %s | 1.00 |\n' "${base}"
for loss in ${losses}; do
    mbs=$(goodput "${loss}")
    awk -v l="${loss}" -v m="${mbs}" -v b="${base}" \
        'BEGIN { printf "| %s%% | %s | %.2f |\n", l, m, m / b }'
done
usnic_pair_set_loss 0
