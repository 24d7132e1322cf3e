#
# Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
# See file LICENSE for terms.
#

#
# usnic transport: reliable, ordered AM and PUT over libfabric datagram
# endpoints (FI_EP_DGRAM). Needs libfabric, xxHash for the checksum of
# every datagram and hwloc for the devices' locality; libsodium, if found,
# gives the MAC of UCX_USNIC_AUTH_KEY; libfabric's usnic extension header,
# if installed, the VIC's link facts.
#
usnic_happy="no"
AC_ARG_WITH([usnic],
            [AS_HELP_STRING([--with-usnic(=DIR)],
                            [Build the usnic transport over libfabric
                             datagram endpoints; DIR is where libfabric is
                             installed (default: guess)])],
            [], [with_usnic=guess])

AS_IF([test "x$with_usnic" != xno],
      [save_CPPFLAGS="$CPPFLAGS"
       save_LDFLAGS="$LDFLAGS"
       save_LIBS="$LIBS"
       USNIC_CPPFLAGS=""
       USNIC_LDFLAGS=""
       usnic_missing=""

       AS_IF([test "x$with_usnic" != xguess -a "x$with_usnic" != xyes],
             [AS_IF([test -d "$with_usnic"],
                    [USNIC_CPPFLAGS="-I$with_usnic/include"
                     AS_IF([test -d "$with_usnic/lib64"],
                           [USNIC_LDFLAGS="-L$with_usnic/lib64 -Wl,-rpath,$with_usnic/lib64"],
                           [USNIC_LDFLAGS="-L$with_usnic/lib -Wl,-rpath,$with_usnic/lib"])],
                    [AC_MSG_ERROR([--with-usnic=$with_usnic: no such directory])])])

       CPPFLAGS="$USNIC_CPPFLAGS $CPPFLAGS"
       LDFLAGS="$USNIC_LDFLAGS $LDFLAGS"
       AC_CHECK_HEADER([rdma/fabric.h],
                       [AC_CHECK_LIB([fabric], [fi_getinfo],
                                     [usnic_happy="yes"],
                                     [usnic_missing="libfabric library (fi_getinfo in -lfabric)"])],
                       [usnic_missing="libfabric headers (rdma/fabric.h)"])
       AS_IF([test "x$usnic_happy" = xyes],
             [usnic_happy="no"
              AC_CHECK_HEADER([xxhash.h],
                              [AC_CHECK_LIB([xxhash], [XXH3_64bits],
                                            [usnic_happy="yes"],
                                            [usnic_missing="xxHash library (XXH3_64bits in -lxxhash)"])],
                              [usnic_missing="xxHash headers (xxhash.h)"])])

       AS_IF([test "x$usnic_happy" = xyes],
             [usnic_happy="no"
              AC_CHECK_HEADER([hwloc.h],
                              [AC_CHECK_LIB([hwloc], [hwloc_topology_load],
                                            [usnic_happy="yes"],
                                            [usnic_missing="hwloc library (hwloc_topology_load in -lhwloc)"])],
                              [usnic_missing="hwloc headers (hwloc.h)"])])

       usnic_libs="-lfabric -lxxhash -lhwloc"
       usnic_sodium=0
       AS_IF([test "x$usnic_happy" = xyes],
             [AC_CHECK_HEADER([sodium.h],
                              [AC_CHECK_LIB([sodium], [crypto_generichash_init],
                                            [usnic_sodium=1
                                             usnic_libs="$usnic_libs -lsodium"])])
              AS_IF([test $usnic_sodium = 0],
                    [AC_MSG_WARN([usnic: libsodium not found: UCX_USNIC_AUTH_KEY (datagram MACs) will be unavailable])])])
       AC_DEFINE_UNQUOTED([HAVE_USNIC_SODIUM], [$usnic_sodium],
                          [usnic transport: libsodium for datagram MACs])

       # The usnic provider's extension (link speed, subnet of a VIC):
       # installed by libfabric builds with that provider
       usnic_fi_ext=0
       AS_IF([test "x$usnic_happy" = xyes],
             [AC_CHECK_HEADER([rdma/fi_ext_usnic.h], [usnic_fi_ext=1], [],
                              [#include <rdma/fabric.h>])])
       AC_DEFINE_UNQUOTED([HAVE_USNIC_FI_EXT], [$usnic_fi_ext],
                          [usnic transport: libfabric's rdma/fi_ext_usnic.h])

       CPPFLAGS="$save_CPPFLAGS"
       LDFLAGS="$save_LDFLAGS"
       LIBS="$save_LIBS"

       AS_IF([test "x$usnic_happy" = xyes],
             [uct_modules="${uct_modules}:usnic"
              AC_SUBST([USNIC_CPPFLAGS])
              AC_SUBST([USNIC_LDFLAGS])
              AC_SUBST([USNIC_LIBS], ["$usnic_libs"])
              AC_DEFINE([HAVE_TL_USNIC], [1], [usnic transport support])],
             [AS_IF([test "x$with_usnic" != xguess],
                    [AC_MSG_ERROR([usnic transport requested but $usnic_missing not found; install libfabric-dev, libxxhash-dev and libhwloc-dev, or pass --with-usnic=DIR])],
                    [AC_MSG_WARN([usnic transport disabled: $usnic_missing not found])])])
      ])

AM_CONDITIONAL([HAVE_USNIC], [test "x$usnic_happy" = xyes])
AC_CONFIG_FILES([src/uct/usnic/Makefile
                 src/uct/usnic/ucx-usnic.pc])
