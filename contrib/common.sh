# Shared by the contrib scripts: where a build leg lives and how to reach it.
#
# A leg is one (UCX source, libfabric) pair. Each leg has its own tree under
# build/<leg>/ (src, obj, install), so switching legs stays incremental.
#   UCX_SRC        UCX source directory or tarball; default: Debian's ucx
#                  source package (apt-get source ucx)
#   LIBFABRIC_SRC  libfabric source directory or tarball; default: the
#                  system libfabric (Debian's libfabric-dev)
#   USNIC_ASAN=1   build UCX, the module and the tests with AddressSanitizer,
#                  in a leg of its own (<leg>-asan)
#   USNIC_STATS=1  build UCX with statistics (--enable-stats: UCX_STATS_DEST),
#                  in a leg of its own (<leg>-stats)

usnic_top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usnic_build=${usnic_top}/build

usnic_log() {
    echo "[usnic] $*" >&2
}

usnic_die() {
    echo "[usnic] error: $*" >&2
    exit 1
}

# Name of a source given as a directory or a tarball: its base name without
# the archive suffix.
usnic_src_name() {
    local name
    name=$(basename "$1")
    name=${name%.tar.gz}
    name=${name%.tar.xz}
    name=${name%.tar.bz2}
    name=${name%.tgz}
    echo "${name}"
}

usnic_ucx_name=debian
[ -z "${UCX_SRC:-}" ] || usnic_ucx_name=$(usnic_src_name "${UCX_SRC}")
usnic_fabric_name=system
[ -z "${LIBFABRIC_SRC:-}" ] || usnic_fabric_name=$(usnic_src_name "${LIBFABRIC_SRC}")

if [ "${usnic_ucx_name}" = debian ] && [ "${usnic_fabric_name}" = system ]; then
    usnic_leg=default
else
    usnic_leg=${usnic_ucx_name}+${usnic_fabric_name}
fi

if [ "${USNIC_ASAN:-0}" = 1 ]; then
    usnic_leg=${usnic_leg}-asan
fi
if [ "${USNIC_STATS:-0}" = 1 ]; then
    usnic_leg=${usnic_leg}-stats
fi

usnic_leg_dir=${usnic_build}/${usnic_leg}
usnic_obj=${usnic_leg_dir}/obj
usnic_prefix=${usnic_leg_dir}/install
usnic_fabric_prefix=${usnic_leg_dir}/libfabric
usnic_bin=${usnic_prefix}/bin
usnic_gtest=${usnic_obj}/test/gtest/gtest

# Make the leg's own libfabric win over the system one at run time.
usnic_env() {
    if [ -d "${usnic_fabric_prefix}/lib" ]; then
        export LD_LIBRARY_PATH=${usnic_fabric_prefix}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
        export PATH=${usnic_fabric_prefix}/bin:${PATH}
    fi
}

# The UCX source tree the leg was configured from (UCX_SRC as a directory,
# or the tree unpacked or fetched under build/<leg>/src)
usnic_ucx_src() {
    awk '$1 == "abs_top_srcdir" { print $3; exit }' "${usnic_obj}/Makefile"
}

# Whether UCX's configure found libsodium (UCX_USNIC_AUTH_KEY works)
usnic_have_sodium() {
    grep -q '^#define HAVE_USNIC_SODIUM 1' "${usnic_obj}/config.h"
}

# usnic_build_tool <binary> <source> [dependencies...] -- [cc arguments...]:
# build a tool from one source file against the leg's UCX, when the source
# or a dependency is newer than the binary
usnic_build_tool() {
    local bin=$1 src=$2 stale=0 sanitize=()
    shift 2
    { [ -x "${bin}" ] && [ ! "${src}" -nt "${bin}" ]; } || stale=1
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        [ ! "$1" -nt "${bin}" ] || stale=1
        shift
    done
    [ $# -eq 0 ] || shift
    [ "${stale}" -eq 1 ] || return 0

    usnic_log "building ${bin}"
    mkdir -p "$(dirname "${bin}")"
    if [ "${USNIC_ASAN:-0}" = 1 ]; then
        sanitize=(-fsanitize=address -fno-omit-frame-pointer)
    fi
    # UCX's headers as system headers: some of theirs trip -Wextra
    "${CC:-cc}" -O2 -g -Wall -Wextra -Werror "${sanitize[@]}" \
        -o "${bin}.tmp" "${src}" -isystem "${usnic_prefix}/include" \
        -L"${usnic_prefix}/lib" -Wl,-rpath,"${usnic_prefix}/lib" "$@" ||
        usnic_die "cannot build ${src}"
    mv -f "${bin}.tmp" "${bin}"
}

# A fresh random key file for UCX_USNIC_AUTH_KEY, readable by its owner only
usnic_make_key() {
    (umask 077 && head -c 32 /dev/urandom >"$1")
}

# Install Debian packages that are missing; quiet when all are there.
usnic_apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null |
            grep -q "install ok installed" || missing+=("${pkg}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    usnic_log "installing ${missing[*]}"
    mkdir -p "${usnic_build}"
    if [ ! -f "${usnic_build}/.apt-updated" ]; then
        apt-get update -q >"${usnic_build}/apt.log" 2>&1 ||
            usnic_die "apt-get update failed; see ${usnic_build}/apt.log"
        touch "${usnic_build}/.apt-updated"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
        >>"${usnic_build}/apt.log" 2>&1 ||
        usnic_die "apt-get install ${missing[*]} failed; see ${usnic_build}/apt.log"
}
