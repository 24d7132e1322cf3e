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
#include <uct/usnic/usnic_rx.h>
}

#include <functional>
#include <map>
#include <vector>


/*
 * A receiver's streams are bounded: at MAX_STREAMS a new one takes the place
 * of the one quiet the longest, and only if it has been quiet for
 * STREAM_IDLE; a stream whose sender was silent for the peer timeout goes
 * anyway. A sender whose stream went opens it again, and loses nothing.
 */
class test_usnic_streams : public test_usnic_base {
protected:
    static const uint8_t  AM_ID   = 5;
    static const unsigned NUM_EPS = 3;

    void init()
    {
        set_usnic_config("MAX_STREAMS", "2");
        set_usnic_config("RTO_MAX", "50ms");
        set_usnic_config("STREAM_IDLE", "200ms");
        set_usnic_config("TIMEOUT", "1s");
        set_usnic_config("MAX_REASSEMBLY", "1");
        uct_test::init();

        m_receiver = create_entity(0);
        m_entities.push_back(m_receiver);
        m_sender = create_entity(0);
        m_entities.push_back(m_sender);
        for (unsigned i = 0; i < NUM_EPS; ++i) {
            m_sender->connect(i, *m_receiver, 0);
        }
        ASSERT_UCS_OK(uct_iface_set_am_handler(m_receiver->iface(), AM_ID,
                                               am_handler, this, 0));
    }


    /* A message: its ep index and sequence number, then a filler of
     * bytes equal to the ep index */
    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        test_usnic_streams *self = (test_usnic_streams*)arg;
        const uint8_t *filler    = (const uint8_t*)data + sizeof(uint64_t);
        uint64_t payload;

        memcpy(&payload, data, sizeof(payload));
        self->m_received[payload >> 32].push_back(payload & UINT32_MAX);
        for (size_t i = sizeof(payload); i < length; ++i) {
            EXPECT_EQ(payload >> 32, filler[i - sizeof(payload)]);
        }
        return UCS_OK;
    }

    static size_t pack_message(void *dest, void *arg)
    {
        const std::vector<uint8_t> *message = (std::vector<uint8_t>*)arg;

        memcpy(dest, message->data(), message->size());
        return message->size();
    }

    /* The next message of ep index, length bytes in several datagrams */
    bool post_bcopy(unsigned index, size_t length)
    {
        uint64_t payload = ((uint64_t)index << 32) | m_sent[index];
        std::vector<uint8_t> message(length, index);
        ssize_t packed;

        memcpy(message.data(), &payload, sizeof(payload));
        packed = uct_ep_am_bcopy(m_sender->ep(index), AM_ID, pack_message,
                                 &message, 0);
        if (packed == UCS_ERR_NO_RESOURCE) {
            return false;
        }

        EXPECT_EQ((ssize_t)length, packed);
        ++m_sent[index];
        return true;
    }


    /* The next message of ep index; true once it was taken */
    bool post(unsigned index)
    {
        uint64_t payload = ((uint64_t)index << 32) | m_sent[index];
        ucs_status_t status;

        status = uct_ep_am_short(m_sender->ep(index), AM_ID, payload, NULL, 0);
        if (status == UCS_ERR_NO_RESOURCE) {
            return false;
        }

        EXPECT_UCS_OK(status);
        ++m_sent[index];
        return true;
    }

    /* Progress both until done() or 10 s have passed, the receiver never
     * keeping more than its two streams */
    bool progress_capped(const std::function<bool()> &done)
    {
        return progress_until([&]() {
            EXPECT_LE(usnic_iface(m_receiver)->num_streams, 2u);
            return done();
        }, 10);
    }

    bool delivered(unsigned index)
    {
        return m_received[index].size() == m_sent[index];
    }

    /* Every message of every ep arrived once, in order */
    void check_received()
    {
        for (unsigned i = 0; i < NUM_EPS; ++i) {
            std::vector<uint32_t> expected(m_sent[i]);

            for (uint32_t seq = 0; seq < m_sent[i]; ++seq) {
                expected[seq] = seq;
            }
            EXPECT_EQ(expected, m_received[i]) << "ep " << i;
        }
    }

    entity                                  *m_receiver;
    entity                                  *m_sender;
    std::map<unsigned, uint32_t>            m_sent;
    std::map<unsigned, std::vector<uint32_t>> m_received;
};

UCS_TEST_P(test_usnic_streams, busy_streams_stay_quiet_ones_give_way) {
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);
    uct_usnic_iface_t *sender   = usnic_iface(m_sender);

    ASSERT_TRUE(post(0));
    ASSERT_TRUE(post(1));
    ASSERT_TRUE(progress_capped(
            [&]() { return delivered(0) && delivered(1); }));
    EXPECT_EQ(2u, receiver->num_streams);

    /* A third stream, while the first two have just been busy: refused */
    ASSERT_TRUE(post(2));
    ASSERT_TRUE(progress_capped([&]() {
        return USNIC_DROPS(receiver, NO_RESOURCE) > 0;
    }));
    EXPECT_FALSE(delivered(2));
    EXPECT_EQ(0u, USNIC_COUNTER(receiver, RX_STREAMS_RECLAIMED));

    /* Once they have been quiet for STREAM_IDLE, the oldest gives way */
    ASSERT_TRUE(progress_capped([&]() { return delivered(2); }));
    EXPECT_EQ(1u, USNIC_COUNTER(receiver, RX_STREAMS_RECLAIMED));
    EXPECT_EQ(2u, receiver->num_streams);

    /* The sender of the reclaimed stream (either) opens it again, losing
     * nothing */
    for (unsigned i = 0; i < 10; ++i) {
        ASSERT_TRUE(post(0));
        ASSERT_TRUE(post(1));
    }
    ASSERT_TRUE(progress_capped(
            [&]() { return delivered(0) && delivered(1); }));
    EXPECT_GE(USNIC_COUNTER(sender, TX_REOPENS), 1u);
    flush();
    check_received();
}

/* At MAX_STREAMS, a stream that delivered nothing yet (here: a probe only)
 * gives way to a new one before an older stream that delivered messages */
UCS_TEST_P(test_usnic_streams, quiet_new_stream_gives_way) {
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);

    uct_usnic_iface_t *sender   = usnic_iface(m_sender);

    ASSERT_TRUE(post(0));
    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));
    ASSERT_UCS_OK(uct_ep_check(m_sender->ep(1), 0, NULL));
    ASSERT_TRUE(progress_capped([&]() {
        return (receiver->num_streams == 2) && (sender->tx_outstanding == 0);
    }));

    ASSERT_TRUE(post(2));
    ASSERT_TRUE(progress_capped([&]() { return delivered(2); }));
    EXPECT_EQ(1u, USNIC_COUNTER(receiver, RX_STREAMS_RECLAIMED));

    /* The stream of ep 0 stayed: its next message needs no reopening */
    ASSERT_TRUE(post(0));
    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));
    EXPECT_EQ(0u, USNIC_COUNTER(sender, TX_REOPENS));
    flush();
    check_received();
}

UCS_TEST_P(test_usnic_streams, silent_sender_reclaimed) {
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);

    ASSERT_TRUE(post(0));
    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));
    ASSERT_EQ(1u, receiver->num_streams);

    /* Silent for the peer timeout (1 s) */
    ASSERT_TRUE(progress_capped([&]() { return receiver->num_streams == 0; }));
    EXPECT_EQ(1u, USNIC_COUNTER(receiver, RX_STREAMS_RECLAIMED));
    /* With the stream, the peer's address went out of the address vector:
     * only the sender's eps hold theirs */
    EXPECT_EQ(0u, kh_size(&receiver->av.map));

    ASSERT_TRUE(post(0));
    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));
    flush();
    check_received();
}

/* A sender restarted on the same ports (a new incarnation): its old
 * stream is reclaimed once quiet for STREAM_IDLE, before the timeout */
UCS_TEST_P(test_usnic_streams, new_incarnation_supersedes) {
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);
    unsigned port               = usnic_test::free_port_pair();
    std::string range           = ucs::to_string(port) + "-" +
                                  ucs::to_string(port + 1);
    ucs_time_t start;

    set_usnic_config("PORT_RANGE", range);
    m_sender = create_entity(0);
    m_entities.push_back(m_sender);
    m_sender->connect(0, *m_receiver, 0);
    ASSERT_TRUE(post(0));
    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));
    flush();
    m_entities.remove(m_sender);

    m_sender = create_entity(0);
    m_entities.push_back(m_sender);
    m_sender->connect(1, *m_receiver, 0);
    ASSERT_TRUE(post(1));
    ASSERT_TRUE(progress_capped([&]() { return delivered(1); }));
    ASSERT_EQ(2u, receiver->num_streams);

    start = ucs_get_time();
    ASSERT_TRUE(progress_capped([&]() { return receiver->num_streams == 1; }));
    EXPECT_LT(ucs_time_to_sec(ucs_get_time() - start), 0.9);
    EXPECT_EQ(1u, USNIC_COUNTER(receiver, RX_STREAMS_RECLAIMED));
    check_received();
}

/* Two streams, each sending messages of several datagrams through 10%
 * drop (so that a message waits for a datagram while the other stream's
 * next one starts), while the receiver reassembles one message at a time
 * (MAX_REASSEMBLY=1): the other's first datagram waits to be resent,
 * nothing is lost */
UCS_TEST_P(test_usnic_streams, one_reassembly_at_a_time) {
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);
    size_t length;

    set_usnic_config("FAULT_DROP", "0.1");
    m_sender = create_entity(0);
    m_entities.push_back(m_sender);
    m_sender->connect(0, *m_receiver, 0);
    m_sender->connect(1, *m_receiver, 0);
    length = 4 * usnic_iface(m_sender)->config.max_payload;

    for (unsigned i = 0; i < 200; ++i) {
        while (!post_bcopy(i % 2, length)) {
            progress();
        }
        ASSERT_LE(receiver->rx_reassembling, 1u);
    }

    ASSERT_TRUE(progress_capped(
            [&]() { return delivered(0) && delivered(1); }));
    flush();
    check_received();
    EXPECT_EQ(0u, receiver->rx_reassembling);
    EXPECT_GT(USNIC_DROPS(receiver, NO_RESOURCE), 0u);
}

/*
 * A flood of datagrams that each open a stream, from identities nobody
 * will use again, while a genuine sender streams: the receiver keeps no
 * more streams, addresses and buffers than its caps allow, and the genuine
 * stream loses nothing.
 */
UCS_TEST_P(test_usnic_streams, flood_of_opens) {
    struct open_datagram {
        uct_usnic_hdr_t      hdr;
        uint64_t             payload;
        uct_usnic_open_ext_t open;
    } UCS_S_PACKED dgram = {};
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);
    const unsigned count        = 2000;

    ASSERT_TRUE(post(0));
    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));

    for (unsigned i = 0; i < count; ++i) {
        dgram.hdr                  = usnic_test::data_hdr(
                UCT_USNIC_PKT_AM,
                UCT_USNIC_PKT_FLAG_FIRST | UCT_USNIC_PKT_FLAG_OPEN, AM_ID,
                receiver->incarnation, UCT_USNIC_STREAM_ID_NONE, 1000,
                ucs::rand());
        dgram.open.src_incarnation = ucs::rand();
        dgram.open.src_ep_id       = i;
        dgram.open.src_ep_serial   = i;
        dgram.open.src_in_addr     = receiver->dev_addr.in_addr;
        dgram.open.src_prio_port   = htons(10000 + i);
        dgram.open.src_data_port   = htons(10000 + i);
        dgram.open.first_psn       = 1000;
        dgram.open.dst_open_key    = receiver->open_key;
        usnic_test::send_datagram(receiver, UCT_USNIC_CHANNEL_DATA, &dgram,
                                  sizeof(dgram));

        /* Genuine traffic meanwhile, one message per ten forged ones */
        if ((i % 10) == 0) {
            post(0);
        }
        progress();
        ASSERT_LE(receiver->num_streams, 2u);
        ASSERT_LE(kh_size(&receiver->av.map), 2u);
    }

    ASSERT_TRUE(progress_capped([&]() { return delivered(0); }));
    flush();
    check_received();
    EXPECT_GT(USNIC_DROPS(receiver, NO_RESOURCE), 0u);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_streams, usnic)
