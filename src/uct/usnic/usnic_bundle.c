/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_bundle.h"
#include "usnic_ep.h"
#include "usnic_rx.h"
#include "usnic_tx.h"

#include <uct/base/uct_iov.inl>


/*
 * A short AM waits for company only while the peer has not acknowledged
 * the ep's previous datagrams and the newest of them left a moment ago:
 * the application posts faster than the wire takes its messages. A lone
 * message always goes at once.
 */
static UCS_F_ALWAYS_INLINE int
uct_usnic_bundle_may_wait(uct_usnic_iface_t *iface, uct_usnic_ep_t *ep,
                          ucs_time_t now)
{
    return (ep->tx_count > 0) &&
           ((ep->last_tx_time + iface->config.bundle_delay) > now);
}

static ucs_status_t uct_usnic_bundle_open(uct_usnic_iface_t *iface,
                                          uct_usnic_ep_t *ep, ucs_time_t now)
{
    uct_usnic_tx_desc_t *desc;
    ucs_status_t status;

    status = uct_usnic_ep_send_check(ep, 1);
    if (status != UCS_OK) {
        return status;
    }

    desc = ucs_mpool_get_inline(&iface->tx_mp);
    if (desc == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }

    ++iface->tx_outstanding;
    desc->length    = 0; /* Of the body, until it is sent */
    ep->bundle      = desc;
    ep->bundle_time = now;
    ucs_list_add_tail(&iface->bundle_eps, &ep->bundle_list);
    return UCS_OK;
}

ucs_status_t uct_usnic_bundle_am(uct_usnic_ep_t *ep, uint8_t id,
                                 const uint64_t *header, const uct_iov_t *iov,
                                 size_t iovcnt, size_t length)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    size_t rec_len           = sizeof(uct_usnic_bundle_rec_t) + length;
    uct_usnic_bundle_rec_t *rec;
    ucs_time_t now;
    ucs_iov_iter_t iov_iter;
    ucs_status_t status;
    void *data;

    /* Nothing in flight and no bundle: the message goes alone, decided
     * without the lock (only this thread opens bundles, and the async one
     * never adds packets to an ep without one) */
    if ((rec_len > iface->config.max_payload) ||
        ((ep->bundle == NULL) && (ep->tx_count == 0))) {
        return UCS_ERR_UNSUPPORTED;
    }

    now = ucs_get_time();
    uct_usnic_iface_enter(iface);
    if ((ep->bundle != NULL) &&
        (((ep->bundle->length + rec_len) > iface->config.max_payload) ||
         (uct_usnic_elapsed(now, ep->bundle_time) >=
          iface->config.bundle_delay))) {
        uct_usnic_bundle_send(ep);
    }

    if (ep->bundle != NULL) {
        status = uct_usnic_ep_send_check(ep, 0);
    } else if (uct_usnic_bundle_may_wait(iface, ep, now)) {
        status = uct_usnic_bundle_open(iface, ep, now);
    } else {
        status = UCS_ERR_UNSUPPORTED;
    }

    if (status != UCS_OK) {
        uct_usnic_iface_leave(iface);
        return status;
    }

    rec           = UCS_PTR_BYTE_OFFSET(uct_usnic_tx_desc_hdr(iface,
                                                              ep->bundle) + 1,
                                        ep->bundle->length);
    rec->am_id    = id;
    rec->reserved = 0;
    rec->length   = length;
    data          = rec + 1;
    if (header != NULL) {
        memcpy(data, header, sizeof(*header));
    }
    ucs_iov_iter_init(&iov_iter);
    uct_iov_to_buffer(iov, iovcnt, &iov_iter,
                      UCS_PTR_BYTE_OFFSET(data, (header != NULL) ?
                                                sizeof(*header) : 0),
                      SIZE_MAX);
    ep->bundle->length += rec_len;
    UCT_USNIC_IFACE_STAT_ADD(iface, TX_BUNDLED, 1);
    uct_usnic_iface_leave(iface);

    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id, data,
                       length, "TX: AM_SHORT (bundled)");
    UCT_TL_EP_STAT_OP(&ep->super, AM, SHORT, length);
    return UCS_OK;
}

void uct_usnic_bundle_send(uct_usnic_ep_t *ep)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_tx_desc_t *desc = ep->bundle;

    ep->bundle = NULL;
    ucs_list_del(&ep->bundle_list);
    --iface->tx_outstanding; /* Counted again as a packet of the window */
    uct_usnic_tx_post(ep, desc, UCT_USNIC_PKT_BUNDLE, 0,
                      UCT_USNIC_PKT_FLAG_FIRST | UCT_USNIC_PKT_FLAG_LAST,
                      desc->length);
}

void uct_usnic_bundle_progress(uct_usnic_iface_t *iface, int all)
{
    ucs_time_t now = ucs_get_time();
    uct_usnic_ep_t *ep, *tmp;

    ucs_list_for_each_safe(ep, tmp, &iface->bundle_eps, bundle_list) {
        if (all || (ep->tx_count == 0) ||
            (uct_usnic_elapsed(now, ep->bundle_time) >=
             iface->config.bundle_delay)) {
            uct_usnic_bundle_send(ep);
        }
    }

    ucs_list_for_each_safe(ep, tmp, &iface->held_eps, held_list) {
        if (all || (uct_usnic_elapsed(now, ep->held_time) >=
                    iface->config.hold_delay)) {
            uct_usnic_tx_send_queued(ep, ep->held);
        }
    }
}

/*
 * The first message posted after the peer sent us something may answer it,
 * and the peer may be waiting: a ping-pong of 4 KiB messages, each held for
 * the delay, took 10 us one way against 3 us for one datagram. The posts
 * that follow it without news from the peer are held as before.
 */
static UCS_F_ALWAYS_INLINE int
uct_usnic_bundle_is_reply(const uct_usnic_ep_t *ep)
{
    return (ep->ack_stream != NULL) &&
           ((int64_t)(ep->ack_stream->last_time - ep->post_time) > 0);
}

/*
 * Messages to one peer share a system call the same way: one posted less
 * than the delay after the application's previous post on the ep returned
 * waits in the window, and the ones after it join it, until the ep sends
 * anything else, a burst's worth waits, or the first has waited the delay.
 * The kernel provider then sends them all with one sendmmsg, each message
 * cut into datagrams by the kernel. Whether the peer acknowledged the
 * earlier ones does not matter here: a fast receiver acknowledges each
 * message before the next is posted, and the sender is then the one whose
 * system calls limit the stream. A reply is never held.
 */
void uct_usnic_bundle_post_msg(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *first,
                               unsigned count)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    ucs_time_t now           = ucs_get_time();

    /* A window too full for the next message sends what it has */
    if ((ep->held == NULL) ?
        ((iface->config.hold_delay == 0) ||
         (uct_usnic_elapsed(now, ep->post_time) >= iface->config.hold_delay) ||
         uct_usnic_bundle_is_reply(ep)) :
        (((ep->held_count + count) > UCT_USNIC_CHANNEL_MAX_BURST) ||
         (uct_usnic_elapsed(now, ep->held_time) >= iface->config.hold_delay)) ||
        !uct_usnic_ep_has_room(ep, iface->config.max_bcopy_packets)) {
        uct_usnic_tx_send_queued(ep, first);
        ep->post_time = ucs_get_time();
        return;
    }

    if (ep->held == NULL) {
        ep->held       = first;
        ep->held_count = 0;
        ep->held_time  = now;
        ucs_list_add_tail(&iface->held_eps, &ep->held_list);
    }

    ep->held_count += count;
    ep->post_time   = now;
    UCT_USNIC_IFACE_STAT_ADD(iface, TX_HELD, 1);
}

uct_usnic_tx_desc_t *uct_usnic_bundle_take_held(uct_usnic_ep_t *ep)
{
    uct_usnic_tx_desc_t *first = ep->held;

    ep->held = NULL;
    ucs_list_del(&ep->held_list);
    return first;
}

void uct_usnic_bundle_discard(uct_usnic_ep_t *ep)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    if (ep->held != NULL) {
        uct_usnic_bundle_take_held(ep);
    }

    if (ep->bundle == NULL) {
        return;
    }

    ucs_list_del(&ep->bundle_list);
    ucs_mpool_put_inline(ep->bundle);
    ep->bundle = NULL;
    --iface->tx_outstanding;
}
