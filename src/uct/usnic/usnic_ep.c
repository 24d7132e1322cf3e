/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_ep.h"
#include "usnic_bundle.h"
#include "usnic_get.h"
#include "usnic_rx.h"
#include "usnic_tx.h"

#include <uct/base/uct_iov.inl>
#include <arpa/inet.h>
#include <ucs/debug/log.h>


/*
 * A datagram larger than the receiver's buffers would be cut short and lost
 * for good, resent and lost again until the peer timeout: peers must agree
 * on the datagram size, and each side of a connection says so when it
 * connects. Prefixes differ freely: they never travel.
 */
static ucs_status_t
uct_usnic_ep_check_mtu(uct_usnic_iface_t *iface,
                       const uct_usnic_device_addr_t *dev_addr,
                       const uct_usnic_iface_addr_t *if_addr)
{
    char peer[INET_ADDRSTRLEN];

    if (if_addr->mtu == uct_usnic_iface_dgram_size(iface)) {
        return UCS_OK;
    }

    ucs_error("usnic %s: peer %s sends and receives datagrams of up to %u "
              "bytes (message prefix %u), this iface %u (message prefix "
              "%zu): set %s the same on both sides",
              ucs_derived_of(iface->super.md,
                             uct_usnic_md_t)->info->domain_attr->name,
              inet_ntop(AF_INET, &dev_addr->in_addr, peer, sizeof(peer)),
              if_addr->mtu, if_addr->prefix, uct_usnic_iface_dgram_size(iface),
              iface->config.prefix, UCT_USNIC_CONFIG_VAR("MTU"));
    return UCS_ERR_UNREACHABLE;
}

#ifdef ENABLE_STATS
static ucs_stats_class_t uct_usnic_ep_stats_class = {
    .name          = "usnic_ep",
    .num_counters  = UCT_USNIC_EP_STAT_LAST,
    .class_id      = UCS_STATS_CLASS_ID_INVALID,
    .counter_names = {
        [UCT_USNIC_EP_STAT_TX_PACKETS]     = "tx_packets",
        [UCT_USNIC_EP_STAT_TX_RESENDS]     = "tx_resends",
        [UCT_USNIC_EP_STAT_TX_TIMEOUTS]    = "tx_timeouts",
        [UCT_USNIC_EP_STAT_TX_TAIL_PROBES] = "tx_tail_probes",
        [UCT_USNIC_EP_STAT_TX_REOPENS]     = "tx_reopens",
        [UCT_USNIC_EP_STAT_RX_ACKS]        = "rx_acks"
    }
};
#endif

UCS_CLASS_INIT_FUNC(uct_usnic_ep_t, const uct_ep_params_t *params,
                    int internal)
{
    uct_usnic_iface_t *iface = ucs_derived_of(params->iface,
                                              uct_usnic_iface_t);
    const uct_usnic_device_addr_t *dev_addr;
    const uct_usnic_iface_addr_t *if_addr;
    struct {
        uint64_t        token;
        uct_usnic_psn_t first_psn;
    } secrets;
    ucs_status_t status;

    UCT_EP_PARAMS_CHECK_DEV_IFACE_ADDRS(params);
    UCS_CLASS_CALL_SUPER_INIT(uct_base_ep_t, &iface->super);

    dev_addr = (const uct_usnic_device_addr_t*)params->dev_addr;
    if_addr  = (const uct_usnic_iface_addr_t*)params->iface_addr;
    if (dev_addr->magic != UCT_USNIC_DEV_ADDR_MAGIC) {
        ucs_error("usnic: not a usnic device address (magic 0x%x)",
                  dev_addr->magic);
        return UCS_ERR_INVALID_ADDR;
    }

    status = uct_usnic_ep_check_mtu(iface, dev_addr, if_addr);
    if (status != UCS_OK) {
        return status;
    }

    /* Off the path, nobody can forge our packets or the ACKs for them
     * without the token, nor guess where the sequence starts */
    status = uct_usnic_random(&secrets, sizeof(secrets));
    if (status != UCS_OK) {
        return status;
    }

    status = uct_usnic_iface_av_insert(iface, dev_addr->in_addr,
                                       if_addr->ports[UCT_USNIC_CHANNEL_DATA],
                                       &self->peer_fi_addr);
    if (status != UCS_OK) {
        return status;
    }

    status = UCS_STATS_NODE_ALLOC(&self->stats_node, &uct_usnic_ep_stats_class,
                                  self->super.stats, "-%p", self);
    if (status != UCS_OK) {
        uct_usnic_iface_av_remove(iface, dev_addr->in_addr,
                                  if_addr->ports[UCT_USNIC_CHANNEL_DATA]);
        return status;
    }

    self->peer_dev_addr    = *dev_addr;
    self->peer_iface_addr  = *if_addr;
    self->peer_incarnation = if_addr->incarnation;
    self->peer_open_key    = if_addr->open_key;
    self->peer_stream_id   = UCT_USNIC_STREAM_ID_NONE;
    self->serial           = iface->next_ep_serial++;
    self->token            = secrets.token;
    self->first_psn        = secrets.first_psn;
    self->next_psn         = self->first_psn;
    self->acked_psn        = self->first_psn - 1;
    self->tx_count         = 0;
    self->unsent           = 0;
    /* Replies to reads are paced by the requester, which asks only for
     * what it has room for: they need no slow start, which would make the
     * read of a target that progresses now and then wait for its ACKs */
    self->cwnd             = internal ? iface->config.window :
                                        iface->config.cwnd_init;
    self->ssthresh         = iface->config.window;
    self->cwnd_acked       = 0;
    self->recovery_psn     = self->acked_psn;
    self->rto              = iface->config.rto_min;
    self->srtt             = 0;
    self->rttvar           = 0;
    ucs_queue_head_init(&self->window);
    ucs_queue_head_init(&self->flush_reqs);
    ucs_arbiter_group_init(&self->arb_group);
    ucs_wtimer_init(&self->timer, uct_usnic_tx_timer_fired);
    ucs_list_head_init(&self->timer_list);
    self->ack_stream       = NULL;
    self->progress_time    = 0;
    self->status           = UCS_OK;
    ucs_list_head_init(&self->failed_list);
    ucs_queue_head_init(&self->gets);
    self->bundle           = NULL;
    self->bundle_time      = 0;
    ucs_list_head_init(&self->bundle_list);
    self->last_tx_time     = 0;
    self->post_time        = 0;
    self->held             = NULL;
    self->held_count       = 0;
    self->held_time        = 0;
    self->internal         = internal;
    self->id               = ucs_ptr_array_insert(&iface->eps, self);
    /* A reply ep neither opens nor closes the connection to its peer */
    if (!internal) {
        uct_usnic_iface_peer_link(iface, self->peer_incarnation, self, NULL);
    }

    ucs_debug("usnic ep %p: id %u to iface 0x%x", self, self->id,
              self->peer_incarnation);
    return UCS_OK;
}

UCS_CLASS_CLEANUP_FUNC(uct_usnic_ep_t)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(self);

    /* The async timer looks for timeouts on the timer wheel */
    uct_usnic_iface_enter(iface);
    if ((self->bundle != NULL) && (self->status == UCS_OK)) {
        /* Posted before, so sent once as any datagram of the window was */
        uct_usnic_bundle_send(self);
    }
    if ((self->held != NULL) && (self->status == UCS_OK)) {
        uct_usnic_tx_send_queued(self, self->held);
    }
    uct_usnic_tx_window_purge(self, UCS_ERR_CANCELED);
    ucs_wtimer_remove(&iface->tx_wheel, &self->timer);
    ucs_list_del(&self->failed_list);
    if (!self->internal) {
        uct_usnic_iface_peer_unlink(iface, self->peer_incarnation, self,
                                    NULL);
    }
    ucs_arbiter_group_cleanup(&self->arb_group);
    ucs_ptr_array_remove(&iface->eps, self->id);
    uct_usnic_iface_av_remove(
            iface, self->peer_dev_addr.in_addr,
            self->peer_iface_addr.ports[UCT_USNIC_CHANNEL_DATA]);
    UCS_STATS_NODE_FREE(self->stats_node);
    uct_usnic_iface_leave(iface);
}

UCS_CLASS_DEFINE(uct_usnic_ep_t, uct_base_ep_t);
UCS_CLASS_DEFINE_DELETE_FUNC(uct_usnic_ep_t, uct_ep_t);

ucs_status_t uct_usnic_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
    return UCS_CLASS_NEW(uct_usnic_ep_t, ep_p, params, 0);
}

/*
 * Put a short AM of the given length (header, if any, included) in the ep's
 * bundle (*desc_p = NULL), or take a send buffer for it to go on its own
 */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_usnic_ep_am_short_get(uct_usnic_ep_t *ep, uint8_t id,
                          const uint64_t *header, const uct_iov_t *iov,
                          size_t iovcnt, size_t length,
                          uct_usnic_tx_desc_t **desc_p)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    ucs_status_t status;

    UCT_CHECK_AM_ID(id);
    UCT_CHECK_LENGTH(length, 0, iface->config.max_payload, "am_short");

    if (iface->config.bundle_delay != 0) {
        status = uct_usnic_bundle_am(ep, id, header, iov, iovcnt, length);
        if (status != UCS_ERR_UNSUPPORTED) {
            *desc_p = NULL;
            return status;
        }
    }

    status = uct_usnic_ep_send_check(ep, 1);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    *desc_p = ucs_mpool_get_inline(&iface->tx_mp);
    return (*desc_p != NULL) ? UCS_OK : UCS_ERR_NO_RESOURCE;
}

static UCS_F_ALWAYS_INLINE void
uct_usnic_ep_am_short_post(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc,
                           uint8_t id, size_t length)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id,
                       uct_usnic_tx_desc_hdr(iface, desc) + 1, length,
                       "TX: AM_SHORT");
    UCT_TL_EP_STAT_OP(&ep->super, AM, SHORT, length);
    uct_usnic_iface_enter(iface);
    uct_usnic_tx_post(ep, desc, UCT_USNIC_PKT_AM, id,
                      UCT_USNIC_PKT_FLAG_FIRST | UCT_USNIC_PKT_FLAG_LAST,
                      length);
    uct_usnic_iface_leave(iface);
}

ucs_status_t uct_usnic_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header,
                                   const void *payload, unsigned length)
{
    uct_usnic_ep_t *ep = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_iov_t iov      = {
        .buffer = (void*)payload,
        .length = length,
        .memh   = UCT_MEM_HANDLE_NULL,
        .stride = 0,
        .count  = 1
    };
    uct_usnic_tx_desc_t *desc;
    ucs_status_t status;
    uint64_t *data;

    status = uct_usnic_ep_am_short_get(ep, id, &header, &iov, 1,
                                       sizeof(header) + length, &desc);
    if (ucs_unlikely((status != UCS_OK) || (desc == NULL))) {
        return status;
    }

    data    = (uint64_t*)(uct_usnic_tx_desc_hdr(uct_usnic_ep_iface(ep),
                                                desc) + 1);
    data[0] = header;
    memcpy(data + 1, payload, length);
    uct_usnic_ep_am_short_post(ep, desc, id, sizeof(header) + length);
    return UCS_OK;
}

/* The message is exactly the iov's bytes, even fewer than 8 */
ucs_status_t uct_usnic_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id,
                                       const uct_iov_t *iov, size_t iovcnt)
{
    uct_usnic_ep_t *ep = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    size_t length      = uct_iov_total_length(iov, iovcnt);
    uct_usnic_tx_desc_t *desc;
    ucs_iov_iter_t iov_iter;
    ucs_status_t status;

    UCT_CHECK_IOV_SIZE(iovcnt, UCT_USNIC_MAX_IOV, "uct_usnic_ep_am_short_iov");
    status = uct_usnic_ep_am_short_get(ep, id, NULL, iov, iovcnt, length,
                                       &desc);
    if (ucs_unlikely((status != UCS_OK) || (desc == NULL))) {
        return status;
    }

    ucs_iov_iter_init(&iov_iter);
    uct_iov_to_buffer(iov, iovcnt, &iov_iter,
                      uct_usnic_tx_desc_hdr(uct_usnic_ep_iface(ep), desc) + 1,
                      SIZE_MAX);
    uct_usnic_ep_am_short_post(ep, desc, id, length);
    return UCS_OK;
}

/*
 * A message to cut into datagrams: header bytes (am_zcopy's) copied into
 * the first, then the data, copied from data, or with iov != NULL sent from
 * the user's memory and completed (comp) once acknowledged. A remote write
 * (put != NULL) repeats its extension in every datagram.
 */
typedef struct uct_usnic_ep_msg {
    uint8_t             am_id;
    uct_usnic_put_ext_t *put;
    const void          *header;
    size_t              header_length;
    const void          *data;
    const uct_iov_t     *iov;
    size_t              iovcnt;
    size_t              length;        /* Of the data */
    uct_completion_t    *comp;
} uct_usnic_ep_msg_t;


/* Datagrams a message of length bytes (header included) takes */
static UCS_F_ALWAYS_INLINE unsigned
uct_usnic_ep_msg_packets(size_t length, size_t max_frag)
{
    return ucs_max(ucs_div_round_up(length, max_frag), 1);
}

/*
 * A copied message is cut into datagrams of equal size, the last one padded
 * to it: a stream of equal messages is then a stream of equal datagrams,
 * which the kernel provider hands over a burst's worth at a time as one
 * segmentation-offload send, where each message's shorter last datagram
 * ended the run. The padding, less than one byte per datagram, says its
 * length in its last byte. Returns it.
 */
static UCS_F_ALWAYS_INLINE size_t
uct_usnic_ep_msg_frag(const uct_usnic_ep_msg_t *msg, size_t total,
                      size_t max_frag, size_t *frag_p)
{
    unsigned packets = uct_usnic_ep_msg_packets(total, max_frag);
    size_t frag;

    /* The user's memory leaves as it is */
    if ((msg->iov != NULL) || (packets == 1) || (packets > UINT8_MAX)) {
        *frag_p = max_frag;
        return 0;
    }

    /* The last one keeps a byte of the message: frag * (packets - 1) is
     * less than total as long as a datagram holds more than 255 bytes */
    frag    = ucs_div_round_up(total, packets);
    *frag_p = frag;
    ucs_assert((frag * (packets - 1)) < total);
    return (frag * packets) - total;
}

static UCS_F_ALWAYS_INLINE void uct_usnic_ep_pad(void *dst, size_t pad)
{
    memset(dst, 0, pad - 1);
    *(uint8_t*)UCS_PTR_BYTE_OFFSET(dst, pad - 1) = pad;
}

/* Post a message; the window has room for all its datagrams */
static void uct_usnic_ep_post_msg(uct_usnic_ep_t *ep,
                                  const uct_usnic_ep_msg_t *msg)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uint8_t flags            = UCT_USNIC_PKT_FLAG_FIRST;
    uct_usnic_put_ext_t *put = msg->put;
    size_t ext_len           = (put == NULL) ? 0 : sizeof(*put);
    size_t max_frag          = (put == NULL) ? iface->config.max_payload :
                                               iface->config.put_max_payload;
    uint8_t type             = (put == NULL) ? UCT_USNIC_PKT_AM :
                                               UCT_USNIC_PKT_PUT;
    size_t total             = msg->header_length + msg->length;
    size_t offset            = 0;
    uct_usnic_tx_desc_t *desc, *first = NULL;
    size_t frag_len, hdr_len, iovcnt, frag, pad;
    ucs_iov_iter_t iov_iter;
    void *body;

    pad = uct_usnic_ep_msg_frag(msg, total, max_frag, &frag);
    ucs_iov_iter_init(&iov_iter);
    uct_usnic_iface_enter(iface);
    do {
        frag_len = ucs_min(total - offset, frag);
        if ((offset + frag_len) == total) {
            flags |= UCT_USNIC_PKT_FLAG_LAST;
        }

        desc = ucs_mpool_get_inline((msg->iov == NULL) ?
                                    &iface->tx_mp : &iface->tx_zcopy_mp);
        ucs_assert_always(desc != NULL);
        body = uct_usnic_tx_desc_hdr(iface, desc) + 1;
        if (put != NULL) {
            put->offset = offset;
            memcpy(body, put, ext_len);
            body = UCS_PTR_BYTE_OFFSET(body, ext_len);
        }

        /* Header and data may be NULL where their length is 0 */
        hdr_len = (offset < msg->header_length) ?
                  ucs_min(msg->header_length - offset, frag_len) : 0;
        if (hdr_len > 0) {
            memcpy(body, UCS_PTR_BYTE_OFFSET(msg->header, offset), hdr_len);
        }
        if (msg->iov == NULL) {
            if (frag_len > hdr_len) {
                memcpy(UCS_PTR_BYTE_OFFSET(body, hdr_len),
                       UCS_PTR_BYTE_OFFSET(msg->data, offset + hdr_len -
                                                      msg->header_length),
                       frag_len - hdr_len);
            }
            if (!(flags & UCT_USNIC_PKT_FLAG_LAST) || (pad == 0)) {
                uct_usnic_tx_queue(ep, desc, type, msg->am_id, flags,
                                   ext_len + frag_len);
            } else {
                uct_usnic_ep_pad(UCS_PTR_BYTE_OFFSET(body, frag_len), pad);
                uct_usnic_tx_queue(ep, desc, type, msg->am_id,
                                   flags | UCT_USNIC_PKT_FLAG_PADDED,
                                   ext_len + frag_len + pad);
            }
        } else {
            iovcnt             = UCT_USNIC_ZCOPY_MAX_IOV;
            desc->zcopy.length = uct_iov_to_iovec(desc->zcopy.iov, &iovcnt,
                                                  msg->iov, msg->iovcnt,
                                                  frag_len - hdr_len,
                                                  &iov_iter);
            desc->zcopy.iovcnt = iovcnt;
            desc->zcopy.comp   = NULL;
            if (flags & UCT_USNIC_PKT_FLAG_LAST) {
                /* The user's memory is lent until this ACK, with or without
                 * a completion (a flush tells then): no delayed ACK, and a
                 * user who frees the memory once the peer has the message
                 * finds the ACK there before any resend timer fires */
                desc->zcopy.comp = msg->comp;
                flags           |= UCT_USNIC_PKT_FLAG_ACK_REQ;
                ++iface->tx_awaited;
            }
            uct_usnic_tx_queue_zcopy(ep, desc, type, msg->am_id, flags,
                                     ext_len + hdr_len);
            if (flags & UCT_USNIC_PKT_FLAG_LAST) {
                desc->flags |= UCT_USNIC_TX_DESC_FLAG_AWAITED;
            }
        }

        if (first == NULL) {
            first = desc;
        }

        offset += frag_len;
        flags   = 0;
    } while (offset < total);

    /* The whole message at once: one system call where the provider can */
    uct_usnic_bundle_post_msg(ep, first, ucs_div_round_up(total, max_frag));
    uct_usnic_iface_leave(iface);
}

ssize_t uct_usnic_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id,
                              uct_pack_callback_t pack_cb, void *arg,
                              unsigned flags)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_ep_msg_t msg   = {.am_id = id, .data = iface->bcopy_buf};
    ucs_status_t status;

    UCT_CHECK_AM_ID(id);
    /* The size is known only after packing: room for the largest */
    status = uct_usnic_ep_send_check(ep, iface->config.max_bcopy_packets);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    msg.length = pack_cb(iface->bcopy_buf, arg);
    ucs_assertv(msg.length <= iface->config.max_bcopy,
                "length=%zu max_bcopy=%zu", msg.length,
                iface->config.max_bcopy);

    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id,
                       iface->bcopy_buf, msg.length, "TX: AM_BCOPY");
    UCT_TL_EP_STAT_OP(&ep->super, AM, BCOPY, msg.length);
    uct_usnic_ep_post_msg(ep, &msg);
    return msg.length;
}

/* Completes when the peer has every datagram: until then the user's memory
 * is read again for a retransmission */
ucs_status_t uct_usnic_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id,
                                   const void *header, unsigned header_length,
                                   const uct_iov_t *iov, size_t iovcnt,
                                   unsigned flags, uct_completion_t *comp)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_ep_msg_t msg   = {
        .am_id         = id,
        .header        = header,
        .header_length = header_length,
        .iov           = iov,
        .iovcnt        = iovcnt,
        .length        = uct_iov_total_length(iov, iovcnt),
        .comp          = comp
    };
    ucs_status_t status;

    UCT_CHECK_AM_ID(id);
    UCT_CHECK_IOV_SIZE(iovcnt, UCT_USNIC_ZCOPY_MAX_IOV,
                       "uct_usnic_ep_am_zcopy");
    UCT_CHECK_LENGTH(header_length, 0, UCT_USNIC_AM_ZCOPY_MAX_HDR,
                     "am_zcopy header");
    UCT_CHECK_LENGTH(header_length + msg.length, 0, iface->config.max_bcopy,
                     "am_zcopy");
    status = uct_usnic_ep_send_check(
            ep, uct_usnic_ep_msg_packets(header_length + msg.length,
                                         iface->config.max_payload));
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id, header,
                       header_length, "TX: AM_ZCOPY");
    UCT_TL_EP_STAT_OP(&ep->super, AM, ZCOPY, header_length + msg.length);
    uct_usnic_ep_post_msg(ep, &msg);
    return UCS_INPROGRESS;
}

/* What every datagram of a write tells the target */
static UCS_F_ALWAYS_INLINE void
uct_usnic_ep_put_ext_init(uct_usnic_put_ext_t *put, size_t length,
                          uint64_t remote_addr, uct_rkey_t rkey)
{
    const uct_usnic_rkey_t *key;

    /* A write of nothing may come without a key (UCX's tests pass 0) */
    if ((length != 0) && (rkey != UCT_INVALID_RKEY)) {
        key         = (const uct_usnic_rkey_t*)rkey;
        put->secret  = key->secret;
        put->rkey_id = key->id;
    }
    put->address = remote_addr;
    put->length  = length;
}

ucs_status_t uct_usnic_ep_put_short(uct_ep_h tl_ep, const void *buffer,
                                    unsigned length, uint64_t remote_addr,
                                    uct_rkey_t rkey)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_put_ext_t put  = {0};
    uct_usnic_ep_msg_t msg   = {.put = &put, .data = buffer, .length = length};
    ucs_status_t status;

    UCT_CHECK_LENGTH(length, 0, iface->config.put_max_payload, "put_short");
    status = uct_usnic_ep_send_check(ep, 1);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    uct_usnic_ep_put_ext_init(&put, length, remote_addr, rkey);
    UCT_TL_EP_STAT_OP(&ep->super, PUT, SHORT, length);
    uct_usnic_ep_post_msg(ep, &msg);
    return UCS_OK;
}

/* The target applies the write when it arrives in order: once the ep's
 * flush completes, the data is in place */
ssize_t uct_usnic_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb,
                               void *arg, uint64_t remote_addr,
                               uct_rkey_t rkey)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_put_ext_t put  = {0};
    uct_usnic_ep_msg_t msg   = {.put = &put, .data = iface->bcopy_buf};
    ucs_status_t status;

    /* The size is known only after packing: room for the largest */
    status = uct_usnic_ep_send_check(ep, iface->config.max_bcopy_packets);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    msg.length = pack_cb(iface->bcopy_buf, arg);
    ucs_assertv(msg.length <= iface->config.put_max_bcopy,
                "length=%zu put_max_bcopy=%zu", msg.length,
                iface->config.put_max_bcopy);

    uct_usnic_ep_put_ext_init(&put, msg.length, remote_addr, rkey);
    ucs_trace_data("ep %p: put_bcopy %zu bytes to 0x%" PRIx64 " key %u", ep,
                   msg.length, remote_addr, put.rkey_id);
    UCT_TL_EP_STAT_OP(&ep->super, PUT, BCOPY, msg.length);
    uct_usnic_ep_post_msg(ep, &msg);
    return msg.length;
}

/* Completes when the target has applied every datagram */
ucs_status_t uct_usnic_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                    size_t iovcnt, uint64_t remote_addr,
                                    uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_put_ext_t put  = {0};
    uct_usnic_ep_msg_t msg   = {
        .put    = &put,
        .iov    = iov,
        .iovcnt = iovcnt,
        .length = uct_iov_total_length(iov, iovcnt),
        .comp   = comp
    };
    ucs_status_t status;

    UCT_CHECK_IOV_SIZE(iovcnt, UCT_USNIC_ZCOPY_MAX_IOV,
                       "uct_usnic_ep_put_zcopy");
    UCT_CHECK_LENGTH(msg.length, 0, iface->config.put_max_bcopy, "put_zcopy");
    status = uct_usnic_ep_send_check(
            ep, uct_usnic_ep_msg_packets(msg.length,
                                         iface->config.put_max_payload));
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    uct_usnic_ep_put_ext_init(&put, msg.length, remote_addr, rkey);
    ucs_trace_data("ep %p: put_zcopy %zu bytes to 0x%" PRIx64 " key %u", ep,
                   msg.length, remote_addr, put.rkey_id);
    UCT_TL_EP_STAT_OP(&ep->super, PUT, ZCOPY, msg.length);
    uct_usnic_ep_post_msg(ep, &msg);
    return UCS_INPROGRESS;
}

ucs_status_t uct_usnic_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req,
                                      unsigned flags)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    /* On a failed ep too: the error handler purges what waits */
    if ((ep->status == UCS_OK) &&
        uct_usnic_ep_can_send(ep, iface->config.max_bcopy_packets)) {
        return UCS_ERR_BUSY;
    }

    uct_pending_req_arb_group_push(&ep->arb_group, req);
    if (uct_usnic_ep_window_fits(ep, 1)) {
        /* The request may fit the window: try it when iface buffers free
         * up, in turn with the other eps; a full window waits for an ACK */
        ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
    }
    UCT_TL_EP_STAT_PEND(&ep->super);
    return UCS_OK;
}

ucs_arbiter_cb_result_t uct_usnic_ep_do_pending(ucs_arbiter_t *arbiter,
                                                ucs_arbiter_group_t *group,
                                                ucs_arbiter_elem_t *elem,
                                                void *arg)
{
    uct_usnic_ep_t *ep       = ucs_container_of(group, uct_usnic_ep_t,
                                                arb_group);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_pending_req_t *req   = ucs_container_of(elem, uct_pending_req_t, priv);
    ucs_status_t status;

    if (iface->tx_outstanding + iface->config.max_bcopy_packets >
        iface->config.tx_max_bufs) {
        return UCS_ARBITER_CB_RESULT_STOP;
    }

    /* The request's size is unknown here: it tries whenever one packet
     * fits the window, or a short request would wait for this ep's ACKs
     * while other eps send all of theirs */
    status = uct_usnic_ep_window_fits(ep, 1) ? req->func(req) :
                                               UCS_ERR_NO_RESOURCE;
    if (status == UCS_OK) {
        return UCS_ARBITER_CB_RESULT_REMOVE_ELEM;
    } else if (status == UCS_INPROGRESS) {
        /* Made progress but not done: keep it, let other eps go */
        return UCS_ARBITER_CB_RESULT_NEXT_GROUP;
    }

    /* Out of window, or failed: an ACK or the error handler reschedules */
    return UCS_ARBITER_CB_RESULT_DESCHED_GROUP;
}

static ucs_arbiter_cb_result_t
uct_usnic_ep_pending_purge_cb(ucs_arbiter_t *arbiter,
                              ucs_arbiter_group_t *group,
                              ucs_arbiter_elem_t *elem, void *arg)
{
    uct_purge_cb_args_t *args = arg;
    uct_pending_req_t *req    = ucs_container_of(elem, uct_pending_req_t,
                                                 priv);

    if (args->cb != NULL) {
        args->cb(req, args->arg);
    }
    return UCS_ARBITER_CB_RESULT_REMOVE_ELEM;
}

void uct_usnic_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb,
                                void *arg)
{
    uct_usnic_ep_t *ep        = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface  = uct_usnic_ep_iface(ep);
    uct_purge_cb_args_t args  = {cb, arg};

    ucs_arbiter_group_purge(&iface->arbiter, &ep->arb_group,
                            uct_usnic_ep_pending_purge_cb, &args);
}

ucs_status_t uct_usnic_ep_flush(uct_ep_h tl_ep, unsigned flags,
                                uct_completion_t *comp)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_flush_req_t *req;

    if (flags & UCT_FLUSH_FLAG_CANCEL) {
        uct_usnic_iface_enter(iface);
        uct_usnic_tx_window_purge(ep, UCS_ERR_CANCELED);
        uct_usnic_iface_leave(iface);
        return UCS_OK;
    }

    if (ucs_unlikely(ep->status != UCS_OK)) {
        return ep->status;
    }

    uct_usnic_iface_enter(iface);
    if (ep->bundle != NULL) {
        uct_usnic_bundle_send(ep);
    }
    if (ep->held != NULL) {
        uct_usnic_tx_send_queued(ep, ep->held);
    }
    uct_usnic_iface_leave(iface);

    /* Pending sends go first, unless this flush is one of them */
    if (!iface->in_pending && !ucs_arbiter_group_is_empty(&ep->arb_group)) {
        UCT_TL_EP_STAT_FLUSH_WAIT(&ep->super);
        return UCS_ERR_NO_RESOURCE;
    }

    if (uct_usnic_ep_is_idle(ep)) {
        UCT_TL_EP_STAT_FLUSH(&ep->super);
        return UCS_OK;
    }

    if (comp != NULL) {
        UCS_STATIC_ASSERT(sizeof(*req) <= sizeof(uct_usnic_tx_desc_t));
        if (iface->tx_outstanding >= iface->config.tx_max_bufs) {
            return UCS_ERR_NO_RESOURCE;
        }

        req = ucs_mpool_get_inline(&iface->tx_mp);
        if (req == NULL) {
            return UCS_ERR_NO_RESOURCE;
        }
        ++iface->tx_outstanding;
        ++iface->tx_awaited;

        req->psn  = ep->next_psn - 1;
        req->comp = comp;
        ucs_queue_push(&ep->flush_reqs, &req->queue);
    }

    UCT_TL_EP_STAT_FLUSH_WAIT(&ep->super);
    return UCS_INPROGRESS;
}

int uct_usnic_ep_is_connected(uct_ep_h tl_ep,
                              const uct_ep_is_connected_params_t *params)
{
    uct_usnic_ep_t *ep = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    const uct_usnic_device_addr_t *dev_addr;
    const uct_usnic_iface_addr_t *if_addr;

    if (!ucs_test_all_flags(params->field_mask,
                            UCT_EP_IS_CONNECTED_FIELD_DEVICE_ADDR |
                            UCT_EP_IS_CONNECTED_FIELD_IFACE_ADDR)) {
        return 0;
    }

    dev_addr = (const uct_usnic_device_addr_t*)params->device_addr;
    if_addr  = (const uct_usnic_iface_addr_t*)params->iface_addr;
    return (dev_addr->in_addr == ep->peer_dev_addr.in_addr) &&
           (dev_addr->ns_id == ep->peer_dev_addr.ns_id) &&
           !memcmp(if_addr, &ep->peer_iface_addr, sizeof(*if_addr));
}

void uct_usnic_ep_fail(uct_usnic_ep_t *ep, ucs_status_t status)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    if ((ep->status != UCS_OK) || !ucs_list_is_empty(&ep->failed_list)) {
        return;
    }

    ucs_debug("usnic ep %p to iface 0x%x failed: %s", ep,
              ep->peer_incarnation, ucs_status_string(status));
    ep->status = status;
    ucs_list_add_tail(&iface->failed_eps, &ep->failed_list);
}

void uct_usnic_ep_report_failures(uct_usnic_iface_t *iface)
{
    uct_usnic_ep_t *ep;

    while (!ucs_list_is_empty(&iface->failed_eps)) {
        ep = ucs_list_extract_head(&iface->failed_eps, uct_usnic_ep_t,
                                   failed_list);
        ucs_list_head_init(&ep->failed_list);
        if (ep->status == UCS_OK) {
            ep->status = UCS_ERR_ENDPOINT_TIMEOUT; /* Invalidated */
        }
        uct_usnic_tx_window_purge(ep, ep->status);
        if (ep->internal) {
            uct_usnic_get_reply_ep_failed(ep);
        } else {
            uct_iface_handle_ep_err(&iface->super.super, &ep->super.super,
                                    ep->status);
        }
    }
}

/*
 * Send a probe, which the peer acknowledges like any packet, or answers
 * that it closed its side (it has no ep to us any more). Its silence fails
 * the ep after the peer timeout. With the window full, the timeout alone
 * watches the ep.
 */
ucs_status_t uct_usnic_ep_check(uct_ep_h tl_ep, unsigned flags,
                                uct_completion_t *comp)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_tx_desc_t *desc;

    /* A completion is never fired: a failure reaches the error handler */
    UCT_CHECK_PARAM(flags == 0, "Unsupported flags: %x", flags);

    if ((ep->status != UCS_OK) || (ep->tx_count >= iface->config.window)) {
        return UCS_OK;
    }

    desc = ucs_mpool_get_inline(&iface->tx_mp);
    if (desc == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }

    uct_usnic_iface_enter(iface);
    uct_usnic_tx_post(ep, desc, UCT_USNIC_PKT_PROBE, 0,
                      UCT_USNIC_PKT_FLAG_FIRST | UCT_USNIC_PKT_FLAG_LAST, 0);
    uct_usnic_iface_leave(iface);
    return UCS_OK;
}

ucs_status_t uct_usnic_ep_invalidate(uct_ep_h tl_ep)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    /* The async timer may be failing eps at the same time. The ep keeps
     * taking sends until its failure is reported, as after a peer failure
     * that is not detected yet */
    uct_usnic_iface_enter(iface);
    if ((ep->status == UCS_OK) && ucs_list_is_empty(&ep->failed_list)) {
        ucs_list_add_tail(&iface->failed_eps, &ep->failed_list);
    }
    uct_usnic_iface_leave(iface);
    return UCS_OK;
}
