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
#include <vector>

/* The checksum's reference: XXH3 compiled into this file, for any CPU */
#define XXH_INLINE_ALL
#include <xxhash.h>


/*
 * Datagrams forged off the path: by someone who knows the protocol, the
 * addresses, ports, incarnations, ep ids and sequence numbers, but has not
 * seen the stream's token. Nothing they send is delivered or taken as an
 * ACK; the same datagram with the token is, so the token is what stopped it.
 */
class test_usnic_forged : public test_usnic_base {
protected:
    static const uint8_t AM_ID = 9;

    struct am_datagram {
        uct_usnic_hdr_t hdr;
        uint64_t        payload;
    } UCS_S_PACKED;

    struct open_datagram {
        am_datagram          am;
        uct_usnic_open_ext_t open;
    } UCS_S_PACKED;

    void init()
    {
        uct_test::init();
        /* Each AM goes at once, on its own */
        set_usnic_config("BUNDLE_DELAY", "0");
        m_receiver = create_entity(0);
        m_entities.push_back(m_receiver);
        m_sender = create_entity(0);
        m_entities.push_back(m_sender);
        m_sender->connect(0, *m_receiver, 0);
        ASSERT_UCS_OK(uct_iface_set_am_handler(m_receiver->iface(), AM_ID,
                                               am_handler, this, 0));
    }

    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        test_usnic_forged *self = (test_usnic_forged*)arg;
        uint64_t payload;

        EXPECT_EQ(sizeof(payload), length);
        memcpy(&payload, data, sizeof(payload));
        self->m_payloads.push_back(payload);
        return UCS_OK;
    }


    uct_usnic_ep_t *sender_ep(unsigned index = 0)
    {
        return ucs_derived_of(m_sender->ep(index), uct_usnic_ep_t);
    }

    uct_usnic_rx_stream_t *rx_stream()
    {
        void *stream = NULL;

        EXPECT_TRUE(ucs_ptr_array_lookup(&usnic_iface(m_receiver)->streams,
                                         sender_ep()->peer_stream_id,
                                         stream));
        return (uct_usnic_rx_stream_t*)stream;
    }

    static uint64_t drops(entity *e, uct_usnic_rx_drop_t reason)
    {
        return USNIC_DROPS_BY(usnic_iface(e), reason);
    }

    /* Send a raw datagram to e, and progress only e until it took it */
    void send_and_wait(entity *e, uct_usnic_channel_id_t id, const void *data,
                       size_t length, bool seal = true)
    {
        uint64_t seen = usnic_test::rx_seen(usnic_iface(e));

        usnic_test::send_datagram(usnic_iface(e), id, data, length, seal);
        EXPECT_TRUE(progress_until([&]() {
            return usnic_test::rx_seen(usnic_iface(e)) > seen;
        }, 10, e));
    }

    /* A genuine AM, delivered and acknowledged */
    void send_genuine(uint64_t payload)
    {
        uct_usnic_ep_t *ep = sender_ep();
        size_t count       = m_payloads.size();

        ASSERT_UCS_OK(uct_ep_am_short(m_sender->ep(0), AM_ID, payload, NULL,
                                      0));
        while ((m_payloads.size() == count) || (ep->tx_count > 0)) {
            progress();
        }
        ASSERT_EQ(payload, m_payloads.back());
    }

    /* The datagram the sender would send next, with the token given */
    am_datagram next_am(uint64_t payload, uint64_t token)
    {
        uct_usnic_ep_t *ep = sender_ep();
        am_datagram dgram  = {};

        dgram.hdr     = usnic_test::data_hdr(UCT_USNIC_PKT_AM,
                                             UCT_USNIC_PKT_FLAG_FIRST |
                                             UCT_USNIC_PKT_FLAG_LAST,
                                             AM_ID, ep->peer_incarnation,
                                             ep->peer_stream_id, ep->next_psn,
                                             token);
        dgram.payload = payload;
        return dgram;
    }

    /* An ACK from the receiver to the sender's ep */
    usnic_test::ack_datagram ack(uct_usnic_psn_t psn, uint64_t token)
    {
        uct_usnic_ep_t *ep = sender_ep();
        usnic_test::ack_datagram dgram = {};

        dgram.hdr.version           = UCT_USNIC_PROTO_VERSION;
        dgram.hdr.type              = UCT_USNIC_PKT_ACK;
        dgram.hdr.incarnation       = usnic_iface(m_sender)->incarnation;
        dgram.rec.ack.ep_id         = ep->id;
        dgram.rec.ack.stream_id     = ep->peer_stream_id;
        dgram.rec.ack.psn           = psn;
        dgram.rec.ack.token         = token;
        dgram.body.src_incarnation  = ep->peer_incarnation;
        return dgram;
    }

    entity                *m_sender;
    entity                *m_receiver;
    std::vector<uint64_t> m_payloads;
};

UCS_TEST_P(test_usnic_forged, secrets_are_random) {
    m_sender->connect(1, *m_receiver, 0);

    EXPECT_NE(sender_ep(0)->token, sender_ep(1)->token);
    EXPECT_NE(sender_ep(0)->first_psn, sender_ep(1)->first_psn);
    EXPECT_NE(usnic_iface(m_sender)->incarnation,
              usnic_iface(m_receiver)->incarnation);

    /* The receiver takes the token and where the sequence starts from the
     * stream's first packet */
    send_genuine(1);
    EXPECT_EQ(sender_ep()->token, rx_stream()->token);
    EXPECT_EQ(sender_ep()->first_psn + 1, rx_stream()->expected_psn);
}

UCS_TEST_P(test_usnic_forged, data_needs_token) {
    uct_usnic_ep_t *ep = sender_ep();
    am_datagram dgram;

    send_genuine(1);
    dgram = next_am(2, ep->token ^ 1);
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, drops(m_receiver, UCT_USNIC_RX_DROP_FORGED));
    EXPECT_EQ(1u, m_payloads.size());
    EXPECT_EQ(ep->next_psn, rx_stream()->expected_psn);

    dgram.hdr.token = ep->token;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &dgram, sizeof(dgram));
    ASSERT_EQ(2u, m_payloads.size());
    EXPECT_EQ(2u, m_payloads.back());
}

/*
 * On the path: a copy of the stream's next datagram, token and seal right,
 * then changed on the way without sealing it again: dropped before the
 * protocol reads it (the checksum is on by default).
 */
UCS_TEST_P(test_usnic_forged, altered_copy_dropped) {
    const uct_usnic_channel_t *channel =
            &usnic_iface(m_receiver)->channels[UCT_USNIC_CHANNEL_DATA];
    am_datagram am                     = {};
    uint8_t dgram[sizeof(am) + UCT_USNIC_SEAL_MAX_LEN + 4] = {};
    size_t length                      = sizeof(am) + channel->seal.length;

    ASSERT_NE(UCT_USNIC_SEAL_NONE, channel->seal.type)
            << "datagrams are not sealed by default";
    send_genuine(1);
    am = next_am(2, sender_ep()->token);
    memcpy(dgram, &am, sizeof(am));
    uct_usnic_seal_put(&channel->seal, dgram, sizeof(am));
    dgram[ucs_offsetof(am_datagram, payload) + 2] ^= 2;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram, length, false);
    EXPECT_EQ(1u, channel->rx_bad_seal);
    EXPECT_EQ(1u, m_payloads.size());

    /* Cut short, and extended */
    dgram[ucs_offsetof(am_datagram, payload) + 2] ^= 2;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram, length - 1,
                  false);
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram, length + 4,
                  false);
    EXPECT_EQ(3u, channel->rx_bad_seal);
    EXPECT_EQ(1u, m_payloads.size());

    /* The genuine one is taken */
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram, length, false);
    ASSERT_EQ(2u, m_payloads.size());
    EXPECT_EQ(2u, m_payloads.back());
}

/*
 * Peers on different CPUs must agree: the checksum is the low 32 bits of
 * XXH3 over the datagram whether it is sealed in one piece or in several,
 * and whichever code computes it (AVX2 where the CPU has it). Lengths cross
 * XXH3's internal thresholds (16, 128, 240 bytes, its 256-byte buffer, its
 * 1024-byte blocks).
 */
UCS_TEST_P(test_usnic_forged, checksum_is_xxh3) {
    static const size_t lengths[] = {1,    8,    16,   17,   128,  129, 240,
                                     241,  255,  256,  257,  1023, 1024,
                                     1025, 1472, 4097, 8996};
    std::vector<uint8_t> data(9000), whole, head, middle, tail;
    uct_usnic_seal_t checksum;
    const uct_usnic_seal_t *seal = &checksum;
    struct iovec iov[3];
    uint32_t expected, sealed;
    size_t cut, tail_start;

    /* The channels' seal may be a MAC (UCX_USNIC_AUTH_KEY) */
    ASSERT_UCS_OK(uct_usnic_seal_init(&checksum, UCT_USNIC_SEAL_CHECKSUM,
                                      NULL));
    ucs::fill_random(data);
    for (size_t length : lengths) {
        expected = (uint32_t)XXH3_64bits(&data[0], length);

        whole.assign(data.begin(), data.begin() + length);
        whole.resize(length + UCT_USNIC_SEAL_MAX_LEN);
        uct_usnic_seal_put(seal, &whole[0], length);
        memcpy(&sealed, &whole[length], sizeof(sealed));
        EXPECT_EQ(expected, sealed) << length << " bytes in one piece";

        /* A header, the user's data and a trailer, as zero-copy sends */
        cut        = ucs_min(length, 27);
        tail_start = ucs_max(cut, length - length / 9);
        head.assign(data.begin(), data.begin() + cut);
        middle.assign(data.begin() + cut, data.begin() + tail_start);
        tail.assign(data.begin() + tail_start, data.begin() + length);
        tail.resize(length - tail_start + UCT_USNIC_SEAL_MAX_LEN);
        iov[0] = {&head[0], head.size()};
        iov[1] = {middle.empty() ? NULL : &middle[0], middle.size()};
        iov[2] = {&tail[0], length - tail_start};
        uct_usnic_seal_put_iov(seal, iov, 3);
        memcpy(&sealed, &tail[length - tail_start], sizeof(sealed));
        EXPECT_EQ(expected, sealed) << length << " bytes in three pieces";
    }

    uct_usnic_seal_cleanup(&checksum);
}

/* A forged open trailer cannot take over a stream that exists */
UCS_TEST_P(test_usnic_forged, open_trailer_must_match) {
    uct_usnic_iface_t *iface = usnic_iface(m_sender);
    uct_usnic_ep_t *ep       = sender_ep();
    open_datagram dgram;

    send_genuine(1);
    dgram.am                   = next_am(2, ep->token ^ UCS_BIT(63));
    dgram.am.hdr.stream_id     = UCT_USNIC_STREAM_ID_NONE;
    dgram.am.hdr.flags        |= UCT_USNIC_PKT_FLAG_OPEN;
    dgram.open.src_incarnation = iface->incarnation;
    dgram.open.src_ep_id       = ep->id;
    dgram.open.src_ep_serial   = ep->serial;
    dgram.open.src_in_addr     = iface->dev_addr.in_addr;
    dgram.open.src_prio_port   =
            iface->channels[UCT_USNIC_CHANNEL_PRIO].addr.sin_port;
    dgram.open.src_data_port   =
            iface->channels[UCT_USNIC_CHANNEL_DATA].addr.sin_port;
    dgram.open.first_psn       = ep->first_psn;
    dgram.open.src_open_key    = iface->open_key;
    dgram.open.dst_open_key    = usnic_iface(m_receiver)->open_key;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, drops(m_receiver, UCT_USNIC_RX_DROP_FORGED));
    EXPECT_EQ(1u, m_payloads.size());
    EXPECT_EQ(1u, kh_size(&usnic_iface(m_receiver)->stream_hash));

    dgram.am.hdr.token = ep->token;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &dgram, sizeof(dgram));
    ASSERT_EQ(2u, m_payloads.size());
    EXPECT_EQ(2u, m_payloads.back());
}

/* A new stream opens only with the receiver's open key, given with its
 * address: off the path, 64 bits to guess with the incarnation */
UCS_TEST_P(test_usnic_forged, open_needs_iface_key) {
    uct_usnic_iface_t *receiver = usnic_iface(m_receiver);
    open_datagram dgram         = {};

    dgram.am                   = next_am(7, 0x70ce);
    dgram.am.hdr.stream_id     = UCT_USNIC_STREAM_ID_NONE;
    dgram.am.hdr.psn           = 1;
    dgram.am.hdr.flags        |= UCT_USNIC_PKT_FLAG_OPEN;
    dgram.open.src_incarnation = 0x5eed;
    dgram.open.src_ep_serial   = 1;
    dgram.open.src_in_addr     = receiver->dev_addr.in_addr;
    dgram.open.src_prio_port   = htons(9);
    dgram.open.src_data_port   = htons(9);
    dgram.open.first_psn       = 1;
    dgram.open.dst_open_key    = receiver->open_key ^ 1;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, drops(m_receiver, UCT_USNIC_RX_DROP_FORGED));
    EXPECT_EQ(0u, receiver->num_streams);
    EXPECT_TRUE(m_payloads.empty());

    dgram.open.dst_open_key = receiver->open_key;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, receiver->num_streams);
    ASSERT_EQ(1u, m_payloads.size());
    EXPECT_EQ(7u, m_payloads.back());
}

/*
 * With a message in flight, ACKs that would complete it: only one with the
 * token, for the ep's stream and for what was sent, is taken.
 */
UCS_TEST_P(test_usnic_forged, acks_need_token) {
    const uct_usnic_channel_id_t prio = UCT_USNIC_CHANNEL_PRIO;
    uct_usnic_ep_t *ep                = sender_ep();
    usnic_test::ack_datagram dgram;
    uct_usnic_psn_t acked;

    send_genuine(1);
    ASSERT_UCS_OK(uct_ep_am_short(m_sender->ep(0), AM_ID, 2, NULL, 0));
    ASSERT_EQ(1u, ep->tx_count);
    acked = ep->acked_psn;

    dgram = ack(ep->next_psn - 1, ep->token ^ 1);
    send_and_wait(m_sender, prio, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, drops(m_sender, UCT_USNIC_RX_DROP_FORGED)) << "token";

    dgram = ack(ep->next_psn - 1, ep->token);
    ++dgram.rec.ack.stream_id;
    send_and_wait(m_sender, prio, &dgram, sizeof(dgram));
    EXPECT_EQ(2u, drops(m_sender, UCT_USNIC_RX_DROP_FORGED)) << "stream id";

    dgram = ack(ep->next_psn, ep->token);
    send_and_wait(m_sender, prio, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, drops(m_sender, UCT_USNIC_RX_DROP_INVALID)) << "unsent psn";

    EXPECT_EQ(acked, ep->acked_psn);
    EXPECT_EQ(1u, ep->tx_count);

    dgram = ack(ep->next_psn - 1, ep->token);
    send_and_wait(m_sender, prio, &dgram, sizeof(dgram));
    EXPECT_EQ(0u, ep->tx_count) << "the right ACK was not taken";
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_forged, usnic)


/*
 * With UCX_USNIC_AUTH_KEY: forged on the path by someone who knows the
 * protocol and has seen the token, but not the key.
 */
class test_usnic_auth : public test_usnic_forged {
protected:
    void init()
    {
        if (!HAVE_USNIC_SODIUM) {
            UCS_TEST_SKIP_R("built without libsodium");
        }

        uct_test::init();
        m_key_file = write_key(0x5a);
        set_key(m_key_file);
        test_usnic_forged::init();
    }

    void cleanup()
    {
        test_usnic_forged::cleanup();
        unlink(m_key_file.c_str());
    }

    /* UCX 1.13 and 1.22 name the variables differently (see
     * test_usnic_pending) */
    void set_key(const std::string &path)
    {
        set_usnic_config("AUTH_KEY", path);
    }

    /* A key file of 32 bytes from seed, readable only by its owner */
    static std::string write_key(uint8_t seed)
    {
        char path[] = "/tmp/usnic_key.XXXXXX";
        uint8_t key[32];
        int fd;

        for (size_t i = 0; i < sizeof(key); ++i) {
            key[i] = seed + i * 37;
        }

        fd = mkstemp(path);
        EXPECT_GE(fd, 0);
        EXPECT_EQ((ssize_t)sizeof(key), write(fd, key, sizeof(key)));
        close(fd);
        return path;
    }

    static ucs_status_t copy_handler(void *arg, void *data, size_t length,
                                     unsigned flags)
    {
        std::vector<uint8_t> *copy = (std::vector<uint8_t>*)arg;

        copy->assign((uint8_t*)data, (uint8_t*)data + length);
        return UCS_OK;
    }

    const uct_usnic_channel_t *channel(entity *e, uct_usnic_channel_id_t id)
    {
        return &usnic_iface(e)->channels[id];
    }

    std::string m_key_file;
};

UCS_TEST_P(test_usnic_auth, mac_on_every_datagram) {
    std::vector<uint8_t> data(5000), copy;
    size_t count;

    for (entity *e : {m_sender, m_receiver}) {
        for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
            EXPECT_EQ(UCT_USNIC_SEAL_MAC,
                      channel(e, (uct_usnic_channel_id_t)id)->seal.type);
        }
    }

    /* Short, and in several datagrams gathered from the user's pieces */
    send_genuine(1);
    for (size_t i = 0; i < data.size(); ++i) {
        data[i] = i * 7;
    }
    ASSERT_UCS_OK(uct_iface_set_am_handler(m_receiver->iface(), AM_ID + 1,
                                           copy_handler, &copy, 0));
    std::vector<uct_iov_t> iov = usnic_test::random_iov(
            data.data(), data.size(), UCT_USNIC_ZCOPY_MAX_IOV);
    count = USNIC_COUNTER(usnic_iface(m_receiver), RX_PACKETS);
    ASSERT_EQ(UCS_INPROGRESS,
              uct_ep_am_zcopy(m_sender->ep(0), AM_ID + 1, NULL, 0, iov.data(),
                              iov.size(), 0, NULL));
    flush();
    EXPECT_EQ(data, copy);
    EXPECT_GE(USNIC_COUNTER(usnic_iface(m_receiver), RX_PACKETS), count + 4);
    EXPECT_EQ(0u, channel(m_receiver, UCT_USNIC_CHANNEL_DATA)->rx_bad_seal);
    EXPECT_EQ(0u, channel(m_sender, UCT_USNIC_CHANNEL_PRIO)->rx_bad_seal);
}

UCS_TEST_P(test_usnic_auth, forger_with_token_dropped) {
    const uct_usnic_channel_t *data = channel(m_receiver,
                                              UCT_USNIC_CHANNEL_DATA);
    const uct_usnic_channel_t *prio = channel(m_sender,
                                              UCT_USNIC_CHANNEL_PRIO);
    uct_usnic_ep_t *ep              = sender_ep();
    uct_usnic_seal_t checksum;
    usnic_test::ack_datagram ack_dgram;
    am_datagram am;
    std::vector<uint8_t> dgram;

    send_genuine(1);

    /* Right token, with no seal, with a checksum, with a wrong MAC */
    am = next_am(2, ep->token);
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, &am, sizeof(am), false);
    ASSERT_UCS_OK(uct_usnic_seal_init(&checksum, UCT_USNIC_SEAL_CHECKSUM,
                                      NULL));
    dgram.resize(sizeof(am) + UCT_USNIC_SEAL_MAX_LEN);
    memcpy(dgram.data(), &am, sizeof(am));
    uct_usnic_seal_put(&checksum, dgram.data(), sizeof(am));
    uct_usnic_seal_cleanup(&checksum);
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram.data(),
                  sizeof(am) + UCT_USNIC_SEAL_CHECKSUM_LEN, false);
    uct_usnic_seal_put(&data->seal, dgram.data(), sizeof(am));
    dgram[sizeof(am) + 3] ^= 1;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram.data(),
                  sizeof(am) + UCT_USNIC_SEAL_MAC_LEN, false);
    EXPECT_EQ(3u, data->rx_bad_seal);
    EXPECT_EQ(1u, m_payloads.size());

    /* The same datagram sealed with the key is taken */
    dgram[sizeof(am) + 3] ^= 1;
    send_and_wait(m_receiver, UCT_USNIC_CHANNEL_DATA, dgram.data(),
                  sizeof(am) + UCT_USNIC_SEAL_MAC_LEN, false);
    ASSERT_EQ(2u, m_payloads.size());
    EXPECT_EQ(2u, m_payloads.back());

    /* The receiver owes an ACK for that PSN, which the sender never sent:
     * taken now, it is dropped; taken after the next message, which reuses
     * the PSN, it would complete that message (the receiver's async timer
     * sends owed ACKs without the test progressing it) */
    EXPECT_TRUE(progress_until([&]() {
        return ucs_list_is_empty(&usnic_iface(m_receiver)->ack_streams);
    }, 10, m_receiver));
    EXPECT_TRUE(progress_until([&]() {
        return drops(m_sender, UCT_USNIC_RX_DROP_INVALID) > 0;
    }, 10, m_sender));

    /* An ACK with the token that would complete a message in flight */
    ASSERT_UCS_OK(uct_ep_am_short(m_sender->ep(0), AM_ID, 3, NULL, 0));
    ack_dgram = ack(ep->next_psn - 1, ep->token);
    send_and_wait(m_sender, UCT_USNIC_CHANNEL_PRIO, &ack_dgram,
                  sizeof(ack_dgram), false);
    EXPECT_EQ(1u, prio->rx_bad_seal);
    EXPECT_EQ(1u, ep->tx_count);
}

UCS_TEST_P(test_usnic_auth, different_keys_never_deliver) {
    std::string other = write_key(0xa5);
    entity *stranger;

    set_key(other);
    stranger = create_entity(0);
    m_entities.push_back(stranger);
    unlink(other.c_str());
    stranger->connect(0, *m_receiver, 0);

    ASSERT_UCS_OK(uct_ep_am_short(stranger->ep(0), AM_ID, 7, NULL, 0));
    EXPECT_TRUE(progress_until([&]() {
        return channel(m_receiver, UCT_USNIC_CHANNEL_DATA)->rx_bad_seal > 0;
    }, 10, m_receiver));
    short_progress_loop(100);
    EXPECT_TRUE(m_payloads.empty());
    EXPECT_EQ(0u, USNIC_COUNTER(usnic_iface(m_receiver), RX_PACKETS));
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_auth, usnic)
