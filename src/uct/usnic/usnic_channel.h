/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_CHANNEL_H
#define UCT_USNIC_CHANNEL_H

#include "usnic_md.h"
#include "usnic_fault.h"
#include "usnic_seal.h"

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>
#include <ucs/datastruct/mpool.inl>

#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <netinet/in.h>
#include <sys/uio.h>


typedef struct uct_usnic_channel uct_usnic_channel_t;


/* Most pieces of one datagram: its header in a send buffer, up to
 * UCT_USNIC_ZCOPY_MAX_IOV pieces of user memory, its trailers */
#define UCT_USNIC_ZCOPY_MAX_IOV 4ul
#define UCT_USNIC_DGRAM_MAX_IOV (UCT_USNIC_ZCOPY_MAX_IOV + 2)


/**
 * A datagram to send, gathered from pieces. The first starts with the
 * provider's prefix room; the last lies in a send buffer with room for a
 * seal behind it.
 */
typedef struct uct_usnic_dgram {
    size_t       length;  /* Sum of the pieces */
    unsigned     iovcnt;
    struct iovec iov[UCT_USNIC_DGRAM_MAX_IOV];
} uct_usnic_dgram_t;


/* A peer address in the address vector, and how many eps and streams use
 * it */
typedef struct uct_usnic_av_entry {
    fi_addr_t fi_addr;
    unsigned  refs;
} uct_usnic_av_entry_t;

/* IPv4 address and port -> entry */
KHASH_INIT(uct_usnic_av_map, uint64_t, uct_usnic_av_entry_t, 1,
           uct_usnic_hash64, uct_usnic_hash64_equal)


/**
 * Peers' addresses, shared by the channels of an iface. A fi_addr_t names
 * an entry: libfabric's address vector, or on the kernel provider an index
 * into the table of socket addresses. An address is inserted once however
 * many eps and streams use it, and removed with the last of them, so that
 * streams opened and reclaimed without end leave no trace.
 *
 * The kernel provider gives the first max_connected addresses a send
 * socket of their own, connected to the address: the kernel keeps its
 * route, where a datagram sent to an address looks the route up.
 */
typedef struct uct_usnic_av {
    struct fid_av             *fid;      /* NULL on the kernel provider */
    struct sockaddr_in        *addrs;    /* Kernel provider's table */
    int                       *fds;      /* Its connected sockets, -1: none */
    fi_addr_t                 *free;     /* Its entries free for reuse */
    size_t                    num_free;
    size_t                    count;
    size_t                    capacity;
    struct sockaddr_in        src;       /* Where connected sockets bind */
    int                       sndbuf;    /* Their send buffer size */
    unsigned                  max_connected;
    unsigned                  num_connected;
    khash_t(uct_usnic_av_map) map;
} uct_usnic_av_t;


/**
 * What differs between carrying datagrams on a libfabric endpoint and on a
 * kernel UDP socket (usnic_sock.c). Buffers start with the provider's
 * prefix room; lengths include it.
 */
typedef struct uct_usnic_channel_ops {
    /* Send one datagram; 0, or a negative errno (-FI_EAGAIN when full) */
    ssize_t  (*send)(uct_usnic_channel_t *channel, const void *buffer,
                     size_t length, fi_addr_t dest);
    /* Seal datagrams and send them to one peer, in order; returns how many
     * went */
    unsigned (*send_burst)(uct_usnic_channel_t *channel,
                           uct_usnic_dgram_t *dgrams, unsigned count,
                           fi_addr_t dest);
    /* Take up to max_events received datagrams */
    unsigned (*progress)(uct_usnic_channel_t *channel, unsigned max_events);
    /* Nothing received is waiting: the wait fd may be slept on */
    int      (*may_wait)(uct_usnic_channel_t *channel);
    void     (*cleanup)(uct_usnic_channel_t *channel);
} uct_usnic_channel_ops_t;


/* Most datagrams handed to a provider in one burst */
#define UCT_USNIC_CHANNEL_MAX_BURST 64


/**
 * Receive buffer. The datagram lands at a fixed offset behind this header,
 * after the room the channel's user asked for (AM headroom) and the
 * provider's message prefix.
 */
typedef struct uct_usnic_rx_desc {
    struct fi_context2  ctx;      /* Owned by libfabric while posted */
    ucs_list_link_t     list;     /* Entry in the channel's posted list */
    void                *mr_desc; /* Local registration, NULL without one */
    uct_recv_desc_t     release;  /* For a user who keeps the data */
    size_t              length;   /* Payload length, while kept */
} uct_usnic_rx_desc_t;


/**
 * Send slot: a registered buffer that a datagram too large for fi_inject
 * (or every datagram, under FORCE_MR_LOCAL) is copied into, and handed to
 * the provider with its descriptor until the send completes. The datagram
 * follows it, after the prefix room.
 */
typedef struct uct_usnic_tx_slot {
    struct fi_context2  ctx;      /* Owned by libfabric while posted */
    void                *mr_desc; /* Local registration, NULL without one */
} uct_usnic_tx_slot_t;


/* What lies in a message prefix the provider does not know about
 * (FORCE_MSG_PREFIX): rewritten on every send, checked on every receive */
#define UCT_USNIC_PREFIX_POISON 0xa5


/* Buffers handed to a libfabric provider, for the tests of FI_MR_LOCAL */
typedef struct uct_usnic_channel_posts {
    uint64_t injects;        /* fi_inject: copied, needs no registration */
    uint64_t sends;          /* fi_send from a send slot */
    uint64_t sends_mr;       /* ... with a registration descriptor */
    uint64_t recvs;          /* fi_recv */
    uint64_t recvs_mr;       /* ... with a registration descriptor */
    uint64_t bad_prefix;     /* Received datagrams whose prefix was written */
} uct_usnic_channel_posts_t;


/**
 * Called for every datagram received on a channel. Returns UCS_OK when the
 * descriptor may be reused at once, UCS_INPROGRESS when the callee keeps it
 * and releases it later with uct_usnic_channel_rx_desc_put(). The time the
 * datagram came is channel->rx_time.
 */
typedef ucs_status_t (*uct_usnic_channel_rx_cb_t)(uct_usnic_channel_t *channel,
                                                  uct_usnic_rx_desc_t *desc,
                                                  void *data, size_t length);


typedef struct uct_usnic_channel_params {
    const char                *name;         /* For logs and mpool names */
    unsigned                  rx_queue_len;  /* Receives kept posted */
    unsigned                  tx_queue_len;  /* Sends in flight */
    unsigned                  rx_batch;      /* Repost granularity */
    size_t                    rx_headroom;   /* Room in front of the prefix,
                                                for a user's AM headroom */
    size_t                    max_msg_size;  /* Datagram size, no prefix */
    size_t                    forced_prefix; /* FORCE_MSG_PREFIX, 0: none */
    /* Where AM payload starts in a datagram, and the iface parameters with
     * its alignment request; NULL for a channel that carries no payload */
    size_t                    am_offset;
    const uct_iface_params_t  *am_params;
    const uct_iface_mpool_config_t *rx_mpool;
    const ucs_range_spec_t    *port_range;  /* 0-0: any port */
    uct_usnic_channel_rx_cb_t rx_cb;
    uct_usnic_seal_type_t     seal_type;    /* End-to-end integrity */
    const uct_usnic_seal_key_t *seal_key;   /* For a MAC */
    int                       wakeup;       /* CQ with a wait fd */
    int                       coalesce;     /* Bursts from a peer may come
                                               as one buffer (UDP_GRO) */
    unsigned                  id;           /* For the fault injector */
    ucs_time_t                max_skip;     /* Longest time between polls
                                               that may be skipped */
    const uct_usnic_fault_config_t *fault;
} uct_usnic_channel_params_t;


/**
 * One libfabric datagram endpoint with its completion queue and posted
 * receive buffers.
 */
struct uct_usnic_channel {
    uct_base_iface_t          *iface;       /* Owner */
    const uct_usnic_channel_ops_t *ops;
    const uct_usnic_av_t      *av;
    struct fid_ep             *ep;          /* libfabric provider */
    struct fid_cq             *cq;
    struct {
        int                   fd;           /* Kernel provider's socket */
        int                   gso;          /* UDP_SEGMENT sends work */
        int                   gro;          /* UDP_GRO receives asked */
        int                   gro_on;       /* UDP_GRO now on */
        int                   single;       /* One datagram per recv() */
        unsigned              streak;       /* Batches: non-empty polls
                                               in a row that found just one
                                               datagram; one per recv():
                                               polls in a row that found
                                               one */
        unsigned              num_slots;    /* Datagrams per recvmmsg */
        size_t                slot_size;
        void                  *slots;       /* Receive staging buffers */
        struct mmsghdr        *msgs;
        struct iovec          *iovs;
        void                  *cmsgs;
        void                  *stage;       /* Send: runs to segment */
        uct_usnic_rx_desc_t   *rx_desc;     /* recv() target, or NULL */
        uint64_t              sends;        /* Datagrams and runs handed
                                               to the kernel */
    } sock;
    uct_usnic_channel_rx_cb_t rx_cb;
    size_t                    prefix_size;  /* FI_MSG_PREFIX room */
    size_t                    fake_prefix;  /* Of it, what the provider
                                               does not know about */
    size_t                    inject_size;  /* Largest fi_inject, prefix
                                               included; 0: none */
    ucs_mpool_t               tx_slot_mp;   /* Send slots */
    unsigned                  tx_slots_posted;
    uct_usnic_channel_posts_t posts;
    size_t                    rx_offset;    /* Datagram offset in a desc */
    size_t                    max_msg_size; /* Datagram size, no prefix */
    uct_usnic_seal_t          seal;         /* Ends every datagram */
    uct_usnic_fault_t         *fault;       /* NULL unless injecting */
    uint64_t                  rx_bad_seal;  /* Dropped: damaged or forged */
    uint64_t                  rx_oversized; /* Dropped: longer than any
                                               datagram of the protocol */
    ucs_time_t                rx_time;      /* When the datagrams of this
                                               poll came, 0 before the
                                               first: one clock read for
                                               a batch */
    unsigned                  rx_queue_len;
    unsigned                  rx_batch;
    unsigned                  rx_posted;
    ucs_list_link_t           rx_posted_list;
    ucs_mpool_t               rx_mp;
    unsigned                  idle_polls;   /* Empty polls in a row */
    unsigned                  skipped_polls;
    ucs_time_t                last_poll;    /* While polls may be skipped */
    ucs_time_t                max_skip;
    struct sockaddr_in        addr;         /* Bound address and port */
    int                       wait_fd;      /* Readable on a completion, or
                                               -1 without a wakeup */
    void                      *gather_buf;  /* A datagram in one piece, for
                                               whoever needs it so */
    const char                *name;
};


/* max_connected and sndbuf: the kernel provider's connected sockets */
ucs_status_t uct_usnic_av_open(uct_usnic_av_t *av, uct_usnic_md_t *md,
                               unsigned max_connected, int sndbuf);


void uct_usnic_av_close(uct_usnic_av_t *av);


ucs_status_t uct_usnic_av_insert(uct_usnic_av_t *av,
                                 const struct sockaddr_in *addr,
                                 fi_addr_t *fi_addr_p);


/* One user of the address less */
void uct_usnic_av_remove(uct_usnic_av_t *av, const struct sockaddr_in *addr);


ucs_status_t uct_usnic_channel_init(uct_usnic_channel_t *channel,
                                    uct_base_iface_t *iface,
                                    uct_usnic_md_t *md,
                                    const uct_usnic_av_t *av,
                                    const uct_usnic_channel_params_t *params);


void uct_usnic_channel_cleanup(uct_usnic_channel_t *channel);


/* Copy a datagram's pieces end to end to dst; returns its length */
size_t uct_usnic_dgram_gather(const uct_usnic_dgram_t *dgram, void *dst);


/* Copy a datagram's pieces into the channel's gather buffer */
void *uct_usnic_channel_gather(uct_usnic_channel_t *channel,
                               const uct_usnic_dgram_t *dgram);


/* Seal a datagram of length bytes (prefix room included) in one piece;
 * returns its length with the seal */
static UCS_F_ALWAYS_INLINE size_t
uct_usnic_channel_seal(uct_usnic_channel_t *channel, void *buffer,
                       size_t length)
{
    if (channel->seal.length == 0) {
        return length;
    }

    uct_usnic_seal_put(&channel->seal,
                       UCS_PTR_BYTE_OFFSET(buffer, channel->prefix_size),
                       length - channel->prefix_size);
    return length + channel->seal.length;
}


/* Seal a datagram in pieces: its last piece grows by the seal */
void uct_usnic_channel_dgram_seal(uct_usnic_channel_t *channel,
                                  uct_usnic_dgram_t *dgram);


/* Message prefix room in front of every datagram buffer: the provider's
 * (FI_MSG_PREFIX), or the one a test forces on a provider without it */
static UCS_F_ALWAYS_INLINE size_t
uct_usnic_channel_prefix(const struct fi_info *info, size_t forced_prefix)
{
    return (info->mode & FI_MSG_PREFIX) ? info->ep_attr->msg_prefix_size :
                                          forced_prefix;
}


/* Largest datagram the provider carries, without the prefix */
static UCS_F_ALWAYS_INLINE size_t
uct_usnic_channel_max_dgram(const struct fi_info *info)
{
    return info->ep_attr->max_msg_size -
           uct_usnic_channel_prefix(info, 0);
}


/* Hand a received datagram, lying in desc's data area, to the user */
void uct_usnic_channel_rx_deliver(uct_usnic_channel_t *channel,
                                  uct_usnic_rx_desc_t *desc, size_t length);


/* The kernel provider (usnic_sock.c) */
extern const uct_usnic_channel_ops_t uct_usnic_sock_ops;


ucs_status_t uct_usnic_sock_open(uct_usnic_channel_t *channel,
                                 const struct fi_info *info,
                                 const uct_usnic_channel_params_t *params);


/* Socket buffer bytes for queue_len datagrams of up to max_msg_size */
int uct_usnic_sock_buf_size(unsigned queue_len, size_t max_msg_size);


/* A send socket bound to src's address and connected to dst, or -1 */
int uct_usnic_sock_connect(const struct sockaddr_in *src,
                           const struct sockaddr_in *dst, int sndbuf);


static UCS_F_ALWAYS_INLINE unsigned
uct_usnic_channel_progress(uct_usnic_channel_t *channel, unsigned max_events)
{
    unsigned count;

    channel->rx_time = 0;
    count            = channel->ops->progress(channel, max_events);

    if (ucs_unlikely(channel->fault != NULL)) {
        uct_usnic_fault_progress(channel);
    }

    return count;
}


/*
 * Send a datagram. The buffer starts with the provider's prefix room and has
 * room for a seal after the length bytes of the datagram. Returns 0, or
 * a negative errno: -FI_EAGAIN when the send queue is full.
 */
static UCS_F_ALWAYS_INLINE ssize_t
uct_usnic_channel_send(uct_usnic_channel_t *channel, void *buffer,
                       size_t length, fi_addr_t dest)
{
    length = uct_usnic_channel_seal(channel, buffer,
                                    channel->prefix_size + length);
    if (ucs_unlikely(channel->fault != NULL)) {
        return uct_usnic_fault_send(channel, buffer, length, dest);
    }

    return channel->ops->send(channel, buffer, length, dest);
}


/*
 * Send datagrams to one peer, in order, as few system calls as the provider
 * allows; a datagram's last piece grows by the seal. Returns how many
 * were sent.
 */
unsigned uct_usnic_channel_send_burst(uct_usnic_channel_t *channel,
                                      uct_usnic_dgram_t *dgrams,
                                      unsigned count, fi_addr_t dest);


/*
 * Poll a channel, or skip it if allowed: a channel that brought nothing in
 * UCT_USNIC_CHANNEL_IDLE_POLLS polls in a row is then polled only on every
 * UCT_USNIC_CHANNEL_POLL_INTERVAL-th call, and at least every max_skip (the
 * ACK delay), until it brings something again. With the udp provider every
 * poll is a system call; a skipped one costs next to nothing. Callers allow
 * skipping when the user sends between progress calls (streaming), not when
 * the user spins on progress waiting for a datagram. Progress calls that
 * each send a large message are far apart: counted alone, the skipped ones
 * kept a peer's datagrams waiting past its retransmission timeout.
 */
#define UCT_USNIC_CHANNEL_IDLE_POLLS    2
#define UCT_USNIC_CHANNEL_POLL_INTERVAL 16

static UCS_F_ALWAYS_INLINE unsigned
uct_usnic_channel_poll(uct_usnic_channel_t *channel, unsigned max_events,
                       int may_skip, ucs_time_t now)
{
    unsigned count;

    /* Send slots come back with completions: never skipped while any is
     * out */
    if (may_skip && (channel->tx_slots_posted == 0) &&
        (channel->idle_polls >= UCT_USNIC_CHANNEL_IDLE_POLLS)) {
        if (((++channel->skipped_polls % UCT_USNIC_CHANNEL_POLL_INTERVAL) !=
             0) &&
            ((now - channel->last_poll) < channel->max_skip)) {
            return 0;
        }
        channel->last_poll = now;
    }

    count               = uct_usnic_channel_progress(channel, max_events);
    channel->idle_polls = (count > 0) ? 0 : (channel->idle_polls + 1);
    return count;
}


static UCS_F_ALWAYS_INLINE void *
uct_usnic_rx_desc_data(uct_usnic_channel_t *channel, uct_usnic_rx_desc_t *desc)
{
    return UCS_PTR_BYTE_OFFSET(desc, channel->rx_offset);
}


static UCS_F_ALWAYS_INLINE void
uct_usnic_channel_rx_desc_put(uct_usnic_rx_desc_t *desc)
{
    ucs_mpool_put_inline(desc);
}

#endif
