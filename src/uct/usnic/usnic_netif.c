/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "usnic_netif.h"

#include <ucs/debug/log.h>
#include <ucs/sys/sys.h>

#include <ifaddrs.h>
#include <netinet/in.h>


/* Link speed assumed when the device does not report one, bits/s */
#define UCT_USNIC_DEFAULT_LINK_SPEED 10e9


uint8_t uct_usnic_netif_prefix_len(uint32_t in_addr)
{
    struct ifaddrs *ifaddrs, *ifa;
    uint8_t prefix_len = 32;

    if (getifaddrs(&ifaddrs) != 0) {
        ucs_debug("getifaddrs() failed: %m");
        return prefix_len;
    }

    for (ifa = ifaddrs; ifa != NULL; ifa = ifa->ifa_next) {
        if ((ifa->ifa_addr != NULL) && (ifa->ifa_netmask != NULL) &&
            (ifa->ifa_addr->sa_family == AF_INET) &&
            (((struct sockaddr_in*)ifa->ifa_addr)->sin_addr.s_addr ==
             in_addr)) {
            prefix_len = __builtin_popcount(
                ((struct sockaddr_in*)ifa->ifa_netmask)->sin_addr.s_addr);
            break;
        }
    }

    freeifaddrs(ifaddrs);
    return prefix_len;
}

double uct_usnic_netif_link_speed(const char *dev_name)
{
    long speed_mbps;

    if (ucs_read_file_number(&speed_mbps, 1, "/sys/class/net/%s/speed",
                             dev_name) != UCS_OK) {
        return UCT_USNIC_DEFAULT_LINK_SPEED;
    }

    return (speed_mbps > 0) ? (speed_mbps * 1e6) :
                              UCT_USNIC_DEFAULT_LINK_SPEED;
}
