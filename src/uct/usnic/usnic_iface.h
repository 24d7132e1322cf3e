/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_IFACE_H
#define UCT_USNIC_IFACE_H

#include "usnic_channel.h"
#include "usnic_md.h"

#include <rdma/fi_domain.h>
#include <netinet/in.h>


#define UCT_USNIC_TL_NAME        "usnic"

/* First byte of a device address: format and version of what follows */
#define UCT_USNIC_DEV_ADDR_MAGIC 0xd1


/* The two channels of an iface */
typedef enum {
    UCT_USNIC_CHANNEL_PRIO, /* ACKs and control: never waits behind data */
    UCT_USNIC_CHANNEL_DATA, /* Payload and retransmissions */
    UCT_USNIC_CHANNEL_LAST
} uct_usnic_channel_id_t;


/* Why a received datagram was dropped */
typedef enum {
    UCT_USNIC_RX_DROP_INVALID, /* Not a datagram of this protocol */
    UCT_USNIC_RX_DROP_LAST
} uct_usnic_rx_drop_t;


/**
 * Device address: where the device is, and enough to tell whether a peer
 * can reach it.
 */
typedef struct uct_usnic_device_addr {
    uint8_t  magic;      /* UCT_USNIC_DEV_ADDR_MAGIC */
    uint8_t  prefix_len; /* Length of the subnet prefix */
    uint32_t in_addr;    /* IPv4 address, network order */
    uint64_t ns_id;      /* Host and network namespace, for loopback */
} UCS_S_PACKED uct_usnic_device_addr_t;


/**
 * Interface address: the two channels' UDP ports and the incarnation that
 * tells a restarted iface on the same ports from its predecessor.
 */
typedef struct uct_usnic_iface_addr {
    uint16_t ports[UCT_USNIC_CHANNEL_LAST]; /* Network order */
    uint32_t incarnation;
} UCS_S_PACKED uct_usnic_iface_addr_t;


typedef struct uct_usnic_iface_config {
    uct_iface_config_t       super;
    size_t                   mtu;
    unsigned                 tx_queue_len;
    unsigned                 rx_queue_len;
    unsigned                 prio_rx_queue_len;
    unsigned                 rx_post_batch;
    unsigned                 max_poll;
    uct_iface_mpool_config_t rx_mpool;
} uct_usnic_iface_config_t;


typedef struct uct_usnic_iface {
    uct_base_iface_t        super;
    struct fid_av           *av;
    uct_usnic_channel_t     channels[UCT_USNIC_CHANNEL_LAST];
    uct_usnic_device_addr_t dev_addr;
    uint32_t                incarnation;
    double                  bandwidth; /* Link bandwidth, bytes/s */
    struct {
        size_t              mtu;
        unsigned            max_poll;
    } config;
    struct {
        uint64_t            rx_drop[UCT_USNIC_RX_DROP_LAST];
    } stats;
} uct_usnic_iface_t;


ucs_status_t uct_usnic_iface_get_address(uct_iface_h tl_iface,
                                         uct_iface_addr_t *addr);

ucs_status_t uct_usnic_iface_get_device_address(uct_iface_h tl_iface,
                                                uct_device_addr_t *addr);

#endif
