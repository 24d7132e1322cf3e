#!/usr/bin/env bash
#
# Every byte through UCP: builds test/ucp/ucp_check.c against the current
# leg's UCX (when the source is newer than the binary) and runs its server
# and client: tag messages and active messages both ways, puts (flushed and
# checked by the server) and gets, random sizes from 1 B to 4 MiB. Prints
# both sides' summary lines and a last line "ucp_check: PASS" or
# "ucp_check: FAIL"; fails if either side fails or times out.
#
#   contrib/ucp_check.sh [--lo]     on loopback in the current namespace
#                                   (UCX_NET_DEVICES=lo)
#   contrib/ucp_check.sh --netns    across two network namespaces joined by
#                                   a veth pair (UCX_NET_DEVICES=usnic0)
#   contrib/ucp_check.sh --netns2   joined by two veth pairs, both used
#                                   (UCX_NET_DEVICES=usnic0,usnic1, and
#                                   UCX_MAX_EAGER_RAILS=2,
#                                   UCX_MAX_RNDV_RAILS=2 unless set): also
#                                   prints the bytes each rail carried, and
#                                   fails if one carried no message data;
#                                   AMs are checked exactly once but in any
#                                   order (ucp_check -u), as UCP delivers
#                                   them over several eager rails
#   --no-build                      do not run contrib/build.sh first (the
#                                   leg must be built)
#   -- ARGS                         passed to both sides of ucp_check: -n
#                                   iterations, -s seed, -m max size, -k
#                                   kinds, -w window, -t timeout (the
#                                   client's -n, -s, -m and -k rule)
#   UCX_TLS=tcp contrib/ucp_check.sh ...   another transport, to compare
#                                          (default UCX_TLS=usnic)
#
set -euo pipefail

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pair.sh"

mode=lo
build=1
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --lo)       mode=lo ;;
    --netns)    mode=netns ;;
    --netns2)   mode=netns2 ;;
    --no-build) build=0 ;;
    --)         shift; args=("$@"); break ;;
    *)          usnic_die "usage: $0 [--lo|--netns|--netns2] [--no-build]" \
                          "[-- ucp_check args]" ;;
    esac
    shift
done

[ "${build}" -eq 0 ] || "${usnic_top}/contrib/build.sh"
usnic_env

[ -f "${usnic_prefix}/include/ucp/api/ucp.h" ] ||
    usnic_die "no UCX in ${usnic_prefix}: run contrib/build.sh first"

bin=${usnic_leg_dir}/bin/ucp_check
usnic_build_tool "${bin}" "${usnic_top}/test/ucp/ucp_check.c" -- -lucp -lucs

logs=${usnic_leg_dir}/ucp_check
mkdir -p "${logs}"
trap usnic_pair_cleanup EXIT
usnic_pair_setup "${mode}"

tls=${UCX_TLS:-usnic}
port=$((20000 + $$ % 10000))
log=${logs}/${mode}-${tls//,/_}
run=(env UCX_TLS="${tls}" UCX_NET_DEVICES="${usnic_pair_dev}" "${bin}"
     -p "${port}")
if [ "${mode}" = netns2 ]; then
    eager_rails=${UCX_MAX_EAGER_RAILS:-2}
    run=(env UCX_MAX_EAGER_RAILS="${eager_rails}"
         UCX_MAX_RNDV_RAILS="${UCX_MAX_RNDV_RAILS:-2}" "${run[@]}")
    # UCP runs a whole-message AM handler when the message's last fragment
    # is in, whichever rail it took: each AM is checked once, not in order
    [ "${eager_rails}" -lt 2 ] || args=(-u "${args[@]}")
fi

# Bytes received so far by the server side of each rail
rail_bytes() {
    local dev
    for dev in "${usnic_pair_devs[@]}"; do
        "${usnic_pair_server_pfx[@]}" cat \
            "/sys/class/net/${dev}/statistics/rx_bytes"
    done
}

echo "== ucp_check over ${tls} (${mode}, UCX_NET_DEVICES=${usnic_pair_dev})" \
     "${args[*]}"
# pair.sh's own report of a failure (the tails of both logs) would repeat
# what is printed below: keep it in a file
rc=0
[ "${mode}" = lo ] || mapfile -t bytes_before < <(rail_bytes)
usnic_pair_run "${log}" t "${port}" \
    "${run[@]}" -l "${usnic_pair_addr}" "${args[@]}" -- \
    "${run[@]}" "${args[@]}" @ADDR@ 2>"${log}.run" || rc=$?

grep -hs '^ucp_check \(server\|client\): ' "${log}.server" "${log}.client" |
    grep -v ': listening on ' || true
if [ "${rc}" -ne 0 ]; then
    grep '^\[usnic\]' "${log}.run" >&2 || true
    for side in server client; do
        # what else the side printed: UCX's warnings and errors
        grep -sv '^ucp_check ' "${log}.${side}" | tail -n 10 |
            sed "s/^/${side}: /" >&2 || true
    done
fi
if [ "${mode}" != lo ]; then
    mapfile -t bytes_after < <(rail_bytes)
    for i in "${!usnic_pair_devs[@]}"; do
        carried=$((bytes_after[i] - bytes_before[i]))
        echo "ucp_check: ${usnic_pair_devs[i]} carried ${carried} bytes" \
             "to the server"
        # a rail UCP left out carries only wireup and keepalive: well
        # under a megabyte, where the check moves hundreds
        if [ "${mode}" = netns2 ] && [ "${carried}" -lt 1048576 ]; then
            usnic_log "${usnic_pair_devs[i]} carried no message data"
            rc=1
        fi
    done
fi
usnic_log "logs: ${log}.server ${log}.client"
if [ "${rc}" -ne 0 ]; then
    echo "ucp_check: FAIL"
    exit 1
fi
echo "ucp_check: PASS"
