#!/usr/bin/env bash
#
# Build if needed, then show what UCX sees of the usnic transport: every
# libfabric datagram domain as a memory domain with a "usnic" transport.
#
set -euo pipefail

. "$(dirname "$0")/common.sh"

"${usnic_top}/contrib/build.sh"
usnic_env

echo "== ${usnic_bin}/ucx_info -v"
"${usnic_bin}/ucx_info" -v
echo
echo "== ${usnic_bin}/ucx_info -d -t usnic"
"${usnic_bin}/ucx_info" -d -t usnic
