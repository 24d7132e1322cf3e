# shellcheck shell=bash
# The --system path of contrib/build.sh: the usnic module alone, for the
# distribution's installed UCX (Debian's libucx0), so its users keep their
# UCX. Sourced by build.sh, whose run_logged, install_build_deps, sync_module,
# integrate_module and refresh_makefiles it uses; not run on its own.
#
#   contrib/build.sh --system               build and install
#   contrib/build.sh --system --uninstall   remove what --system installed
#
# The module is built from the source package of the installed version
# (apt-get source ucx=<version>, or the one build/default already fetched,
# unpacked again into build/system/src), configured with the options the
# installed ucx_info -b reports, only libucm/libucs/libuct and the module are
# compiled (build/system/obj), and libuct_usnic.so* is copied into the module
# directory of the installed UCX. It is linked against the system libucs,
# libuct and libfabric with no RUNPATH. build/system/installed-files lists
# what was installed; --uninstall removes exactly those files.

system_dir=${usnic_build}/system
system_manifest=${system_dir}/installed-files

system_usage() {
    usnic_die "usage: contrib/build.sh --system [--uninstall]"
}

# Everything of this path lives in build/system: never the default leg's
system_set_paths() {
    usnic_leg=system
    usnic_leg_dir=${system_dir}
    usnic_obj=${system_dir}/obj
    logs=${system_dir}/logs
}

# Package that owns a path (merged /usr: ldd says /lib, dpkg knows /usr/lib)
system_owner() {
    local path=$1 real
    real=$(realpath -m "${path}")
    dpkg -S "${real}" 2>/dev/null | cut -d: -f1 | head -n 1 ||
        true
}

# Where the installed libucs looks for modules: <dir of libucs>/<subdir>
system_module_dir() {
    local libucs subdir dir
    libucs=$(dpkg -L libucx0 | grep -E '/libucs\.so\.[0-9]+$' | head -n 1)
    [ -n "${libucs}" ] || usnic_die "libucx0 ships no libucs.so.N: cannot locate its module directory"
    subdir=$(/usr/bin/ucx_info -b |
             sed -n 's/^#define UCX_MODULE_SUBDIR *"\(.*\)"$/\1/p')
    [ -n "${subdir}" ] || subdir=ucx
    dir=$(dirname "${libucs}")/${subdir}
    # the directory libucx0's own modules are in must be the same one
    dpkg -L libucx0 | grep -qE "^${dir}/libuct_[^/]*\.so\.[0-9]+$" ||
        usnic_die "libucx0's modules are not in ${dir}: unknown layout"
    echo "${dir}"
}

system_uninstall() {
    local f n=0
    if [ ! -f "${system_manifest}" ]; then
        usnic_log "nothing to uninstall: no ${system_manifest}"
        return 0
    fi
    while IFS= read -r f; do
        [ -n "${f}" ] || continue
        case "$(basename "${f}")" in
            libuct_usnic.so*) ;;
            *) usnic_log "skipping ${f}: not a file --system installs"
               continue ;;
        esac
        if [ -n "$(system_owner "${f}")" ]; then
            usnic_log "keeping ${f}: it belongs to package $(system_owner "${f}") now"
            continue
        fi
        if [ -e "${f}" ] || [ -L "${f}" ]; then
            rm -f "${f}"
            usnic_log "removed ${f}"
            n=$((n + 1))
        fi
    done <"${system_manifest}"
    rm -f "${system_manifest}"
    usnic_log "uninstalled (${n} files)"
}

# The installed UCX's source: build/default's download when it is the same
# version, else apt-get source ucx=<version>; unpacked into build/system/src
system_source_tree() {
    local srcpkg=$1 srcver=$2 dsc dest=${system_dir}/src tree files
    local default_src=${usnic_build}/default/src
    dsc=${srcpkg}_${srcver#*:}.dsc
    # one tree per Debian revision: an upgraded libucx0 gets a fresh one
    tree=${dest}/${srcpkg}-${srcver#*:}
    if [ -f "${tree}/.usnic-unpacked" ]; then
        echo "${tree}"
        return
    fi

    rm -rf "${tree}" "${tree}.tmp"
    mkdir -p "${dest}"
    if [ ! -f "${dest}/${dsc}" ]; then
        if [ -f "${default_src}/${dsc}" ]; then
            usnic_log "reusing ${default_src}/${dsc}"
            # the .dsc and the files its Files: section names
            mapfile -t files < <(sed -n '/^Files:/,/^[^ ]/s/^ [0-9a-f]* [0-9]* //p' \
                                     "${default_src}/${dsc}")
            cp -p "${default_src}/${dsc}" "${files[@]/#/${default_src}/}" "${dest}/"
        else
            add_deb_src
            usnic_log "fetching the source of the installed UCX: ${srcpkg} ${srcver}"
            (cd "${dest}" && apt-get source -q --download-only \
                "${srcpkg}=${srcver}") >"${logs}/apt-source.log" 2>&1 ||
                usnic_die "cannot get the source of the installed UCX (${srcpkg} ${srcver}): $(grep -m1 '^E:' "${logs}/apt-source.log" || echo 'apt-get source failed'); see ${logs}/apt-source.log"
        fi
    fi
    [ -f "${dest}/${dsc}" ] ||
        usnic_die "cannot get the source of the installed UCX: no ${dest}/${dsc}"
    run_logged dpkg-source dpkg-source --no-check -x "${dest}/${dsc}" "${tree}.tmp"
    mv "${tree}.tmp" "${tree}"
    touch "${tree}/.usnic-unpacked"
    echo "${tree}"
}

# The installed build's configure options, as its ucx_info -b reports them,
# checked against the source package's debian/rules
system_configure_flags() {
    local ucx=$1 flags opt
    flags=$(/usr/bin/ucx_info -b |
            sed -n 's/^#define UCX_CONFIGURE_FLAGS *"\(.*\)"$/\1/p')
    [ -n "${flags}" ] ||
        usnic_die "/usr/bin/ucx_info -b does not say how the installed UCX was configured"
    for opt in $(sed -n '/^override_dh_auto_configure:/,/^$/p' \
                     "${ucx}/debian/rules" | grep -o -- '--[a-z][-a-z=/]*'); do
        case " ${flags} " in
            *" ${opt} "*) ;;
            *) usnic_log "warning: debian/rules passes ${opt}, the installed build was configured without it" ;;
        esac
    done
    echo "${flags}"
}

# (cd obj && configure ...) with arguments passed verbatim: the options hold
# a literal ${prefix}, which configure expands itself
system_run_configure() (
    cd "${usnic_obj}" && "$@"
)

system_configure() {
    local ucx=$1 flags args stamp=${usnic_obj}/.usnic-configured stamp_new
    flags=$(system_configure_flags "${ucx}")
    read -r -a args <<<"${flags}"
    args+=(--with-usnic)
    stamp_new=$(configure_inputs "${ucx}" \
                "$(dpkg-buildflags --export=sh | sha1sum | cut -d' ' -f1)" \
                "${args[*]}")
    configure_is_current "${stamp}" "${stamp_new}" && return 0

    usnic_log "autogen + configure of ${ucx} as the installed UCX was: ${flags}"
    run_logged autogen sh -c "cd '${ucx}' && ./autogen.sh"
    rm -rf "${usnic_obj}"
    mkdir -p "${usnic_obj}"
    # Debian's compiler and linker flags, as dh_auto_configure sets them
    (
        eval "$(dpkg-buildflags --export=sh)"
        run_logged configure system_run_configure "${ucx}/configure" "${args[@]}"
    )
    grep -q '^#define HAVE_TL_USNIC 1' "${usnic_obj}/config.h" ||
        usnic_die "configure did not enable usnic; see ${logs}/configure.log"
    system_compare_config
    echo "${stamp_new}" >"${stamp}"
    makefiles_hash >"${usnic_obj}/.usnic-makefiles"
}

# config.h of this build against the one the installed UCX reports: the
# settings that shape UCX's structures (ENABLE_*, UCS_*, ...) must agree
system_compare_config() {
    local ours theirs diffs fatal
    ours=$(sed -n 's/^#define \([A-Za-z_0-9]*\) *\(.*\)$/\1 \2/p' \
               "${usnic_obj}/config.h" | sed 's/ *$//' | sort)
    theirs=$(/usr/bin/ucx_info -b |
             sed -n 's/^#define \([A-Za-z_0-9]*\) *\(.*\)$/\1 \2/p' |
             sed 's/ *$//' | sort)
    diffs=$(diff <(echo "${theirs}") <(echo "${ours}") | grep '^[<>]' |
            grep -vE '^[<>] (HAVE_TL_USNIC|uct_MODULES|UCX_CONFIGURE_FLAGS) ' ||
            true)
    [ -z "${diffs}" ] && {
        usnic_log "config.h agrees with the installed UCX's (ucx_info -b)"
        return 0
    }
    echo "${diffs}" >"${logs}/config-diff.log"
    fatal=$(echo "${diffs}" |
            grep -E '^[<>] (ENABLE_|UCS_|UCT_|UCM_|UCP_|NVALGRIND|HAVE_HW_TIMER)' ||
            true)
    [ -z "${fatal}" ] ||
        usnic_die "this build's config.h differs from the installed UCX's where it matters (< installed, > here):
${fatal}"
    usnic_log "warning: config.h differs from the installed UCX's in details (${logs}/config-diff.log):"
    echo "${diffs}" | head -n 10 >&2
}

# Only what the module links: libucm, libucs, libuct, then the module
system_make() {
    usnic_log "make (-j${jobs}) of ucm, ucs, uct and usnic in ${usnic_obj}"
    run_logged make-ucm make -C "${usnic_obj}/src/ucm" -j"${jobs}" libucm.la
    run_logged make-ucs make -C "${usnic_obj}/src/ucs" -j"${jobs}" libucs.la
    run_logged make-uct make -C "${usnic_obj}/src/uct" -j"${jobs}" libuct.la
    run_logged make-usnic make -C "${usnic_obj}/src/uct/usnic" -j"${jobs}"
}

# The module files as `make install` lays them out, in a staging tree.
# libtool relinks the module there without the RUNPATH into build/system/obj
# that the build tree's copy has; the relink looks for the libraries it
# links in the staged libdir first, so libucs/libuct/libucm.so there point
# at the installed UCX's (Debian ships those links only in libucx-dev)
system_stage() {
    local moddir=$1 stage=${system_dir}/stage libdir lib so
    libdir=$(dirname "${moddir}")
    rm -rf "${stage}"
    mkdir -p "${stage}${libdir}"
    for lib in libucs libuct libucm; do
        so=$(dpkg -L libucx0 | grep -E "/${lib}\.so\.[0-9]+$" | head -n 1)
        [ -n "${so}" ] || usnic_die "libucx0 ships no ${lib}.so.N"
        ln -s "${so}" "${stage}${libdir}/${lib}.so"
    done
    run_logged stage make -C "${usnic_obj}/src/uct/usnic" \
        DESTDIR="${stage}" install-moduleLTLIBRARIES
    echo "${stage}"
}

system_install_files() {
    local stage=$1 moddir=$2 staged f name target owner new_list
    staged=${stage}${moddir}
    [ -d "${staged}" ] ||
        usnic_die "the module was staged into $(cd "${stage}" && find . -name 'libuct_usnic.so*' | head -n 1 | xargs -r dirname), not into ${moddir}: prefix mismatch"
    new_list=$(mktemp)
    for f in "${staged}"/libuct_usnic.so.*; do
        [ -e "${f}" ] || usnic_die "nothing staged in ${staged}"
        name=$(basename "${f}")
        target=${moddir}/${name}
        owner=$(system_owner "${target}")
        [ -z "${owner}" ] ||
            usnic_die "${target} belongs to package ${owner}: not overwriting it"
        # copy, then rename over: a running process keeps its mapping intact
        cp -P --preserve=timestamps "${f}" "${target}.usnic-new"
        # modes as Debian gives its own modules
        [ -L "${target}.usnic-new" ] || chmod 644 "${target}.usnic-new"
        mv -f "${target}.usnic-new" "${target}"
        echo "${target}" >>"${new_list}"
        usnic_log "installed ${target}"
    done
    # files an earlier install left that this one did not replace
    if [ -f "${system_manifest}" ]; then
        { grep -vxF -f "${new_list}" "${system_manifest}" || true; } |
            while IFS= read -r f; do
                case "$(basename "${f}")" in
                    libuct_usnic.so*) rm -f "${f}" && usnic_log "removed stale ${f}" ;;
                esac
            done
    fi
    mv "${new_list}" "${system_manifest}"
    chmod 644 "${system_manifest}"
}

# The installed module: no RUNPATH, every library it needs from a package,
# every symbol resolved
system_check_module() {
    local so=$1 dyn lib path owner
    dyn=$(readelf -d "${so}")
    if echo "${dyn}" | grep -qE '\((RPATH|RUNPATH)\)'; then
        usnic_die "${so} has a search path: $(echo "${dyn}" | grep -E 'RPATH|RUNPATH')"
    fi
    for lib in libucs.so libuct.so libfabric.so; do
        echo "${dyn}" | grep -q "(NEEDED).*\[${lib}\.[0-9]*\]" ||
            usnic_die "${so} does not link ${lib}"
    done
    while read -r lib path; do
        [ "${path}" != not ] || usnic_die "${so}: ${lib} not found"
        case "${path}" in
            "${usnic_top}"/*) usnic_die "${so} resolves ${lib} into the project: ${path}" ;;
        esac
        owner=$(system_owner "${path}")
        [ -n "${owner}" ] ||
            usnic_die "${so} resolves ${lib} to ${path}, which no package owns"
        usnic_log "  ${lib} -> ${path} (${owner})"
    done < <(ldd "${so}" | awk '$1 ~ /^lib(ucs|uct|ucm|fabric)\./ {print $1, $3}')
    if ldd -r "${so}" 2>&1 | grep -q 'undefined symbol'; then
        ldd -r "${so}" 2>&1 | grep 'undefined symbol' | head -n 5 >&2
        usnic_die "${so} needs symbols the installed UCX does not have"
    fi
}

# Does the installed UCX pick the module up by itself?
system_check_loaded() {
    local moddir=$1 so=$1/libuct_usnic.so.0 modules config
    # whole output first: grep -q would cut ucx_info off (SIGPIPE, pipefail)
    config=$(/usr/bin/ucx_info -c -f 2>/dev/null || true)
    if grep -q '^UCX_USNIC_' <<<"${config}"; then
        usnic_log "/usr/bin/ucx_info loads the module: try /usr/bin/ucx_info -d"
        return 0
    fi
    config=$(LD_PRELOAD=${so} /usr/bin/ucx_info -c -f 2>/dev/null || true)
    grep -q '^UCX_USNIC_' <<<"${config}" ||
        usnic_die "the installed UCX does not load ${so} even with LD_PRELOAD"
    modules=$(/usr/bin/ucx_info -b |
              sed -n 's/^#define uct_MODULES *"\(.*\)"$/\1/p')
    usnic_log "warning: the installed UCX does not load the module by itself: its
    libuct loads only the modules named when it was built (uct_MODULES
    \"${modules}\"), not what is in ${moddir}. Load it with LD_PRELOAD:
      LD_PRELOAD=${so} /usr/bin/ucx_info -d
      mpirun -x LD_PRELOAD=${so} -x UCX_TLS=usnic,self ..."
}

system_install() {
    local ver srcpkg srcver ucx moddir stage
    [ "$(dpkg-query -W -f='${db:Status-Abbrev}' libucx0 2>/dev/null)" = "ii " ] ||
        usnic_die "libucx0 is not installed: --system builds the module for the distribution's UCX; install it first (apt-get install libucx0), or build a UCX of the project's own with contrib/build.sh"
    ver=$(dpkg-query -W -f='${Version}' libucx0)
    srcpkg=$(dpkg-query -W -f='${source:Package}' libucx0)
    srcver=$(dpkg-query -W -f='${source:Version}' libucx0)
    usnic_log "installed UCX: libucx0 ${ver} (source ${srcpkg} ${srcver})"

    install_build_deps
    # what the installed build was configured with (--with-verbs; rdmacm)
    usnic_apt_install libibverbs-dev librdmacm-dev
    # ucx_info -b of the installed build; the same version as libucx0
    [ "$(dpkg-query -W -f='${db:Status-Abbrev} ${Version}' ucx-utils 2>/dev/null)" = "ii  ${ver}" ] ||
        usnic_apt_install "ucx-utils=${ver}"

    moddir=$(system_module_dir)
    ucx=$(system_source_tree "${srcpkg}" "${srcver}")
    sync_module "${ucx}"
    integrate_module "${ucx}"
    system_configure "${ucx}"
    refresh_makefiles "${ucx}"
    system_make
    stage=$(system_stage "${moddir}")
    system_install_files "${stage}" "${moddir}"
    usnic_log "checking ${moddir}/libuct_usnic.so.0"
    system_check_module "${moddir}/libuct_usnic.so.0"
    system_check_loaded "${moddir}"
    usnic_log "done; contrib/build.sh --system --uninstall removes it (${system_manifest})"
}

system_main() {
    local uninstall=0 arg
    for arg in "$@"; do
        case "${arg}" in
            --uninstall) uninstall=1 ;;
            *) system_usage ;;
        esac
    done
    [ -z "${UCX_SRC:-}${LIBFABRIC_SRC:-}" ] ||
        usnic_die "--system builds for the installed UCX and libfabric: unset UCX_SRC and LIBFABRIC_SRC"
    [ "${USNIC_ASAN:-0}" != 1 ] ||
        usnic_die "--system does not build with AddressSanitizer: unset USNIC_ASAN"
    [ "$(id -u)" = 0 ] ||
        usnic_die "--system writes into the system's UCX module directory: run it as root"
    command -v dpkg-query >/dev/null ||
        usnic_die "--system needs a Debian-based system (dpkg)"

    system_set_paths
    mkdir -p "${logs}"
    exec 9>"${system_dir}/.lock"
    flock -n 9 || usnic_die "another contrib/build.sh --system is running"

    if [ "${uninstall}" = 1 ]; then
        system_uninstall
    else
        system_install
    fi
}
