/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_channel.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/arch/cpu.h>
#include <ucs/sys/sock.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <unistd.h>


/* Completions read from a CQ in one call */
#define UCT_USNIC_CHANNEL_CQ_BATCH 16


static void uct_usnic_rx_desc_release(uct_recv_desc_t *self, void *desc)
{
    ucs_mpool_put(ucs_container_of(self, uct_usnic_rx_desc_t, release));
}

static void uct_usnic_rx_desc_init(void *obj, void *mr_desc)
{
    uct_usnic_rx_desc_t *desc = obj;

    desc->mr_desc    = mr_desc;
    desc->release.cb = uct_usnic_rx_desc_release;
}

static unsigned uct_usnic_channel_post_recv(uct_usnic_channel_t *channel,
                                            unsigned count)
{
    size_t length = channel->prefix_size + channel->max_msg_size;
    uct_usnic_rx_desc_t *desc;
    unsigned posted;
    void *buffer;
    ssize_t ret;

    for (posted = 0; posted < count; ++posted) {
        desc = ucs_mpool_get_inline(&channel->rx_mp);
        if (desc == NULL) {
            break;
        }

        buffer = UCS_PTR_BYTE_OFFSET(uct_usnic_rx_desc_data(channel, desc),
                                     -channel->prefix_size);
        memset(buffer, UCT_USNIC_PREFIX_POISON, channel->fake_prefix);
        ret = fi_recv(channel->ep,
                      UCS_PTR_BYTE_OFFSET(buffer, channel->fake_prefix),
                      length - channel->fake_prefix, desc->mr_desc,
                      FI_ADDR_UNSPEC, &desc->ctx);
        if (ret != 0) {
            ucs_mpool_put_inline(desc);
            if (ret != -FI_EAGAIN) {
                ucs_error("%s: fi_recv failed: %s", channel->name,
                          fi_strerror(-ret));
            }
            break;
        }

        ucs_list_add_tail(&channel->rx_posted_list, &desc->list);
        ++channel->posts.recvs;
        channel->posts.recvs_mr += (desc->mr_desc != NULL);
    }

    channel->rx_posted += posted;
    return posted;
}

/* Seal a datagram, leaving out the provider's prefix */
void uct_usnic_channel_dgram_seal(uct_usnic_channel_t *channel,
                                  uct_usnic_dgram_t *dgram)
{
    struct iovec iov[UCT_USNIC_DGRAM_MAX_IOV];

    if (channel->seal.length == 0) {
        return;
    }

    memcpy(iov, dgram->iov, sizeof(*iov) * dgram->iovcnt);
    iov[0].iov_base = UCS_PTR_BYTE_OFFSET(iov[0].iov_base,
                                          channel->prefix_size);
    iov[0].iov_len -= channel->prefix_size;
    uct_usnic_seal_put_iov(&channel->seal, iov, dgram->iovcnt);

    dgram->iov[dgram->iovcnt - 1].iov_len += channel->seal.length;
    dgram->length                         += channel->seal.length;
}

size_t uct_usnic_dgram_gather(const uct_usnic_dgram_t *dgram, void *dst)
{
    size_t offset = 0;
    unsigned i;

    for (i = 0; i < dgram->iovcnt; ++i) {
        memcpy(UCS_PTR_BYTE_OFFSET(dst, offset), dgram->iov[i].iov_base,
               dgram->iov[i].iov_len);
        offset += dgram->iov[i].iov_len;
    }

    return offset;
}

void *uct_usnic_channel_gather(uct_usnic_channel_t *channel,
                               const uct_usnic_dgram_t *dgram)
{
    uct_usnic_dgram_gather(dgram, channel->gather_buf);
    return channel->gather_buf;
}

void uct_usnic_channel_rx_deliver(uct_usnic_channel_t *channel,
                                  uct_usnic_rx_desc_t *desc, size_t length)
{
    void *data = uct_usnic_rx_desc_data(channel, desc);

    if ((channel->seal.length != 0) &&
        !uct_usnic_seal_check(&channel->seal, data, &length)) {
        ++channel->rx_bad_seal;
        ucs_mpool_put_inline(desc);
        return;
    }

    if (channel->rx_time == 0) {
        channel->rx_time = ucs_get_time();
    }

    if (channel->rx_cb(channel, desc, data, length) == UCS_OK) {
        ucs_mpool_put_inline(desc);
    }
}

/* Nothing but the poison in the prefix nobody but this channel knows of */
static int uct_usnic_channel_prefix_intact(uct_usnic_channel_t *channel,
                                           uct_usnic_rx_desc_t *desc)
{
    const uint8_t *prefix = UCS_PTR_BYTE_OFFSET(
            uct_usnic_rx_desc_data(channel, desc), -channel->prefix_size);
    size_t i;

    for (i = 0; i < channel->fake_prefix; ++i) {
        if (prefix[i] != UCT_USNIC_PREFIX_POISON) {
            return 0;
        }
    }

    return 1;
}

static void uct_usnic_channel_rx_complete(uct_usnic_channel_t *channel,
                                          const struct fi_cq_msg_entry *comp)
{
    uct_usnic_rx_desc_t *desc = ucs_container_of(comp->op_context,
                                                 uct_usnic_rx_desc_t, ctx);
    size_t length             = comp->len + channel->fake_prefix;

    ucs_list_del(&desc->list);
    --channel->rx_posted;

    /* A provider without FI_MSG_PREFIX handling would report less */
    if (ucs_unlikely(length < channel->prefix_size)) {
        ucs_mpool_put_inline(desc);
        return;
    }

    if (ucs_unlikely(channel->fake_prefix > 0) &&
        !uct_usnic_channel_prefix_intact(channel, desc)) {
        ++channel->posts.bad_prefix;
        ucs_error("%s: a received datagram was written into the message "
                  "prefix", channel->name);
        ucs_mpool_put_inline(desc);
        return;
    }

    uct_usnic_channel_rx_deliver(channel, desc, length - channel->prefix_size);
}

static void uct_usnic_channel_tx_slot_put(uct_usnic_channel_t *channel,
                                          void *op_context)
{
    ucs_mpool_put_inline(ucs_container_of(op_context, uct_usnic_tx_slot_t,
                                          ctx));
    --channel->tx_slots_posted;
}

static UCS_F_NOINLINE void
uct_usnic_channel_handle_cq_error(uct_usnic_channel_t *channel)
{
    struct fi_cq_err_entry err = {0};
    uct_usnic_rx_desc_t *desc;
    ssize_t ret;

    ret = fi_cq_readerr(channel->cq, &err, 0);
    if (ret < 0) {
        if (ret != -FI_EAGAIN) {
            ucs_error("%s: fi_cq_readerr failed: %s", channel->name,
                      fi_strerror(-ret));
        }
        return;
    }

    if (err.flags & FI_RECV) {
        /* Truncated or cancelled receive: the datagram is lost, the buffer
         * goes back to the pool */
        desc = ucs_container_of(err.op_context, uct_usnic_rx_desc_t, ctx);
        ucs_list_del(&desc->list);
        --channel->rx_posted;
        ucs_mpool_put_inline(desc);
        ucs_debug("%s: receive failed: %s", channel->name,
                  fi_strerror(err.err));
    } else if (err.flags & FI_SEND) {
        /* The protocol resends what was lost */
        uct_usnic_channel_tx_slot_put(channel, err.op_context);
        ucs_debug("%s: send failed: %s", channel->name, fi_strerror(err.err));
    } else {
        ucs_warn("%s: completion error: %s", channel->name,
                 fi_strerror(err.err));
    }
}

/*
 * Take up to max_events completions. A provider may complete fewer receives
 * per read than asked (libfabric's udp provider receives one datagram per
 * fi_cq_read), so read until the queue is empty: a target that progresses
 * only now and then must drain everything that arrived meanwhile, or its
 * peers stall on a full socket buffer.
 */
static unsigned uct_usnic_channel_fi_progress(uct_usnic_channel_t *channel,
                                              unsigned max_events)
{
    struct fi_cq_msg_entry comps[UCT_USNIC_CHANNEL_CQ_BATCH];
    unsigned count = 0;
    ssize_t i, ret;

    do {
        ret = fi_cq_read(channel->cq, comps,
                         ucs_min(max_events - count,
                                 UCT_USNIC_CHANNEL_CQ_BATCH));
        if (ucs_unlikely(ret <= 0)) {
            if (ucs_unlikely(ret == -FI_EAVAIL)) {
                uct_usnic_channel_handle_cq_error(channel);
            } else if (ucs_unlikely(ret != -FI_EAGAIN)) {
                ucs_error("%s: fi_cq_read failed: %s", channel->name,
                          fi_strerror(-ret));
            }
            break;
        }

        for (i = 0; i < ret; ++i) {
            if (comps[i].flags & FI_RECV) {
                uct_usnic_channel_rx_complete(channel, &comps[i]);
            } else if (comps[i].flags & FI_SEND) {
                uct_usnic_channel_tx_slot_put(channel, comps[i].op_context);
            }
        }
        count += ret;
    } while (count < max_events);

    while ((channel->rx_queue_len - channel->rx_posted) >= channel->rx_batch) {
        if (uct_usnic_channel_post_recv(channel, channel->rx_batch) <
            channel->rx_batch) {
            break;
        }
    }

    return count;
}

/*
 * What the provider gets of a datagram buffer: all of it, or, behind a
 * prefix it does not know about, what follows the prefix. The usnic
 * provider writes its headers over the prefix of every send; the prefix
 * nobody knows about gets the poison instead, so that nothing kept there
 * survives a send either.
 */
static UCS_F_ALWAYS_INLINE void *
uct_usnic_channel_fi_tx_buffer(uct_usnic_channel_t *channel, void *buffer,
                               size_t *length_p)
{
    memset(buffer, UCT_USNIC_PREFIX_POISON, channel->fake_prefix);
    *length_p -= channel->fake_prefix;
    return UCS_PTR_BYTE_OFFSET(buffer, channel->fake_prefix);
}

/* A datagram larger than fi_inject takes is copied into a send slot: no
 * datagram's memory has to outlive its ACK for the provider's sake */
static ssize_t uct_usnic_channel_fi_send_slot(uct_usnic_channel_t *channel,
                                              const uct_usnic_dgram_t *dgram,
                                              fi_addr_t dest)
{
    uct_usnic_tx_slot_t *slot;
    size_t offset, length;
    void *buffer;
    unsigned i;
    ssize_t ret;

    slot = ucs_mpool_get_inline(&channel->tx_slot_mp);
    if (slot == NULL) {
        return -FI_EAGAIN;
    }

    /* The pieces after the first one's prefix room */
    buffer = slot + 1;
    offset = channel->prefix_size;
    for (i = 0; i < dgram->iovcnt; ++i) {
        length = dgram->iov[i].iov_len - ((i == 0) ? offset : 0);
        memcpy(UCS_PTR_BYTE_OFFSET(buffer, offset),
               UCS_PTR_BYTE_OFFSET(dgram->iov[i].iov_base,
                                   dgram->iov[i].iov_len - length),
               length);
        offset += length;
    }

    length = dgram->length;
    buffer = uct_usnic_channel_fi_tx_buffer(channel, buffer, &length);
    ret    = fi_send(channel->ep, buffer, length, slot->mr_desc, dest,
                     &slot->ctx);
    if (ret != 0) {
        ucs_mpool_put_inline(slot);
        return ret;
    }

    ++channel->tx_slots_posted;
    ++channel->posts.sends;
    channel->posts.sends_mr += (slot->mr_desc != NULL);
    return 0;
}

static ssize_t uct_usnic_channel_fi_send_dgram(uct_usnic_channel_t *channel,
                                               const uct_usnic_dgram_t *dgram,
                                               fi_addr_t dest)
{
    size_t length = dgram->length;
    void *buffer;
    ssize_t ret;

    if (length > channel->inject_size) {
        return uct_usnic_channel_fi_send_slot(channel, dgram, dest);
    }

    /* fi_inject copies the datagram: one in pieces is gathered first */
    buffer = (dgram->iovcnt == 1) ? dgram->iov[0].iov_base :
                                    uct_usnic_channel_gather(channel, dgram);
    buffer = uct_usnic_channel_fi_tx_buffer(channel, buffer, &length);
    ret    = fi_inject(channel->ep, buffer, length, dest);
    channel->posts.injects += (ret == 0);
    return ret;
}

static ssize_t uct_usnic_channel_fi_send(uct_usnic_channel_t *channel,
                                         const void *buffer, size_t length,
                                         fi_addr_t dest)
{
    uct_usnic_dgram_t dgram = {
        .length = length,
        .iovcnt = 1,
        .iov    = {{.iov_base = (void*)buffer, .iov_len = length}}
    };

    return uct_usnic_channel_fi_send_dgram(channel, &dgram, dest);
}

static unsigned
uct_usnic_channel_fi_send_burst(uct_usnic_channel_t *channel,
                                uct_usnic_dgram_t *dgrams, unsigned count,
                                fi_addr_t dest)
{
    unsigned sent;

    for (sent = 0; sent < count; ++sent) {
        uct_usnic_channel_dgram_seal(channel, &dgrams[sent]);
        if (uct_usnic_channel_fi_send_dgram(channel, &dgrams[sent], dest) !=
            0) {
            break;
        }
    }

    return sent;
}

/* Nothing left in the completion queue. This also clears the wait object's
 * own signal. */
static int uct_usnic_channel_fi_may_wait(uct_usnic_channel_t *channel)
{
    uct_usnic_md_t *md = ucs_derived_of(channel->iface->md, uct_usnic_md_t);
    struct fid *fid    = &channel->cq->fid;

    return fi_trywait(md->fabric, &fid, 1) == FI_SUCCESS;
}

static void uct_usnic_channel_fi_cleanup(uct_usnic_channel_t *channel)
{
    uct_usnic_rx_desc_t *desc, *tmp;
    int ret;

    ret = fi_close(&channel->ep->fid);
    if (ret != 0) {
        ucs_warn("%s: fi_close(ep) failed: %s", channel->name,
                 fi_strerror(-ret));
    }

    /* The endpoint is gone: its posted buffers are ours again */
    ucs_list_for_each_safe(desc, tmp, &channel->rx_posted_list, list) {
        ucs_list_del(&desc->list);
        ucs_mpool_put_inline(desc);
    }
    channel->rx_posted = 0;

    ret = fi_close(&channel->cq->fid);
    if (ret != 0) {
        ucs_warn("%s: fi_close(cq) failed: %s", channel->name,
                 fi_strerror(-ret));
    }
}

static const uct_usnic_channel_ops_t uct_usnic_channel_fi_ops = {
    .send       = uct_usnic_channel_fi_send,
    .send_burst = uct_usnic_channel_fi_send_burst,
    .progress   = uct_usnic_channel_fi_progress,
    .may_wait   = uct_usnic_channel_fi_may_wait,
    .cleanup    = uct_usnic_channel_fi_cleanup
};

unsigned uct_usnic_channel_send_burst(uct_usnic_channel_t *channel,
                                      uct_usnic_dgram_t *dgrams,
                                      unsigned count, fi_addr_t dest)
{
    unsigned i;

    if (ucs_likely(channel->fault == NULL)) {
        return channel->ops->send_burst(channel, dgrams, count, dest);
    }

    for (i = 0; i < count; ++i) {
        uct_usnic_channel_dgram_seal(channel, &dgrams[i]);
        if (uct_usnic_fault_send(channel,
                                 uct_usnic_channel_gather(channel, &dgrams[i]),
                                 dgrams[i].length, dest) != 0) {
            break;
        }
    }
    return i;
}

/* Whether nobody is bound to this address and port */
static int uct_usnic_channel_port_is_free(const struct sockaddr_in *addr)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int ret;

    if (fd < 0) {
        return 0;
    }

    ret = bind(fd, (const struct sockaddr*)addr, sizeof(*addr));
    close(fd);
    return ret == 0;
}

/*
 * Create the endpoint on the first free port of the range. Ports are probed
 * with a plain socket first: a provider whose bind fails may leave its
 * socket behind.
 */
static int uct_usnic_channel_endpoint_in_range(uct_usnic_channel_t *channel,
                                               const struct fi_info *info,
                                               struct fid_domain *domain,
                                               const ucs_range_spec_t *ports)
{
    int ret = -FI_EADDRINUSE;
    struct fi_info *bound_info;
    struct sockaddr_in *addr;
    unsigned port;

    if ((info->src_addr == NULL) ||
        (info->src_addrlen != sizeof(struct sockaddr_in))) {
        ucs_error("%s: the provider has no IPv4 source address to bind to "
                  "a port of %sUSNIC_PORT_RANGE", channel->name,
                  UCS_DEFAULT_ENV_PREFIX);
        return -FI_EINVAL;
    }

    bound_info = fi_dupinfo(info);
    if (bound_info == NULL) {
        return -FI_ENOMEM;
    }

    addr = bound_info->src_addr;
    for (port = ports->first; port <= ports->last; ++port) {
        addr->sin_port = htons(port);
        if (uct_usnic_channel_port_is_free(addr)) {
            ret = fi_endpoint(domain, bound_info, &channel->ep, NULL);
            if (ret != -FI_EADDRINUSE) {
                break; /* else taken since the probe */
            }
        }
    }

    fi_freeinfo(bound_info);
    if (ret == -FI_EADDRINUSE) {
        ucs_error("%s: no free port in %sUSNIC_PORT_RANGE=%u-%u",
                  channel->name, UCS_DEFAULT_ENV_PREFIX, ports->first,
                  ports->last);
    } else if (ret != 0) {
        ucs_error("%s: fi_endpoint on port %u of %sUSNIC_PORT_RANGE failed: "
                  "%s", channel->name, port, UCS_DEFAULT_ENV_PREFIX,
                  fi_strerror(-ret));
    }
    return ret;
}

static ucs_status_t uct_usnic_channel_open_ep(uct_usnic_channel_t *channel,
                                              const struct fi_info *info,
                                              struct fid_domain *domain,
                                              const uct_usnic_av_t *av,
                                              const ucs_range_spec_t *ports,
                                              unsigned cq_size, int wakeup)
{
    struct fi_cq_attr cq_attr = {
        .size     = cq_size,
        .format   = FI_CQ_FORMAT_MSG,
        .wait_obj = wakeup ? FI_WAIT_FD : FI_WAIT_NONE
    };
    size_t addrlen            = sizeof(channel->addr);
    int ret;

    ret = fi_cq_open(domain, &cq_attr, &channel->cq, NULL);
    if (ret != 0) {
        ucs_error("%s: fi_cq_open(size %u%s) failed: %s", channel->name,
                  cq_size, wakeup ? ", wait fd" : "", fi_strerror(-ret));
        return UCS_ERR_IO_ERROR;
    }

    channel->wait_fd = -1;
    if (wakeup) {
        ret = fi_control(&channel->cq->fid, FI_GETWAIT, &channel->wait_fd);
        if (ret != 0) {
            ucs_error("%s: the provider gives no wait fd for its completion "
                      "queue (%s); unset %sUSNIC_EVENT_FD", channel->name,
                      fi_strerror(-ret), UCS_DEFAULT_ENV_PREFIX);
            goto err_close_cq;
        }
    }

    if (ports->first != 0) {
        if (uct_usnic_channel_endpoint_in_range(channel, info, domain,
                                                ports) != 0) {
            goto err_close_cq;
        }
    } else {
        ret = fi_endpoint(domain, (struct fi_info*)info, &channel->ep, NULL);
        if (ret != 0) {
            ucs_error("%s: fi_endpoint failed: %s", channel->name,
                      fi_strerror(-ret));
            goto err_close_cq;
        }
    }

    ret = fi_ep_bind(channel->ep, &av->fid->fid, 0);
    if (ret != 0) {
        ucs_error("%s: fi_ep_bind(av) failed: %s", channel->name,
                  fi_strerror(-ret));
        goto err_close_ep;
    }

    ret = fi_ep_bind(channel->ep, &channel->cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret != 0) {
        ucs_error("%s: fi_ep_bind(cq) failed: %s", channel->name,
                  fi_strerror(-ret));
        goto err_close_ep;
    }

    ret = fi_enable(channel->ep);
    if (ret != 0) {
        ucs_error("%s: fi_enable failed: %s", channel->name,
                  fi_strerror(-ret));
        goto err_close_ep;
    }

    ret = fi_getname(&channel->ep->fid, &channel->addr, &addrlen);
    if ((ret != 0) || (addrlen != sizeof(channel->addr)) ||
        (channel->addr.sin_family != AF_INET)) {
        ucs_error("%s: fi_getname failed: %s (length %zu)", channel->name,
                  fi_strerror(-ret), addrlen);
        goto err_close_ep;
    }

    return UCS_OK;

err_close_ep:
    fi_close(&channel->ep->fid);
err_close_cq:
    fi_close(&channel->cq->fid);
    return UCS_ERR_IO_ERROR;
}

static ucs_status_t
uct_usnic_channel_fault_init(uct_usnic_channel_t *channel,
                             const uct_usnic_channel_params_t *params)
{
    ucs_status_t status;

    channel->fault = ucs_malloc(sizeof(*channel->fault), "usnic_fault");
    if (channel->fault == NULL) {
        ucs_error("%s: failed to allocate the fault injector", channel->name);
        return UCS_ERR_NO_MEMORY;
    }

    status = uct_usnic_fault_init(channel->fault, params->fault, params->id,
                                  channel->prefix_size +
                                  channel->max_msg_size);
    if (status != UCS_OK) {
        ucs_free(channel->fault);
        channel->fault = NULL;
        return status;
    }

    ucs_diag("%s: fault injection on (seed %lu)", channel->name,
             params->fault->seed);
    return UCS_OK;
}

static void uct_usnic_tx_slot_init(void *obj, void *mr_desc)
{
    uct_usnic_tx_slot_t *slot = obj;

    slot->mr_desc = mr_desc;
}

/* As many send slots as the send queue holds sends */
static ucs_status_t
uct_usnic_channel_tx_slots_init(uct_usnic_channel_t *channel,
                                uct_usnic_md_t *md,
                                const uct_usnic_channel_params_t *params)
{
    uct_iface_mpool_config_t mp_config = *params->rx_mpool;

    mp_config.max_bufs  = params->tx_queue_len;
    mp_config.bufs_grow = 0;
    return uct_usnic_md_mpool_init(md, &channel->tx_slot_mp,
                                   sizeof(uct_usnic_tx_slot_t) +
                                   channel->prefix_size +
                                   channel->max_msg_size,
                                   0, UCS_SYS_CACHE_LINE_SIZE, &mp_config,
                                   ucs_min(params->tx_queue_len, 64),
                                   uct_usnic_tx_slot_init, params->name);
}

ucs_status_t uct_usnic_channel_init(uct_usnic_channel_t *channel,
                                    uct_base_iface_t *iface,
                                    uct_usnic_md_t *md,
                                    const uct_usnic_av_t *av,
                                    const uct_usnic_channel_params_t *params)
{
    const struct fi_info *info = md->info;
    char addr_str[UCS_SOCKADDR_STRING_LEN];
    size_t align, align_offset;
    ucs_status_t status;

    channel->iface        = iface;
    channel->av           = av;
    channel->ops          = md->kernel ? &uct_usnic_sock_ops :
                                         &uct_usnic_channel_fi_ops;
    channel->name         = params->name;
    channel->rx_cb        = params->rx_cb;
    channel->rx_queue_len = params->rx_queue_len;
    channel->rx_batch     = params->rx_batch;
    channel->rx_posted    = 0;
    channel->idle_polls   = 0;
    channel->skipped_polls = 0;
    channel->last_poll     = 0;
    channel->max_skip      = params->max_skip;
    channel->max_msg_size = params->max_msg_size;
    channel->fault        = NULL;
    channel->rx_bad_seal  = 0;
    channel->rx_oversized = 0;
    channel->prefix_size  = uct_usnic_channel_prefix(info,
                                                     params->forced_prefix);
    channel->fake_prefix  = channel->prefix_size -
                            uct_usnic_channel_prefix(info, 0);
    /* Lengths handed to the channel's provider ops count every prefix,
     * those the provider gets only its own */
    channel->inject_size  = md->force_mr_local ? 0 :
                            (info->tx_attr->inject_size +
                             channel->fake_prefix);
    channel->tx_slots_posted = 0;
    memset(&channel->posts, 0, sizeof(channel->posts));
    /* A user keeping a datagram finds its release descriptor just before
     * its headroom, both in front of the datagram */
    channel->rx_offset    = sizeof(uct_usnic_rx_desc_t) +
                            sizeof(uct_recv_desc_t*) + params->rx_headroom +
                            channel->prefix_size;
    ucs_list_head_init(&channel->rx_posted_list);

    channel->gather_buf = ucs_malloc(channel->prefix_size +
                                     channel->max_msg_size,
                                     "usnic_gather_buf");
    if (channel->gather_buf == NULL) {
        ucs_error("%s: failed to allocate the gather buffer", channel->name);
        return UCS_ERR_NO_MEMORY;
    }

    status = uct_usnic_seal_init(&channel->seal, params->seal_type,
                                 params->seal_key);
    if (status != UCS_OK) {
        goto err_free_gather;
    }

    if (params->am_params != NULL) {
        status = uct_iface_param_am_alignment(params->am_params,
                                              channel->max_msg_size,
                                              channel->rx_offset,
                                              channel->rx_offset +
                                              params->am_offset,
                                              &align, &align_offset);
        if (status != UCS_OK) {
            goto err_free_state;
        }
    } else {
        align        = UCS_SYS_CACHE_LINE_SIZE;
        align_offset = channel->rx_offset;
    }

    if (md->kernel) {
        status = uct_usnic_sock_open(channel, info, params);
    } else {
        status = uct_usnic_channel_open_ep(channel, info, md->domain, av,
                                           params->port_range,
                                           params->rx_queue_len +
                                           params->tx_queue_len,
                                           params->wakeup);
    }
    if (status != UCS_OK) {
        goto err_free_state;
    }

    status = uct_usnic_md_mpool_init(md, &channel->rx_mp,
                                     channel->rx_offset +
                                     channel->max_msg_size,
                                     align_offset, align, params->rx_mpool,
                                     params->rx_queue_len,
                                     uct_usnic_rx_desc_init, params->name);
    if (status != UCS_OK) {
        goto err_close_ep;
    }

    if (md->kernel) {
        /* The socket buffer, sized for the queue, is always posted */
        channel->rx_posted = channel->rx_queue_len;
    } else {
        status = uct_usnic_channel_tx_slots_init(channel, md, params);
        if (status != UCS_OK) {
            goto err_free_rx_mp;
        }

        if (uct_usnic_channel_post_recv(channel, channel->rx_queue_len) ==
            0) {
            ucs_error("%s: could not post any receive buffer", channel->name);
            status = UCS_ERR_NO_RESOURCE;
            goto err_cleanup;
        }
    }

    if (uct_usnic_fault_enabled(params->fault) &&
        (params->fault->channels & UCS_BIT(params->id))) {
        status = uct_usnic_channel_fault_init(channel, params);
        if (status != UCS_OK) {
            goto err_cleanup;
        }
    }

    ucs_debug("%s: bound to %s, %u receives posted", channel->name,
              ucs_sockaddr_str((struct sockaddr*)&channel->addr, addr_str,
                               sizeof(addr_str)),
              channel->rx_posted);
    return UCS_OK;

err_cleanup:
    uct_usnic_channel_cleanup(channel);
    return status;
err_free_rx_mp:
    ucs_mpool_cleanup(&channel->rx_mp, 1);
err_close_ep:
    channel->ops->cleanup(channel);
err_free_state:
    uct_usnic_seal_cleanup(&channel->seal);
err_free_gather:
    ucs_free(channel->gather_buf);
    return status;
}

void uct_usnic_channel_cleanup(uct_usnic_channel_t *channel)
{
    if (channel->fault != NULL) {
        uct_usnic_fault_cleanup(channel->fault);
        ucs_free(channel->fault);
        channel->fault = NULL;
    }

    channel->ops->cleanup(channel);
    if (channel->ops == &uct_usnic_channel_fi_ops) {
        /* The endpoint is gone: so are the sends it had not completed */
        ucs_mpool_cleanup(&channel->tx_slot_mp,
                          channel->tx_slots_posted == 0);
    }
    ucs_mpool_cleanup(&channel->rx_mp, 1);
    uct_usnic_seal_cleanup(&channel->seal);
    ucs_free(channel->gather_buf);
}

ucs_status_t uct_usnic_av_open(uct_usnic_av_t *av, uct_usnic_md_t *md,
                               unsigned max_connected, int sndbuf)
{
    /* Synchronous inserts (no FI_EVENT): an unreachable peer fails its
     * fi_av_insert, and so the ep create, at once */
    struct fi_av_attr av_attr = {
        .type  = md->info->domain_attr->av_type,
        .count = 256
    };
    int ret;

    av->fid           = NULL;
    av->addrs         = NULL;
    av->fds           = NULL;
    av->free          = NULL;
    av->num_free      = 0;
    av->count         = 0;
    av->capacity      = 0;
    av->sndbuf        = sndbuf;
    av->max_connected = max_connected;
    av->num_connected = 0;
    kh_init_inplace(uct_usnic_av_map, &av->map);
    if (md->kernel) {
        av->src          = *(const struct sockaddr_in*)md->info->src_addr;
        av->src.sin_port = 0;
        return UCS_OK;
    }

    ret = fi_av_open(md->domain, &av_attr, &av->fid, NULL);
    if (ret != 0) {
        ucs_error("fi_av_open(%s, %s) failed: %s",
                  md->info->domain_attr->name,
                  fi_tostr(&av_attr.type, FI_TYPE_AV_TYPE), fi_strerror(-ret));
        kh_destroy_inplace(uct_usnic_av_map, &av->map);
        return UCS_ERR_IO_ERROR;
    }

    return UCS_OK;
}

static void uct_usnic_av_disconnect(uct_usnic_av_t *av, fi_addr_t fi_addr)
{
    if (av->fds[fi_addr] >= 0) {
        close(av->fds[fi_addr]);
        av->fds[fi_addr] = -1;
        --av->num_connected;
    }
}

void uct_usnic_av_close(uct_usnic_av_t *av)
{
    fi_addr_t fi_addr;
    int ret;

    for (fi_addr = 0; fi_addr < av->count; ++fi_addr) {
        uct_usnic_av_disconnect(av, fi_addr);
    }
    kh_destroy_inplace(uct_usnic_av_map, &av->map);
    ucs_free(av->addrs);
    ucs_free(av->fds);
    ucs_free(av->free);
    if (av->fid == NULL) {
        return;
    }

    ret = fi_close(&av->fid->fid);
    if (ret != 0) {
        ucs_warn("fi_close(av) failed: %s", fi_strerror(-ret));
    }
}

static UCS_F_ALWAYS_INLINE uint64_t
uct_usnic_av_key(const struct sockaddr_in *addr)
{
    return ((uint64_t)addr->sin_addr.s_addr << 16) | addr->sin_port;
}

/* A connected socket for the entry, while there are fewer than the most */
static void uct_usnic_av_connect(uct_usnic_av_t *av, fi_addr_t fi_addr)
{
    av->fds[fi_addr] = -1;
    if (av->num_connected < av->max_connected) {
        av->fds[fi_addr] = uct_usnic_sock_connect(&av->src,
                                                  &av->addrs[fi_addr],
                                                  av->sndbuf);
        av->num_connected += (av->fds[fi_addr] >= 0);
    }
}

/* The kernel provider's table: a free entry, or a new one */
static ucs_status_t uct_usnic_av_sock_insert(uct_usnic_av_t *av,
                                             const struct sockaddr_in *addr,
                                             fi_addr_t *fi_addr_p)
{
    struct sockaddr_in *addrs;
    fi_addr_t *free_list;
    size_t capacity;
    int *fds;

    if (av->num_free > 0) {
        *fi_addr_p            = av->free[--av->num_free];
        av->addrs[*fi_addr_p] = *addr;
        uct_usnic_av_connect(av, *fi_addr_p);
        return UCS_OK;
    }

    if (av->count == av->capacity) {
        capacity  = ucs_max(av->capacity * 2, 16);
        addrs     = ucs_realloc(av->addrs, capacity * sizeof(*addrs),
                                "usnic_av");
        if (addrs == NULL) {
            goto err_no_memory;
        }
        av->addrs = addrs;

        fds = ucs_realloc(av->fds, capacity * sizeof(*fds), "usnic_av_fds");
        if (fds == NULL) {
            goto err_no_memory;
        }
        av->fds = fds;

        free_list = ucs_realloc(av->free, capacity * sizeof(*free_list),
                                "usnic_av_free");
        if (free_list == NULL) {
            goto err_no_memory;
        }
        av->free     = free_list;
        av->capacity = capacity;
    }

    av->addrs[av->count] = *addr;
    *fi_addr_p           = av->count++;
    uct_usnic_av_connect(av, *fi_addr_p);
    return UCS_OK;

err_no_memory:
    ucs_error("failed to grow the usnic address table to %zu entries",
              av->capacity * 2);
    return UCS_ERR_NO_MEMORY;
}

ucs_status_t uct_usnic_av_insert(uct_usnic_av_t *av,
                                 const struct sockaddr_in *addr,
                                 fi_addr_t *fi_addr_p)
{
    char str[UCS_SOCKADDR_STRING_LEN];
    uct_usnic_av_entry_t *entry;
    ucs_status_t status;
    khiter_t iter;
    int ret;

    iter = kh_put(uct_usnic_av_map, &av->map, uct_usnic_av_key(addr), &ret);
    if (ret < 0) {
        return UCS_ERR_NO_MEMORY;
    }

    entry = &kh_value(&av->map, iter);
    if (ret == 0) {
        ++entry->refs;
        *fi_addr_p = entry->fi_addr;
        return UCS_OK;
    }

    if (av->fid == NULL) {
        status = uct_usnic_av_sock_insert(av, addr, &entry->fi_addr);
    } else {
        ret    = fi_av_insert(av->fid, addr, 1, &entry->fi_addr, 0, NULL);
        status = (ret == 1)                ? UCS_OK :
                 (ret == -FI_EHOSTUNREACH) ? UCS_ERR_UNREACHABLE :
                                             UCS_ERR_IO_ERROR;
        if (status != UCS_OK) {
            ucs_error("fi_av_insert(%s) failed: %s",
                      ucs_sockaddr_str((const struct sockaddr*)addr, str,
                                       sizeof(str)),
                      fi_strerror((ret < 0) ? -ret : FI_EOTHER));
        }
    }

    if (status != UCS_OK) {
        kh_del(uct_usnic_av_map, &av->map, iter);
        return status;
    }

    entry->refs = 1;
    *fi_addr_p  = entry->fi_addr;
    return UCS_OK;
}

void uct_usnic_av_remove(uct_usnic_av_t *av, const struct sockaddr_in *addr)
{
    khiter_t iter = kh_get(uct_usnic_av_map, &av->map,
                           uct_usnic_av_key(addr));
    uct_usnic_av_entry_t *entry;
    int ret;

    ucs_assert_always(iter != kh_end(&av->map));
    entry = &kh_value(&av->map, iter);
    if (--entry->refs > 0) {
        return;
    }

    if (av->fid == NULL) {
        uct_usnic_av_disconnect(av, entry->fi_addr);
        av->free[av->num_free++] = entry->fi_addr;
    } else {
        ret = fi_av_remove(av->fid, &entry->fi_addr, 1, 0);
        if (ret != 0) {
            ucs_warn("fi_av_remove(%" PRIu64 ") failed: %s", entry->fi_addr,
                     fi_strerror(-ret));
        }
    }
    kh_del(uct_usnic_av_map, &av->map, iter);
}
