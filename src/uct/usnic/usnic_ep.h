/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_EP_H
#define UCT_USNIC_EP_H

#include "usnic_iface.h"
#include "usnic_proto.h"

#include <ucs/datastruct/arbiter.h>
#include <ucs/datastruct/queue.h>


enum {
    UCT_USNIC_TX_DESC_FLAG_SACKED  = UCS_BIT(0), /* Peer has it, out of order */
    UCT_USNIC_TX_DESC_FLAG_UNSENT  = UCS_BIT(1), /* Send queue was full */
    UCT_USNIC_TX_DESC_FLAG_PROBED  = UCS_BIT(2), /* Resent as a tail probe */
    UCT_USNIC_TX_DESC_FLAG_READ    = UCS_BIT(3), /* Its user memory is a
                                                    peer's read: checked
                                                    again before a resend */
    UCT_USNIC_TX_DESC_FLAG_AWAITED = UCS_BIT(4), /* Last of a zcopy message:
                                                    its ACK frees user
                                                    memory */
    UCT_USNIC_TX_DESC_FLAG_TIMED_OUT = UCS_BIT(5) /* Resent by a timeout */
};


/**
 * User memory a zero-copy datagram carries between its header and its
 * trailers; every (re)transmission reads it from there.
 */
typedef struct uct_usnic_tx_zcopy {
    uct_completion_t  *comp;     /* The message's, on its last datagram */
    uct_usnic_rkey_t  rkey;      /* FLAG_READ: the key the read came with */
    uint16_t          head;      /* Datagram bytes in front of the user's */
    uint16_t          length;    /* User's bytes */
    uint8_t           iovcnt;    /* 0: the whole datagram is in the buffer */
    struct iovec      iov[UCT_USNIC_ZCOPY_MAX_IOV];
} uct_usnic_tx_zcopy_t;


/**
 * A datagram kept until the peer acknowledges it.
 */
typedef struct uct_usnic_tx_desc {
    ucs_queue_elem_t  queue;     /* Entry in the ep's window, in PSN order */
    ucs_time_t        send_time; /* Last (re)transmission */
    uct_usnic_psn_t   psn;
    uint16_t          length;    /* Datagram bytes */
    uint8_t           flags;     /* UCT_USNIC_TX_DESC_FLAG_xx */
    uint8_t           resends;
    uct_usnic_tx_zcopy_t zcopy;
    /* uct_usnic_hdr_t and the rest of the datagram in the buffer follow */
} uct_usnic_tx_desc_t;


/* Most of a zero-copy datagram that lies in its send buffer: the header, a
 * write's extension, am_zcopy's header, ACK and open trailers and seal */
#define UCT_USNIC_TX_ZCOPY_BUF_LEN \
    (sizeof(uct_usnic_hdr_t) + sizeof(uct_usnic_put_ext_t) + \
     UCT_USNIC_AM_ZCOPY_MAX_HDR + sizeof(uct_usnic_ack_ext_t) + \
     sizeof(uct_usnic_open_ext_t) + UCT_USNIC_SEAL_MAX_LEN)


/**
 * Flush request waiting for everything sent before it to be acknowledged.
 * It lives in a send buffer (tx_mp): those are far larger, and flushes are
 * too rare for a pool of their own.
 */
typedef struct uct_usnic_flush_req {
    ucs_queue_elem_t  queue;
    uct_usnic_psn_t   psn;       /* Completes when this PSN is acknowledged */
    uct_completion_t  *comp;
} uct_usnic_flush_req_t;


/* What an ep counts (with --enable-stats), besides its iface */
enum {
    UCT_USNIC_EP_STAT_TX_PACKETS,
    UCT_USNIC_EP_STAT_TX_RESENDS,
    UCT_USNIC_EP_STAT_TX_TIMEOUTS,
    UCT_USNIC_EP_STAT_TX_TAIL_PROBES,
    UCT_USNIC_EP_STAT_TX_REOPENS,
    UCT_USNIC_EP_STAT_RX_ACKS,
    UCT_USNIC_EP_STAT_LAST
};


/**
 * Endpoint: the sending side of one stream to a peer iface.
 */
typedef struct uct_usnic_ep {
    uct_base_ep_t         super;
    uint32_t              id;              /* Index in iface->eps */
    uint32_t              serial;          /* Unique within the iface */
    uint32_t              peer_incarnation;
    uint32_t              peer_open_key;
    uint32_t              peer_stream_id;  /* NONE until the first ACK */
    uint64_t              token;           /* Random: in every packet and
                                              in every ACK for them */
    uct_usnic_device_addr_t peer_dev_addr;
    uct_usnic_iface_addr_t  peer_iface_addr;
    fi_addr_t             peer_fi_addr;    /* Peer's data channel */
    uct_usnic_psn_t       first_psn;       /* Random, for the open trailer */
    uct_usnic_psn_t       next_psn;        /* PSN of the next new packet */
    uct_usnic_psn_t       acked_psn;       /* Everything up to here ACKed */
    unsigned              tx_count;        /* Packets in the window */
    unsigned              unsent;          /* Of them, refused by the send
                                              queue and not sent yet */
    ucs_queue_head_t      window;          /* uct_usnic_tx_desc_t */
    ucs_queue_head_t      flush_reqs;      /* uct_usnic_flush_req_t */
    ucs_arbiter_group_t   arb_group;       /* Pending requests */
    ucs_wtimer_t          timer;           /* Resends and peer timeout,
                                              every tick while not idle */
    ucs_list_link_t       timer_list;      /* In iface->tx_timers_due */
    struct uct_usnic_rx_stream *ack_stream; /* Its ACKs ride on our packets */
    unsigned              cwnd;            /* Congestion window */
    unsigned              ssthresh;        /* Slow start threshold */
    unsigned              cwnd_acked;      /* ACKed since cwnd last grew */
    uct_usnic_psn_t       recovery_psn;    /* Loss recovery ends past it */
    ucs_time_t            rto;             /* Retransmission timeout */
    ucs_time_t            srtt;            /* Smoothed round-trip time */
    ucs_time_t            rttvar;
    ucs_time_t            progress_time;   /* Last ACK that covered new
                                              packets, or when the window
                                              last became non-empty */
    ucs_status_t          status;          /* Why the ep failed, or OK */
    ucs_list_link_t       failed_list;     /* In iface->failed_eps */
    ucs_queue_head_t      gets;            /* uct_usnic_get_t, oldest first */
    struct uct_usnic_tx_desc *bundle;      /* Short AMs waiting to go as one
                                              datagram, or NULL */
    ucs_time_t            bundle_time;     /* Its first AM's */
    ucs_list_link_t       bundle_list;     /* In iface->bundle_eps */
    ucs_time_t            last_tx_time;    /* Newest datagram sent */
    ucs_time_t            post_time;       /* When the last message post
                                              returned */
    struct uct_usnic_tx_desc *held;        /* Oldest datagram of the
                                              messages waiting for one
                                              burst, or NULL; all after it
                                              in the window wait too */
    unsigned              held_count;      /* Datagrams waiting */
    ucs_time_t            held_time;       /* When the first began to */
    ucs_list_link_t       held_list;       /* In iface->held_eps */
    int                   internal;        /* Carries replies to reads: no
                                              user owns it */
    UCS_STATS_NODE_DECLARE(stats_node)
} uct_usnic_ep_t;


UCS_CLASS_DECLARE(uct_usnic_ep_t, const uct_ep_params_t*, int);
UCS_CLASS_DECLARE_DELETE_FUNC(uct_usnic_ep_t, uct_ep_t);


ucs_status_t uct_usnic_ep_create(const uct_ep_params_t *params,
                                 uct_ep_h *ep_p);


ucs_status_t uct_usnic_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header,
                                   const void *payload, unsigned length);

ucs_status_t uct_usnic_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id,
                                       const uct_iov_t *iov, size_t iovcnt);

ssize_t uct_usnic_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id,
                              uct_pack_callback_t pack_cb, void *arg,
                              unsigned flags);

ucs_status_t uct_usnic_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id,
                                   const void *header, unsigned header_length,
                                   const uct_iov_t *iov, size_t iovcnt,
                                   unsigned flags, uct_completion_t *comp);

ucs_status_t uct_usnic_ep_check(uct_ep_h tl_ep, unsigned flags,
                                uct_completion_t *comp);

ucs_status_t uct_usnic_ep_invalidate(uct_ep_h tl_ep);

/* The peer stopped answering, or the user gave up on it: the ep fails,
 * once; may run on the async thread */
void uct_usnic_ep_fail(uct_usnic_ep_t *ep, ucs_status_t status);

/* Complete what failed eps had outstanding and call the error handler */
void uct_usnic_ep_report_failures(uct_usnic_iface_t *iface);

ucs_status_t uct_usnic_ep_put_short(uct_ep_h tl_ep, const void *buffer,
                                    unsigned length, uint64_t remote_addr,
                                    uct_rkey_t rkey);

ssize_t uct_usnic_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb,
                               void *arg, uint64_t remote_addr,
                               uct_rkey_t rkey);

ucs_status_t uct_usnic_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                    size_t iovcnt, uint64_t remote_addr,
                                    uct_rkey_t rkey, uct_completion_t *comp);

ucs_status_t uct_usnic_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req,
                                      unsigned flags);

void uct_usnic_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb,
                                void *arg);

ucs_status_t uct_usnic_ep_flush(uct_ep_h tl_ep, unsigned flags,
                                uct_completion_t *comp);

int uct_usnic_ep_is_connected(uct_ep_h tl_ep,
                              const uct_ep_is_connected_params_t *params);

ucs_arbiter_cb_result_t uct_usnic_ep_do_pending(ucs_arbiter_t *arbiter,
                                                ucs_arbiter_group_t *group,
                                                ucs_arbiter_elem_t *elem,
                                                void *arg);


/* PSN of the first datagram not handed to the provider yet */
static UCS_F_ALWAYS_INLINE uct_usnic_psn_t
uct_usnic_ep_unposted_psn(const uct_usnic_ep_t *ep)
{
    return (ep->held == NULL) ? ep->next_psn : ep->held->psn;
}

static UCS_F_ALWAYS_INLINE uct_usnic_iface_t *
uct_usnic_ep_iface(uct_usnic_ep_t *ep)
{
    return ucs_derived_of(ep->super.super.iface, uct_usnic_iface_t);
}


/* Nothing to watch: no packet waits for an ACK and no read for its data */
static UCS_F_ALWAYS_INLINE int uct_usnic_ep_is_idle(const uct_usnic_ep_t *ep)
{
    return (ep->tx_count == 0) && ucs_queue_is_empty(&ep->gets);
}


/* The ep starts waiting for its peer: its timer runs from now on */
static UCS_F_ALWAYS_INLINE void uct_usnic_ep_activate(uct_usnic_ep_t *ep)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    if (uct_usnic_ep_is_idle(ep)) {
        ucs_wtimer_add(&iface->tx_wheel, &ep->timer,
                       iface->config.timer_tick);
        ep->progress_time = ucs_get_time();
    }
}


/* Nothing left to watch: the timer stops */
static UCS_F_ALWAYS_INLINE void uct_usnic_ep_deactivate(uct_usnic_ep_t *ep)
{
    if (uct_usnic_ep_is_idle(ep)) {
        ucs_wtimer_remove(&uct_usnic_ep_iface(ep)->tx_wheel, &ep->timer);
    }
}


/* Whether num_packets more packets fit in the ep's congestion window (never
 * larger than the peer's receive window) */
static UCS_F_ALWAYS_INLINE int
uct_usnic_ep_window_fits(const uct_usnic_ep_t *ep, unsigned num_packets)
{
    return ep->tx_count + num_packets <= ep->cwnd;
}


/* Whether num_packets more packets fit in the ep's window and in the
 * iface's send buffers */
static UCS_F_ALWAYS_INLINE int uct_usnic_ep_has_room(uct_usnic_ep_t *ep,
                                                     unsigned num_packets)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    /* An open bundle holds a send buffer and becomes a packet */
    return uct_usnic_ep_window_fits(ep, (ep->bundle != NULL) + num_packets) &&
           (iface->tx_outstanding + num_packets <= iface->config.tx_max_bufs);
}

/* How many packets fit in the ep's window and in the iface's send buffers */
static UCS_F_ALWAYS_INLINE unsigned uct_usnic_ep_room(uct_usnic_ep_t *ep)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    unsigned in_flight       = ep->tx_count + (ep->bundle != NULL);

    if ((in_flight >= ep->cwnd) ||
        (iface->tx_outstanding >= iface->config.tx_max_bufs)) {
        return 0;
    }

    return ucs_min(ep->cwnd - in_flight,
                   iface->config.tx_max_bufs - iface->tx_outstanding);
}

/* Whether num_packets new packets may go now: with room for them, and
 * without overtaking pending requests (unless those are being dispatched) */
static UCS_F_ALWAYS_INLINE int uct_usnic_ep_can_send(uct_usnic_ep_t *ep,
                                                     unsigned num_packets)
{
    return (uct_usnic_ep_iface(ep)->in_pending ||
            ucs_arbiter_group_is_empty(&ep->arb_group)) &&
           uct_usnic_ep_has_room(ep, num_packets);
}

/* Whether num_packets new packets may go now: UCS_OK, the ep's failure, or
 * UCS_ERR_NO_RESOURCE */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_usnic_ep_send_check(uct_usnic_ep_t *ep, unsigned num_packets)
{
    if (ucs_unlikely(ep->status != UCS_OK)) {
        return ep->status;
    }

    if (ucs_unlikely(!uct_usnic_ep_can_send(ep, num_packets))) {
        UCS_STATS_UPDATE_COUNTER(ep->super.stats, UCT_EP_STAT_NO_RES, 1);
        return UCS_ERR_NO_RESOURCE;
    }

    return UCS_OK;
}

/* Count an event of an ep, in its own statistics and its iface's */
#define UCT_USNIC_EP_STAT_ADD(_ep, _counter, _value) \
    do { \
        UCT_USNIC_IFACE_STAT_ADD(uct_usnic_ep_iface(_ep), _counter, _value); \
        UCS_STATS_UPDATE_COUNTER((_ep)->stats_node, \
                                 UCT_USNIC_EP_STAT_##_counter, _value); \
    } while (0)

#endif
