#!/usr/bin/env bash
#
# Build if needed, show what UCX sees of the usnic transport, then run
# ucx_perftest server and client over it: am_lat with 8-byte short messages,
# am_bw with 8 KiB bcopy messages, put_lat with 8-byte and put_bw with 8 KiB
# put_bcopy.
#
#   contrib/demo.sh [-n ITERATIONS]            on this host's loopback (lo)
#   contrib/demo.sh --netns [-n ITERATIONS]    across two network namespaces
#                                              joined by a veth pair (created
#                                              and removed by the script)
#   --all   also am_bw with 8-byte am_short and 1 KiB am_bcopy messages
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

mode=lo
iters=100000
tests=("am_lat -D short -s 8" "am_bw -D bcopy -s 8192"
       "put_lat -D bcopy -s 8" "put_bw -D bcopy -s 8192")
while [ $# -gt 0 ]; do
    case $1 in
    --netns) mode=netns ;;
    --all)   tests=("am_lat -D short -s 8" "am_bw -D short -s 8"
                    "am_bw -D bcopy -s 1024" "am_bw -D bcopy -s 8192"
                    "put_lat -D bcopy -s 8" "put_bw -D bcopy -s 8192") ;;
    -n)      iters=$2; shift ;;
    *)       usnic_die "usage: $0 [--netns] [--all] [-n ITERATIONS]" ;;
    esac
    shift
done

"${usnic_top}/contrib/build.sh"
usnic_env

echo "== ucx_info -d -t usnic"
"${usnic_bin}/ucx_info" -d -t usnic
echo

logs=${usnic_leg_dir}/demo
mkdir -p "${logs}"
trap usnic_pair_cleanup EXIT
usnic_pair_setup "${mode}"

port=$((20000 + $$ % 10000))
perftest=("${usnic_bin}/ucx_perftest" -x usnic -d "${usnic_pair_dev}"
          -p "${port}")
for test in "${tests[@]}"; do
    log=${logs}/${test// /_}
    echo "== ucx_perftest -x usnic -d ${usnic_pair_dev} -t ${test}" \
         "-n ${iters} (${mode})"
    # shellcheck disable=SC2086 # test holds several arguments
    usnic_pair_run "${log}" t "${port}" "${perftest[@]}" -- \
        "${perftest[@]}" @ADDR@ -t ${test} -n "${iters}"
    cat "${log}.client"
    echo
done
