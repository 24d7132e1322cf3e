/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#include <common/test.h>
#include <uct/uct_test.h>

extern "C" {
#include <uct/usnic/usnic_ep.h>
}

#include <unistd.h>

#include <vector>


/*
 * A peer that goes away: the ep fails once, within the timeout, outstanding
 * work completes with the error, and nothing hangs.
 */
class test_usnic_failure : public uct_test {
protected:
    static const uint8_t AM_ID = 3;

    struct failure {
        uct_ep_h     ep;
        ucs_status_t status;
        ucs_time_t   time;
    };

    void init()
    {
        /* Both names, as in test_usnic_pending */
        modify_config("TIMEOUT", "1s", IGNORE_IF_NOT_EXIST);
        modify_config("USNIC_TIMEOUT", "1s", IGNORE_IF_NOT_EXIST);
        uct_test::init();

        m_receiver = create_entity(0);
        m_entities.push_back(m_receiver);
        m_sender = create_entity(0, error_handler);
        m_entities.push_back(m_sender);
        m_sender->connect(0, *m_receiver, 0);
        ASSERT_UCS_OK(uct_iface_set_am_handler(m_receiver->iface(), AM_ID,
                                               am_handler, this, 0));
        ASSERT_EQ(ucs_time_from_sec(1.0),
                  ucs_derived_of(m_sender->iface(), uct_usnic_iface_t)
                          ->config.timeout);
    }

    static ucs_status_t error_handler(void *arg, uct_ep_h ep,
                                      ucs_status_t status)
    {
        test_usnic_failure *self = (test_usnic_failure*)arg;

        self->m_failures.push_back({ep, status, ucs_get_time()});
        return UCS_OK;
    }

    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        ++((test_usnic_failure*)arg)->m_received;
        return UCS_OK;
    }

    ucs_status_t send_am()
    {
        uint64_t header = 0;

        return uct_ep_am_short(m_sender->ep(0), AM_ID, header, NULL, 0);
    }

    void send_and_flush(unsigned count)
    {
        unsigned expected = m_received + count;

        for (unsigned i = 0; i < count; ++i) {
            ASSERT_UCS_OK(send_am());
        }
        while (uct_ep_flush(m_sender->ep(0), 0, NULL) != UCS_OK) {
            progress();
        }
        EXPECT_EQ(expected, m_received);
    }

    /* The receiver's iface goes away, as with a process killed */
    ucs_time_t kill_receiver()
    {
        m_entities.remove(m_receiver);
        m_receiver = NULL;
        return ucs_get_time();
    }

    void progress_for(double seconds)
    {
        ucs_time_t end = ucs_get_time() + ucs_time_from_sec(seconds);

        while (ucs_get_time() < end) {
            progress();
        }
    }

    void wait_for_failure(ucs_time_t since)
    {
        ucs_time_t deadline = since + ucs_time_from_sec(10);

        while (m_failures.empty() && (ucs_get_time() < deadline)) {
            progress();
        }
        ASSERT_EQ(1u, m_failures.size());
        EXPECT_EQ(m_sender->ep(0), m_failures[0].ep);
        EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, m_failures[0].status);
        /* Within the timeout, plus a second */
        EXPECT_LT(ucs_time_to_sec(m_failures[0].time - since), 2.0);
    }

    /* After a failure: errors, not hangs, and no second report */
    void check_failed_ep()
    {
        EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, send_am());
        EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT,
                  uct_ep_flush(m_sender->ep(0), 0, NULL));
        progress_for(0.2);
        EXPECT_EQ(1u, m_failures.size());
    }

    entity               *m_receiver;
    entity               *m_sender;
    std::vector<failure> m_failures;
    unsigned             m_received = 0;
};

UCS_TEST_P(test_usnic_failure, caps) {
    const uct_iface_attr_t &attr = m_sender->iface_attr();

    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE);
    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_EP_CHECK);
}

UCS_TEST_P(test_usnic_failure, dead_peer_mid_stream) {
    uct_completion_t comp;
    ucs_time_t killed;

    send_and_flush(30);
    scoped_log_handler slh(hide_errors_logger);
    killed = kill_receiver();

    for (int i = 0; i < 30; ++i) {
        ASSERT_UCS_OK(send_am());
    }
    comp.func   = (uct_completion_callback_t)ucs_empty_function;
    comp.count  = 1;
    comp.status = UCS_OK;
    ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(m_sender->ep(0), 0, &comp));

    wait_for_failure(killed);
    /* The waiting flush completed with the error */
    EXPECT_EQ(0, comp.count);
    EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, comp.status);
    check_failed_ep();
}

UCS_TEST_P(test_usnic_failure, ep_check_finds_dead_idle_peer) {
    ucs_time_t killed;

    send_and_flush(10);
    scoped_log_handler slh(hide_errors_logger);
    killed = kill_receiver();

    /* Idle: nothing tells that the peer is gone until a probe */
    progress_for(1.5);
    EXPECT_TRUE(m_failures.empty());
    ASSERT_UCS_OK(uct_ep_check(m_sender->ep(0), 0, NULL));
    wait_for_failure(ucs_get_time());
    check_failed_ep();
    (void)killed;
}

UCS_TEST_P(test_usnic_failure, detected_without_progress) {
    ucs_time_t killed;

    send_and_flush(10);
    scoped_log_handler slh(hide_errors_logger);
    killed = kill_receiver();
    ASSERT_UCS_OK(send_am());

    /* The async timer notices while the application sleeps */
    usleep(1500000);
    EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, send_am());
    EXPECT_TRUE(m_failures.empty());

    /* and the next progress reports it */
    progress();
    wait_for_failure(killed);
}

UCS_TEST_P(test_usnic_failure, live_peer_never_fails) {
    send_and_flush(10);

    /* Idle longer than the timeout, with probes: nothing fails */
    for (int i = 0; i < 4; ++i) {
        ASSERT_UCS_OK(uct_ep_check(m_sender->ep(0), 0, NULL));
        progress_for(0.5);
    }
    EXPECT_TRUE(m_failures.empty());
    send_and_flush(0);
    ASSERT_UCS_OK(send_am());
    progress_for(0.1);
    EXPECT_TRUE(m_failures.empty());
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_failure, usnic)


/*
 * Duplicated ACKs reach eps whose windows are already empty; they must not
 * put any ep back among those the timers watch, where an idle ep would be
 * declared dead after the timeout.
 */
class test_usnic_failure_stale_acks : public test_usnic_failure {
protected:
    static const unsigned NUM_EPS = 4;

    void init()
    {
        test_usnic_failure::init();
        for (unsigned i = 1; i < NUM_EPS; ++i) {
            m_sender->connect(i, *m_receiver, 0);
        }
    }

    /* What the receiver sent last for this ep, once more */
    void duplicate_last_ack(unsigned index)
    {
        uct_usnic_ep_t *ep       = ucs_derived_of(m_sender->ep(index),
                                                  uct_usnic_ep_t);
        uct_usnic_iface_t *iface = ucs_derived_of(m_sender->iface(),
                                                  uct_usnic_iface_t);
        uct_usnic_ack_ext_t ack;

        ack.ep_id     = ep->id;
        ack.ep_serial = ep->serial;
        ack.stream_id = ep->peer_stream_id;
        ack.psn       = ep->acked_psn;
        uct_usnic_iface_enter(iface);
        uct_usnic_tx_handle_ack(iface, &ack, ep->peer_incarnation, 0);
        uct_usnic_iface_leave(iface);
    }
};

UCS_TEST_P(test_usnic_failure_stale_acks, idle_eps_stay_alive) {
    uct_usnic_iface_t *iface = ucs_derived_of(m_sender->iface(),
                                              uct_usnic_iface_t);
    uint64_t header          = 0;

    for (unsigned i = 0; i < NUM_EPS; ++i) {
        ASSERT_UCS_OK(uct_ep_am_short(m_sender->ep(i), AM_ID, header, NULL,
                                      0));
    }
    for (unsigned i = 0; i < NUM_EPS; ++i) {
        while (uct_ep_flush(m_sender->ep(i), 0, NULL) != UCS_OK) {
            progress();
        }
    }
    ASSERT_TRUE(ucs_list_is_empty(&iface->active_eps));

    for (unsigned i = 0; i < NUM_EPS; ++i) {
        duplicate_last_ack(i);
        EXPECT_TRUE(ucs_list_is_empty(&iface->active_eps)) << "ep " << i;
    }

    progress_for(1.5);
    EXPECT_TRUE(m_failures.empty());
    EXPECT_EQ(unsigned(NUM_EPS), m_received);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_failure_stale_acks, usnic)
