/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_RX_H
#define UCT_USNIC_RX_H

#include "usnic_iface.h"
#include "usnic_proto.h"


/* Streams owing an ACK looked at for one ACK datagram, past its first */
#define UCT_USNIC_ACK_SCAN (4 * UCT_USNIC_ACK_MAX_RECS)


/**
 * Message being reassembled from several datagrams; delivered to the user
 * like a receive descriptor.
 */
typedef struct uct_usnic_am_buf {
    uct_recv_desc_t release; /* Returns the buffer to its pool */
    size_t          length;  /* Bytes gathered so far */
    uint8_t         am_id;
    /* headroom and the message follow at iface->config.am_buf_offset */
} uct_usnic_am_buf_t;


/**
 * Receiving side of one stream: one per remote ep that sends to this iface.
 */
typedef struct uct_usnic_rx_stream {
    uint32_t             id;              /* Index in iface->streams */
    uint64_t             key;             /* Sender incarnation and ep */
    uint64_t             token;           /* Sender ep's secret */
    uint64_t             open_seq;        /* Streams the iface opened
                                             before this one */
    uint32_t             src_ep_id;       /* Addressee of our ACKs */
    fi_addr_t            ack_fi_addr;     /* Sender's priority channel */
    uint32_t             src_in_addr;     /* Sender's address and data */
    uint16_t             src_port;        /* port, network order, for logs */
    uint16_t             src_prio_port;   /* Where our ACKs go */
    uint32_t             src_open_key;    /* For read replies back to it */
    ucs_list_link_t      lru_list;        /* In iface->streams_lru[proven] */
    ucs_time_t           last_time;       /* Of its last packet */
    uct_usnic_psn_t      expected_psn;    /* Next PSN to deliver */
    unsigned             unacked;         /* Delivered since the last ACK */
    ucs_time_t           unacked_since;
    int                  ack_now;         /* Gap or duplicate: ACK at once */
    int                  proven;          /* Has delivered a message (probes
                                             do not count) */
    int                  closed_reply;    /* The last packet was a probe
                                             and we have no ep to its
                                             sender: say so in the ACK */
    ucs_list_link_t      ack_list;        /* In iface->ack_streams */
    uct_usnic_rx_desc_t  **ooo;           /* Reorder ring, on first gap */
    unsigned             ooo_count;
    uct_usnic_am_buf_t   *am_buf;         /* Message being reassembled */
    struct uct_usnic_ep  *ack_ep;         /* Our ep to the sender: carries
                                             our ACKs on its packets */
} uct_usnic_rx_stream_t;


/* Incarnation of the iface the stream comes from */
static UCS_F_ALWAYS_INLINE uint32_t
uct_usnic_rx_stream_peer(const uct_usnic_rx_stream_t *stream)
{
    return stream->key >> 32;
}


ucs_status_t uct_usnic_rx_data(uct_usnic_channel_t *channel,
                               uct_usnic_rx_desc_t *desc, void *data,
                               size_t length);

ucs_status_t uct_usnic_rx_prio(uct_usnic_channel_t *channel,
                               uct_usnic_rx_desc_t *desc, void *data,
                               size_t length);

/* Send the ACKs that are due at now, or all that are owed */
unsigned uct_usnic_rx_send_acks(uct_usnic_iface_t *iface, int all,
                                ucs_time_t now);

/* Fill in the ACK the stream owes; it then owes none */
void uct_usnic_rx_ack_take(uct_usnic_rx_stream_t *stream,
                           uct_usnic_ack_ext_t *ack);

void uct_usnic_rx_stream_destroy(uct_usnic_iface_t *iface,
                                 uct_usnic_rx_stream_t *stream);

/* Reclaim the streams whose sender has been silent for the peer timeout */
void uct_usnic_rx_reclaim_streams(uct_usnic_iface_t *iface, ucs_time_t now);

/* A remote write (write != 0) or read from the peer at in_addr:port
 * (network order) was refused: count it, and tell the user at most once a
 * second */
void uct_usnic_rx_refused(uct_usnic_iface_t *iface, uint32_t in_addr,
                          uint16_t port, int write, uint32_t rkey_id,
                          uint64_t address, uint32_t length,
                          uct_usnic_md_access_result_t result);

void uct_usnic_am_buf_release(uct_recv_desc_t *self, void *desc);

#endif
