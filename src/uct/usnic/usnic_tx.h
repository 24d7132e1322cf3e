/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_TX_H
#define UCT_USNIC_TX_H

#include "usnic_ep.h"


/*
 * The send engine: each ep's window of datagrams, their (re)transmission,
 * the ACKs that release them, congestion window and timers.
 */


/* Put one datagram of a message in the window, to be sent by
 * uct_usnic_tx_send_queued(); the caller has entered the iface. Its body is
 * body_length bytes in the buffer, then desc->zcopy's user memory. */
void uct_usnic_tx_queue_zcopy(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc,
                              uint8_t type, uint8_t am_id, uint8_t flags,
                              size_t body_length);

/* The same for a datagram whose body is all in the buffer */
static UCS_F_ALWAYS_INLINE void
uct_usnic_tx_queue(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc, uint8_t type,
                   uint8_t am_id, uint8_t flags, size_t body_length)
{
    desc->zcopy.iovcnt = 0;
    desc->zcopy.length = 0;
    desc->zcopy.comp   = NULL;
    uct_usnic_tx_queue_zcopy(ep, desc, type, am_id, flags, body_length);
}

/* Send the datagrams queued since first, as one burst */
void uct_usnic_tx_send_queued(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *first);

/* Send one datagram of a message; the caller has entered the iface */
static UCS_F_ALWAYS_INLINE void
uct_usnic_tx_post(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc, uint8_t type,
                  uint8_t am_id, uint8_t flags, size_t body_length)
{
    uct_usnic_tx_queue(ep, desc, type, am_id, flags, body_length);
    uct_usnic_tx_send_queued(ep, desc);
}

/* An ACK from the peer iface src_incarnation, received at now */
void uct_usnic_tx_handle_ack(uct_usnic_iface_t *iface,
                             const uct_usnic_ack_ext_t *ack,
                             uint32_t src_incarnation, uint64_t sack,
                             uint8_t flags, ucs_time_t now);

/* An ep's timer fired: the sweep's caller runs it */
void uct_usnic_tx_timer_fired(ucs_wtimer_t *timer);

/* Resends, tail-loss probes and peer timeouts of the eps whose timers are
 * due, within UCX_USNIC_MAX_RESEND datagrams */
unsigned uct_usnic_tx_progress_timers(uct_usnic_iface_t *iface,
                                      ucs_time_t now);

/* Fail the eps whose timers are due and whose peer acknowledged nothing for
 * the timeout; nothing is resent (the user's progress reads the ACKs
 * first) */
void uct_usnic_tx_check_timeouts(uct_usnic_iface_t *iface);

void uct_usnic_tx_window_purge(uct_usnic_ep_t *ep, ucs_status_t status);

/* Complete the flushes that nothing they wait for holds back any more; all
 * of them (with status) when all != 0 */
void uct_usnic_tx_flush_complete(uct_usnic_ep_t *ep, int all,
                                 ucs_status_t status);


static UCS_F_ALWAYS_INLINE uct_usnic_hdr_t *
uct_usnic_tx_desc_hdr(uct_usnic_iface_t *iface, uct_usnic_tx_desc_t *desc)
{
    return (uct_usnic_hdr_t*)UCS_PTR_BYTE_OFFSET(desc,
                                                 iface->config.tx_hdr_offset);
}

#endif
