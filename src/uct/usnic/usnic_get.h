/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_GET_H
#define UCT_USNIC_GET_H

#include "usnic_ep.h"

#include <ucs/datastruct/queue.h>
#include <sys/uio.h>


/**
 * A remote read waiting for its data. Its request travels in the ep's
 * stream like a write; the target sends the data back on a stream of its
 * own to this iface, where it lands in the user's buffer (get_zcopy) or in
 * a reassembly buffer unpacked at the end (get_bcopy).
 */
typedef struct uct_usnic_get {
    ucs_queue_elem_t      queue;    /* In ep->gets, in request order */
    uct_usnic_ep_t        *ep;
    uint32_t              id;       /* Index in iface->gets */
    uint32_t              serial;   /* Tells apart reads that reuse an id */
    uct_usnic_psn_t       psn;      /* Of the request */
    uint32_t              length;   /* Bytes requested */
    uint32_t              received; /* Bytes arrived, in order */
    uct_completion_t      *comp;
    uct_unpack_callback_t unpack_cb; /* get_bcopy, else NULL */
    void                  *unpack_arg;
    void                  *buf;     /* get_bcopy: uct_usnic_am_buf_t */
    size_t                iovcnt;   /* get_zcopy: where the data goes */
    size_t                iov_index;
    size_t                iov_offset;
    struct iovec          iov[UCT_USNIC_MAX_IOV];
} uct_usnic_get_t;


ucs_status_t uct_usnic_ep_get_bcopy(uct_ep_h tl_ep,
                                    uct_unpack_callback_t unpack_cb,
                                    void *arg, size_t length,
                                    uint64_t remote_addr, uct_rkey_t rkey,
                                    uct_completion_t *comp);

ucs_status_t uct_usnic_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                    size_t iovcnt, uint64_t remote_addr,
                                    uct_rkey_t rkey, uct_completion_t *comp);

/* Whether a read requested at or before psn still waits for its data */
int uct_usnic_get_before(uct_usnic_ep_t *ep, uct_usnic_psn_t psn);

/* Complete the ep's outstanding reads with status */
void uct_usnic_get_purge(uct_usnic_ep_t *ep, ucs_status_t status);

/* Target: serve a read request that arrived in order on the stream */
void uct_usnic_get_serve(uct_usnic_iface_t *iface,
                         struct uct_usnic_rx_stream *stream, const void *body,
                         size_t body_len);

/* Requester: data of one of its reads arrived in order on the stream */
void uct_usnic_get_rx_reply(uct_usnic_iface_t *iface,
                            const struct uct_usnic_rx_stream *stream,
                            const void *body, size_t body_len);

/*
 * Before a datagram of a read's reply is sent again: with its key still
 * valid, lock the registrations (uct_usnic_md_read_end() after the send)
 * and return 1; with the memory gone, turn it into a refusal and return 0.
 */
int uct_usnic_get_reply_resend_begin(uct_usnic_ep_t *ep,
                                     uct_usnic_tx_desc_t *desc);

/* Destroy the eps that carry replies to reads */
void uct_usnic_get_cleanup(uct_usnic_iface_t *iface);

/* A reply ep failed: drop what it had to send and the ep itself */
void uct_usnic_get_reply_ep_failed(uct_usnic_ep_t *ep);


#endif
