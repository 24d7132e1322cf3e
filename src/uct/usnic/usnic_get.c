/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_get.h"
#include "usnic_rx.h"
#include "usnic_tx.h"

#include <uct/base/uct_iov.inl>
#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>


/*
 * A read whose reply waits for room in its ep's window. Not in a send
 * buffer: the read was already acknowledged, so once the send buffers were
 * all in use (TX_MAX_BUFS) its data could only be lost, and the requester
 * would wait for it until its peer timeout.
 */
typedef struct uct_usnic_get_reply {
    uct_pending_req_t   super;
    uct_usnic_ep_t      *ep;
    uct_usnic_get_ext_t request;
    uint32_t            sent;    /* Bytes of the reply sent so far */
} uct_usnic_get_reply_t;


/* Requester side */

static UCS_F_ALWAYS_INLINE ucs_status_t
uct_usnic_get_check(uct_usnic_ep_t *ep, size_t length, size_t max_length)
{
    UCT_CHECK_LENGTH(length, 0, max_length, "get");
    return uct_usnic_ep_send_check(ep, 1);
}

/* Send the request of a read; its data comes back on the target's stream */
static ucs_status_t uct_usnic_get_post(uct_usnic_ep_t *ep, uct_usnic_get_t *get,
                                       size_t length, uint64_t remote_addr,
                                       uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_usnic_iface_t *iface     = uct_usnic_ep_iface(ep);
    const uct_usnic_rkey_t *key  = (const uct_usnic_rkey_t*)rkey;
    uct_usnic_get_ext_t *request;
    uct_usnic_tx_desc_t *desc;

    desc = ucs_mpool_get_inline(&iface->tx_mp);
    if (desc == NULL) {
        if (get->buf != NULL) {
            ucs_mpool_put_inline(get->buf);
        }
        ucs_mpool_put_inline(get);
        return UCS_ERR_NO_RESOURCE;
    }

    get->ep       = ep;
    get->length   = length;
    get->received = 0;
    get->comp     = comp;
    get->serial   = iface->next_get_serial++;

    uct_usnic_iface_enter(iface);
    get->id  = ucs_ptr_array_insert(&iface->gets, get);
    uct_usnic_ep_activate(ep);
    ucs_queue_push(&ep->gets, &get->queue);
    ++iface->num_gets;

    request             = (uct_usnic_get_ext_t*)
                          (uct_usnic_tx_desc_hdr(iface, desc) + 1);
    request->secret     = key->secret;
    request->address    = remote_addr;
    request->rkey_id    = key->id;
    request->length     = length;
    request->get_id     = get->id;
    request->get_serial = get->serial;
    ucs_trace_data("ep %p: get %u of %zu bytes from 0x%" PRIx64 " key %u", ep,
                   get->id, length, remote_addr, key->id);
    uct_usnic_tx_post(ep, desc, UCT_USNIC_PKT_GET, 0,
                      UCT_USNIC_PKT_FLAG_FIRST | UCT_USNIC_PKT_FLAG_LAST,
                      sizeof(*request));
    get->psn = ep->next_psn - 1; /* After a bundle that went before it */
    uct_usnic_iface_leave(iface);
    return UCS_INPROGRESS;
}

ucs_status_t uct_usnic_ep_get_bcopy(uct_ep_h tl_ep,
                                    uct_unpack_callback_t unpack_cb,
                                    void *arg, size_t length,
                                    uint64_t remote_addr, uct_rkey_t rkey,
                                    uct_completion_t *comp)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_get_t *get;
    ucs_status_t status;

    status = uct_usnic_get_check(ep, length, iface->config.get_max);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    UCT_TL_EP_STAT_OP(&ep->super, GET, BCOPY, length);
    if (length == 0) {
        unpack_cb(arg, NULL, 0);
        return UCS_OK;
    }

    get = ucs_mpool_get_inline(&iface->get_mp);
    if (get == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }

    get->buf = ucs_mpool_get_inline(&iface->am_buf_mp);
    if (get->buf == NULL) {
        ucs_mpool_put_inline(get);
        return UCS_ERR_NO_RESOURCE;
    }

    get->unpack_cb  = unpack_cb;
    get->unpack_arg = arg;
    get->iovcnt     = 0;
    return uct_usnic_get_post(ep, get, length, remote_addr, rkey, comp);
}

ucs_status_t uct_usnic_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                    size_t iovcnt, uint64_t remote_addr,
                                    uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_usnic_ep_t *ep       = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    size_t length            = uct_iov_total_length(iov, iovcnt);
    ucs_iov_iter_t iov_iter;
    uct_usnic_get_t *get;
    ucs_status_t status;

    UCT_CHECK_IOV_SIZE(iovcnt, UCT_USNIC_MAX_IOV, "uct_usnic_ep_get_zcopy");
    status = uct_usnic_get_check(ep, length, iface->config.get_max_zcopy);
    if (ucs_unlikely(status != UCS_OK)) {
        return status;
    }

    UCT_TL_EP_STAT_OP(&ep->super, GET, ZCOPY, length);
    if (length == 0) {
        return UCS_OK;
    }

    get = ucs_mpool_get_inline(&iface->get_mp);
    if (get == NULL) {
        return UCS_ERR_NO_RESOURCE;
    }

    get->unpack_cb  = NULL;
    get->buf        = NULL;
    get->iovcnt     = UCT_USNIC_MAX_IOV;
    get->iov_index  = 0;
    get->iov_offset = 0;
    ucs_iov_iter_init(&iov_iter);
    uct_iov_to_iovec(get->iov, &get->iovcnt, iov, iovcnt, SIZE_MAX, &iov_iter);
    return uct_usnic_get_post(ep, get, length, remote_addr, rkey, comp);
}

static void *uct_usnic_get_bcopy_data(uct_usnic_iface_t *iface,
                                      const uct_usnic_get_t *get)
{
    return UCS_PTR_BYTE_OFFSET(get->buf, iface->config.am_buf_offset);
}

/* Copy the next data of a get_zcopy into the user's buffers */
static void uct_usnic_get_scatter(uct_usnic_get_t *get, const void *data,
                                  size_t length)
{
    struct iovec *iov;
    size_t chunk;

    while (length > 0) {
        iov   = &get->iov[get->iov_index];
        chunk = ucs_min(length, iov->iov_len - get->iov_offset);
        memcpy(UCS_PTR_BYTE_OFFSET(iov->iov_base, get->iov_offset), data,
               chunk);
        data             = UCS_PTR_BYTE_OFFSET(data, chunk);
        length          -= chunk;
        get->iov_offset += chunk;
        if (get->iov_offset == iov->iov_len) {
            ++get->iov_index;
            get->iov_offset = 0;
        }
    }
}

/* The oldest read of its ep is done, or given up */
static void uct_usnic_get_complete(uct_usnic_iface_t *iface,
                                   uct_usnic_get_t *get, ucs_status_t status)
{
    uct_usnic_ep_t *ep     = get->ep;
    uct_completion_t *comp = get->comp;

    ucs_assert(ucs_queue_head_elem_non_empty(&ep->gets, uct_usnic_get_t,
                                             queue) == get);
    ucs_queue_pull_non_empty(&ep->gets);
    ucs_ptr_array_remove(&iface->gets, get->id);
    --iface->num_gets;
    uct_usnic_ep_deactivate(ep);

    if (get->buf != NULL) {
        if (status == UCS_OK) {
            get->unpack_cb(get->unpack_arg, uct_usnic_get_bcopy_data(iface, get),
                           get->length);
        }
        ucs_mpool_put_inline(get->buf);
    }
    ucs_mpool_put_inline(get);

    if (comp != NULL) {
        uct_invoke_completion(comp, status);
    }
}

int uct_usnic_get_before(uct_usnic_ep_t *ep, uct_usnic_psn_t psn)
{
    return !ucs_queue_is_empty(&ep->gets) &&
           UCT_USNIC_PSN_LE(ucs_queue_head_elem_non_empty(&ep->gets,
                                                          uct_usnic_get_t,
                                                          queue)->psn,
                            psn);
}

void uct_usnic_get_purge(uct_usnic_ep_t *ep, ucs_status_t status)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);

    while (!ucs_queue_is_empty(&ep->gets)) {
        uct_usnic_get_complete(iface,
                               ucs_queue_head_elem_non_empty(&ep->gets,
                                                             uct_usnic_get_t,
                                                             queue),
                               status);
    }
}

/*
 * The target answers the reads of one ep in the order they were asked, on
 * one stream: data for any other read than the ep's oldest is forged or
 * stale (its read was given up), and is dropped.
 */
void uct_usnic_get_rx_reply(uct_usnic_iface_t *iface,
                            const uct_usnic_rx_stream_t *stream,
                            const void *body, size_t body_len)
{
    const uct_usnic_get_reply_ext_t *reply = body;
    size_t data_len = body_len - sizeof(*reply);
    uct_usnic_get_t *get;
    uct_usnic_ep_t *ep;

    if (!ucs_ptr_array_lookup(&iface->gets, reply->get_id, get) ||
        (get->serial != reply->get_serial) ||
        (get->ep->peer_incarnation != uct_usnic_rx_stream_peer(stream)) ||
        (ucs_queue_head_elem_non_empty(&get->ep->gets, uct_usnic_get_t,
                                       queue) != get)) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_STREAM);
        return;
    }

    ep = get->ep;
    if (ucs_unlikely(reply->status != UCT_USNIC_GET_REPLY_OK)) {
        if ((reply->status != UCT_USNIC_GET_REPLY_REFUSED) ||
            (data_len != 0)) {
            uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
            return;
        }

        uct_usnic_get_complete(iface, get, UCS_ERR_INVALID_ADDR);
        uct_usnic_tx_flush_complete(ep, 0, UCS_OK);
        return;
    }

    if (ucs_unlikely((reply->offset != get->received) ||
                     (data_len > (get->length - get->received)))) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return;
    }

    if (get->buf != NULL) {
        memcpy(UCS_PTR_BYTE_OFFSET(uct_usnic_get_bcopy_data(iface, get),
                                   get->received),
               reply + 1, data_len);
    } else {
        uct_usnic_get_scatter(get, reply + 1, data_len);
    }

    get->received     += data_len;
    ep->progress_time  = ucs_get_time();
    if (get->received == get->length) {
        uct_usnic_get_complete(iface, get, UCS_OK);
        uct_usnic_tx_flush_complete(ep, 0, UCS_OK);
    }
}


/* Target side */

/* The ep that carries replies to the reads of the stream's peer iface */
static uct_usnic_ep_t *
uct_usnic_get_reply_ep(uct_usnic_iface_t *iface,
                       const uct_usnic_rx_stream_t *stream)
{
    uint32_t peer                    = uct_usnic_rx_stream_peer(stream);
    uct_usnic_device_addr_t dev_addr = {0};
    uct_usnic_iface_addr_t if_addr   = {{0}};
    uct_ep_params_t params;
    uct_ep_h tl_ep;
    ucs_status_t status;
    khiter_t iter;
    int ret;

    iter = kh_get(uct_usnic_reply_eps, &iface->reply_eps, peer);
    if (iter != kh_end(&iface->reply_eps)) {
        return kh_value(&iface->reply_eps, iter);
    }

    dev_addr.magic                         = UCT_USNIC_DEV_ADDR_MAGIC;
    dev_addr.in_addr                       = stream->src_in_addr;
    if_addr.ports[UCT_USNIC_CHANNEL_DATA] = stream->src_port;
    if_addr.incarnation                    = peer;
    if_addr.open_key                       = stream->src_open_key;
    /* The requester checked when it connected that it agrees with this
     * iface on the datagram size */
    if_addr.mtu                            = uct_usnic_iface_dgram_size(iface);
    if_addr.prefix                         = iface->config.prefix;
    params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                        UCT_EP_PARAM_FIELD_DEV_ADDR |
                        UCT_EP_PARAM_FIELD_IFACE_ADDR;
    params.iface      = &iface->super.super;
    params.dev_addr   = (const uct_device_addr_t*)&dev_addr;
    params.iface_addr = (const uct_iface_addr_t*)&if_addr;
    status            = UCS_CLASS_NEW(uct_usnic_ep_t, &tl_ep, &params, 1);
    if (status != UCS_OK) {
        return NULL;
    }

    iter = kh_put(uct_usnic_reply_eps, &iface->reply_eps, peer, &ret);
    if (ret < 0) {
        UCS_CLASS_DELETE(uct_usnic_ep_t, tl_ep);
        return NULL;
    }

    kh_value(&iface->reply_eps, iter) = ucs_derived_of(tl_ep, uct_usnic_ep_t);
    return kh_value(&iface->reply_eps, iter);
}

static uct_usnic_get_reply_ext_t *
uct_usnic_get_reply_hdr(uct_usnic_ep_t *ep, uct_usnic_tx_desc_t *desc)
{
    return (uct_usnic_get_reply_ext_t*)
           (uct_usnic_tx_desc_hdr(uct_usnic_ep_iface(ep), desc) + 1);
}

static void uct_usnic_get_reply_init(uct_usnic_ep_t *ep,
                                     uct_usnic_tx_desc_t *desc,
                                     const uct_usnic_get_ext_t *request,
                                     uint32_t offset, uint8_t status)
{
    uct_usnic_get_reply_ext_t *reply = uct_usnic_get_reply_hdr(ep, desc);

    reply->get_id     = request->get_id;
    reply->get_serial = request->get_serial;
    reply->offset     = offset;
    reply->status     = status;
}

/* A read the key does not allow gets a refusal instead of data, so that the
 * requester fails it rather than waits */
static void uct_usnic_get_reply_refuse(uct_usnic_ep_t *ep,
                                       const uct_usnic_get_ext_t *request,
                                       uct_usnic_md_access_result_t result)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_tx_desc_t *desc;

    uct_usnic_rx_refused(iface, ep->peer_dev_addr.in_addr,
                         ep->peer_iface_addr.ports[UCT_USNIC_CHANNEL_DATA], 0,
                         request->rkey_id, request->address, request->length,
                         result);

    desc = ucs_mpool_get_inline(&iface->tx_mp);
    ucs_assert_always(desc != NULL);
    uct_usnic_get_reply_init(ep, desc, request, 0,
                             UCT_USNIC_GET_REPLY_REFUSED);
    uct_usnic_tx_post(ep, desc, UCT_USNIC_PKT_GET_REPLY, 0,
                      UCT_USNIC_PKT_FLAG_FIRST | UCT_USNIC_PKT_FLAG_LAST,
                      sizeof(uct_usnic_get_reply_ext_t));
}

/*
 * Send the data of a read as one message, straight from the registered
 * memory, as far as the window lets: the rest goes as it opens (a read may
 * be larger than the window). The registrations stay locked while they are
 * read, and every resend checks the key again
 * (uct_usnic_get_reply_resend_begin()). Returns UCS_OK once all is sent,
 * UCS_INPROGRESS when some was, UCS_ERR_NO_RESOURCE when none could be.
 */
static ucs_status_t
uct_usnic_get_reply_send(uct_usnic_ep_t *ep, const uct_usnic_get_ext_t *request,
                         uint32_t *sent)
{
    uct_usnic_iface_t *iface  = uct_usnic_ep_iface(ep);
    uct_usnic_md_t *md        = ucs_derived_of(iface->super.md, uct_usnic_md_t);
    size_t max_data           = iface->config.get_max_payload;
    uct_usnic_rkey_t rkey     = {.secret = request->secret,
                                 .id     = request->rkey_id};
    uint8_t flags             = (*sent == 0) ? UCT_USNIC_PKT_FLAG_FIRST : 0;
    uct_usnic_tx_desc_t *desc, *first = NULL;
    uct_usnic_md_access_result_t result;
    size_t offset, end, data_len;
    unsigned room;

    room = uct_usnic_ep_can_send(ep, 1) ? uct_usnic_ep_room(ep) : 0;
    if (room == 0) {
        return UCS_ERR_NO_RESOURCE;
    }

    offset = *sent;
    result = uct_usnic_md_read_begin(md, &rkey, request->address + offset,
                                     request->length - offset);
    if (ucs_unlikely(result != UCT_USNIC_MD_ACCESS_OK)) {
        uct_usnic_get_reply_refuse(ep, request, result);
        return UCS_OK;
    }

    end = offset + ucs_min(request->length - offset, room * max_data);
    do {
        data_len = ucs_min(end - offset, max_data);
        desc     = ucs_mpool_get_inline(&iface->tx_zcopy_mp);
        ucs_assert_always(desc != NULL);

        uct_usnic_get_reply_init(ep, desc, request, offset,
                                 UCT_USNIC_GET_REPLY_OK);
        desc->zcopy.comp            = NULL;
        desc->zcopy.rkey            = rkey;
        desc->zcopy.length          = data_len;
        desc->zcopy.iovcnt          = 1;
        desc->zcopy.iov[0].iov_base = (void*)(uintptr_t)(request->address +
                                                         offset);
        desc->zcopy.iov[0].iov_len  = data_len;
        offset                     += data_len;
        if (offset == request->length) {
            flags |= UCT_USNIC_PKT_FLAG_LAST;
        }

        uct_usnic_tx_queue_zcopy(ep, desc, UCT_USNIC_PKT_GET_REPLY, 0, flags,
                                 sizeof(uct_usnic_get_reply_ext_t));
        desc->flags |= UCT_USNIC_TX_DESC_FLAG_READ;
        if (first == NULL) {
            first = desc;
        }
        flags = 0;
    } while (offset < end);

    uct_usnic_tx_send_queued(ep, first);
    uct_usnic_md_read_end(md);
    *sent = offset;
    return (offset == request->length) ? UCS_OK : UCS_INPROGRESS;
}

int uct_usnic_get_reply_resend_begin(uct_usnic_ep_t *ep,
                                     uct_usnic_tx_desc_t *desc)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_md_t *md       = ucs_derived_of(iface->super.md, uct_usnic_md_t);
    uint64_t address         = (uintptr_t)desc->zcopy.iov[0].iov_base;
    uct_usnic_get_reply_ext_t *reply;

    if (ucs_likely(uct_usnic_md_read_begin(md, &desc->zcopy.rkey, address,
                                           desc->zcopy.length) ==
                   UCT_USNIC_MD_ACCESS_OK)) {
        return 1;
    }

    /* The memory was deregistered before the requester acknowledged the
     * data. Usually it has the data and drops this copy: UCP deregisters as
     * soon as the requester says it is done. Otherwise the read fails there,
     * as an RDMA read from deregistered memory would. */
    ucs_debug("ep %p: resending psn %u of a read of 0x%" PRIx64 " key %u as a "
              "refusal: the memory is no longer registered", ep, desc->psn,
              address, desc->zcopy.rkey.id);
    UCT_USNIC_IFACE_STAT_ADD(iface, TX_READS_REVOKED, 1);
    reply               = uct_usnic_get_reply_hdr(ep, desc);
    reply->status       = UCT_USNIC_GET_REPLY_REFUSED;
    desc->length       -= desc->zcopy.length;
    desc->zcopy.length  = 0;
    desc->zcopy.iovcnt  = 0;
    desc->flags        &= ~UCT_USNIC_TX_DESC_FLAG_READ;
    return 0;
}

static ucs_status_t uct_usnic_get_reply_progress(uct_pending_req_t *self)
{
    uct_usnic_get_reply_t *reply = ucs_derived_of(self, uct_usnic_get_reply_t);
    uct_usnic_ep_t *ep           = reply->ep;
    ucs_status_t status;

    status = uct_usnic_get_reply_send(ep, &reply->request, &reply->sent);
    if (status == UCS_OK) {
        ucs_free(reply);
    }
    return status;
}

void uct_usnic_get_serve(uct_usnic_iface_t *iface,
                         uct_usnic_rx_stream_t *stream, const void *body,
                         size_t body_len)
{
    const uct_usnic_get_ext_t *request = body;
    uint32_t sent                      = 0;
    uct_usnic_get_reply_t *reply;
    uct_usnic_ep_t *ep;
    ucs_status_t status;

    /* Any length: the requester's limits may differ from this iface's */
    if (ucs_unlikely(request->length == 0)) {
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_INVALID);
        return;
    }

    ep = uct_usnic_get_reply_ep(iface, stream);
    if (ucs_unlikely((ep == NULL) || (ep->status != UCS_OK))) {
        /* The requester's peer timeout fails the read */
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
        return;
    }

    /* The reply takes the ACK the request's stream owes where a datagram
     * has room for it (a short last one): an ACK of its own would cost a
     * system call per read. A reply ep is never paired with a stream. */
    ep->ack_stream = stream;
    status         = uct_usnic_get_reply_send(ep, request, &sent);
    ep->ack_stream = NULL;
    if (status == UCS_OK) {
        return;
    }

    reply = ucs_malloc(sizeof(*reply), "usnic_get_reply");
    if (reply == NULL) {
        ucs_error("failed to allocate the reply of a read of %u bytes",
                  request->length);
        uct_usnic_iface_drop(iface, UCT_USNIC_RX_DROP_NO_RESOURCE);
        return;
    }

    reply->super.func = uct_usnic_get_reply_progress;
    reply->ep         = ep;
    reply->request    = *request;
    reply->sent       = sent;
    uct_pending_req_arb_group_push(&ep->arb_group, &reply->super);
    ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
}

static void uct_usnic_get_reply_purge_cb(uct_pending_req_t *self, void *arg)
{
    ucs_free(ucs_derived_of(self, uct_usnic_get_reply_t));
}

static void uct_usnic_get_reply_ep_destroy(uct_usnic_ep_t *ep)
{
    uct_usnic_ep_pending_purge(&ep->super.super, uct_usnic_get_reply_purge_cb,
                               NULL);
    UCS_CLASS_DELETE(uct_usnic_ep_t, ep);
}

void uct_usnic_get_reply_ep_failed(uct_usnic_ep_t *ep)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    khiter_t iter;

    iter = kh_get(uct_usnic_reply_eps, &iface->reply_eps,
                  ep->peer_incarnation);
    if (iter != kh_end(&iface->reply_eps)) {
        kh_del(uct_usnic_reply_eps, &iface->reply_eps, iter);
    }
    uct_usnic_get_reply_ep_destroy(ep);
}

void uct_usnic_get_cleanup(uct_usnic_iface_t *iface)
{
    uct_usnic_ep_t *ep;

    kh_foreach_value(&iface->reply_eps, ep, {
        uct_usnic_get_reply_ep_destroy(ep);
    })
    kh_clear(uct_usnic_reply_eps, &iface->reply_eps);
}
