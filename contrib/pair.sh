# Shared by demo.sh, bench.sh, loss.sh and peer_kill.sh: run a server/client
# pair of a benchmark tool either on this host's loopback or across two
# network namespaces.
#
#   usnic_pair_setup lo|netns|netns2
#                                 sets usnic_pair_dev, usnic_pair_addr and
#                                 the command prefixes of both sides;
#                                 netns2: two veth pairs (two rails, usnic0
#                                 and usnic1), usnic_pair_dev lists both
#   usnic_pair_run <log> <server cmd...> -- <client cmd...>
#                                 starts the server, runs the client against
#                                 it, waits for both; "@ADDR@" in the client
#                                 command becomes the server's address
#   usnic_pair_cleanup            stops what is left, removes namespaces
#   usnic_pair_set_loss <percent> drops that share of the UDP and TCP packets
#                                 arriving in the server's namespace (nft;
#                                 netns mode only), 0 removes the rule
#   usnic_pair_perftest <name>    for a usnic ucx_perftest across namespaces:
#                                 sets it all up and sets logs (a directory
#                                 build/<leg>/<name>), port and perftest (the
#                                 command both sides share)
#
# The namespaces are joined by a veth pair whose ends carry the same name in
# both, so one UCX_NET_DEVICES / -d value fits both sides; addresses come
# from 198.18.0.0/15 (benchmarking range, never routed).

usnic_pair_mode=
usnic_pair_ns=()
usnic_pair_server_pid=
usnic_pair_timeout=${USNIC_PAIR_TIMEOUT:-600}

usnic_pair_setup() {
    usnic_pair_mode=$1
    case ${usnic_pair_mode} in
    lo)
        usnic_pair_dev=lo
        usnic_pair_devs=(lo)
        usnic_pair_addr=127.0.0.1
        usnic_pair_server_pfx=()
        usnic_pair_client_pfx=()
        ;;
    netns|netns2)
        local a=usnic-srv-$$ b=usnic-cli-$$ rails=1 rail dev ns i
        [ "${usnic_pair_mode}" = netns ] || rails=2
        usnic_pair_devs=()
        usnic_pair_addr=198.18.0.1
        ip netns add "${a}" ||
            usnic_die "cannot create network namespace ${a} (needs root)"
        usnic_pair_ns+=("${a}")
        ip netns add "${b}" || usnic_die "cannot create network namespace ${b}"
        usnic_pair_ns+=("${b}")
        for ns in "${a}" "${b}"; do
            ip -n "${ns}" link set lo up
        done
        for rail in $(seq 0 $((rails - 1))); do
            dev=usnic${rail}
            usnic_pair_devs+=("${dev}")
            ip link add "${dev}" netns "${a}" type veth \
                peer name "${dev}" netns "${b}" ||
                usnic_die "cannot create the veth pair ${dev}"
            ip -n "${a}" addr add "198.18.${rail}.1/24" dev "${dev}"
            ip -n "${b}" addr add "198.18.${rail}.2/24" dev "${dev}"
            for ns in "${a}" "${b}"; do
                ip -n "${ns}" link set "${dev}" up
            done
            # libfabric lists only interfaces that are running: wait for
            # the carrier on both ends
            for ns in "${a}" "${b}"; do
                for i in $(seq 50); do
                    ip -n "${ns}" -o link show "${dev}" |
                        grep -q 'state UP' && break
                    sleep 0.1
                done
            done
        done
        usnic_pair_dev=$(IFS=,; echo "${usnic_pair_devs[*]}")
        usnic_pair_server_pfx=(ip netns exec "${a}")
        usnic_pair_client_pfx=(ip netns exec "${b}")
        ;;
    *)
        usnic_die "unknown pair mode ${usnic_pair_mode}"
        ;;
    esac
}

usnic_pair_cleanup() {
    local ns
    [ -z "${usnic_pair_server_pid}" ] || usnic_pair_stop_server
    for ns in "${usnic_pair_ns[@]}"; do
        ip netns delete "${ns}" 2>/dev/null || true
    done
    usnic_pair_ns=()
}

# Wait until the server side listens on a TCP (OOB) or UDP port.
usnic_pair_wait_port() {
    local proto=$1 port=$2 i
    for i in $(seq 100); do
        if "${usnic_pair_server_pfx[@]}" ss -H -n "-l${proto}" \
                "sport = :${port}" 2>/dev/null | grep -q .; then
            return 0
        fi
        kill -0 "${usnic_pair_server_pid}" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# usnic_pair_run <log> <t|u> <port> <server cmd...> -- <client cmd...>
# Output of both sides goes to <log>.server and <log>.client; the client's
# is also printed. Fails if either side fails or times out.
usnic_pair_run() {
    local log=$1 proto=$2 port=$3 server=() client=() rc=0 src=0 arg
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        server+=("$1")
        shift
    done
    shift
    for arg in "$@"; do
        client+=("${arg//@ADDR@/${usnic_pair_addr}}")
    done

    "${usnic_pair_server_pfx[@]}" timeout "${usnic_pair_timeout}" \
        "${server[@]}" >"${log}.server" 2>&1 &
    usnic_pair_server_pid=$!
    if ! usnic_pair_wait_port "${proto}" "${port}"; then
        cat "${log}.server" >&2
        usnic_pair_stop_server
        usnic_log "server did not start: ${server[*]}"
        return 1
    fi

    "${usnic_pair_client_pfx[@]}" timeout "${usnic_pair_timeout}" \
        "${client[@]}" >"${log}.client" 2>&1 || rc=$?
    wait "${usnic_pair_server_pid}" || src=$?
    [ "${rc}" -ne 0 ] || rc=${src}
    usnic_pair_server_pid=
    if [ "${rc}" -ne 0 ]; then
        usnic_log "failed (exit ${rc}): ${client[*]}"
        tail -n 20 "${log}.server" "${log}.client" >&2
    fi
    return "${rc}"
}

usnic_pair_set_loss() {
    local nft=("${usnic_pair_server_pfx[@]}" nft)
    [ "${usnic_pair_mode}" != lo ] ||
        usnic_die "loss needs the two network namespaces"
    "${nft[@]}" delete table inet usnic_loss 2>/dev/null || true
    [ "$1" -eq 0 ] && return 0
    "${nft[@]}" add table inet usnic_loss
    "${nft[@]}" add chain inet usnic_loss input \
        '{ type filter hook input priority 0; policy accept; }'
    "${nft[@]}" add rule inet usnic_loss input \
        meta l4proto "{ udp, tcp }" numgen random mod 100 "<" "$1" drop
}

usnic_pair_stop_server() {
    kill "${usnic_pair_server_pid}" 2>/dev/null || true
    wait "${usnic_pair_server_pid}" 2>/dev/null || true
    usnic_pair_server_pid=
}

usnic_pair_perftest() {
    logs=${usnic_leg_dir}/$1
    mkdir -p "${logs}"
    trap usnic_pair_cleanup EXIT
    usnic_pair_setup netns

    port=$((20000 + $$ % 10000))
    perftest=("${usnic_bin}/ucx_perftest" -x usnic -d "${usnic_pair_dev}"
              -p "${port}")
}
