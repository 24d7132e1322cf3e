/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_NETIF_H
#define UCT_USNIC_NETIF_H

#include <stdint.h>


/*
 * What the kernel tells about a network interface, for devices that are
 * one (the kernel and udp providers name their domains after it)
 */


/* Network prefix length of the interface that holds in_addr (network
 * order); 32 when none does */
uint8_t uct_usnic_netif_prefix_len(uint32_t in_addr);


/* Link speed of the interface, bits/s; 10 Gb/s when it reports none */
double uct_usnic_netif_link_speed(const char *dev_name);

#endif
