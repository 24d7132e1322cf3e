/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_rx.h"
#include "usnic_ep.h"
#include "usnic_get.h"
#include "usnic_tx.h"

#include <ucs/debug/log.h>

#include <rdma/fi_errno.h>
#include <arpa/inet.h>


static UCS_F_ALWAYS_INLINE uint64_t uct_usnic_rx_stream_key(uint32_t incarnation,
                                                            uint32_t ep_serial)
{
    return ((uint64_t)incarnation << 32) | ep_serial;
}

static void uct_usnic_rx_schedule_ack(uct_usnic_iface_t *iface,
                                      uct_usnic_rx_stream_t *stream,
                                      ucs_time_t now)
{
    if (ucs_list_is_empty(&stream->ack_list)) {
        stream->unacked_since = now;
        ucs_list_add_tail(&iface->ack_streams, &stream->ack_list);
    }
}

static UCS_F_ALWAYS_INLINE int
uct_usnic_rx_ack_due(const uct_usnic_iface_t *iface,
                     const uct_usnic_rx_stream_t *stream, ucs_time_t now)
{
    return stream->ack_now || (stream->unacked >= iface->config.ack_freq) ||
           (uct_usnic_elapsed(now, stream->unacked_since) >=
            iface->config.ack_delay);
}

static void uct_usnic_rx_send_ack(uct_usnic_iface_t *iface,
                                  uct_usnic_rx_stream_t *stream);

/* Reorder ring slot of a PSN; the ring's size is a power of two, so that
 * PSNs less than a ring apart never share a slot, even across the wrap */
static UCS_F_ALWAYS_INLINE unsigned
uct_usnic_rx_ooo_slot(const uct_usnic_iface_t *iface, uct_usnic_psn_t psn)
{
    return psn & (iface->config.ooo_ring_size - 1);
}

/* A packet taken out of the reorder ring. The ring goes once nothing waits
 * in it: rings are held only by streams with packets parked, at most
 * MAX_OOO of them */
static void uct_usnic_rx_ooo_take(uct_usnic_iface_t *iface,
                                  uct_usnic_rx_stream_t *stream, unsigned slot)
{
    stream->ooo[slot] = NULL;
    --stream->ooo_count;
    --iface->rx_ooo_count;
    if (stream->ooo_count == 0) {
        ucs_free(stream->ooo);
        stream->ooo = NULL;
    }
}

/* The message being reassembled goes (delivered, or given up) */
static void uct_usnic_rx_reassembly_end(uct_usnic_iface_t *iface,
                                        uct_usnic_rx_stream_t *stream)
{
    if (stream->am_buf != NULL) {
        ucs_mpool_put(stream->am_buf);
        stream->am_buf = NULL;
        --iface->rx_reassembling;
    }
}

static UCS_F_ALWAYS_INLINE uint64_t
uct_usnic_rx_sender_key(const uct_usnic_rx_stream_t *stream)
{
    return ((uint64_t)stream->src_in_addr << 16) | stream->src_port;
}

/* Count the stream at its source; the newest incarnation seen there wins */
static ucs_status_t uct_usnic_rx_sender_link(uct_usnic_iface_t *iface,
                                             uct_usnic_rx_stream_t *stream)
{
    uct_usnic_sender_t *sender;
    khiter_t iter;
    int ret;

    iter = kh_put(uct_usnic_senders, &iface->senders,
                  uct_usnic_rx_sender_key(stream), &ret);
    if (ret < 0) {
        return UCS_ERR_NO_MEMORY;
    }

    sender = &kh_value(&iface->senders, iter);
    if (ret != 0) {
        sender->num_streams = 0;
    }
    sender->incarnation = uct_usnic_rx_stream_peer(stream);
    ++sender->num_streams;
    return UCS_OK;
}

static void uct_usnic_rx_sender_unlink(uct_usnic_iface_t *iface,
                                       const uct_usnic_rx_stream_t *stream)
{
    khiter_t iter = kh_get(uct_usnic_senders, &iface->senders,
                           uct_usnic_rx_sender_key(stream));

    if (--kh_value(&iface->senders, iter).num_streams == 0) {
        kh_del(uct_usnic_senders, &iface->senders, iter);
    }
}

/* Whether a process with a new incarnation has since sent from the
 * stream's address and port: the stream's sender is gone */
static int uct_usnic_rx_stream_superseded(uct_usnic_iface_t *iface,
                                          const uct_usnic_rx_stream_t *stream)
{
    khiter_t iter = kh_get(uct_usnic_senders, &iface->senders,
                           uct_usnic_rx_sender_key(stream));

    return kh_value(&iface->senders, iter).incarnation !=
           uct_usnic_rx_stream_peer(stream);
}

static void uct_usnic_rx_stream_reclaim(uct_usnic_iface_t *iface,
                                        uct_usnic_rx_stream_t *stream,
                                        const char *why)
{
    ucs_debug("iface %p: reclaiming rx stream %u from ep %u of iface 0x%x: "
              "%s", iface, stream->id, stream->src_ep_id,
              uct_usnic_rx_stream_peer(stream), why);
    UCT_USNIC_IFACE_STAT_ADD(iface, RX_STREAMS_RECLAIMED, 1);
    uct_usnic_rx_stream_destroy(iface, stream);
}

void uct_usnic_rx_reclaim_streams(uct_usnic_iface_t *iface, ucs_time_t now)
{
    uct_usnic_rx_stream_t *stream, *tmp;
    ucs_time_t idle;
    int proven;

    if (now < iface->next_reclaim_check) {
        return;
    }

    /* Oldest first: those quiet for less than STREAM_IDLE come last */
    iface->next_reclaim_check = now + (iface->config.stream_idle / 4);
    for (proven = 0; proven < 2; ++proven) {
        ucs_list_for_each_safe(stream, tmp, &iface->streams_lru[proven],
                               lru_list) {
            idle = uct_usnic_elapsed(now, stream->last_time);
            if (idle < iface->config.stream_idle) {
                break;
            } else if (idle >= iface->config.timeout) {
                uct_usnic_rx_stream_reclaim(iface, stream,
                                            "its sender was silent for the "
                                            "timeout");
            } else if (uct_usnic_rx_stream_superseded(iface, stream)) {
                uct_usnic_rx_stream_reclaim(iface, stream,
                                            "its sender's address has a "
                                            "new incarnation");
            }
        }
    }
}

/*
 * Room for one more stream: at MAX_STREAMS, the quietest stream gives way
 * if quiet for STREAM_IDLE. Its sender then has every ACK (it would have
 * resent otherwise), and opens the stream again when it next sends. While
 * there are streams that have not delivered a message yet, which is all a
 * flood of new streams brings, only those give way: the flood cannot push
 * out the streams in use, even quiet ones.
 */
static int uct_usnic_rx_stream_make_room(uct_usnic_iface_t *iface,
                                         ucs_time_t now)
{
    ucs_list_link_t *lru = &iface->streams_lru[0];
    uct_usnic_rx_stream_t *oldest;

    if (iface->num_streams < iface->config.max_streams) {
        return 1;
    }

    if (ucs_list_is_empty(lru)) {
        lru = &iface->streams_lru[1];
    }

    oldest = ucs_list_head(lru, uct_usnic_rx_stream_t, lru_list);
    if (uct_usnic_elapsed(now, oldest->last_time) <
        iface->config.stream_idle) {
        return 0;
    }

    uct_usnic_rx_stream_reclaim(iface, oldest,
                                "quiet, and MAX_STREAMS are open");
    return 1;
}

static uct_usnic_rx_stream_t *
uct_usnic_rx_stream_create(uct_usnic_iface_t *iface,
                           const uct_usnic_hdr_t *hdr,
                           const uct_usnic_open_ext_t *open, uint64_t key,
                           ucs_time_t now)
{
    uct_usnic_rx_stream_t *stream;
    ucs_status_t status;
    khiter_t iter;
    int ret;

    if (!uct_usnic_rx_stream_make_room(iface, now)) {
        return NULL;
    }

    stream = ucs_calloc(1, sizeof(*stream), "usnic_rx_stream");
    if (stream == NULL) {
        return NULL;
    }

    status = uct_usnic_iface_av_insert(iface, open->src_in_addr,
                                       open->src_prio_port,
                                       &stream->ack_fi_addr);
    if (status != UCS_OK) {
        goto err_free;
    }

    iter = kh_put(uct_usnic_streams, &iface->stream_hash, key, &ret);
    if (ret < 0) {
        goto err_av_remove;
    }

    stream->open_seq     = iface->streams_opened++;
    stream->key          = key;
    stream->token        = hdr->token;
    stream->src_ep_id    = open->src_ep_id;
    stream->src_in_addr  = open->src_in_addr;
    stream->src_port     = open->src_data_port;
    stream->src_prio_port = open->src_prio_port;
    stream->src_open_key = open->src_open_key;
    stream->expected_psn = open->first_psn;
    stream->last_time    = now;
    if (uct_usnic_rx_sender_link(iface, stream) != UCS_OK) {
        goto err_hash_del;
    }

    stream->id = ucs_ptr_array_insert(&iface->streams, stream);
    ucs_list_head_init(&stream->ack_list);
    ucs_list_add_tail(&iface->streams_lru[0], &stream->lru_list);
    ++iface->num_streams;
    kh_value(&iface->stream_hash, iter) = stream->id;

    uct_usnic_iface_peer_link(iface, uct_usnic_rx_stream_peer(stream), NULL,
                              stream);
    ucs_debug("iface %p: new rx stream %u from ep %u of iface 0x%x", iface,
              stream->id, open->src_ep_id, open->src_incarnation);
    return stream;

err_hash_del:
    kh_del(uct_usnic_streams, &iface->stream_hash, iter);
err_av_remove:
    uct_usnic_iface_av_remove(iface, open->src_in_addr, open->src_prio_port);
err_free:
    ucs_free(stream);
    return NULL;
}

void uct_usnic_rx_stream_destroy(uct_usnic_iface_t *iface,
                                 uct_usnic_rx_stream_t *stream)
{
    khiter_t iter;
    unsigned i;

    for (i = 0; (stream->ooo != NULL) && (i < iface->config.ooo_ring_size);
         ++i) {
        if (stream->ooo[i] != NULL) {
            uct_usnic_channel_rx_desc_put(stream->ooo[i]);
            uct_usnic_rx_ooo_take(iface, stream, i);
        }
    }

    uct_usnic_rx_reassembly_end(iface, stream);

    uct_usnic_iface_peer_unlink(iface, uct_usnic_rx_stream_peer(stream), NULL,
                                stream);
    uct_usnic_iface_av_remove(iface, stream->src_in_addr,
                              stream->src_prio_port);
    uct_usnic_rx_sender_unlink(iface, stream);
    ucs_list_del(&stream->ack_list);
    ucs_list_del(&stream->lru_list);
    --iface->num_streams;
    iter = kh_get(uct_usnic_streams, &iface->stream_hash, stream->key);
    if (iter != kh_end(&iface->stream_hash)) {
        kh_del(uct_usnic_streams, &iface->stream_hash, iter);
    }
    ucs_ptr_array_remove(&iface->streams, stream->id);
    ucs_free(stream);
}

/* Whether a packet with an open trailer comes from the stream's sender */
static int uct_usnic_rx_stream_opened_by(const uct_usnic_rx_stream_t *stream,
                                         const uct_usnic_hdr_t *hdr,
                                         const uct_usnic_open_ext_t *open)
{
    return (hdr->token == stream->token) &&
           (open->src_ep_id == stream->src_ep_id) &&
           (open->src_in_addr == stream->src_in_addr) &&
           (open->src_data_port == stream->src_port);
}

/*
 * Find the stream of a data packet, creating it on an open trailer. Only
 * packets that carry the token of the stream's opener get further.
 */
static uct_usnic_rx_stream_t *
uct_usnic_rx_stream_get(uct_usnic_iface_t *iface, const uct_usnic_hdr_t *hdr,
                        const uct_usnic_open_ext_t *open, ucs_time_t now)
{
    uct_usnic_rx_stream_t *stream;
    khiter_t iter;
    uint64_t key;

    if (hdr->stream_id != UCT_USNIC_STREAM_ID_NONE) {
        if (!ucs_ptr_array_lookup(&iface->streams, hdr->stream_id, stream)) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_STREAM);
            return NULL;
        } else if (ucs_unlikely(hdr->token != stream->token)) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_FORGED);
            return NULL;
        }
        return stream;
    }

    if (open == NULL) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return NULL;
    }

    key  = uct_usnic_rx_stream_key(open->src_incarnation, open->src_ep_serial);
    iter = kh_get(uct_usnic_streams, &iface->stream_hash, key);
    if (iter != kh_end(&iface->stream_hash)) {
        if (!ucs_ptr_array_lookup(&iface->streams,
                                  kh_value(&iface->stream_hash, iter),
                                  stream)) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_STREAM);
            return NULL;
        } else if (!uct_usnic_rx_stream_opened_by(stream, hdr, open)) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_FORGED);
            return NULL;
        }
        return stream;
    }

    /* Only who was given our address may open a stream: off the path, that
     * takes guessing the incarnation and the open key, 64 random bits */
    if (open->dst_open_key != iface->open_key) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_FORGED);
        return NULL;
    }

    /* ACKs will go where the trailer says: only to a peer that can be on
     * this network */
    if ((open->src_prio_port == 0) || (open->src_data_port == 0) ||
        !uct_usnic_dev_addr_reaches(&iface->dev_addr, open->src_in_addr)) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return NULL;
    }

    /* A packet after the first may open the stream: the first was lost
     * and will be resent */
    stream = uct_usnic_rx_stream_create(iface, hdr, open, key, now);
    if (stream == NULL) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
    }
    return stream;
}

static ucs_status_t
uct_usnic_rx_invoke_am(uct_usnic_iface_t *iface, uint8_t am_id, void *data,
                       size_t length, uct_recv_desc_t *release)
{
    ucs_status_t status;

    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_RECV, am_id, data,
                       length, "RX: AM");
    status = uct_iface_invoke_am(&iface->super, am_id, data, length,
                                 UCT_CB_PARAM_FLAG_DESC);
    if (status == UCS_INPROGRESS) {
        /* The user keeps the data and releases it later */
        uct_recv_desc(UCS_PTR_BYTE_OFFSET(data, -iface->config.rx_headroom)) =
                release;
    }

    return status;
}

/*
 * Deliver the payload of the next in-order packet. Returns UCS_INPROGRESS
 * when the user kept the receive descriptor.
 */
static ucs_status_t
uct_usnic_rx_deliver(uct_usnic_iface_t *iface, uct_usnic_rx_stream_t *stream,
                     uct_usnic_rx_desc_t *desc, const uct_usnic_hdr_t *hdr,
                     void *payload, size_t length)
{
    uct_usnic_am_buf_t *am_buf = stream->am_buf;
    uint8_t flags              = hdr->flags;
    ucs_status_t status;
    void *data;

    if (ucs_likely(ucs_test_all_flags(flags, UCT_USNIC_PKT_FLAG_FIRST |
                                             UCT_USNIC_PKT_FLAG_LAST) &&
                   (am_buf == NULL))) {
        return uct_usnic_rx_invoke_am(iface, hdr->am_id, payload, length,
                                      &desc->release);
    }

    if (flags & UCT_USNIC_PKT_FLAG_FIRST) {
        if (am_buf != NULL) {
            /* The sender never starts a message inside another one */
            uct_usnic_rx_reassembly_end(iface, stream);
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        }

        /* uct_usnic_rx_may_take() made sure there is room */
        am_buf = ucs_mpool_get(&iface->am_buf_mp);
        if (am_buf == NULL) {
            ucs_error("failed to allocate a usnic reassembly buffer");
            return UCS_OK;
        }

        am_buf->length = 0;
        am_buf->am_id  = hdr->am_id;
        stream->am_buf = am_buf;
        ++iface->rx_reassembling;
    } else if (am_buf == NULL) {
        /* Continuation of a message whose start was refused */
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return UCS_OK;
    }

    data = UCS_PTR_BYTE_OFFSET(am_buf, iface->config.am_buf_offset);
    if ((am_buf->length + length) > iface->config.max_bcopy) {
        uct_usnic_rx_reassembly_end(iface, stream);
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return UCS_OK;
    }

    memcpy(UCS_PTR_BYTE_OFFSET(data, am_buf->length), payload, length);
    am_buf->length += length;
    if (!(flags & UCT_USNIC_PKT_FLAG_LAST)) {
        return UCS_OK;
    }

    /* The user may keep the buffer: it no longer counts as reassembly */
    stream->am_buf = NULL;
    --iface->rx_reassembling;
    status = uct_usnic_rx_invoke_am(iface, am_buf->am_id, data,
                                    am_buf->length, &am_buf->release);
    if (status != UCS_INPROGRESS) {
        ucs_mpool_put(am_buf);
    }

    return UCS_OK;
}

/*
 * The padding that made the last datagram of a copied message as long as
 * the others: only there, and with at least a byte of the message before
 * it. Takes it off body_len_p.
 */
static int uct_usnic_rx_unpad(const uct_usnic_hdr_t *hdr, uint8_t type,
                              size_t min_body, size_t *body_len_p)
{
    uint8_t pad;

    if (((type != UCT_USNIC_PKT_AM) && (type != UCT_USNIC_PKT_PUT)) ||
        !(hdr->flags & UCT_USNIC_PKT_FLAG_LAST) ||
        (*body_len_p <= min_body)) {
        return 0;
    }

    pad = *(const uint8_t*)UCS_PTR_BYTE_OFFSET(hdr + 1, *body_len_p - 1);
    if ((pad == 0) || (pad >= (*body_len_p - min_body))) {
        return 0;
    }

    *body_len_p -= pad;
    return 1;
}

/*
 * Check what every datagram starts with: room for the header and min_body
 * more bytes, our protocol version, the expected type, and addressed to
 * this incarnation of the iface. Counts and drops what fails.
 */
static int uct_usnic_rx_hdr_check(uct_usnic_iface_t *iface,
                                  const uct_usnic_hdr_t *hdr, size_t length,
                                  uint8_t type, size_t min_body)
{
    if (ucs_unlikely((length < (sizeof(*hdr) + min_body)) ||
                     (hdr->version != UCT_USNIC_PROTO_VERSION) ||
                     (hdr->type != type))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return 0;
    }

    if (ucs_unlikely(hdr->incarnation != iface->incarnation)) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_STALE);
        return 0;
    }

    return 1;
}

/* A bundle is a whole message of records that fill its body exactly */
static int uct_usnic_rx_bundle_valid(const uct_usnic_hdr_t *hdr,
                                     size_t body_len)
{
    const uct_usnic_bundle_rec_t *rec = (const void*)(hdr + 1);
    size_t offset                     = 0;

    if (!ucs_test_all_flags(hdr->flags, UCT_USNIC_PKT_FLAG_FIRST |
                                        UCT_USNIC_PKT_FLAG_LAST)) {
        return 0;
    }

    while (offset < body_len) {
        if (((body_len - offset) < sizeof(*rec)) ||
            (rec->am_id >= UCT_AM_ID_MAX) || (rec->reserved != 0) ||
            (rec->length > (body_len - offset - sizeof(*rec)))) {
            return 0;
        }

        offset += sizeof(*rec) + rec->length;
        rec     = UCS_PTR_BYTE_OFFSET(hdr + 1, offset);
    }

    return 1;
}

/* Deliver each AM of a bundle; they share the datagram, so no user may
 * keep one (no UCT_CB_PARAM_FLAG_DESC) */
static void uct_usnic_rx_bundle(uct_usnic_iface_t *iface,
                                uct_usnic_rx_stream_t *stream,
                                void *body, size_t body_len)
{
    uct_usnic_bundle_rec_t *rec;
    size_t offset;

    if (ucs_unlikely(stream->am_buf != NULL)) {
        /* The sender never bundles inside a fragmented message */
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return;
    }

    for (offset = 0; offset < body_len;
         offset += sizeof(*rec) + rec->length) {
        rec = UCS_PTR_BYTE_OFFSET(body, offset);
        uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_RECV, rec->am_id,
                           rec + 1, rec->length, "RX: AM (bundled)");
        uct_iface_invoke_am(&iface->super, rec->am_id, rec + 1, rec->length,
                            0);
    }
}

/*
 * Parse and check a datagram of the data channel: AM, PUT, PROBE, GET,
 * GET_REPLY or BUNDLE. The body is what lies between the header and the
 * trailers.
 */
static const uct_usnic_hdr_t *
uct_usnic_rx_parse(uct_usnic_iface_t *iface, void *data, size_t length,
                   const uct_usnic_open_ext_t **open_p,
                   const uct_usnic_ack_ext_t **ack_p, size_t *body_len_p)
{
    const uct_usnic_hdr_t *hdr = data;
    uint8_t type               = UCT_USNIC_PKT_AM;
    size_t open_len = 0, ack_len = 0, min_body = 0;

    if (ucs_likely(length >= sizeof(*hdr))) {
        if (hdr->flags & UCT_USNIC_PKT_FLAG_OPEN) {
            open_len = sizeof(uct_usnic_open_ext_t);
        }
        if (hdr->flags & UCT_USNIC_PKT_FLAG_ACK) {
            ack_len = sizeof(uct_usnic_ack_ext_t);
        }
        switch (hdr->type) {
        case UCT_USNIC_PKT_PUT:
            type     = UCT_USNIC_PKT_PUT;
            min_body = sizeof(uct_usnic_put_ext_t);
            break;
        case UCT_USNIC_PKT_PROBE:
            type     = UCT_USNIC_PKT_PROBE;
            break;
        case UCT_USNIC_PKT_GET:
            type     = UCT_USNIC_PKT_GET;
            min_body = sizeof(uct_usnic_get_ext_t);
            break;
        case UCT_USNIC_PKT_GET_REPLY:
            type     = UCT_USNIC_PKT_GET_REPLY;
            min_body = sizeof(uct_usnic_get_reply_ext_t);
            break;
        case UCT_USNIC_PKT_BUNDLE:
            type     = UCT_USNIC_PKT_BUNDLE;
            min_body = sizeof(uct_usnic_bundle_rec_t);
            break;
        }
    }

    if (!uct_usnic_rx_hdr_check(iface, hdr, length, type,
                                min_body + open_len + ack_len)) {
        return NULL;
    }

    *body_len_p = length - sizeof(*hdr) - open_len - ack_len;
    if (ucs_unlikely((hdr->flags & ~UCT_USNIC_PKT_FLAGS_ALL) ||
                     ((hdr->flags & UCT_USNIC_PKT_FLAG_PADDED) &&
                      !uct_usnic_rx_unpad(hdr, type, min_body,
                                          body_len_p)) ||
                     (hdr->am_id >= ((type == UCT_USNIC_PKT_AM) ?
                                     UCT_AM_ID_MAX : 1)) ||
                     ((type == UCT_USNIC_PKT_PROBE) && (*body_len_p != 0)) ||
                     ((type == UCT_USNIC_PKT_GET) &&
                      (*body_len_p != sizeof(uct_usnic_get_ext_t))) ||
                     ((type == UCT_USNIC_PKT_BUNDLE) &&
                      !uct_usnic_rx_bundle_valid(hdr, *body_len_p)))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return NULL;
    }

    *open_p = (open_len == 0) ? NULL :
              UCS_PTR_BYTE_OFFSET(data, length - open_len);
    *ack_p  = (ack_len == 0) ? NULL :
              UCS_PTR_BYTE_OFFSET(data, length - open_len - ack_len);
    return hdr;
}

void uct_usnic_rx_refused(uct_usnic_iface_t *iface, uint32_t in_addr,
                          uint16_t port, int write, uint32_t rkey_id,
                          uint64_t address, uint32_t length,
                          uct_usnic_md_access_result_t result)
{
    static const uct_usnic_rx_drop_t reasons[2][2] = {
        {UCT_USNIC_RX_DROP_GET_KEY, UCT_USNIC_RX_DROP_GET_RANGE},
        {UCT_USNIC_RX_DROP_PUT_KEY, UCT_USNIC_RX_DROP_PUT_RANGE}
    };
    int bad_range  = (result == UCT_USNIC_MD_ACCESS_BAD_RANGE);
    ucs_time_t now = ucs_get_time();
    char addr_str[INET_ADDRSTRLEN];

    uct_usnic_iface_drop(iface, reasons[!!write][bad_range]);
    if ((iface->put_refused_logged != 0) &&
        (uct_usnic_elapsed(now, iface->put_refused_logged) <
         ucs_time_from_sec(1.0))) {
        ++iface->put_refused_unlogged;
        return;
    }

    ucs_warn("usnic iface %p: refused a remote %s from %s:%u: %s "
             "(key %u, address 0x%" PRIx64 ", %u bytes); %lu more refused "
             "since the previous report", iface, write ? "write" : "read",
             inet_ntop(AF_INET, &in_addr, addr_str, sizeof(addr_str)),
             ntohs(port), bad_range ? "range outside the registered region" :
                         "no live registration with that key",
             rkey_id, address, length, iface->put_refused_unlogged);
    iface->put_refused_logged   = now;
    iface->put_refused_unlogged = 0;
}

/* Apply the next in-order datagram of a remote write, if its key allows */
static void uct_usnic_rx_put(uct_usnic_iface_t *iface,
                             const uct_usnic_rx_stream_t *stream,
                             const void *body, size_t body_len)
{
    uct_usnic_md_t *md = ucs_derived_of(iface->super.md, uct_usnic_md_t);
    const uct_usnic_put_ext_t *put = body;
    size_t data_len                = body_len - sizeof(*put);
    uct_usnic_md_access_result_t result;
    uct_usnic_rkey_t rkey;

    if (ucs_unlikely((put->offset > put->length) ||
                     (data_len > (put->length - put->offset)))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return;
    }

    if (put->length == 0) {
        return; /* Writes nothing, whatever its key */
    }

    rkey.id     = put->rkey_id;
    rkey.secret = put->secret;
    result      = uct_usnic_md_write(md, &rkey, put->address, put->length,
                                     put->offset, put + 1, data_len);
    if (result != UCT_USNIC_MD_ACCESS_OK) {
        uct_usnic_rx_refused(iface, stream->src_in_addr, stream->src_port, 1,
                             put->rkey_id, put->address, put->length, result);
    }
}

/*
 * Act on the next in-order datagram of a stream. Returns UCS_INPROGRESS
 * when the user kept the receive descriptor.
 */
static ucs_status_t
uct_usnic_rx_in_order(uct_usnic_iface_t *iface, uct_usnic_rx_stream_t *stream,
                      uct_usnic_rx_desc_t *desc, const uct_usnic_hdr_t *hdr,
                      size_t body_len)
{
    if (ucs_unlikely(hdr->type == UCT_USNIC_PKT_PROBE)) {
        /* Acknowledged like any packet, nothing to deliver. ep_check asks
         * whether the connection lives: not once this side closed it */
        stream->closed_reply = uct_usnic_iface_peer_closed(iface, stream);
        stream->ack_now     |= stream->closed_reply;
        return UCS_OK;
    }

    stream->closed_reply = 0;
    if (ucs_unlikely(!stream->proven) &&
        (hdr->flags & UCT_USNIC_PKT_FLAG_LAST)) {
        stream->proven = 1;
        ucs_list_del(&stream->lru_list);
        ucs_list_add_tail(&iface->streams_lru[1], &stream->lru_list);
    }

    switch (hdr->type) {
    case UCT_USNIC_PKT_PUT:
        uct_usnic_rx_put(iface, stream, hdr + 1, body_len);
        return UCS_OK;
    case UCT_USNIC_PKT_GET:
        uct_usnic_get_serve(iface, stream, hdr + 1, body_len);
        /* Each read served sends as much of its reply as the window takes:
         * reads queued in one poll kept their ACKs past the requester's
         * RTO, unless the reply took the ACK */
        if (!ucs_list_is_empty(&stream->ack_list) &&
            uct_usnic_rx_ack_due(iface, stream, ucs_get_time())) {
            uct_usnic_rx_send_ack(iface, stream);
        }
        return UCS_OK;
    case UCT_USNIC_PKT_GET_REPLY:
        uct_usnic_get_rx_reply(iface, stream, hdr + 1, body_len);
        return UCS_OK;
    case UCT_USNIC_PKT_BUNDLE:
        uct_usnic_rx_bundle(iface, stream, (void*)(hdr + 1), body_len);
        return UCS_OK;
    }

    return uct_usnic_rx_deliver(iface, stream, desc, hdr, (void*)(hdr + 1),
                                body_len);
}

/*
 * How much of a shared receive resource (reassembly buffers, room for
 * packets out of order) a stream may use. Streams that have not yet
 * delivered a message, which is all a flood of forged opens brings, get
 * half: the streams in use always find the other half.
 */
static UCS_F_ALWAYS_INLINE unsigned
uct_usnic_rx_share(const uct_usnic_rx_stream_t *stream, unsigned cap)
{
    return stream->proven ? cap : ((cap + 1) / 2);
}

/*
 * Whether the stream's next packet may be taken now: the first datagram of
 * a message in several needs a reassembly buffer, and they may all be in
 * use. Refused, it is resent by its sender.
 */
static UCS_F_ALWAYS_INLINE int
uct_usnic_rx_may_take(const uct_usnic_iface_t *iface,
                      const uct_usnic_rx_stream_t *stream,
                      const uct_usnic_hdr_t *hdr)
{
    return ucs_likely((hdr->flags & UCT_USNIC_PKT_FLAG_LAST) ||
                      !(hdr->flags & UCT_USNIC_PKT_FLAG_FIRST) ||
                      (hdr->type != UCT_USNIC_PKT_AM) ||
                      (iface->rx_reassembling <
                       uct_usnic_rx_share(stream,
                                          iface->config.max_reassembly)));
}

/* Deliver the packets kept in the reorder ring that are now in order */
static void uct_usnic_rx_drain_ooo(uct_usnic_iface_t *iface,
                                   uct_usnic_channel_t *channel,
                                   uct_usnic_rx_stream_t *stream)
{
    const uct_usnic_hdr_t *hdr;
    uct_usnic_rx_desc_t *desc;
    unsigned slot;

    while (stream->ooo_count > 0) {
        slot = uct_usnic_rx_ooo_slot(iface, stream->expected_psn);
        desc = stream->ooo[slot];
        if (desc == NULL) {
            break;
        }

        uct_usnic_rx_ooo_take(iface, stream, slot);
        hdr = uct_usnic_rx_desc_data(channel, desc);
        if (ucs_unlikely(!uct_usnic_rx_may_take(iface, stream, hdr))) {
            uct_usnic_channel_rx_desc_put(desc);
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
            break;
        }

        ++stream->expected_psn;
        ++stream->unacked;
        if (uct_usnic_rx_in_order(iface, stream, desc, hdr, desc->length) !=
            UCS_INPROGRESS) {
            uct_usnic_channel_rx_desc_put(desc);
        }
    }
}

/* Keep a packet that arrived ahead of a hole, as far as the caps allow */
static ucs_status_t uct_usnic_rx_keep_ooo(uct_usnic_iface_t *iface,
                                          uct_usnic_rx_stream_t *stream,
                                          uct_usnic_rx_desc_t *desc,
                                          uct_usnic_psn_t psn)
{
    uct_usnic_psn_t ahead = psn - stream->expected_psn;
    unsigned slot         = uct_usnic_rx_ooo_slot(iface, psn);

    if (ahead >= iface->config.window) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_OUT_OF_WINDOW);
        return UCS_OK;
    }

    if ((ahead >= iface->config.ooo_ring_size) ||
        (iface->rx_ooo_count >=
         uct_usnic_rx_share(stream, iface->config.max_ooo))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
        return UCS_OK;
    }

    if (stream->ooo == NULL) {
        stream->ooo = ucs_calloc(iface->config.ooo_ring_size,
                                 sizeof(*stream->ooo), "usnic_rx_ooo");
        if (stream->ooo == NULL) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
            return UCS_OK;
        }
    }

    if (stream->ooo[slot] != NULL) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_DUPLICATE);
        return UCS_OK;
    }

    stream->ooo[slot] = desc;
    ++stream->ooo_count;
    ++iface->rx_ooo_count;
    return UCS_INPROGRESS;
}

ucs_status_t uct_usnic_rx_data(uct_usnic_channel_t *channel,
                               uct_usnic_rx_desc_t *desc, void *data,
                               size_t length)
{
    uct_usnic_iface_t *iface = ucs_derived_of(channel->iface,
                                              uct_usnic_iface_t);
    const uct_usnic_open_ext_t *open;
    const uct_usnic_ack_ext_t *ack;
    const uct_usnic_hdr_t *hdr;
    uct_usnic_rx_stream_t *stream;
    ucs_status_t status;
    size_t body_len;
    uct_usnic_psn_t psn;
    ucs_time_t now;

    hdr = uct_usnic_rx_parse(iface, data, length, &open, &ack, &body_len);
    if (ucs_unlikely(hdr == NULL)) {
        return UCS_OK;
    }

    now    = channel->rx_time;
    stream = uct_usnic_rx_stream_get(iface, hdr, open, now);
    if (ucs_unlikely(stream == NULL)) {
        return UCS_OK;
    }

    /* The most recently active stream goes last in line for reclaiming */
    stream->last_time = now;
    if (stream->lru_list.next != &iface->streams_lru[stream->proven]) {
        ucs_list_del(&stream->lru_list);
        ucs_list_add_tail(&iface->streams_lru[stream->proven],
                          &stream->lru_list);
    }

    /* Even a duplicate may carry news for the reverse direction */
    if (ack != NULL) {
        uct_usnic_tx_handle_ack(iface, ack, uct_usnic_rx_stream_peer(stream),
                                0, 0, now);
    }

    UCT_USNIC_IFACE_STAT_ADD(iface, RX_PACKETS, 1);
    psn = hdr->psn;
    ucs_trace_data("stream %u: rx psn %u (expected %u) length %zu flags 0x%x",
                   stream->id, psn, stream->expected_psn, body_len,
                   hdr->flags);

    uct_usnic_rx_schedule_ack(iface, stream, now);
    if (hdr->flags & UCT_USNIC_PKT_FLAG_ACK_REQ) {
        stream->ack_now = 1;
    }

    if (ucs_likely(psn == stream->expected_psn)) {
        if (ucs_unlikely(!uct_usnic_rx_may_take(iface, stream, hdr))) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
            return UCS_OK;
        }

        ++stream->expected_psn;
        ++stream->unacked;
        status = uct_usnic_rx_in_order(iface, stream, desc, hdr, body_len);
        if (ucs_unlikely(stream->ooo_count > 0)) {
            uct_usnic_rx_drain_ooo(iface, channel, stream);
        }
        return status;
    }

    /* A duplicate or a hole: tell the sender at once */
    stream->ack_now = 1;
    if (UCT_USNIC_PSN_LT(psn, stream->expected_psn)) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_DUPLICATE);
        return UCS_OK;
    }

    desc->length = body_len;
    return uct_usnic_rx_keep_ooo(iface, stream, desc, psn);
}

void uct_usnic_rx_ack_take(uct_usnic_rx_stream_t *stream,
                           uct_usnic_ack_ext_t *ack)
{
    ack->ep_id     = stream->src_ep_id;
    ack->stream_id = stream->id;
    ack->psn       = stream->expected_psn - 1;
    ack->token     = stream->token;

    stream->unacked = 0;
    stream->ack_now = 0;
    ucs_list_del(&stream->ack_list);
    ucs_list_head_init(&stream->ack_list);
}

/* A stream's record in a standalone ACK; the stream owes nothing after */
static void uct_usnic_rx_ack_rec(uct_usnic_iface_t *iface,
                                 uct_usnic_rx_stream_t *stream,
                                 uct_usnic_ack_rec_t *rec)
{
    unsigned reach = iface->config.ooo_ring_size;
    unsigned i;

    rec->flags = 0;
    if (ucs_unlikely(stream->closed_reply) &&
        uct_usnic_iface_peer_closed(iface, stream)) {
        rec->flags = UCT_USNIC_ACK_FLAG_CLOSED;
    }

    rec->sack = 0;
    if (stream->ooo_count > 0) {
        for (i = 0; i < ucs_min(64, reach - 1); ++i) {
            if (stream->ooo[uct_usnic_rx_ooo_slot(
                        iface, stream->expected_psn + 1 + i)] != NULL) {
                rec->sack |= UCS_BIT(i);
            }
        }
    }

    uct_usnic_rx_ack_take(stream, &rec->ack);
}

static UCS_F_ALWAYS_INLINE int
uct_usnic_rx_ack_same_peer(const uct_usnic_rx_stream_t *a,
                           const uct_usnic_rx_stream_t *b)
{
    return (a->ack_fi_addr == b->ack_fi_addr) &&
           (uct_usnic_rx_stream_peer(a) == uct_usnic_rx_stream_peer(b));
}

/*
 * One standalone ACK datagram for stream, and in it the ACKs of other
 * streams from the same peer iface that owe one, due or not: a peer sending
 * on many eps gets one ACK datagram for many streams (with 1,000 eps, each
 * stream's next packet came so late that every packet earned its own ACK).
 * Only streams scheduled after this one are looked at, a bounded number of
 * them, so that a list of streams of many peers costs no more than before.
 */
static void uct_usnic_rx_send_ack(uct_usnic_iface_t *iface,
                                  uct_usnic_rx_stream_t *stream)
{
    uct_usnic_channel_t *channel   = &iface->channels[UCT_USNIC_CHANNEL_PRIO];
    uct_usnic_ack_packet_t *packet = UCS_PTR_BYTE_OFFSET(iface->ack_buf,
                                                         channel->prefix_size);
    unsigned max_recs              = iface->config.ack_max_recs;
    unsigned scan                  = UCT_USNIC_ACK_SCAN;
    uct_usnic_rx_stream_t *other;
    ucs_list_link_t *link;
    unsigned count;
    ssize_t ret;

    packet->hdr.version          = UCT_USNIC_PROTO_VERSION;
    packet->hdr.type             = UCT_USNIC_PKT_ACK;
    packet->hdr.flags            = 0;
    packet->hdr.am_id            = 0;
    packet->hdr.incarnation      = uct_usnic_rx_stream_peer(stream);
    packet->hdr.stream_id        = 0;
    packet->hdr.psn              = 0;
    packet->hdr.token            = 0;
    packet->body.src_incarnation = iface->incarnation;

    link = stream->ack_list.next;
    uct_usnic_rx_ack_rec(iface, stream, &packet->recs[0]);
    count = 1;
    while ((count < max_recs) && (scan-- > 0) &&
           (link != &iface->ack_streams)) {
        other = ucs_container_of(link, uct_usnic_rx_stream_t, ack_list);
        link  = link->next;
        if (uct_usnic_rx_ack_same_peer(other, stream)) {
            uct_usnic_rx_ack_rec(iface, other, &packet->recs[count++]);
        }
    }

    UCT_USNIC_IFACE_STAT_ADD(iface, TX_ACKS, count);
    UCT_USNIC_IFACE_STAT_ADD(iface, TX_ACK_DGRAMS, 1);

    /* A lost ACK is recovered by the protocol: no retry here */
    ret = uct_usnic_channel_send(channel, iface->ack_buf,
                                 ucs_offsetof(uct_usnic_ack_packet_t, recs) +
                                 (count * sizeof(packet->recs[0])),
                                 stream->ack_fi_addr);
    if ((ret != 0) && (ret != -FI_EAGAIN)) {
        ucs_diag("%s: sending an ACK failed: %s", channel->name,
                 fi_strerror(-ret));
    }
}

unsigned uct_usnic_rx_send_acks(uct_usnic_iface_t *iface, int all,
                                ucs_time_t now)
{
    ucs_list_link_t *link  = iface->ack_streams.next;
    unsigned count         = 0;
    uct_usnic_rx_stream_t *stream;
    ucs_list_link_t *prev;

    /* Sending takes the stream and maybe some after it off the list, never
     * one before it */
    while (link != &iface->ack_streams) {
        stream = ucs_container_of(link, uct_usnic_rx_stream_t, ack_list);
        if (!all && !uct_usnic_rx_ack_due(iface, stream, now)) {
            link = link->next;
            continue;
        }

        prev = link->prev;
        uct_usnic_rx_send_ack(iface, stream);
        link = prev->next;
        ++count;
    }

    return count;
}

ucs_status_t uct_usnic_rx_prio(uct_usnic_channel_t *channel,
                               uct_usnic_rx_desc_t *desc, void *data,
                               size_t length)
{
    uct_usnic_iface_t *iface   = ucs_derived_of(channel->iface,
                                                uct_usnic_iface_t);
    const uct_usnic_hdr_t *hdr = data;
    const uct_usnic_ack_body_t *body;
    const uct_usnic_ack_rec_t *rec, *end;
    size_t recs_len;

    if (!uct_usnic_rx_hdr_check(iface, hdr, length, UCT_USNIC_PKT_ACK,
                                sizeof(*body) + sizeof(*rec))) {
        return UCS_OK;
    }

    /* Whole records, and none of the header's stream fields */
    recs_len = length - sizeof(*hdr) - sizeof(*body);
    if (ucs_unlikely(((recs_len % sizeof(*rec)) != 0) ||
                     (hdr->flags != 0) || (hdr->am_id != 0) ||
                     (hdr->stream_id != 0) || (hdr->psn != 0) ||
                     (hdr->token != 0))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return UCS_OK;
    }

    body = (const uct_usnic_ack_body_t*)(hdr + 1);
    end  = UCS_PTR_BYTE_OFFSET(body + 1, recs_len);
    for (rec = (const void*)(body + 1); rec < end; ++rec) {
        if (ucs_unlikely(rec->flags & ~UCT_USNIC_ACK_FLAGS_ALL)) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
            continue;
        }

        uct_usnic_tx_handle_ack(iface, &rec->ack, body->src_incarnation,
                                rec->sack, rec->flags, channel->rx_time);
    }

    return UCS_OK;
}

void uct_usnic_am_buf_release(uct_recv_desc_t *self, void *desc)
{
    ucs_mpool_put(ucs_container_of(self, uct_usnic_am_buf_t, release));
}
