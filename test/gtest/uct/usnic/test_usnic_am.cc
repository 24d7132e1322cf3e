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

#include <map>
#include <vector>


/*
 * Active messages between ifaces: every message arrives intact, exactly
 * once and in order, whatever its size.
 */
class test_usnic_am : public uct_test {
protected:
    static const uint8_t AM_ID = 7;

    struct message {
        uint32_t sender;
        uint32_t seq;
        uint32_t length;
    };

    void init()
    {
        uct_test::init();
        m_receiver = create_entity(0);
        m_entities.push_back(m_receiver);
        ASSERT_UCS_OK(uct_iface_set_am_handler(m_receiver->iface(), AM_ID,
                                               am_handler, this,
                                               0));
        m_keep_descs = false;
    }

    void cleanup()
    {
        for (void *desc : m_kept) {
            uct_iface_release_desc(desc);
        }
        m_kept.clear();
        uct_test::cleanup();
    }

    entity *add_sender()
    {
        entity *sender = create_entity(0);
        m_entities.push_back(sender);
        sender->connect(0, *m_receiver, 0);
        m_next_seq.push_back(0);
        return sender;
    }

    const uct_usnic_iface_t *receiver_iface() const
    {
        return ucs_derived_of(m_receiver->iface(), uct_usnic_iface_t);
    }

    static uint8_t pattern(uint32_t sender, uint32_t seq, size_t offset)
    {
        return (uint8_t)((sender * 131) + (seq * 7) + offset);
    }

    static void fill(void *buffer, const message &msg, size_t length)
    {
        uint8_t *p = (uint8_t*)buffer;

        memcpy(p, &msg, ucs_min(length, sizeof(msg)));
        for (size_t i = sizeof(msg); i < length; ++i) {
            p[i] = pattern(msg.sender, msg.seq, i);
        }
    }

    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        test_usnic_am *self = (test_usnic_am*)arg;
        message msg;

        EXPECT_GE(length, sizeof(msg));
        if (length < sizeof(msg)) {
            ++self->m_errors_found;
            return UCS_OK;
        }

        memcpy(&msg, data, sizeof(msg));
        EXPECT_EQ(msg.length, length);
        self->check_received(msg, (uint8_t*)data, length);

        if (self->m_keep_descs && (flags & UCT_CB_PARAM_FLAG_DESC) &&
            ((msg.seq % 3) == 0)) {
            self->m_kept.push_back((char*)data - self->m_rx_headroom);
            return UCS_INPROGRESS;
        }
        return UCS_OK;
    }

    void check_received(const message &msg, const uint8_t *data,
                        size_t length)
    {
        uint32_t &expected = m_expected_seq[msg.sender];

        /* In order and exactly once */
        if (msg.seq != expected) {
            ADD_FAILURE() << "sender " << msg.sender << ": got seq "
                          << msg.seq << ", expected " << expected;
            ++m_errors_found;
        }
        expected = msg.seq + 1;

        for (size_t i = sizeof(msg); i < length; ++i) {
            if (data[i] != pattern(msg.sender, msg.seq, i)) {
                ADD_FAILURE() << "sender " << msg.sender << " seq "
                              << msg.seq << ": byte " << i << " corrupt";
                ++m_errors_found;
                break;
            }
        }
        ++m_received;
    }

    static size_t pack_cb(void *dest, void *arg)
    {
        const message *msg = (const message*)arg;

        fill(dest, *msg, msg->length);
        return msg->length;
    }

    /* Send one message of the given size, progressing until it is taken */
    void send(entity *sender, uint32_t sender_index, size_t length,
              bool bcopy)
    {
        std::vector<uint8_t> buffer(ucs_max(length, sizeof(message)));
        message msg = {sender_index, m_next_seq[sender_index], (uint32_t)length};
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
        ucs_status_t status;
        ssize_t packed;

        fill(&buffer[0], msg, length);
        do {
            if (bcopy) {
                packed = uct_ep_am_bcopy(sender->ep(0), AM_ID, pack_cb, &msg,
                                         0);
                status = (packed < 0) ? (ucs_status_t)packed : UCS_OK;
                if (status == UCS_OK) {
                    EXPECT_EQ((ssize_t)length, packed);
                }
            } else {
                uint64_t header;
                memcpy(&header, &buffer[0], sizeof(header));
                status = uct_ep_am_short(sender->ep(0), AM_ID, header,
                                         &buffer[sizeof(header)],
                                         length - sizeof(header));
            }

            if (status == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while ((status == UCS_ERR_NO_RESOURCE) &&
                 (ucs_get_time() < deadline));

        ASSERT_EQ(UCS_OK, status) << "length " << length;
        ++m_next_seq[sender_index];
        ++m_sent;
    }

    void wait_all_received()
    {
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);

        while ((m_received < m_sent) && (ucs_get_time() < deadline)) {
            progress();
        }
        flush();
        EXPECT_EQ(m_sent, m_received);
        EXPECT_EQ(0u, m_errors_found);
    }

    size_t max_short() const
    {
        return m_receiver->iface_attr().cap.am.max_short;
    }

    size_t max_bcopy() const
    {
        return m_receiver->iface_attr().cap.am.max_bcopy;
    }

    entity                      *m_receiver;
    std::vector<uint32_t>       m_next_seq;
    std::map<uint32_t, uint32_t> m_expected_seq;
    std::vector<void*>          m_kept;
    bool                        m_keep_descs;
    size_t                      m_rx_headroom = 0;
    size_t                      m_sent        = 0;
    size_t                      m_received    = 0;
    unsigned                    m_errors_found = 0;
};

UCS_TEST_P(test_usnic_am, caps) {
    const uct_iface_attr_t &attr = m_receiver->iface_attr();
    const uct_usnic_iface_t *iface = receiver_iface();

    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_AM_SHORT);
    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_AM_BCOPY);
    EXPECT_TRUE(attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE);
    EXPECT_FALSE(attr.cap.flags & UCT_IFACE_FLAG_AM_DUP);
    EXPECT_GE(attr.cap.am.max_iov, 1u);
    EXPECT_EQ(iface->config.max_payload, attr.cap.am.max_short);
    EXPECT_GE(attr.cap.am.max_bcopy, 8192u);
    /* A short message is one datagram */
    EXPECT_LE(attr.cap.am.max_short + sizeof(uct_usnic_hdr_t) +
              sizeof(uct_usnic_open_ext_t), iface->config.mtu);
}

UCS_TEST_P(test_usnic_am, short_sizes) {
    entity *sender = add_sender();
    size_t sizes[] = {sizeof(message), sizeof(message) + 1, max_short() - 1,
                      max_short()};

    for (size_t size : sizes) {
        send(sender, 0, size, false);
    }
    wait_all_received();
}

UCS_TEST_P(test_usnic_am, bcopy_sizes) {
    entity *sender = add_sender();
    size_t datagram = receiver_iface()->config.max_payload;
    size_t sizes[]  = {sizeof(message), sizeof(message) + 1, datagram - 1,
                       datagram, datagram + 1, 2 * datagram,
                       2 * datagram + 1, max_bcopy() - 1, max_bcopy()};

    for (size_t size : sizes) {
        send(sender, 0, size, true);
    }
    wait_all_received();
}

UCS_TEST_P(test_usnic_am, stream_short) {
    entity *sender = add_sender();
    size_t count   = 1000000 / ucs::test_time_multiplier();

    for (size_t i = 0; i < count; ++i) {
        send(sender, 0, sizeof(message) + (i % 16), false);
    }
    wait_all_received();
    EXPECT_EQ(0u, receiver_iface()->stats.rx_drop[UCT_USNIC_RX_DROP_INVALID]);
}

UCS_TEST_P(test_usnic_am, stream_bcopy_random_sizes) {
    entity *sender = add_sender();
    size_t count   = 20000 / ucs::test_time_multiplier();

    m_keep_descs = true;
    for (size_t i = 0; i < count; ++i) {
        send(sender, 0,
             sizeof(message) + ucs::rand() % (max_bcopy() - sizeof(message)),
             true);
    }
    wait_all_received();
}

UCS_TEST_P(test_usnic_am, many_to_one) {
    const unsigned num_senders = 10;
    size_t count               = 5000 / ucs::test_time_multiplier();
    std::vector<entity*> senders;

    for (unsigned i = 0; i < num_senders; ++i) {
        senders.push_back(add_sender());
    }

    for (size_t n = 0; n < count; ++n) {
        for (unsigned i = 0; i < num_senders; ++i) {
            bool bcopy = (n % 2) != 0;
            send(senders[i], i,
                 sizeof(message) +
                 (n % ((bcopy ? max_bcopy() : max_short()) - sizeof(message))),
                 bcopy);
        }
    }
    wait_all_received();
    EXPECT_EQ(num_senders, m_expected_seq.size());
}

UCS_TEST_P(test_usnic_am, ep_create_destroy) {
    entity *sender = create_entity(0);
    m_entities.push_back(sender);
    m_next_seq.push_back(0);

    for (int i = 0; i < 100 / ucs::test_time_multiplier(); ++i) {
        sender->connect(0, *m_receiver, 0);
        /* Each ep is a new stream: sequence numbers start again */
        m_next_seq[0]       = 0;
        m_expected_seq[0]   = 0;
        send(sender, 0, sizeof(message) + i, (i % 2) != 0);
        wait_all_received();
        sender->destroy_ep(0);
    }
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_am, usnic)
