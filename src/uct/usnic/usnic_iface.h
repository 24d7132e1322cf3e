/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_IFACE_H
#define UCT_USNIC_IFACE_H

#include "usnic_channel.h"
#include "usnic_md.h"

#include <ucs/datastruct/arbiter.h>
#include <ucs/async/async.h>
#include <ucs/datastruct/khash.h>
#include <ucs/datastruct/list.h>
#include <ucs/datastruct/ptr_array.h>
#include <ucs/sys/event_set.h>
#include <ucs/time/time.h>
#include <ucs/time/timer_wheel.h>

#include <rdma/fi_domain.h>
#include <netinet/in.h>


#define UCT_USNIC_TL_NAME        "usnic"

/* First byte of a device address: format and version of what follows */
#define UCT_USNIC_DEV_ADDR_MAGIC 0xd1

/* Most iov entries am_short_iov gathers into one datagram */
#define UCT_USNIC_MAX_IOV        16ul

/* Largest am_zcopy header, copied into the message's first datagrams */
#define UCT_USNIC_AM_ZCOPY_MAX_HDR 128


/* The two channels of an iface */
typedef enum {
    UCT_USNIC_CHANNEL_PRIO, /* ACKs and control: never waits behind data */
    UCT_USNIC_CHANNEL_DATA, /* Payload and retransmissions */
    UCT_USNIC_CHANNEL_LAST
} uct_usnic_channel_id_t;


/* Why a received datagram was dropped */
typedef enum {
    UCT_USNIC_RX_DROP_INVALID,     /* Not a datagram of this protocol */
    UCT_USNIC_RX_DROP_STALE,       /* For another incarnation of this iface */
    UCT_USNIC_RX_DROP_FORGED,      /* Wrong token, or an open trailer or ACK
                                      that contradicts its stream: forged,
                                      or for a stream or ep long gone whose
                                      id was reused */
    UCT_USNIC_RX_DROP_NO_STREAM,   /* Unknown stream or ep, or a reply to
                                      no outstanding read */
    UCT_USNIC_RX_DROP_DUPLICATE,   /* Already delivered */
    UCT_USNIC_RX_DROP_OUT_OF_WINDOW, /* Too far ahead to keep */
    UCT_USNIC_RX_DROP_NO_RESOURCE, /* No memory for a new stream */
    UCT_USNIC_RX_DROP_PUT_KEY,     /* Write refused: unknown, revoked or
                                      wrong key, or no remote write access */
    UCT_USNIC_RX_DROP_PUT_RANGE,   /* Write refused: outside its region */
    UCT_USNIC_RX_DROP_GET_KEY,     /* Read refused: as PUT_KEY, or no
                                      remote read access */
    UCT_USNIC_RX_DROP_GET_RANGE,   /* Read refused: outside its region */
    UCT_USNIC_RX_DROP_LAST
} uct_usnic_rx_drop_t;


/* What an iface counts */
enum {
    UCT_USNIC_IFACE_STAT_TX_PACKETS,
    UCT_USNIC_IFACE_STAT_TX_RESENDS,
    UCT_USNIC_IFACE_STAT_TX_TIMEOUTS,    /* Retransmission timer expiries */
    UCT_USNIC_IFACE_STAT_TX_TAIL_PROBES,
    UCT_USNIC_IFACE_STAT_TX_READS_REVOKED, /* Reply datagrams resent as
                                              refusals: memory gone */
    UCT_USNIC_IFACE_STAT_TX_ACKS,        /* Standalone */
    UCT_USNIC_IFACE_STAT_TX_ACK_DGRAMS,  /* Datagrams they went in */
    UCT_USNIC_IFACE_STAT_TX_PIGGY_ACKS,  /* Carried by AM packets */
    UCT_USNIC_IFACE_STAT_TX_BUNDLED,     /* AMs sent in bundles */
    UCT_USNIC_IFACE_STAT_TX_HELD,        /* Messages held back to share a
                                            system call */
    UCT_USNIC_IFACE_STAT_TX_REOPENS,     /* Streams opened again */
    UCT_USNIC_IFACE_STAT_RX_PACKETS,
    UCT_USNIC_IFACE_STAT_RX_ACKS,
    UCT_USNIC_IFACE_STAT_RX_STREAMS_RECLAIMED,
    UCT_USNIC_IFACE_STAT_RX_DROP,        /* One per uct_usnic_rx_drop_t */
    UCT_USNIC_IFACE_STAT_LAST = UCT_USNIC_IFACE_STAT_RX_DROP +
                                UCT_USNIC_RX_DROP_LAST
};


/* Sender incarnation and ep serial -> stream id */
KHASH_INIT(uct_usnic_streams, uint64_t, uint32_t, 1, uct_usnic_hash64,
           uct_usnic_hash64_equal)


/**
 * What this iface has with one peer iface: the ep that sends to it and the
 * stream that receives from it. When both exist, the ep's packets carry
 * the stream's ACKs (one pair per peer iface takes part). A peer to which
 * every ep was destroyed is closed: its probes are answered so.
 */
typedef struct uct_usnic_peer {
    struct uct_usnic_ep        *ep;
    struct uct_usnic_rx_stream *stream;
    unsigned                   num_eps; /* Our eps to the peer iface */
    int                        closed;  /* num_eps dropped to 0 */
    uint64_t                   closed_streams; /* Streams opened before
                                                  the close: later ones
                                                  belong to a new
                                                  connection */
    ucs_time_t                 closed_time;
} uct_usnic_peer_t;

KHASH_INIT(uct_usnic_peers, uint32_t, uct_usnic_peer_t, 1, uct_usnic_hash64,
           uct_usnic_hash64_equal)

/* Where streams come from (IPv4 address and data port): the newest
 * incarnation seen there, and how many streams come from there. A stream
 * of an older incarnation is of a process that is gone. */
typedef struct uct_usnic_sender {
    uint32_t incarnation;
    unsigned num_streams;
} uct_usnic_sender_t;

KHASH_INIT(uct_usnic_senders, uint64_t, uct_usnic_sender_t, 1,
           uct_usnic_hash64, uct_usnic_hash64_equal)

/* Peer iface incarnation -> the ep that replies to its reads */
KHASH_INIT(uct_usnic_reply_eps, uint32_t, struct uct_usnic_ep*, 1,
           uct_usnic_hash64, uct_usnic_hash64_equal)


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
    uint32_t open_key;   /* Opening a stream here takes it */
    uint16_t mtu;        /* Largest datagram, sent and received */
    uint16_t prefix;     /* Message prefix room: local, only for errors */
} UCS_S_PACKED uct_usnic_iface_addr_t;


/* A configuration variable's name, as the user sets it */
#define UCT_USNIC_CONFIG_VAR(_name) UCS_DEFAULT_ENV_PREFIX "USNIC_" _name


/* Most prefix room a test may force */
#define UCT_USNIC_MAX_FORCED_PREFIX 4096


typedef struct uct_usnic_iface_config {
    uct_iface_config_t       super;
    size_t                   mtu;
    unsigned                 tx_queue_len;
    unsigned                 rx_queue_len;
    unsigned                 prio_rx_queue_len;
    unsigned                 rx_post_batch;
    unsigned                 max_poll;
    unsigned                 window;
    unsigned long            cwnd_init;
    size_t                   max_bcopy;
    size_t                   put_max_bcopy;
    size_t                   get_max_zcopy;
    unsigned                 ack_freq;
    double                   ack_delay;
    double                   bundle_delay;
    double                   rto_min;
    double                   rto_max;
    double                   async_tick;
    double                   timeout;
    unsigned                 max_resend;
    unsigned                 max_streams;
    double                   stream_idle;
    unsigned                 max_ooo;
    unsigned                 stream_max_ooo;
    unsigned                 max_reassembly;
    ucs_range_spec_t         port_range;
    unsigned                 connected_peers;
    int                      checksum;
    size_t                   force_msg_prefix;
    char                     *auth_key;
    int                      event_fd;
    int                      stats_summary;
    uct_usnic_fault_config_t fault;
    uct_iface_mpool_config_t rx_mpool;
    uct_iface_mpool_config_t tx_mpool;
} uct_usnic_iface_config_t;


typedef struct uct_usnic_iface {
    uct_base_iface_t        super;
    uct_usnic_av_t          av;
    uct_usnic_channel_t     channels[UCT_USNIC_CHANNEL_LAST];
    uct_usnic_device_addr_t dev_addr;
    uint32_t                incarnation;
    uint32_t                open_key;      /* Random: see the open trailer */
    double                  bandwidth;     /* Estimated, bytes/s */
    double                  latency;       /* Estimated, seconds */
    double                  overhead;      /* Estimated, seconds */
    size_t                  inject_size;   /* Largest fi_inject datagram */
    ucs_ptr_array_t         eps;           /* ep id -> uct_usnic_ep_t */
    uint32_t                next_ep_serial;
    ucs_ptr_array_t         streams;       /* stream id -> rx stream */
    khash_t(uct_usnic_streams) stream_hash; /* sender key -> stream id */
    uint64_t                streams_opened; /* Ever, on this iface */
    unsigned                num_streams;
    ucs_list_link_t         streams_lru[2]; /* Least recently active first:
                                               [0] streams yet to deliver a
                                               message, [1] the others */
    unsigned                rx_ooo_count;  /* Packets parked, all streams */
    unsigned                rx_reassembling; /* Messages being reassembled */
    ucs_time_t              next_reclaim_check;
    khash_t(uct_usnic_peers) peers;        /* peer incarnation -> peer */
    khash_t(uct_usnic_senders) senders;    /* stream source -> sender */
    ucs_arbiter_t           arbiter;       /* eps with pending requests */
    ucs_twheel_t            tx_wheel;      /* Timers of the eps waiting for
                                              their peer */
    ucs_list_link_t         tx_timers_due; /* eps whose timers the sweep
                                              under way found due */
    ucs_list_link_t         failed_eps;    /* eps whose failure is still to
                                              be reported, from progress */
    ucs_list_link_t         ack_streams;   /* streams owing an ACK */
    ucs_list_link_t         bundle_eps;    /* eps collecting a bundle */
    ucs_list_link_t         held_eps;      /* eps holding messages back */
    unsigned                tx_outstanding; /* Unacked packets, all eps */
    unsigned                tx_awaited;    /* ACKs the user waits for: of
                                              zcopy sends, of flushes */
    int                     in_pending;    /* Dispatching pending requests */
    int                     sent_since_progress;
    int                     async_handler_id; /* Async timer: sends due
                                                 ACKs when idle */
    int                     async_timer_fd; /* Its timerfd, or -1 */
    ucs_sys_event_set_t     *event_set;    /* What the user waits on, or
                                              NULL without UCX_USNIC_EVENT_FD */
    int                     wakeup_fd;     /* eventfd the async timer writes */
    int                     armed;         /* The user may be waiting */
    ucs_mpool_t             tx_mp;         /* uct_usnic_tx_desc_t */
    ucs_mpool_t             tx_zcopy_mp;   /* The same, for datagrams that
                                              carry user memory: a quarter
                                              of the size, so that a window
                                              of them stays in the cache */
    ucs_mpool_t             am_buf_mp;     /* uct_usnic_am_buf_t */
    ucs_mpool_t             get_mp;        /* uct_usnic_get_t */
    ucs_ptr_array_t         gets;          /* read id -> uct_usnic_get_t */
    unsigned                num_gets;      /* Reads waiting for data */
    uint32_t                next_get_serial;
    khash_t(uct_usnic_reply_eps) reply_eps;
    void                    *bcopy_buf;    /* Packs a multi-datagram AM/PUT */
    void                    *ack_buf;      /* Standalone ACKs are built here,
                                              behind the provider's prefix:
                                              not on the stack, at 1 KB */
    ucs_time_t              put_refused_logged; /* Last log of a refused
                                                   remote write */
    unsigned long           put_refused_unlogged;
    struct {
        size_t              mtu;           /* Datagram size, no seal */
        size_t              prefix;        /* Message prefix room */
        uct_usnic_seal_type_t seal_type;
        size_t              max_payload;   /* Payload of one datagram */
        size_t              max_bcopy;
        size_t              put_max_payload; /* PUT data of one datagram */
        size_t              put_max_bcopy;
        size_t              get_max_payload; /* Read data of one reply
                                                datagram */
        size_t              get_max;       /* Largest get_bcopy */
        size_t              get_max_zcopy;
        unsigned            max_bcopy_packets; /* Datagrams of the largest
                                                  am_bcopy or put_bcopy */
        size_t              tx_hdr_offset; /* Header offset in a tx desc */
        unsigned            tx_max_bufs;
        size_t              rx_headroom;
        size_t              am_buf_offset;
        unsigned            max_poll;
        unsigned            window;
        unsigned            cwnd_init;
        unsigned            cwnd_min;
        unsigned            ack_freq;
        ucs_time_t          ack_delay;
        unsigned            ack_max_recs;  /* Streams per ACK datagram */
        ucs_time_t          bundle_delay;  /* 0: no bundles */
        ucs_time_t          hold_delay;    /* 0: every message sent at once */
        ucs_time_t          rto_min;
        ucs_time_t          rto_max;
        ucs_time_t          timer_tick;    /* An ep's timer, while it waits
                                              for its peer */
        unsigned            max_resend;
        ucs_time_t          timeout;       /* Peer failure */
        unsigned            max_streams;
        ucs_time_t          stream_idle;   /* A stream quiet this long may
                                              give way to a new one */
        unsigned            max_ooo;       /* Packets parked, all streams */
        unsigned            ooo_ring_size; /* Reach of a stream's reorder
                                              ring: a power of two */
        unsigned            max_reassembly;
        int                 stats_summary; /* Counters printed on close */
    } config;
    /* Counted in every build (the summary line, the tests); with
     * --enable-stats also in the UCS statistics node */
    uint64_t                stats[UCT_USNIC_IFACE_STAT_LAST];
    UCS_STATS_NODE_DECLARE(stats_node)
} uct_usnic_iface_t;


ucs_status_t uct_usnic_iface_get_address(uct_iface_h tl_iface,
                                         uct_iface_addr_t *addr);

/* Peer addresses (network order), counted by their users */
ucs_status_t uct_usnic_iface_av_insert(uct_usnic_iface_t *iface,
                                       uint32_t in_addr, uint16_t port,
                                       fi_addr_t *fi_addr_p);

void uct_usnic_iface_av_remove(uct_usnic_iface_t *iface, uint32_t in_addr,
                               uint16_t port);

void uct_usnic_iface_peer_link(uct_usnic_iface_t *iface, uint32_t incarnation,
                               struct uct_usnic_ep *ep,
                               struct uct_usnic_rx_stream *stream);

void uct_usnic_iface_peer_unlink(uct_usnic_iface_t *iface,
                                 uint32_t incarnation, struct uct_usnic_ep *ep,
                                 struct uct_usnic_rx_stream *stream);

/* Whether this iface had eps to the stream's sender iface and destroyed them
 * all after the stream opened */
int uct_usnic_iface_peer_closed(uct_usnic_iface_t *iface,
                                const struct uct_usnic_rx_stream *stream);

/* Keep the async timer out while the iface state and libfabric objects
 * are in use from the user's thread */
/* Waiting for events on a file descriptor (usnic_event.c) */
ucs_status_t uct_usnic_iface_event_init(uct_usnic_iface_t *iface);
void uct_usnic_iface_event_cleanup(uct_usnic_iface_t *iface);
ucs_status_t uct_usnic_iface_event_fd_get(uct_iface_h tl_iface, int *fd_p);
ucs_status_t uct_usnic_iface_event_arm(uct_iface_h tl_iface, unsigned events);
void uct_usnic_iface_event_async(uct_usnic_iface_t *iface);


/* Whether a peer with this IPv4 address can be on the device's network:
 * its subnet (127.0.0.0/8 for loopback) */
int uct_usnic_dev_addr_reaches(const uct_usnic_device_addr_t *local,
                               uint32_t in_addr);


/* Whether bundles or messages held back wait to be sent */
static UCS_F_ALWAYS_INLINE int
uct_usnic_iface_holds_msgs(uct_usnic_iface_t *iface)
{
    return !ucs_list_is_empty(&iface->bundle_eps) ||
           !ucs_list_is_empty(&iface->held_eps);
}

static UCS_F_ALWAYS_INLINE void uct_usnic_iface_enter(uct_usnic_iface_t *iface)
{
    UCS_ASYNC_BLOCK(iface->super.worker->async);
}

static UCS_F_ALWAYS_INLINE void uct_usnic_iface_leave(uct_usnic_iface_t *iface)
{
    UCS_ASYNC_UNBLOCK(iface->super.worker->async);
}

/*
 * Time from then to now. The user's thread and the async thread read the
 * clock on different cores, where a time the other thread has just taken
 * may lie slightly ahead: that is no time, not the wrapped-around maximum
 * (which would fail an ep for a peer timeout at once).
 */
static UCS_F_ALWAYS_INLINE ucs_time_t uct_usnic_elapsed(ucs_time_t now,
                                                        ucs_time_t then)
{
    return (now > then) ? (now - then) : 0;
}

/* Count an event of the iface */
#define UCT_USNIC_IFACE_STAT_ADD(_iface, _counter, _value) \
    uct_usnic_iface_stat_add(_iface, UCT_USNIC_IFACE_STAT_##_counter, _value)

static UCS_F_ALWAYS_INLINE void
uct_usnic_iface_stat_add(uct_usnic_iface_t *iface, unsigned counter,
                         uint64_t value)
{
    iface->stats[counter] += value;
    UCS_STATS_UPDATE_COUNTER(iface->stats_node, counter, value);
}

static UCS_F_ALWAYS_INLINE void
uct_usnic_iface_drop(uct_usnic_iface_t *iface, uct_usnic_rx_drop_t reason)
{
    uct_usnic_iface_stat_add(iface, UCT_USNIC_IFACE_STAT_RX_DROP + reason, 1);
}

ucs_status_t uct_usnic_iface_get_device_address(uct_iface_h tl_iface,
                                                uct_device_addr_t *addr);

/* Largest datagram on the wire, seal included: peers must agree on it */
static UCS_F_ALWAYS_INLINE uint16_t
uct_usnic_iface_dgram_size(const uct_usnic_iface_t *iface)
{
    return iface->config.mtu +
           uct_usnic_seal_length(iface->config.seal_type);
}


#endif
