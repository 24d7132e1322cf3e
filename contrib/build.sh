#!/usr/bin/env bash
#
# Build UCX with the usnic transport, from a bare Debian 12 machine to an
# installed UCX in build/<leg>/install (build/install for the default leg).
#
#   contrib/build.sh                      Debian's UCX 1.13.1 + libfabric 1.17
#   UCX_SRC=<dir|tarball> contrib/build.sh
#   UCX_SRC=... LIBFABRIC_SRC=<dir|tarball> contrib/build.sh
#   USNIC_ASAN=1 contrib/build.sh        any of the above, with AddressSanitizer
#   USNIC_STATS=1 contrib/build.sh       any of the above, with UCX statistics
#                                         (--enable-stats)
#   contrib/build.sh --system             only the module, for the distribution's
#                                         installed UCX (libucx0): built from that
#                                         version's source with its configure
#                                         options in build/system, installed into
#                                         its module directory (contrib/system.sh)
#   contrib/build.sh --system --uninstall removes what --system installed
#
# Incremental: module files are mirrored into the UCX tree with their times
# kept, autogen/configure run again only when their inputs change, and make
# rebuilds only what changed.
#
set -euo pipefail

. "$(dirname "$0")/common.sh"

jobs=${JOBS:-$(nproc)}
logs=${usnic_leg_dir}/logs
ucx_configure_args=(--enable-gtest --without-cuda --without-rocm
                    --without-java --without-go --disable-doxygen-doc)
if [ "${USNIC_ASAN:-0}" = 1 ]; then
    asan_flags="-g -O2 -fsanitize=address -fno-omit-frame-pointer"
    ucx_configure_args+=("CFLAGS='${asan_flags}'" "CXXFLAGS='${asan_flags}'"
                         "LDFLAGS=-fsanitize=address")
fi
if [ "${USNIC_STATS:-0}" = 1 ]; then
    ucx_configure_args+=(--enable-stats)
fi
# GCC 12 flags a use-after-free in UCX's own gtest sources (ucm/malloc_hook.cc):
# keep that one a warning; everything else still builds with -Werror
ucx_make_args=(CPPFLAGS=-Wno-error=use-after-free)

run_logged() {
    local name=$1
    shift
    if ! "$@" >"${logs}/${name}.log" 2>&1; then
        tail -n 40 "${logs}/${name}.log" >&2
        usnic_die "${name} failed; full log: ${logs}/${name}.log"
    fi
}

install_build_deps() {
    local pkgs=(build-essential autoconf automake libtool pkg-config
                dpkg-dev rsync libfabric-dev libfabric-bin libhwloc-dev
                libxxhash-dev libsodium-dev libnuma-dev iproute2)
    if [ -n "${LIBFABRIC_SRC:-}" ]; then
        pkgs+=(libibverbs-dev libnl-3-dev libnl-route-3-dev)
    fi
    usnic_apt_install "${pkgs[@]}"
}

# Unpack a tarball once into build/<leg>/src and print the tree's path
unpack_source() {
    local archive=$1 dest=${usnic_leg_dir}/src
    local name
    name=$(usnic_src_name "${archive}")
    if [ ! -d "${dest}/${name}" ]; then
        usnic_log "unpacking ${archive}"
        mkdir -p "${dest}/${name}.tmp"
        tar -xf "${archive}" -C "${dest}/${name}.tmp" --strip-components=1
        mv "${dest}/${name}.tmp" "${dest}/${name}"
    fi
    echo "${dest}/${name}"
}

# apt-get source needs a deb-src entry; add Debian's when there is none
add_deb_src() {
    local list=/etc/apt/sources.list.d/uct-usnic-src.sources
    if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list \
            /etc/apt/sources.list.d/; then
        usnic_log "adding a deb-src entry for Debian's source packages"
        cat >"${list}" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        apt-get update -q >/dev/null
    fi
}

# Debian's UCX source package, fetched once
fetch_debian_ucx() {
    local dest=${usnic_leg_dir}/src tree
    tree=$(ls -d "${dest}"/ucx-*/ 2>/dev/null | head -n 1)
    if [ -n "${tree}" ]; then
        echo "${tree%/}"
        return
    fi

    add_deb_src
    usnic_log "fetching Debian's ucx source package"
    mkdir -p "${dest}"
    (cd "${dest}" && apt-get source -q ucx >"${logs}/apt-source.log" 2>&1) ||
        usnic_die "apt-get source ucx failed; see ${logs}/apt-source.log"
    tree=$(ls -d "${dest}"/ucx-*/ | head -n 1)
    echo "${tree%/}"
}

ucx_source_tree() {
    if [ -z "${UCX_SRC:-}" ]; then
        fetch_debian_ucx
    elif [ -d "${UCX_SRC}" ]; then
        (cd "${UCX_SRC}" && pwd)
    elif [ -f "${UCX_SRC}" ]; then
        unpack_source "$(cd "$(dirname "${UCX_SRC}")" && pwd)/$(basename "${UCX_SRC}")"
    else
        usnic_die "UCX_SRC=${UCX_SRC}: no such directory or tarball"
    fi
}

# Build libfabric with only the providers the module uses
build_libfabric() {
    local tree stamp=${usnic_fabric_prefix}/.usnic-built providers
    if [ -d "${LIBFABRIC_SRC}" ]; then
        tree=$(cd "${LIBFABRIC_SRC}" && pwd)
    elif [ -f "${LIBFABRIC_SRC}" ]; then
        tree=$(unpack_source "$(cd "$(dirname "${LIBFABRIC_SRC}")" && pwd)/$(basename "${LIBFABRIC_SRC}")")
    else
        usnic_die "LIBFABRIC_SRC=${LIBFABRIC_SRC}: no such directory or tarball"
    fi

    [ -f "${stamp}" ] && return 0

    usnic_log "building libfabric from ${tree}"
    [ -x "${tree}/configure" ] || run_logged libfabric-autogen \
        sh -c "cd '${tree}' && ./autogen.sh"
    providers=(--enable-only --enable-udp --enable-rxd --enable-usnic)
    mkdir -p "${usnic_leg_dir}/libfabric-obj"
    run_logged libfabric-configure sh -c \
        "cd '${usnic_leg_dir}/libfabric-obj' && '${tree}/configure' \
         --prefix='${usnic_fabric_prefix}' ${providers[*]}"
    run_logged libfabric-make make -C "${usnic_leg_dir}/libfabric-obj" \
        -j"${jobs}" install
    touch "${stamp}"
}

# Mirror the module and its tests into the UCX tree. Files are copied, not
# the directory linked: automake's relative top_srcdir would resolve through
# a directory link into the wrong tree. A changed file gets the time of the
# copy, not of its edit: an edit made while an earlier build was compiling
# the old copy must still look newer than that object.
sync_module() {
    local ucx=$1 dir
    for dir in src/uct/usnic test/gtest/uct/usnic; do
        mkdir -p "${ucx}/${dir}"
        rsync -rl --checksum --delete "${usnic_top}/${dir}/" "${ucx}/${dir}/"
    done
}

# No suite of UCX's own ucs and ucm unit tests is instantiated for usnic:
# leave their sources (a third of them) out of the gtest binary, which
# takes most of the build
prune_gtest() {
    local makefile=$1 marker='# usnic: without the ucs and ucm unit tests'
    grep -qxF "${marker}" "${makefile}" && return 0
    awk -v marker="${marker}" '
        { line[NR] = $0 }
        /^gtest_SOURCES = \\$/ { in_list = 1; next }
        in_list && /^[ \t]+uc[sm]\/[^ ]*\.cc( \\)?$/ {
            drop[NR] = 1
            if ($0 !~ /\\$/) {
                # It ended the list: the last line kept before it now does
                for (i = NR - 1; drop[i] || (line[i] ~ /^[ \t]*\\$/); --i) {
                    drop[i] = 1
                }
                sub(/[ \t]*\\$/, "", line[i])
            }
        }
        in_list && !/\\$/ { in_list = 0 }
        END {
            for (i = 1; i <= NR; ++i) {
                if (!drop[i]) {
                    print line[i]
                }
            }
            print ""
            print marker
        }' "${makefile}" >"${makefile}.usnic" &&
        mv "${makefile}.usnic" "${makefile}"
}

# The few edits that make UCX build and test the module; each is applied
# once, anchored on lines that exist in UCX 1.13 and 1.22 alike
integrate_module() {
    local ucx=$1

    grep -q 'src/uct/usnic/configure.m4' "${ucx}/src/uct/configure.m4" ||
        sed -i 's|^m4_include(\[src/uct/ugni/configure.m4\])$|&\nm4_include([src/uct/usnic/configure.m4])|' \
            "${ucx}/src/uct/configure.m4"
    grep -q '^SUBDIRS = .* usnic' "${ucx}/src/uct/Makefile.am" ||
        sed -i 's|^SUBDIRS = \..*$|& usnic|' "${ucx}/src/uct/Makefile.am"
    # usnic joins every generic suite through the macros that instantiate
    # them, not their transport lists: the preprocessor iteration behind
    # those lists is already full in UCX 1.22
    grep -q '_UCT_INSTANTIATE_TEST_CASE(_test_case, usnic)' \
            "${ucx}/test/gtest/uct/uct_test.h" ||
        sed -i -E 's#^(    UCS_PP_FOREACH\(_UCT_INSTANTIATE_TEST_CASE, _test_case, UCT_TEST_(TLS|NO_SELF_TLS|NO_GPU_MEM_TYPE_TLS)\))$#\1 \\\n    _UCT_INSTANTIATE_TEST_CASE(_test_case, usnic)#' \
            "${ucx}/test/gtest/uct/uct_test.h"
    # UCP's suites: the transport lists behind UCP_INSTANTIATE_TEST_CASE and
    # its GPU-aware twin (usnic there runs on host memory only, as tcp does)
    grep -q '_test_case, usnic,  "usnic")' "${ucx}/test/gtest/ucp/ucp_test.h" ||
        sed -i -E \
            -e 's#^(    UCP_INSTANTIATE_TEST_CASE_TLS\(_test_case, self, +"self"\) \\)$#\1\n    UCP_INSTANTIATE_TEST_CASE_TLS(_test_case, usnic,  "usnic") \\#' \
            -e '/^    UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE\(_test_case, ugni, \\$/{n;s#$#\n    UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE(_test_case, usnic, "usnic") \\#}' \
            "${ucx}/test/gtest/ucp/ucp_test.h"
    grep -q '^                   usnic, \\' "${ucx}/test/gtest/uct/test_md.cc" ||
        sed -i 's|^                   ugni, \\$|&\n                   usnic, \\|' \
            "${ucx}/test/gtest/uct/test_md.cc"
    grep -q 'include $(srcdir)/uct/usnic/gtest.am' "${ucx}/test/gtest/Makefile.am" ||
        sed -i 's|^noinst_HEADERS = \\$|include $(srcdir)/uct/usnic/gtest.am\n\n&|' \
            "${ucx}/test/gtest/Makefile.am"
    prune_gtest "${ucx}/test/gtest/Makefile.am"

    grep -q 'src/uct/usnic/configure.m4' "${ucx}/src/uct/configure.m4" &&
        [ "$(grep -c '_UCT_INSTANTIATE_TEST_CASE(_test_case, usnic)' \
               "${ucx}/test/gtest/uct/uct_test.h")" -eq 3 ] &&
        [ "$(grep -c '(_test_case, usnic, *"usnic")' \
               "${ucx}/test/gtest/ucp/ucp_test.h")" -eq 2 ] &&
        grep -q 'include $(srcdir)/uct/usnic/gtest.am' "${ucx}/test/gtest/Makefile.am" ||
        usnic_die "could not integrate the module into ${ucx}: unknown UCX layout"

    # Debian's orig tarball lacks files that configure.ac links
    if [ -d "${ucx}/debian.upstream" ]; then
        local f
        for f in compat copyright ucx.prerm; do
            [ -e "${ucx}/debian/${f}" ] || {
                mkdir -p "${ucx}/debian"
                cp -a "${ucx}/debian.upstream/${f}" "${ucx}/debian/${f}"
            }
        done
    fi
}

# UCX builds in automake's maintainer mode off, so a changed Makefile.am is
# not picked up by make: regenerate just the Makefiles that include ours
makefiles_hash() {
    local ucx=$1
    cat "${usnic_top}/src/uct/usnic/Makefile.am" \
        "${usnic_top}/test/gtest/uct/usnic/gtest.am" \
        "${ucx}/test/gtest/Makefile.am" | sha1sum | cut -d' ' -f1
}

refresh_makefiles() {
    local ucx=$1 stamp=${usnic_obj}/.usnic-makefiles stamp_new
    stamp_new=$(makefiles_hash "${ucx}")
    [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "${stamp_new}" ] && return 0

    usnic_log "regenerating the module's Makefiles"
    run_logged automake sh -c "cd '${ucx}' && automake --foreign \
        src/uct/usnic/Makefile test/gtest/Makefile"
    run_logged config-status sh -c "cd '${usnic_obj}' && ./config.status \
        src/uct/usnic/Makefile test/gtest/Makefile depfiles"
    echo "${stamp_new}" >"${stamp}"
}

# What decides whether configure must run again: the module's configure.m4
# and the given arguments
configure_inputs() {
    echo "$(sha1sum <"${usnic_top}/src/uct/usnic/configure.m4" |
            cut -d' ' -f1) $*"
}

# Whether configure already ran in ${usnic_obj} with these inputs
configure_is_current() {
    local stamp=$1 inputs=$2
    [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "${inputs}" ] &&
        [ -f "${usnic_obj}/Makefile" ]
}

configure_ucx() {
    local ucx=$1 args stamp_new stamp=${usnic_obj}/.usnic-configured
    args=("${ucx_configure_args[@]}" "--prefix=${usnic_prefix}")
    if [ -n "${LIBFABRIC_SRC:-}" ]; then
        args+=("--with-usnic=${usnic_fabric_prefix}")
    else
        args+=(--with-usnic)
    fi

    # Only configure.m4 needs autogen + configure again; a changed
    # Makefile.am is regenerated by automake's own rules during make
    stamp_new=$(configure_inputs "${args[*]}")
    configure_is_current "${stamp}" "${stamp_new}" && return 0

    usnic_log "autogen + configure of ${ucx}"
    run_logged autogen sh -c "cd '${ucx}' && ./autogen.sh"
    mkdir -p "${usnic_obj}"
    run_logged configure sh -c "cd '${usnic_obj}' && '${ucx}/configure' \
        ${args[*]}"
    grep -q '^#define HAVE_TL_USNIC 1' "${usnic_obj}/config.h" ||
        usnic_die "configure did not enable usnic; see ${logs}/configure.log"
    echo "${stamp_new}" >"${stamp}"
    makefiles_hash "${ucx}" >"${usnic_obj}/.usnic-makefiles"
}

make_ucx() {
    local stamp=${usnic_prefix}/.usnic-installed
    usnic_log "make (-j${jobs}) in ${usnic_obj}"
    run_logged make make -C "${usnic_obj}" -j"${jobs}" "${ucx_make_args[@]}"
    # Install only what is newer than the last install
    if [ ! -f "${stamp}" ] ||
       [ -n "$(find "${usnic_obj}/src" -newer "${stamp}" \
                    \( -name '*.so*' -o -name '*.la' -o -perm -u+x \) \
                    -type f -print -quit)" ]; then
        usnic_log "make install into ${usnic_prefix}"
        run_logged install make -C "${usnic_obj}" -j"${jobs}" \
            "${ucx_make_args[@]}" install
        touch "${stamp}"
    fi
}

main() {
    local ucx
    mkdir -p "${logs}"
    install_build_deps
    [ -z "${LIBFABRIC_SRC:-}" ] || build_libfabric
    ucx=$(ucx_source_tree)
    sync_module "${ucx}"
    integrate_module "${ucx}"
    configure_ucx "${ucx}"
    refresh_makefiles "${ucx}"
    make_ucx
    if [ "${usnic_leg}" = default ]; then
        ln -sfn "${usnic_leg}/install" "${usnic_build}/install"
    fi
    if grep -q '^#define HAVE_USNIC_FI_EXT 1' "${usnic_obj}/config.h"; then
        usnic_log "built with libfabric's usnic extension (rdma/fi_ext_usnic.h)"
    fi
    usnic_log "done: ${usnic_bin}/ucx_info -d -t usnic"
}

if [ "${1:-}" = --system ]; then
    . "${usnic_top}/contrib/system.sh"
    system_main "${@:2}"
else
    main "$@"
fi
