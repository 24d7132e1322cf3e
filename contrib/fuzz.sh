#!/usr/bin/env bash
#
# Fuzz the receive path of the usnic transport with libFuzzer: build
# test/fuzz/fuzz_rx.c and the module's sources with clang's fuzzer, address
# and undefined-behaviour sanitizers, then run it in a network namespace that
# holds only the loopback device, on a copy of test/fuzz/corpus: half the
# time with the default checksum, half with a UCX_USNIC_AUTH_KEY MAC (when
# UCX was configured with libsodium). Fails if libFuzzer reports a crash, a leak or a sanitizer error.
#
#   contrib/fuzz.sh [--time N] [--build-only]    (FUZZ_TIME, default 600 s)
#
# Output under build/<leg>/fuzz: the binary fuzz_rx, corpus/ (the shipped
# seeds plus what the run found), artifacts/ (crash-*, leak-*), fuzz.log.
#
set -euo pipefail

# clang's sanitizers instrument the target; it links the plain default leg
unset USNIC_ASAN
. "$(dirname "$0")/common.sh"

fuzz_time=${FUZZ_TIME:-600}
build_only=0
while [ $# -gt 0 ]; do
    case $1 in
    --time)       fuzz_time=$2; shift ;;
    --build-only) build_only=1 ;;
    *)            usnic_die "usage: $0 [--time N] [--build-only]" ;;
    esac
    shift
done

"${usnic_top}/contrib/build.sh"
usnic_env
usnic_apt_install clang libclang-rt-14-dev

ucx_src=$(usnic_ucx_src)
fuzz_dir=${usnic_leg_dir}/fuzz
fuzz_bin=${fuzz_dir}/fuzz_rx
mkdir -p "${fuzz_dir}"

# The module's own sources, not the installed libuct_usnic.so: they need
# the fuzzer's coverage instrumentation. One clang call, for 2-core hosts.
# UBSan's null and object-size checks flag UCS's offsetof idiom
# (&((type*)0)->member) in every ucs_container_of(); ASan still catches a
# real null dereference or overflow.
fabric_flags=()
if [ -d "${usnic_fabric_prefix}/lib" ]; then
    fabric_flags=(-I"${usnic_fabric_prefix}/include"
                  -L"${usnic_fabric_prefix}/lib"
                  -Wl,-rpath,"${usnic_fabric_prefix}/lib")
fi
# The MAC path of UCX_USNIC_AUTH_KEY, where UCX's configure found libsodium
sodium_libs=()
if usnic_have_sodium; then
    sodium_libs=(-lsodium)
fi
usnic_log "building ${fuzz_bin}"
clang -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize=null,object-size -fno-omit-frame-pointer \
    -DHAVE_CONFIG_H -DCPU_FLAGS="" \
    -I"${usnic_top}/src" -I"${usnic_obj}" -I"${usnic_obj}/src" \
    -I"${ucx_src}/src" -Wno-unknown-attributes \
    -o "${fuzz_bin}" \
    "${usnic_top}"/src/uct/usnic/*.c "${usnic_top}/test/fuzz/fuzz_rx.c" \
    "${fabric_flags[@]}" -L"${usnic_prefix}/lib" \
    -Wl,-rpath,"${usnic_prefix}/lib" -luct -lucs -lucm -lfabric -lxxhash -lhwloc \
    "${sodium_libs[@]}" ||
    usnic_die "building the fuzz target failed"
[ "${build_only}" -eq 0 ] || { usnic_log "built ${fuzz_bin}"; exit 0; }

# A fresh copy of the shipped seeds, so that a run never edits the repo
rm -rf "${fuzz_dir}/corpus" "${fuzz_dir}/artifacts"
mkdir -p "${fuzz_dir}/artifacts"
cp -r "${usnic_top}/test/fuzz/corpus" "${fuzz_dir}/corpus"

netns=usnic-fuzz-$$
trap 'ip netns delete "${netns}" 2>/dev/null || true' EXIT
ip netns add "${netns}" ||
    usnic_die "cannot create network namespace ${netns} (needs root)"
ip -n "${netns}" link set lo up

# Half the time with the checksum (the default), half with a MAC key; the
# second run starts from the corpus the first one grew
fuzz_run() {
    local log=$1 seconds=$2
    shift 2
    usnic_log "fuzzing for ${seconds} s $*; log: ${log}"
    ip netns exec "${netns}" env UCX_LOG_LEVEL=error "$@" \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "${fuzz_bin}" -max_total_time="${seconds}" -timeout=10 \
        -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="${fuzz_dir}/artifacts/" "${fuzz_dir}/corpus" \
        >"${log}" 2>&1
}

rc=0
if [ ${#sodium_libs[@]} -gt 0 ]; then
    key_file=${fuzz_dir}/auth.key
    usnic_make_key "${key_file}"
    fuzz_run "${fuzz_dir}/fuzz.log" $(( (fuzz_time + 1) / 2 )) || rc=$?
    if [ "${rc}" -eq 0 ]; then
        fuzz_run "${fuzz_dir}/fuzz-mac.log" $(( fuzz_time / 2 )) \
            UCX_USNIC_AUTH_KEY="${key_file}" || rc=$?
        cat "${fuzz_dir}/fuzz-mac.log" >>"${fuzz_dir}/fuzz.log"
    fi
else
    usnic_log "no libsodium in this build: the MAC path is not fuzzed"
    fuzz_run "${fuzz_dir}/fuzz.log" "${fuzz_time}" || rc=$?
fi

grep -E '^#[0-9]+[[:space:]]+DONE|^stat::' "${fuzz_dir}/fuzz.log" ||
    tail -n 5 "${fuzz_dir}/fuzz.log"
usnic_log "corpus: $(ls "${fuzz_dir}/corpus" | wc -l) inputs"
if [ "${rc}" -ne 0 ] || [ -n "$(ls "${fuzz_dir}/artifacts")" ]; then
    grep -E -A30 '^==[0-9]+==ERROR|runtime error|fuzz_rx:' \
        "${fuzz_dir}/fuzz.log" | head -n 60 >&2 || true
    usnic_die "libFuzzer found a problem (exit ${rc}): ${fuzz_dir}/artifacts"
fi
