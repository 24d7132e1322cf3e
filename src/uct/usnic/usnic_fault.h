/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_FAULT_H
#define UCT_USNIC_FAULT_H

#include <ucs/datastruct/queue.h>
#include <ucs/time/time.h>
#include <ucs/type/status.h>

#include <rdma/fabric.h>


struct uct_usnic_channel;


/* What can happen to a datagram on its way out */
typedef enum {
    UCT_USNIC_FAULT_DROP,      /* Never sent */
    UCT_USNIC_FAULT_DUPLICATE, /* Sent twice */
    UCT_USNIC_FAULT_REORDER,   /* Sent after the next datagram */
    UCT_USNIC_FAULT_DELAY,     /* Sent FAULT_DELAY_TIME later */
    UCT_USNIC_FAULT_CORRUPT,   /* One byte changed */
    UCT_USNIC_FAULT_TRUNCATE,  /* Cut short */
    UCT_USNIC_FAULT_LAST
} uct_usnic_fault_type_t;


/* Fault injector settings, from UCX_USNIC_FAULT_* */
typedef struct uct_usnic_fault_config {
    double        prob[UCT_USNIC_FAULT_LAST]; /* Per datagram, 0..1 */
    double        delay_time;                 /* Seconds */
    unsigned long seed;
    unsigned      channels;                   /* Bit per channel id */
} uct_usnic_fault_config_t;


/**
 * Fault injector of one channel: decides the fate of each datagram sent,
 * from a seeded generator so that a run can be repeated.
 */
typedef struct uct_usnic_fault {
    double           prob[UCT_USNIC_FAULT_LAST];
    ucs_time_t       delay;
    uint64_t         rng;
    ucs_queue_head_t held;    /* Datagrams sent later: reordered, delayed */
    void             *scratch; /* Copy of a datagram being damaged */
    uint64_t         count[UCT_USNIC_FAULT_LAST]; /* Faults injected */
} uct_usnic_fault_t;


extern const char *uct_usnic_fault_names[];


int uct_usnic_fault_enabled(const uct_usnic_fault_config_t *config);

ucs_status_t uct_usnic_fault_init(uct_usnic_fault_t *fault,
                                  const uct_usnic_fault_config_t *config,
                                  unsigned channel_id, size_t max_length);

void uct_usnic_fault_cleanup(uct_usnic_fault_t *fault);

/* Send a datagram (prefix included) through the injector */
ssize_t uct_usnic_fault_send(struct uct_usnic_channel *channel, void *buffer,
                             size_t length, fi_addr_t dest);

/* Send the held datagrams whose time has come */
void uct_usnic_fault_progress(struct uct_usnic_channel *channel);

#endif
