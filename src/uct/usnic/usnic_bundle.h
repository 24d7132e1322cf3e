/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_BUNDLE_H
#define UCT_USNIC_BUNDLE_H

#include "usnic_ep.h"


/*
 * Short AMs to one peer sharing a datagram, and messages held back to
 * share a system call.
 */


/* Whether the AM was taken into a bundle: UCS_OK; the ep's failure or
 * UCS_ERR_NO_RESOURCE; or UCS_ERR_UNSUPPORTED when it goes on its own */
ucs_status_t uct_usnic_bundle_am(uct_usnic_ep_t *ep, uint8_t id,
                                 const uint64_t *header, const uct_iov_t *iov,
                                 size_t iovcnt, size_t length);

/* Send the ep's bundle; the caller has entered the iface */
void uct_usnic_bundle_send(uct_usnic_ep_t *ep);

/* Send the bundles that waited long enough, or whose eps' windows drained;
 * all of them with all != 0. The caller has entered the iface */
void uct_usnic_bundle_progress(uct_usnic_iface_t *iface, int all);

/* Drop the ep's bundle unsent, and forget the messages it holds back; the
 * caller has entered the iface */
void uct_usnic_bundle_discard(uct_usnic_ep_t *ep);

/* Send a message's datagrams, queued since first, with the ep's next burst
 * when the application posts faster than the wire takes them, else at once;
 * the caller has entered the iface */
void uct_usnic_bundle_post_msg(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *first,
                               unsigned count);

/* The oldest datagram held back, which the caller now sends with the rest */
uct_usnic_tx_desc_t *uct_usnic_bundle_take_held(uct_usnic_ep_t *ep);

#endif
