/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#include <common/test.h>
#include <uct/uct_test.h>
#include "usnic_test.h"

extern "C" {
#include <uct/usnic/usnic_ep.h>
}

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>


/*
 * A peer that goes away: the ep fails once, within the timeout, outstanding
 * work completes with the error, and nothing hangs.
 */
class test_usnic_failure : public test_usnic_base {
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
        set_usnic_config("TIMEOUT", "1s");
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

    /* Probe the sender's ep 4 times over 4 * interval seconds: a live,
     * connected peer never fails it */
    void expect_probes_answered(double interval)
    {
        for (int i = 0; i < 4; ++i) {
            ASSERT_UCS_OK(uct_ep_check(m_sender->ep(0), 0, NULL));
            progress_for(interval);
        }
        EXPECT_TRUE(m_failures.empty());
    }

    void wait_for_failure(ucs_time_t since, double within = 2.0,
                          ucs_status_t status = UCS_ERR_ENDPOINT_TIMEOUT)
    {
        ucs_time_t deadline = since + ucs_time_from_sec(10);

        while (m_failures.empty() && (ucs_get_time() < deadline)) {
            progress();
        }
        ASSERT_EQ(1u, m_failures.size());
        EXPECT_EQ(m_sender->ep(0), m_failures[0].ep);
        EXPECT_EQ(status, m_failures[0].status);
        /* By default within the timeout, plus a second */
        EXPECT_LT(ucs_time_to_sec(m_failures[0].time - since), within);
    }

    /* After a failure: errors, not hangs, and no second report */
    void check_failed_ep(ucs_status_t status = UCS_ERR_ENDPOINT_TIMEOUT)
    {
        EXPECT_EQ(status, send_am());
        EXPECT_EQ(status, uct_ep_flush(m_sender->ep(0), 0, NULL));
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
    expect_probes_answered(0.5);
    send_and_flush(0);
    ASSERT_UCS_OK(send_am());
    progress_for(0.1);
    EXPECT_TRUE(m_failures.empty());
}

/* The peer's iface lives on, but it closed its ep to us: a probe is
 * answered at once, as a closed TCP connection would be */
UCS_TEST_P(test_usnic_failure, ep_check_finds_closed_remote_ep) {
    m_receiver->connect(0, *m_sender, 0);
    send_and_flush(10);

    m_receiver->destroy_ep(0);
    send_and_flush(10);
    progress_for(0.2);
    EXPECT_TRUE(m_failures.empty()) << "data alone still reaches the iface";

    ASSERT_UCS_OK(uct_ep_check(m_sender->ep(0), 0, NULL));
    wait_for_failure(ucs_get_time(), 0.5, UCS_ERR_CONNECTION_RESET);
    check_failed_ep(UCS_ERR_CONNECTION_RESET);
}

UCS_TEST_P(test_usnic_failure, reconnected_remote_ep_stays_alive) {
    m_receiver->connect(0, *m_sender, 0);
    send_and_flush(10);
    m_receiver->destroy_ep(0);
    m_receiver->connect(0, *m_sender, 0);

    expect_probes_answered(0.3);
    send_and_flush(10);
}

/* The peer closed its side; an ep created afterwards starts a new
 * connection, which its probes must not find closed (UCP's keepalive in
 * test_ucp_wireup_errh_peer.stress_connect_force_disconnect did) */
UCS_TEST_P(test_usnic_failure, new_ep_after_remote_close_stays_alive) {
    m_receiver->connect(0, *m_sender, 0);
    send_and_flush(10);
    m_receiver->destroy_ep(0);
    m_sender->destroy_ep(0);
    m_sender->connect(0, *m_receiver, 0);
    send_and_flush(10);

    expect_probes_answered(0.3);
    send_and_flush(10);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_failure, usnic)


/*
 * A user asleep on the event fd learns of a dead peer: the async timer wakes
 * it within the timeout plus a second, and progress reports the failure.
 */
class test_usnic_failure_wakeup : public test_usnic_failure {
protected:
    void init()
    {
        set_usnic_config("EVENT_FD", "y");
        test_usnic_failure::init();
    }

    void arm(entity *e)
    {
        ucs_status_t status;

        do {
            e->progress();
            status = uct_iface_event_arm(e->iface(), UCT_EVENT_SEND_COMP |
                                                     UCT_EVENT_RECV);
        } while (status == UCS_ERR_BUSY);
        ASSERT_UCS_OK(status);
    }

    /* Whether the fd became readable within the time */
    static bool wait_fd(int fd, double seconds)
    {
        struct pollfd pfd = {fd, POLLIN, 0};

        return poll(&pfd, 1, (int)(seconds * 1000)) == 1;
    }
};

UCS_TEST_P(test_usnic_failure_wakeup, dead_peer_wakes_sleeper) {
    const uct_iface_attr_t &attr = m_sender->iface_attr();
    ucs_time_t killed;
    int fd;

    ASSERT_TRUE(attr.cap.event_flags & UCT_IFACE_FLAG_EVENT_FD);
    ASSERT_UCS_OK(uct_iface_event_fd_get(m_sender->iface(), &fd));

    /* Armed and idle: no wakeup */
    send_and_flush(10);
    arm(m_sender);
    EXPECT_FALSE(wait_fd(fd, 0.2));

    scoped_log_handler slh(hide_errors_logger);
    killed = kill_receiver();
    ASSERT_UCS_OK(send_am());
    arm(m_sender);

    /* Woken more than once while resends are due; never past the
     * timeout plus a second without the failure */
    while (m_failures.empty()) {
        ASSERT_TRUE(wait_fd(fd, 2.0)) << "not woken";
        ASSERT_LT(ucs_time_to_sec(ucs_get_time() - killed), 2.0);
        progress();
        if (m_failures.empty()) {
            arm(m_sender);
        }
    }
    wait_for_failure(killed);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_failure_wakeup, usnic)


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
        uct_usnic_ep_t *ep = ucs_derived_of(m_sender->ep(index),
                                            uct_usnic_ep_t);

        usnic_test::ack_ep(ep, ep->acked_psn);
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
    ASSERT_TRUE(ucs_twheel_is_empty(&iface->tx_wheel));

    for (unsigned i = 0; i < NUM_EPS; ++i) {
        duplicate_last_ack(i);
        EXPECT_TRUE(ucs_twheel_is_empty(&iface->tx_wheel)) << "ep " << i;
    }

    progress_for(1.5);
    EXPECT_TRUE(m_failures.empty());
    EXPECT_EQ(unsigned(NUM_EPS), m_received);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_failure_stale_acks, usnic)


/*
 * A peer restarted on the same ports is a new incarnation: what was meant for
 * the old one (resent data, ACKs it owed) is dropped as stale and never
 * delivered, the endpoint to the old one fails, and new endpoints work.
 */
class test_usnic_restart : public test_usnic_base {
protected:
    static const uint8_t AM_ID = 4;

    void init()
    {
        set_usnic_config("TIMEOUT", "1s");
        uct_test::init();

        m_stable = create_entity(0, error_handler);
        m_entities.push_back(m_stable);
        set_handler(m_stable, &m_stable_rx);

        /* Only the restarting peer has fixed ports */
        unsigned port = usnic_test::free_port_pair();
        std::string range = ucs::to_string(port) + "-" +
                            ucs::to_string(port + 1);
        set_usnic_config("PORT_RANGE", range);
        m_peer = start_peer();
    }

    void set_handler(entity *e, std::vector<uint64_t> *log)
    {
        ASSERT_UCS_OK(uct_iface_set_am_handler(e->iface(), AM_ID, am_handler,
                                               log, 0));
    }

    entity *start_peer()
    {
        entity *peer = create_entity(0);

        m_entities.push_back(peer);
        set_handler(peer, &m_peer_rx);
        return peer;
    }

    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        ((std::vector<uint64_t>*)arg)->push_back(*(uint64_t*)data);
        return UCS_OK;
    }

    static ucs_status_t error_handler(void *arg, uct_ep_h ep,
                                      ucs_status_t status)
    {
        test_usnic_restart *self = (test_usnic_restart*)arg;

        EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, status);
        self->m_failed_eps.push_back(ep);
        return UCS_OK;
    }


    void send(uct_ep_h ep, uint64_t first, unsigned count)
    {
        for (uint64_t seq = first; seq < first + count; ++seq) {
            ASSERT_UCS_OK(uct_ep_am_short(ep, AM_ID, seq, NULL, 0));
        }
    }

    void flush(uct_ep_h ep)
    {
        while (uct_ep_flush(ep, 0, NULL) != UCS_OK) {
            progress();
        }
    }

    void progress_for(double seconds)
    {
        ucs_time_t end = ucs_get_time() + ucs_time_from_sec(seconds);

        while (ucs_get_time() < end) {
            progress();
        }
    }

    static std::vector<uint64_t> sequence(uint64_t first, unsigned count)
    {
        std::vector<uint64_t> seqs;

        for (uint64_t seq = first; seq < first + count; ++seq) {
            seqs.push_back(seq);
        }
        return seqs;
    }

    entity                *m_stable;
    entity                *m_peer;
    std::vector<uint64_t> m_stable_rx;
    std::vector<uint64_t> m_peer_rx;
    std::vector<uct_ep_h> m_failed_eps;
};

UCS_TEST_P(test_usnic_restart, new_incarnation_gets_no_stale_data) {
    entity *old_peer = m_peer;
    uint16_t ports[UCT_USNIC_CHANNEL_LAST];
    uct_usnic_iface_t *peer_iface;

    m_stable->connect(0, *old_peer, 0);
    old_peer->connect(0, *m_stable, 0);
    send(m_stable->ep(0), 0, 10);
    send(old_peer->ep(0), 0, 10);
    flush(m_stable->ep(0));
    flush(old_peer->ep(0));
    EXPECT_EQ(sequence(0, 10), m_peer_rx);
    for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
        ports[id] = usnic_iface(old_peer)->channels[id].addr.sin_port;
    }

    /* The peer dies with data on its way to it and ACKs it owes */
    scoped_log_handler slh(hide_errors_logger);
    send(m_stable->ep(0), 10, 5);
    send(old_peer->ep(0), 10, 5);
    m_entities.remove(old_peer);
    m_peer_rx.clear();

    m_peer     = start_peer();
    peer_iface = usnic_iface(m_peer);
    for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
        ASSERT_EQ(ports[id], peer_iface->channels[id].addr.sin_port);
    }

    /* A new ep reaches the new incarnation first, so that its stream there
     * may get the id the stale packets name */
    m_stable->connect(1, *m_peer, 0);
    send(m_stable->ep(1), 100, 3);
    while (m_peer_rx.size() < 3) {
        m_peer->progress();
    }

    /* The stable side takes in what the old peer sent, and keeps resending
     * to it: the new incarnation drops it all */
    progress_for(0.5);
    EXPECT_EQ(sequence(0, 15), m_stable_rx);
    EXPECT_EQ(sequence(100, 3), m_peer_rx);
    EXPECT_GT(USNIC_DROPS(peer_iface, STALE), 0u);

    /* The ep to the old incarnation fails, within the timeout plus 1 s */
    progress_until([this]() { return !m_failed_eps.empty(); }, 2.0);
    ASSERT_EQ(1u, m_failed_eps.size());
    EXPECT_EQ(m_stable->ep(0), m_failed_eps[0]);

    /* The new eps, both ways, carry data exactly once and in order, past
     * the sequence numbers the stale packets had */
    m_peer->connect(0, *m_stable, 0);
    send(m_stable->ep(1), 103, 20);
    send(m_peer->ep(0), 100, 10);
    flush(m_stable->ep(1));
    flush(m_peer->ep(0));
    progress_for(0.1);
    EXPECT_EQ(sequence(100, 23), m_peer_rx);
    std::vector<uint64_t> expected = sequence(0, 15);
    std::vector<uint64_t> fresh    = sequence(100, 10);
    expected.insert(expected.end(), fresh.begin(), fresh.end());
    EXPECT_EQ(expected, m_stable_rx);
    EXPECT_EQ(1u, m_failed_eps.size());
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_restart, usnic)
