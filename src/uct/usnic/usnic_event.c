/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_iface.h"
#include "usnic_rx.h"

#include <ucs/debug/log.h>

#include <rdma/fi_eq.h>
#include <sys/eventfd.h>
#include <unistd.h>


/*
 * One file descriptor for the user to wait on: the wait objects of both
 * channels' completion queues, readable when a datagram arrives, and an
 * eventfd through which the async timer wakes the user for work only
 * progress can do (reporting a failed peer, resending).
 */
ucs_status_t uct_usnic_iface_event_init(uct_usnic_iface_t *iface)
{
    uct_usnic_channel_id_t id;
    ucs_status_t status;

    iface->wakeup_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (iface->wakeup_fd < 0) {
        ucs_error("usnic: eventfd() failed: %m");
        return UCS_ERR_IO_ERROR;
    }

    status = ucs_event_set_create(&iface->event_set);
    if (status != UCS_OK) {
        goto err_close;
    }

    status = ucs_event_set_add(iface->event_set, iface->wakeup_fd,
                               UCS_EVENT_SET_EVREAD, NULL);
    for (id = 0; (id < UCT_USNIC_CHANNEL_LAST) && (status == UCS_OK); ++id) {
        status = ucs_event_set_add(iface->event_set,
                                   iface->channels[id].wait_fd,
                                   UCS_EVENT_SET_EVREAD, NULL);
    }
    if (status != UCS_OK) {
        goto err_cleanup;
    }

    return UCS_OK;

err_cleanup:
    ucs_event_set_cleanup(iface->event_set);
err_close:
    close(iface->wakeup_fd);
    iface->event_set = NULL;
    return status;
}

void uct_usnic_iface_event_cleanup(uct_usnic_iface_t *iface)
{
    if (iface->event_set != NULL) {
        ucs_event_set_cleanup(iface->event_set);
        close(iface->wakeup_fd);
    }
}

ucs_status_t uct_usnic_iface_event_fd_get(uct_iface_h tl_iface, int *fd_p)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);

    if (iface->event_set == NULL) {
        return UCS_ERR_UNSUPPORTED;
    }

    return ucs_event_set_fd_get(iface->event_set, fd_p);
}

ucs_status_t uct_usnic_iface_event_arm(uct_iface_h tl_iface, unsigned events)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);
    ucs_status_t status      = UCS_OK;
    uct_usnic_channel_id_t id;
    uint64_t count;

    if (iface->event_set == NULL) {
        return UCS_ERR_UNSUPPORTED;
    }

    uct_usnic_iface_enter(iface);
    /* A wakeup already seen by the user is spent */
    while (read(iface->wakeup_fd, &count, sizeof(count)) > 0) {
    }

    /* ACKs held back for more data would wait for the async timer while
     * the user sleeps, and with them the peer: send them now */
    if (!ucs_list_is_empty(&iface->ack_streams)) {
        uct_usnic_rx_send_acks(iface, 1, ucs_get_time());
    }

    if (!ucs_list_is_empty(&iface->failed_eps)) {
        status = UCS_ERR_BUSY;
    }
    for (id = 0; (id < UCT_USNIC_CHANNEL_LAST) && (status == UCS_OK); ++id) {
        if (!iface->channels[id].ops->may_wait(&iface->channels[id])) {
            status = UCS_ERR_BUSY;
        }
    }

    iface->armed = (status == UCS_OK);
    uct_usnic_iface_leave(iface);
    return status;
}

/*
 * From the async timer: wake an armed user when there is work only progress
 * does: a failure to report, or packets in flight whose timers are due.
 */
void uct_usnic_iface_event_async(uct_usnic_iface_t *iface)
{
    uint64_t one = 1;

    if (!iface->armed ||
        (ucs_list_is_empty(&iface->failed_eps) &&
         ucs_twheel_is_empty(&iface->tx_wheel))) {
        return;
    }

    iface->armed = 0;
    if (write(iface->wakeup_fd, &one, sizeof(one)) != sizeof(one)) {
        ucs_debug("usnic iface %p: waking the user failed: %m", iface);
    }
}
