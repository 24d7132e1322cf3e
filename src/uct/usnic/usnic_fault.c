/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_fault.h"
#include "usnic_channel.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>

#include <rdma/fi_endpoint.h>


/* A datagram held back by the injector */
typedef struct uct_usnic_fault_held {
    ucs_queue_elem_t queue;
    ucs_time_t       due;        /* Sent by then at the latest */
    int              after_next; /* Sent right after the next datagram */
    fi_addr_t        dest;
    size_t           length;
    uint8_t          data[0];    /* Prefix and datagram */
} uct_usnic_fault_held_t;


const char *uct_usnic_fault_names[] = {
    [UCT_USNIC_FAULT_DROP]      = "DROP",
    [UCT_USNIC_FAULT_DUPLICATE] = "DUPLICATE",
    [UCT_USNIC_FAULT_REORDER]   = "REORDER",
    [UCT_USNIC_FAULT_DELAY]     = "DELAY",
    [UCT_USNIC_FAULT_CORRUPT]   = "CORRUPT",
    [UCT_USNIC_FAULT_TRUNCATE]  = "TRUNCATE",
    [UCT_USNIC_FAULT_LAST]      = NULL
};


int uct_usnic_fault_enabled(const uct_usnic_fault_config_t *config)
{
    int type;

    for (type = 0; type < UCT_USNIC_FAULT_LAST; ++type) {
        if (config->prob[type] > 0) {
            return 1;
        }
    }
    return 0;
}

/* xorshift64*: fast, and the same sequence for the same seed */
static uint64_t uct_usnic_fault_rand(uct_usnic_fault_t *fault)
{
    fault->rng ^= fault->rng >> 12;
    fault->rng ^= fault->rng << 25;
    fault->rng ^= fault->rng >> 27;
    return fault->rng * 0x2545f4914f6cdd1dull;
}

static int uct_usnic_fault_hit(uct_usnic_fault_t *fault,
                               uct_usnic_fault_type_t type)
{
    if ((fault->prob[type] <= 0) ||
        ((double)(uct_usnic_fault_rand(fault) >> 11) * 0x1p-53 >=
         fault->prob[type])) {
        return 0;
    }

    ++fault->count[type];
    return 1;
}

ucs_status_t uct_usnic_fault_init(uct_usnic_fault_t *fault,
                                  const uct_usnic_fault_config_t *config,
                                  unsigned channel_id, size_t max_length)
{
    memcpy(fault->prob, config->prob, sizeof(fault->prob));
    memset(fault->count, 0, sizeof(fault->count));
    fault->delay = ucs_time_from_sec(config->delay_time);
    /* Never 0, which would stay 0; each channel its own sequence */
    fault->rng   = (config->seed * 0x9e3779b97f4a7c15ull) +
                   channel_id + 1;
    ucs_queue_head_init(&fault->held);

    fault->scratch = ucs_malloc(max_length, "usnic_fault_scratch");
    if (fault->scratch == NULL) {
        ucs_error("failed to allocate the fault injector's buffer");
        return UCS_ERR_NO_MEMORY;
    }

    return UCS_OK;
}

void uct_usnic_fault_cleanup(uct_usnic_fault_t *fault)
{
    uct_usnic_fault_held_t *held;

    ucs_debug("fault injector %p: %lu dropped, %lu duplicated, %lu reordered, "
              "%lu delayed, %lu corrupted, %lu truncated", fault,
              fault->count[UCT_USNIC_FAULT_DROP],
              fault->count[UCT_USNIC_FAULT_DUPLICATE],
              fault->count[UCT_USNIC_FAULT_REORDER],
              fault->count[UCT_USNIC_FAULT_DELAY],
              fault->count[UCT_USNIC_FAULT_CORRUPT],
              fault->count[UCT_USNIC_FAULT_TRUNCATE]);
    ucs_queue_for_each_extract(held, &fault->held, queue, 1) {
        ucs_free(held);
    }
    ucs_free(fault->scratch);
}

/* Keep a copy to send later; the sender sees a datagram sent */
static void uct_usnic_fault_hold(uct_usnic_fault_t *fault, const void *buffer,
                                 size_t length, fi_addr_t dest,
                                 int after_next)
{
    uct_usnic_fault_held_t *held;

    held = ucs_malloc(sizeof(*held) + length, "usnic_fault_held");
    if (held == NULL) {
        return; /* Lost instead */
    }

    held->due        = ucs_get_time() + fault->delay;
    held->after_next = after_next;
    held->dest       = dest;
    held->length     = length;
    memcpy(held->data, buffer, length);
    ucs_queue_push(&fault->held, &held->queue);
}

static void uct_usnic_fault_release(uct_usnic_channel_t *channel,
                                    int after_send)
{
    uct_usnic_fault_held_t *held;
    ucs_time_t now;

    if (ucs_queue_is_empty(&channel->fault->held)) {
        return;
    }

    now = ucs_get_time();
    ucs_queue_for_each_extract(held, &channel->fault->held, queue,
                               (after_send && held->after_next) ||
                               (held->due <= now)) {
        /* A held datagram the send queue refuses is lost */
        (void)channel->ops->send(channel, held->data, held->length,
                                 held->dest);
        ucs_free(held);
    }
}

ssize_t uct_usnic_fault_send(uct_usnic_channel_t *channel, void *buffer,
                             size_t length, fi_addr_t dest)
{
    uct_usnic_fault_t *fault = channel->fault;
    size_t prefix            = channel->prefix_size;
    uint8_t *byte;
    ssize_t ret;

    if (uct_usnic_fault_hit(fault, UCT_USNIC_FAULT_DROP)) {
        return 0;
    }

    if ((length > prefix) &&
        uct_usnic_fault_hit(fault, UCT_USNIC_FAULT_CORRUPT)) {
        /* The sender keeps its copy for retransmission: damage another */
        memcpy(fault->scratch, buffer, length);
        byte   = UCS_PTR_BYTE_OFFSET(fault->scratch,
                                     prefix + (uct_usnic_fault_rand(fault) %
                                               (length - prefix)));
        *byte ^= 1 + (uct_usnic_fault_rand(fault) % 255);
        buffer = fault->scratch;
    }

    if ((length > prefix) &&
        uct_usnic_fault_hit(fault, UCT_USNIC_FAULT_TRUNCATE)) {
        length = prefix + (uct_usnic_fault_rand(fault) % (length - prefix));
    }

    if (uct_usnic_fault_hit(fault, UCT_USNIC_FAULT_REORDER)) {
        uct_usnic_fault_hold(fault, buffer, length, dest, 1);
        return 0;
    }

    if (uct_usnic_fault_hit(fault, UCT_USNIC_FAULT_DELAY)) {
        uct_usnic_fault_hold(fault, buffer, length, dest, 0);
        return 0;
    }

    ret = channel->ops->send(channel, buffer, length, dest);
    if (ret == 0) {
        if (uct_usnic_fault_hit(fault, UCT_USNIC_FAULT_DUPLICATE)) {
            (void)channel->ops->send(channel, buffer, length, dest);
        }
        uct_usnic_fault_release(channel, 1);
    }

    return ret;
}

void uct_usnic_fault_progress(uct_usnic_channel_t *channel)
{
    uct_usnic_fault_release(channel, 0);
}
