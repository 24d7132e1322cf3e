/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_tx.h"
#include "usnic_bundle.h"
#include "usnic_ep.h"
#include "usnic_get.h"
#include "usnic_rx.h"

#include <ucs/debug/log.h>

#include <rdma/fi_errno.h>


static UCS_F_ALWAYS_INLINE void *
uct_usnic_tx_desc_dgram(uct_usnic_iface_t *iface, uct_usnic_tx_desc_t *desc)
{
    return UCS_PTR_BYTE_OFFSET(uct_usnic_tx_desc_hdr(iface, desc),
                               -iface->channels[UCT_USNIC_CHANNEL_DATA]
                                        .prefix_size);
}

/* Where desc's trailers go: behind what of the datagram is in the buffer */
static UCS_F_ALWAYS_INLINE void *
uct_usnic_tx_desc_tail(uct_usnic_iface_t *iface, uct_usnic_tx_desc_t *desc)
{
    return UCS_PTR_BYTE_OFFSET(uct_usnic_tx_desc_hdr(iface, desc),
                               desc->length - desc->zcopy.length);
}

/* The pieces of desc's datagram: the buffer, or with user memory, the
 * buffer's header, the user's pieces, and the buffer's trailers */
static void uct_usnic_tx_desc_pieces(uct_usnic_iface_t *iface,
                                     uct_usnic_tx_desc_t *desc,
                                     uct_usnic_dgram_t *dgram)
{
    size_t prefix = iface->channels[UCT_USNIC_CHANNEL_DATA].prefix_size;
    unsigned n    = desc->zcopy.iovcnt;

    dgram->iov[0].iov_base = uct_usnic_tx_desc_dgram(iface, desc);
    dgram->length          = prefix + desc->length;
    if (ucs_likely(n == 0)) {
        dgram->iov[0].iov_len = dgram->length;
        dgram->iovcnt         = 1;
        return;
    }

    dgram->iov[0].iov_len     = prefix + desc->zcopy.head;
    memcpy(&dgram->iov[1], desc->zcopy.iov, sizeof(*dgram->iov) * n);
    dgram->iov[n + 1].iov_base = UCS_PTR_BYTE_OFFSET(
            uct_usnic_tx_desc_hdr(iface, desc), desc->zcopy.head);
    dgram->iov[n + 1].iov_len  = desc->length - desc->zcopy.head -
                                 desc->zcopy.length;
    dgram->iovcnt              = n + 2;
}

static UCS_F_ALWAYS_INLINE void
uct_usnic_tx_sent(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc,
                  ucs_time_t now)
{
    if (ucs_unlikely(desc->flags & UCT_USNIC_TX_DESC_FLAG_UNSENT)) {
        desc->flags &= ~UCT_USNIC_TX_DESC_FLAG_UNSENT;
        --ep->unsent;
    }
    desc->send_time = now;
}

/* The ep's timer fires at the wheel's next slot */
static void uct_usnic_tx_timer_soon(uct_usnic_iface_t *iface,
                                    uct_usnic_ep_t *ep)
{
    ucs_wtimer_remove(&iface->tx_wheel, &ep->timer);
    ucs_wtimer_add(&iface->tx_wheel, &ep->timer, iface->tx_wheel.res);
}

/* Kept in the window: the timer sends it as soon as it can */
static void uct_usnic_tx_unsent(uct_usnic_iface_t *iface, uct_usnic_ep_t *ep,
                                uct_usnic_tx_desc_t *desc)
{
    if (!(desc->flags & UCT_USNIC_TX_DESC_FLAG_UNSENT)) {
        desc->flags |= UCT_USNIC_TX_DESC_FLAG_UNSENT;
        ++ep->unsent;
    }
    desc->send_time = 0;
    uct_usnic_tx_timer_soon(iface, ep);
}

/* Send one datagram of the window (again) */
static void uct_usnic_tx_send(uct_usnic_iface_t *iface, uct_usnic_ep_t *ep,
                              uct_usnic_tx_desc_t *desc, ucs_time_t now)
{
    uct_usnic_channel_t *channel = &iface->channels[UCT_USNIC_CHANNEL_DATA];
    uct_usnic_dgram_t dgram;
    ssize_t ret;

    if (ucs_likely(desc->zcopy.iovcnt == 0)) {
        ret = uct_usnic_channel_send(channel,
                                     uct_usnic_tx_desc_dgram(iface, desc),
                                     desc->length, ep->peer_fi_addr);
    } else {
        uct_usnic_tx_desc_pieces(iface, desc, &dgram);
        ret = (uct_usnic_channel_send_burst(channel, &dgram, 1,
                                            ep->peer_fi_addr) == 1) ?
              0 : -FI_EAGAIN;
    }

    if (ucs_likely(ret == 0)) {
        uct_usnic_tx_sent(ep, desc, now);
        return;
    }

    if (ret != -FI_EAGAIN) {
        ucs_diag("%s: sending psn %u failed: %s", channel->name, desc->psn,
                 fi_strerror(-ret));
    }
    uct_usnic_tx_unsent(iface, ep, desc);
}

/* Send a datagram that went before, or that the send queue refused: the
 * memory of a peer's read may have been deregistered since */
static void uct_usnic_tx_send_again(uct_usnic_iface_t *iface,
                                    uct_usnic_ep_t *ep,
                                    uct_usnic_tx_desc_t *desc, ucs_time_t now)
{
    int locked = ucs_unlikely(desc->flags & UCT_USNIC_TX_DESC_FLAG_READ) &&
                 uct_usnic_get_reply_resend_begin(ep, desc);

    uct_usnic_tx_send(iface, ep, desc, now);
    if (locked) {
        uct_usnic_md_read_end(ucs_derived_of(iface->super.md, uct_usnic_md_t));
    }
}

/* The datagram after desc in the window, NULL after the newest */
static UCS_F_ALWAYS_INLINE uct_usnic_tx_desc_t *
uct_usnic_tx_desc_next(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc)
{
    return (ep->window.ptail == &desc->queue.next) ? NULL :
           ucs_container_of(desc->queue.next, uct_usnic_tx_desc_t, queue);
}

void uct_usnic_tx_send_queued(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *first)
{
    uct_usnic_iface_t *iface     = uct_usnic_ep_iface(ep);
    uct_usnic_channel_t *channel = &iface->channels[UCT_USNIC_CHANNEL_DATA];
    ucs_time_t now               = ucs_get_time();
    uct_usnic_dgram_t dgrams[UCT_USNIC_CHANNEL_MAX_BURST];
    uct_usnic_tx_desc_t *descs[UCT_USNIC_CHANNEL_MAX_BURST];
    uct_usnic_tx_desc_t *desc;
    unsigned count, sent, i;

    /* Messages held back go first, in the same burst */
    if (ucs_unlikely(ep->held != NULL)) {
        first = uct_usnic_bundle_take_held(ep);
    }

    desc             = uct_usnic_tx_desc_next(ep, first);
    ep->last_tx_time = now;
    if (ucs_likely(desc == NULL)) {
        uct_usnic_tx_send(iface, ep, first, now); /* A single datagram */
        return;
    }

    desc = first;
    do {
        for (count = 0;
             (desc != NULL) && (count < UCT_USNIC_CHANNEL_MAX_BURST);
             ++count) {
            descs[count] = desc;
            uct_usnic_tx_desc_pieces(iface, desc, &dgrams[count]);
            desc         = uct_usnic_tx_desc_next(ep, desc);
        }

        sent = uct_usnic_channel_send_burst(channel, dgrams, count,
                                            ep->peer_fi_addr);
        for (i = 0; i < count; ++i) {
            if (i < sent) {
                uct_usnic_tx_sent(ep, descs[i], now);
            } else {
                uct_usnic_tx_unsent(iface, ep, descs[i]);
            }
        }
    } while ((desc != NULL) && (sent == count));

    /* What the send queue refused waits for the timer, in order */
    for (; desc != NULL; desc = uct_usnic_tx_desc_next(ep, desc)) {
        uct_usnic_tx_unsent(iface, ep, desc);
    }
}

/*
 * Let a new packet carry the ACK the reverse stream owes, when there is
 * room for it (and for an open trailer still to come). An ACK that must
 * report holes, or answer a probe of a closed stream, goes standalone: only
 * it carries the selective-ACK bitmap and the closed flag. One the sender
 * asked for at once (ACK_REQ) or that answers a duplicate rides along: the
 * packet leaves now.
 */
static int uct_usnic_tx_add_ack(uct_usnic_iface_t *iface,
                                uct_usnic_rx_stream_t *stream,
                                uct_usnic_tx_desc_t *desc)
{
    uct_usnic_ack_ext_t *ack;

    if (ucs_list_is_empty(&stream->ack_list) || (stream->ooo_count > 0) ||
        stream->closed_reply ||
        ((desc->length + sizeof(*ack) + sizeof(uct_usnic_open_ext_t)) >
         iface->config.mtu)) {
        return 0;
    }

    ack = uct_usnic_tx_desc_tail(iface, desc);
    uct_usnic_rx_ack_take(stream, ack);
    desc->length += sizeof(*ack);
    UCT_USNIC_IFACE_STAT_ADD(iface, TX_PIGGY_ACKS, 1);
    return 1;
}

static void uct_usnic_tx_open_fill(uct_usnic_iface_t *iface,
                                   const uct_usnic_ep_t *ep,
                                   uct_usnic_open_ext_t *open)
{
    open->src_incarnation = iface->incarnation;
    open->src_ep_id       = ep->id;
    open->src_ep_serial   = ep->serial;
    open->src_in_addr     = iface->dev_addr.in_addr;
    open->src_prio_port   =
            iface->channels[UCT_USNIC_CHANNEL_PRIO].addr.sin_port;
    open->src_data_port   =
            iface->channels[UCT_USNIC_CHANNEL_DATA].addr.sin_port;
    open->first_psn       = ep->first_psn;
    open->src_open_key    = iface->open_key;
    open->dst_open_key    = ep->peer_open_key;
}

/* The open trailer goes last, after any ACK trailer; there is always room
 * for it */
static void uct_usnic_tx_add_open(uct_usnic_iface_t *iface,
                                  const uct_usnic_ep_t *ep,
                                  uct_usnic_tx_desc_t *desc)
{
    uct_usnic_tx_open_fill(iface, ep, uct_usnic_tx_desc_tail(iface, desc));
    desc->length += sizeof(uct_usnic_open_ext_t);
}

/*
 * The peer may have reclaimed the stream (quiet for long, or a peer short
 * of streams): what is unacknowledged goes out again as the opening of a
 * new one, which starts at the oldest of it. A peer that still has the
 * stream takes the open trailers as those of the stream it has.
 */
static void uct_usnic_tx_reopen(uct_usnic_iface_t *iface, uct_usnic_ep_t *ep)
{
    uct_usnic_tx_desc_t *desc;
    uct_usnic_hdr_t *hdr;

    ucs_debug("ep %p: no ACK from the peer's stream %u: opening it again "
              "from psn %u", ep, ep->peer_stream_id, ep->acked_psn + 1);
    UCT_USNIC_EP_STAT_ADD(ep, TX_REOPENS, 1);
    ep->peer_stream_id = UCT_USNIC_STREAM_ID_NONE;
    ep->first_psn      = ep->acked_psn + 1;
    ucs_queue_for_each(desc, &ep->window, queue) {
        hdr            = uct_usnic_tx_desc_hdr(iface, desc);
        hdr->stream_id = UCT_USNIC_STREAM_ID_NONE;
        if (hdr->flags & UCT_USNIC_PKT_FLAG_OPEN) {
            uct_usnic_tx_open_fill(iface, ep,
                                   UCS_PTR_BYTE_OFFSET(
                                           uct_usnic_tx_desc_tail(iface, desc),
                                           -sizeof(uct_usnic_open_ext_t)));
        } else {
            hdr->flags |= UCT_USNIC_PKT_FLAG_OPEN;
            uct_usnic_tx_add_open(iface, ep, desc);
        }
    }
}

void uct_usnic_tx_queue_zcopy(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc,
                              uint8_t type, uint8_t am_id, uint8_t flags,
                              size_t body_length)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_hdr_t *hdr     = uct_usnic_tx_desc_hdr(iface, desc);

    /* What was posted before goes before */
    if (ucs_unlikely(ep->bundle != NULL)) {
        uct_usnic_bundle_send(ep);
    }

    hdr->version     = UCT_USNIC_PROTO_VERSION;
    hdr->type        = type;
    hdr->am_id       = am_id;
    hdr->incarnation = ep->peer_incarnation;
    hdr->stream_id   = ep->peer_stream_id;
    hdr->psn         = ep->next_psn++;
    hdr->token       = ep->token;
    desc->zcopy.head = sizeof(*hdr) + body_length;
    desc->length     = desc->zcopy.head + desc->zcopy.length;

    if ((ep->ack_stream != NULL) &&
        uct_usnic_tx_add_ack(iface, ep->ack_stream, desc)) {
        flags |= UCT_USNIC_PKT_FLAG_ACK;
    }

    if (ep->peer_stream_id == UCT_USNIC_STREAM_ID_NONE) {
        flags |= UCT_USNIC_PKT_FLAG_OPEN;
        uct_usnic_tx_add_open(iface, ep, desc);
    }

    /* Once the window cannot take another message, the sender waits for
     * this ACK: the receiver must not hold it back */
    if (!uct_usnic_ep_window_fits(ep, 1 + iface->config.max_bcopy_packets)) {
        flags |= UCT_USNIC_PKT_FLAG_ACK_REQ;
    }

    hdr->flags    = flags;
    desc->psn     = hdr->psn;
    desc->flags   = 0;
    desc->resends = 0;

    uct_usnic_ep_activate(ep);
    ++ep->tx_count;
    ++iface->tx_outstanding;
    UCT_USNIC_EP_STAT_ADD(ep, TX_PACKETS, 1);
    iface->sent_since_progress = 1;
    ucs_queue_push(&ep->window, &desc->queue);

    ucs_trace_data("ep %p: tx psn %u length %u flags 0x%x", ep, desc->psn,
                   desc->length, flags);
}

/* The peer has the datagram, or nobody will: with its message's last one,
 * the user's memory is free */
static void uct_usnic_tx_desc_release(uct_usnic_iface_t *iface,
                                      uct_usnic_ep_t *ep,
                                      uct_usnic_tx_desc_t *desc,
                                      ucs_status_t status)
{
    uct_completion_t *comp = desc->zcopy.comp;
    uint8_t flags          = desc->flags;

    if (flags & UCT_USNIC_TX_DESC_FLAG_UNSENT) {
        --ep->unsent;
    }
    --iface->tx_outstanding;
    ucs_mpool_put_inline(desc);
    --ep->tx_count;
    uct_usnic_ep_deactivate(ep);
    if (flags & UCT_USNIC_TX_DESC_FLAG_AWAITED) {
        --iface->tx_awaited;
    }
    if (comp != NULL) {
        uct_invoke_completion(comp, status);
    }
}

/* A flush waits for the ACK of the last packet sent before it, and for the
 * data of the reads requested before it */
void uct_usnic_tx_flush_complete(uct_usnic_ep_t *ep, int all,
                                 ucs_status_t status)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_flush_req_t *req;

    while (!ucs_queue_is_empty(&ep->flush_reqs)) {
        req = ucs_queue_head_elem_non_empty(&ep->flush_reqs,
                                            uct_usnic_flush_req_t, queue);
        if (!all && (UCT_USNIC_PSN_GT(req->psn, ep->acked_psn) ||
                     uct_usnic_get_before(ep, req->psn))) {
            break;
        }

        ucs_queue_pull_non_empty(&ep->flush_reqs);
        uct_invoke_completion(req->comp, status);
        ucs_mpool_put_inline(req);
        --iface->tx_outstanding;
        --iface->tx_awaited;
    }
}

void uct_usnic_tx_window_purge(uct_usnic_ep_t *ep, ucs_status_t status)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_tx_desc_t *desc;
    ucs_queue_head_t window;

    uct_usnic_bundle_discard(ep);

    /* Completions may send again: those are not purged */
    ucs_queue_head_init(&window);
    ucs_queue_splice(&window, &ep->window);
    ep->acked_psn = ep->next_psn - 1;
    while (!ucs_queue_is_empty(&window)) {
        desc = ucs_queue_pull_elem_non_empty(&window, uct_usnic_tx_desc_t,
                                             queue);
        uct_usnic_tx_desc_release(iface, ep, desc, status);
    }
    uct_usnic_get_purge(ep, status);
    uct_usnic_tx_flush_complete(ep, 1, status);
}

static void uct_usnic_tx_rto_reset(uct_usnic_iface_t *iface,
                                   uct_usnic_ep_t *ep)
{
    ep->rto = ucs_min(ucs_max(ep->srtt + 4 * ep->rttvar,
                              iface->config.rto_min),
                      iface->config.rto_max);
}

/* RFC 6298 estimator, in ucs_time_t units */
static void uct_usnic_tx_rtt_sample(uct_usnic_iface_t *iface,
                                    uct_usnic_ep_t *ep, ucs_time_t rtt)
{
    ucs_time_t delta;

    if (ep->srtt == 0) {
        ep->srtt   = rtt;
        ep->rttvar = rtt / 2;
    } else {
        delta      = (rtt > ep->srtt) ? (rtt - ep->srtt) : (ep->srtt - rtt);
        ep->rttvar = (3 * ep->rttvar + delta) / 4;
        ep->srtt   = (7 * ep->srtt + rtt) / 8;
    }

    uct_usnic_tx_rto_reset(iface, ep);
}

/* Additive increase: slow start below ssthresh, then one more packet per
 * window's worth of ACKed packets */
static void uct_usnic_tx_cwnd_grow(uct_usnic_iface_t *iface,
                                   uct_usnic_ep_t *ep, unsigned acked)
{
    if (ep->cwnd < ep->ssthresh) {
        ep->cwnd += acked;
    } else {
        ep->cwnd_acked += acked;
        if (ep->cwnd_acked >= ep->cwnd) {
            ep->cwnd_acked -= ep->cwnd;
            ++ep->cwnd;
        }
    }

    ep->cwnd = ucs_min(ep->cwnd, iface->config.window);
}

/*
 * Multiplicative decrease, once per window of loss. A timeout means the
 * path is congested or gone: back to the minimum. A hole reported by a
 * selective ACK, with later packets arriving, is as likely random loss:
 * shrink by a quarter, not below the initial window, so that a lossy but
 * uncongested link keeps its throughput.
 */
static void uct_usnic_tx_cwnd_loss(uct_usnic_iface_t *iface,
                                   uct_usnic_ep_t *ep, int timeout)
{
    if (!timeout && UCT_USNIC_PSN_LE(ep->acked_psn, ep->recovery_psn)) {
        return; /* Already reacting to this window's loss */
    }

    if (timeout) {
        ep->ssthresh = ucs_max(ep->cwnd / 2, iface->config.cwnd_min);
        ep->cwnd     = iface->config.cwnd_min;
    } else {
        ep->ssthresh = ucs_max(ep->cwnd - (ep->cwnd / 4),
                               iface->config.cwnd_init);
        ep->cwnd     = ucs_min(ep->cwnd, ep->ssthresh);
    }
    ep->cwnd_acked   = 0;
    ep->recovery_psn = ep->next_psn - 1;
}

static void uct_usnic_tx_resend(uct_usnic_iface_t *iface, uct_usnic_ep_t *ep,
                                uct_usnic_tx_desc_t *desc, ucs_time_t now)
{
    ucs_trace_data("ep %p: resend psn %u (resend %u)", ep, desc->psn,
                   desc->resends + 1);
    ++desc->resends;
    UCT_USNIC_EP_STAT_ADD(ep, TX_RESENDS, 1);
    uct_usnic_tx_send_again(iface, ep, desc, now);
}

/* A datagram's bit in a selective ACK (UCT_USNIC_SACK_RANGE or more: none):
 * bit i stands for acked_psn + 2 + i */
static UCS_F_ALWAYS_INLINE uct_usnic_psn_t
uct_usnic_tx_sack_offset(const uct_usnic_ep_t *ep,
                         const uct_usnic_tx_desc_t *desc)
{
    return desc->psn - ep->acked_psn - 2;
}

/*
 * Selective ACK: mark what arrived beyond the first hole, and resend every
 * hole below the highest PSN that arrived, once a round trip after it was
 * sent. A resent copy is known lost once a datagram sent after it has
 * arrived (delivered: the newest send time among what the peer is known to
 * have); resent again a round trip and its variance after it went, a copy
 * still queued behind a window's worth of segmentation-offload runs at the
 * receiver went twice, for half the resends of a 1% loss stream. The marks
 * reach 64 datagrams past the hole only: without news of later datagrams,
 * twice that wait.
 */
static void uct_usnic_tx_handle_sack(uct_usnic_iface_t *iface,
                                     uct_usnic_ep_t *ep, uint64_t sack,
                                     ucs_time_t delivered, ucs_time_t now)
{
    uct_usnic_psn_t highest = ep->acked_psn + 2 + ucs_ilog2(sack);
    unsigned budget         = iface->config.max_resend;
    ucs_time_t resent_wait  = 2 * (ep->srtt + 4 * ep->rttvar);
    uct_usnic_tx_desc_t *desc;
    uct_usnic_psn_t offset;

    ucs_queue_for_each(desc, &ep->window, queue) {
        if (UCT_USNIC_PSN_GT(desc->psn, highest) || (desc == ep->held)) {
            break;
        }

        offset = uct_usnic_tx_sack_offset(ep, desc);
        if ((offset < UCT_USNIC_SACK_RANGE) && (sack & UCS_BIT(offset))) {
            desc->flags |= UCT_USNIC_TX_DESC_FLAG_SACKED;
        }
        if (desc->flags & UCT_USNIC_TX_DESC_FLAG_SACKED) {
            delivered = ucs_max(delivered, desc->send_time);
        }
    }

    ucs_queue_for_each(desc, &ep->window, queue) {
        if (UCT_USNIC_PSN_GT(desc->psn, highest) || (budget == 0) ||
            (desc == ep->held)) {
            break;
        }

        if (!(desc->flags & UCT_USNIC_TX_DESC_FLAG_SACKED) &&
            (uct_usnic_elapsed(now, desc->send_time) > ep->srtt) &&
            ((desc->resends == 0) || (desc->send_time < delivered) ||
             (uct_usnic_elapsed(now, desc->send_time) > resent_wait))) {
            uct_usnic_tx_cwnd_loss(iface, ep, 0);
            uct_usnic_tx_resend(iface, ep, desc, now);
            --budget;
        }
    }
}

void uct_usnic_tx_handle_ack(uct_usnic_iface_t *iface,
                             const uct_usnic_ack_ext_t *ack,
                             uint32_t src_incarnation, uint64_t sack,
                             uint8_t flags, ucs_time_t now)
{
    uct_usnic_psn_t ack_psn = ack->psn;
    ucs_time_t sent_time    = 0;
    ucs_time_t delivered    = 0;
    int clean_sample        = 1;
    unsigned acked          = 0;
    uct_usnic_tx_desc_t *desc;
    uct_usnic_ep_t *ep;

    if (!ucs_ptr_array_lookup(&iface->eps, ack->ep_id, ep) ||
        (ep->peer_incarnation != src_incarnation)) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_STREAM);
        return;
    }

    /* Only the peer has seen the token; and the stream the ep sends to,
     * once known, never changes */
    if ((ack->token != ep->token) ||
        ((ep->peer_stream_id != UCT_USNIC_STREAM_ID_NONE) &&
         (ack->stream_id != ep->peer_stream_id))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_FORGED);
        return;
    }

    if (ack->stream_id == UCT_USNIC_STREAM_ID_NONE) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return;
    }

    if (UCT_USNIC_PSN_GE(ack_psn, uct_usnic_ep_unposted_psn(ep))) {
        /* Acknowledges what was never sent */
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return;
    }

    if (ucs_unlikely(flags & UCT_USNIC_ACK_FLAG_CLOSED)) {
        /* Our probe found the peer with no ep to us any more */
        uct_usnic_ep_fail(ep, UCS_ERR_CONNECTION_RESET);
    }

    if (UCT_USNIC_PSN_LT(ack_psn, ep->acked_psn)) {
        /* Overtaken by a later ACK: nothing new */
        return;
    }

    UCT_USNIC_EP_STAT_ADD(ep, RX_ACKS, 1);
    ep->peer_stream_id = ack->stream_id;

    while (!ucs_queue_is_empty(&ep->window)) {
        desc = ucs_queue_head_elem_non_empty(&ep->window, uct_usnic_tx_desc_t,
                                             queue);
        if (UCT_USNIC_PSN_GT(desc->psn, ack_psn)) {
            break;
        }

        /* Karn: an ACK that covers a resent packet, or one held behind a
         * hole, says nothing about the round trip */
        if ((desc->resends != 0) || (desc->send_time == 0) ||
            (desc->flags & UCT_USNIC_TX_DESC_FLAG_SACKED)) {
            clean_sample = 0;
        }
        sent_time = desc->send_time;
        delivered = ucs_max(delivered, sent_time);

        ucs_queue_pull_non_empty(&ep->window);
        uct_usnic_tx_desc_release(iface, ep, desc, UCS_OK);
        ++acked;
    }

    if (acked > 0) {
        ep->progress_time = now;
    }

    /* One sample per ACK, from the newest packet it covers. Progress
     * means the path works: drop the backoff of earlier timeouts */
    if ((acked > 0) && clean_sample) {
        uct_usnic_tx_rtt_sample(iface, ep,
                                uct_usnic_elapsed(now, sent_time));
    } else if (acked > 0) {
        uct_usnic_tx_rto_reset(iface, ep);
    }

    ep->acked_psn = ack_psn;
    uct_usnic_tx_cwnd_grow(iface, ep, acked);
    if ((ep->tx_count > 0) && (sack != 0)) {
        uct_usnic_tx_handle_sack(iface, ep, sack, delivered, now);
    }

    uct_usnic_tx_flush_complete(ep, 0, UCS_OK);
    ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
}

/* The peer acknowledged nothing new for the peer timeout */
static UCS_F_ALWAYS_INLINE int
uct_usnic_tx_ep_timed_out(const uct_usnic_iface_t *iface,
                          const uct_usnic_ep_t *ep, ucs_time_t now)
{
    return uct_usnic_elapsed(now, ep->progress_time) > iface->config.timeout;
}

/* What selective ACKs said the peer has is advice, not a promise: the peer
 * may have dropped what it kept out of order, or the ACKs were forged */
static void uct_usnic_tx_forget_sacks(uct_usnic_ep_t *ep)
{
    uct_usnic_tx_desc_t *desc;

    ucs_queue_for_each(desc, &ep->window, queue) {
        desc->flags &= ~UCT_USNIC_TX_DESC_FLAG_SACKED;
    }
}

/*
 * Tail-loss probe: the newest datagram the peer is not known to have, resent
 * once with ACK_REQ. The ACK it draws tells at once what is missing, where
 * waiting for the retransmission timeout (at least RTO_MIN, 1 ms by default)
 * made each burst lost at its tail cost dozens of round trips.
 */
static unsigned uct_usnic_tx_tail_probe(uct_usnic_iface_t *iface,
                                        uct_usnic_ep_t *ep, ucs_time_t now)
{
    uct_usnic_tx_desc_t *desc, *tail = NULL;

    ucs_queue_for_each(desc, &ep->window, queue) {
        if (desc == ep->held) {
            break;
        } else if (!(desc->flags & (UCT_USNIC_TX_DESC_FLAG_SACKED |
                                    UCT_USNIC_TX_DESC_FLAG_UNSENT))) {
            tail = desc;
        }
    }

    if ((tail == NULL) || (tail->flags & UCT_USNIC_TX_DESC_FLAG_PROBED)) {
        return 0;
    }

    tail->flags                              |= UCT_USNIC_TX_DESC_FLAG_PROBED;
    uct_usnic_tx_desc_hdr(iface, tail)->flags |= UCT_USNIC_PKT_FLAG_ACK_REQ;
    UCT_USNIC_EP_STAT_ADD(ep, TX_TAIL_PROBES, 1);
    uct_usnic_tx_resend(iface, ep, tail, now);
    return 1;
}

/*
 * Send what the send queue refused earlier. When the oldest datagram the
 * peer does not have times out, resend it and back off, together with every
 * later one that has waited as long: a burst lost at its tail leaves no
 * later datagram whose ACK would report it, and resending its datagrams one
 * per timer check made each lost burst cost a timer check per datagram.
 * Only those a selective ACK could have reported, though: of the ones
 * beyond, nobody knows, and with a window larger than that range resending
 * them made every timeout a burst of duplicates; the ACK for the resent
 * oldest moves the range on. Should the oldest time out again before any
 * progress, resend also those after it that the peer is not known to have,
 * as many as the congestion window (now at its minimum) allows.
 */
static unsigned uct_usnic_tx_ep_timers(uct_usnic_iface_t *iface,
                                       uct_usnic_ep_t *ep, ucs_time_t now,
                                       unsigned budget)
{
    ucs_time_t rto = ep->rto;
    /* The receiver may hold its ACK for ACK_DELAY */
    ucs_time_t pto = 2 * ep->srtt + iface->config.ack_delay;
    unsigned count = 0;
    int resend_all = 0;
    int expired    = 0;
    int probe      = 0;
    int checked    = 0;
    uct_usnic_tx_desc_t *desc;

    if (ucs_unlikely(uct_usnic_tx_ep_timed_out(iface, ep, now))) {
        uct_usnic_ep_fail(ep, UCS_ERR_ENDPOINT_TIMEOUT);
        return 0;
    }

    if (ucs_unlikely(ep->status != UCS_OK)) {
        return 0; /* Its packets go when the failure is reported */
    }

    ucs_queue_for_each(desc, &ep->window, queue) {
        if ((count >= budget) || (desc == ep->held) ||
            (checked && !expired && (ep->unsent == 0))) {
            break;
        }

        if (desc->flags & UCT_USNIC_TX_DESC_FLAG_UNSENT) {
            uct_usnic_tx_send_again(iface, ep, desc, now);
            if (desc->flags & UCT_USNIC_TX_DESC_FLAG_UNSENT) {
                break; /* the send queue is still full */
            }
            ++count;
        } else if (!checked) {
            /* The oldest the peer did not acknowledge: a selective ACK may
             * have said that the peer has it, but the peer would then have
             * acknowledged it by now */
            checked = 1;
            if (uct_usnic_elapsed(now, desc->send_time) >= rto) {
                if (desc->flags & UCT_USNIC_TX_DESC_FLAG_SACKED) {
                    uct_usnic_tx_forget_sacks(ep);
                }
                /* A copy resent on a selective ACK's word may simply
                 * have been lost: only a second timeout doubts the path */
                expired      = 1;
                resend_all   = !!(desc->flags &
                                  UCT_USNIC_TX_DESC_FLAG_TIMED_OUT);
                desc->flags |= UCT_USNIC_TX_DESC_FLAG_TIMED_OUT;
                if (resend_all &&
                    (ep->peer_stream_id != UCT_USNIC_STREAM_ID_NONE)) {
                    uct_usnic_tx_reopen(iface, ep);
                }
                UCT_USNIC_EP_STAT_ADD(ep, TX_TIMEOUTS, 1);
                uct_usnic_tx_cwnd_loss(iface, ep, 1);
                ep->rto = ucs_min(ep->rto * 2, iface->config.rto_max);
                budget  = ucs_min(budget, count + ep->cwnd);
                uct_usnic_tx_resend(iface, ep, desc, now);
                ++count;
            } else {
                /* Its ACK is late, and so is any ACK for what came after
                 * it: maybe nothing after it arrived to draw one */
                probe = (uct_usnic_elapsed(now, desc->send_time) >= pto) &&
                        (uct_usnic_elapsed(now, ep->progress_time) >= pto);
            }
        } else if (desc->flags & UCT_USNIC_TX_DESC_FLAG_SACKED) {
            continue;
        } else if (expired &&
                   (resend_all ||
                    ((uct_usnic_elapsed(now, desc->send_time) >= rto) &&
                     (uct_usnic_tx_sack_offset(ep, desc) <
                      UCT_USNIC_SACK_RANGE)))) {
            uct_usnic_tx_resend(iface, ep, desc, now);
            ++count;
        }
    }

    if (probe && (count < budget)) {
        count += uct_usnic_tx_tail_probe(iface, ep, now);
    }

    return count;
}

void uct_usnic_tx_timer_fired(ucs_wtimer_t *timer)
{
    uct_usnic_ep_t *ep = ucs_container_of(timer, uct_usnic_ep_t, timer);

    /* Run after the sweep: a timer set again from within it could fire
     * again in the same sweep, once per slot the sweep passes */
    ucs_list_add_tail(&uct_usnic_ep_iface(ep)->tx_timers_due,
                      &ep->timer_list);
}

/* The next due ep, off the wheel, or NULL */
static uct_usnic_ep_t *uct_usnic_tx_timer_next_due(uct_usnic_iface_t *iface)
{
    if (ucs_list_is_empty(&iface->tx_timers_due)) {
        return NULL;
    }

    return ucs_list_extract_head(&iface->tx_timers_due, uct_usnic_ep_t,
                                 timer_list);
}

/* An ep that still waits for its peer is watched again after delta */
static void uct_usnic_tx_timer_rearm(uct_usnic_iface_t *iface,
                                     uct_usnic_ep_t *ep, ucs_time_t delta)
{
    if (!uct_usnic_ep_is_idle(ep)) {
        ucs_wtimer_add(&iface->tx_wheel, &ep->timer, delta);
    }
}

unsigned uct_usnic_tx_progress_timers(uct_usnic_iface_t *iface,
                                      ucs_time_t now)
{
    unsigned budget = iface->config.max_resend;
    unsigned count  = 0;
    uct_usnic_ep_t *ep;

    ucs_twheel_sweep(&iface->tx_wheel, now);
    while ((ep = uct_usnic_tx_timer_next_due(iface)) != NULL) {
        if (count < budget) {
            count += uct_usnic_tx_ep_timers(iface, ep, now, budget - count);
        }

        /* With many eps busy, those the budget left out, and one whose
         * datagrams the send queue refused, come back at the next slot */
        uct_usnic_tx_timer_rearm(iface, ep,
                                 ((count >= budget) || (ep->unsent > 0)) ?
                                 iface->tx_wheel.res :
                                 iface->config.timer_tick);
    }

    return count;
}

void uct_usnic_tx_check_timeouts(uct_usnic_iface_t *iface)
{
    ucs_time_t now = ucs_get_time();
    uct_usnic_ep_t *ep;

    ucs_twheel_sweep(&iface->tx_wheel, now);
    while ((ep = uct_usnic_tx_timer_next_due(iface)) != NULL) {
        if (uct_usnic_tx_ep_timed_out(iface, ep, now)) {
            uct_usnic_ep_fail(ep, UCS_ERR_ENDPOINT_TIMEOUT);
        }

        /* Its resends wait for the user's next progress */
        uct_usnic_tx_timer_rearm(iface, ep, iface->tx_wheel.res);
    }
}
