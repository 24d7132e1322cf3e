/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#include <common/test.h>
#include <uct/uct_test.h>
#include "usnic_test.h"

extern "C" {
#include <uct/usnic/usnic_iface.h>
#include <uct/usnic/usnic_proto.h>
}

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/socket.h>


class test_usnic_iface : public test_usnic_base {
protected:
    void init()
    {
        uct_test::init();
        m_entity = create_entity(0);
        m_entities.push_back(m_entity);
    }


    uct_iface_params_t iface_params()
    {
        uct_iface_params_t params;

        params.field_mask           = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                                      UCT_IFACE_PARAM_FIELD_DEVICE;
        params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
        params.mode.device.tl_name  = GetParam()->tl_name.c_str();
        params.mode.device.dev_name = GetParam()->dev_name.c_str();
        return params;
    }

    /* Open an iface with one configuration variable changed */
    ucs_status_t open_iface(const char *name, const char *value,
                            uct_iface_h *iface_p)
    {
        uct_iface_params_t params = iface_params();
        uct_iface_config_t *config;
        ucs_status_t status;

        status = uct_md_iface_config_read(m_entity->md(),
                                          GetParam()->tl_name.c_str(), NULL,
                                          NULL, &config);
        EXPECT_UCS_OK(status);
        if (name != NULL) {
            status = usnic_test::config_modify(config, name, value);
        }
        if (status == UCS_OK) {
            status = uct_iface_open(m_entity->md(), m_entity->worker(),
                                    &params, config, iface_p);
        }
        uct_config_release(config);
        return status;
    }

    /* The error logged by an iface open that must fail */
    std::string open_iface_error(const char *name, const char *value)
    {
        uct_iface_h iface;
        ucs_status_t status;

        m_errors.clear();
        {
            scoped_log_handler slh(wrap_errors_logger);
            status = open_iface(name, value, &iface);
        }
        EXPECT_NE(UCS_OK, status) << name << "=" << value;
        if (status == UCS_OK) {
            uct_iface_close(iface);
            return "";
        }

        return m_errors.empty() ? "" : m_errors.back();
    }

    static unsigned num_open_fds()
    {
        unsigned count = 0;
        DIR *dir       = opendir("/proc/self/fd");
        struct dirent *entry;

        while ((entry = readdir(dir)) != NULL) {
            count += (entry->d_name[0] != '.');
        }
        closedir(dir);
        return count;
    }

    uint64_t wait_for_drops(uct_usnic_iface_t *iface, uint64_t expected)
    {
        uint64_t *drops = &USNIC_DROPS(iface, INVALID);

        progress_until([&]() { return *drops >= expected; }, 10);
        return *drops;
    }

    entity *m_entity;
};

UCS_TEST_P(test_usnic_iface, md_and_device) {
    uct_md_attr_t md_attr;
    uct_tl_resource_desc_t *resources;
    unsigned num_resources;

    ASSERT_UCS_OK(uct_md_query(m_entity->md(), &md_attr));
    EXPECT_EQ(std::string("usnic"), md_attr.component_name);
    EXPECT_TRUE(md_attr.cap.flags & UCT_MD_FLAG_REG);
    EXPECT_TRUE(md_attr.cap.reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_HOST));

    /* One device per MD, named like the libfabric domain; the MD is named
     * after the provider, which ucx_info -d so shows */
    const uct_usnic_md_t *md = ucs_derived_of(m_entity->md(), uct_usnic_md_t);
    std::string provider(md->info->fabric_attr->prov_name);
    EXPECT_EQ(0u, GetParam()->md_name.rfind(provider + "_", 0))
            << "md " << GetParam()->md_name << ", provider " << provider;
    ASSERT_UCS_OK(uct_md_query_tl_resources(m_entity->md(), &resources,
                                            &num_resources));
    ASSERT_EQ(1u, num_resources);
    EXPECT_EQ(std::string(md->info->domain_attr->name),
              std::string(resources[0].dev_name));
    EXPECT_EQ(GetParam()->dev_name, std::string(resources[0].dev_name));
    EXPECT_EQ(UCT_DEVICE_TYPE_NET, resources[0].dev_type);
    EXPECT_EQ(std::string("usnic"), resources[0].tl_name);
    uct_release_tl_resource_list(resources);
}

UCS_TEST_P(test_usnic_iface, addresses) {
    entity *other = create_entity(0);
    m_entities.push_back(other);

    const uct_iface_attr_t &attr = m_entity->iface_attr();
    EXPECT_EQ(sizeof(uct_usnic_device_addr_t), attr.device_addr_len);
    EXPECT_EQ(sizeof(uct_usnic_iface_addr_t), attr.iface_addr_len);
    EXPECT_GT(attr.bandwidth.shared + attr.bandwidth.dedicated, 0);
    EXPECT_GT(attr.latency.c, 0);

    uct_usnic_device_addr_t dev_addr;
    uct_usnic_iface_addr_t if_addr, other_addr;
    ASSERT_UCS_OK(uct_iface_get_device_address(m_entity->iface(),
                                               (uct_device_addr_t*)&dev_addr));
    ASSERT_UCS_OK(uct_iface_get_address(m_entity->iface(),
                                        (uct_iface_addr_t*)&if_addr));
    ASSERT_UCS_OK(uct_iface_get_address(other->iface(),
                                        (uct_iface_addr_t*)&other_addr));

    EXPECT_EQ(UCT_USNIC_DEV_ADDR_MAGIC, dev_addr.magic);
    EXPECT_LE(dev_addr.prefix_len, 32);
    EXPECT_NE(0u, dev_addr.in_addr);

    /* Two channels, each on its own port; ifaces differ in ports and
     * incarnation */
    EXPECT_NE(0, if_addr.ports[UCT_USNIC_CHANNEL_PRIO]);
    EXPECT_NE(0, if_addr.ports[UCT_USNIC_CHANNEL_DATA]);
    EXPECT_NE(if_addr.ports[UCT_USNIC_CHANNEL_PRIO],
              if_addr.ports[UCT_USNIC_CHANNEL_DATA]);
    EXPECT_NE(if_addr.ports[UCT_USNIC_CHANNEL_DATA],
              other_addr.ports[UCT_USNIC_CHANNEL_DATA]);
    EXPECT_NE(if_addr.incarnation, other_addr.incarnation);
}

UCS_TEST_P(test_usnic_iface, reachability) {
    entity *other = create_entity(0);
    m_entities.push_back(other);

    uct_usnic_device_addr_t dev_addr;
    uct_usnic_iface_addr_t if_addr;
    ASSERT_UCS_OK(uct_iface_get_device_address(other->iface(),
                                               (uct_device_addr_t*)&dev_addr));
    ASSERT_UCS_OK(uct_iface_get_address(other->iface(),
                                        (uct_iface_addr_t*)&if_addr));

    uct_iface_h iface = m_entity->iface();
    EXPECT_TRUE(uct_iface_is_reachable(iface, (uct_device_addr_t*)&dev_addr,
                                       (uct_iface_addr_t*)&if_addr));

    /* Not a usnic address at all */
    uct_usnic_device_addr_t bad = dev_addr;
    bad.magic ^= 0xff;
    EXPECT_FALSE(uct_iface_is_reachable(iface, (uct_device_addr_t*)&bad,
                                        (uct_iface_addr_t*)&if_addr));

    bad            = dev_addr;
    bad.prefix_len = 33;
    EXPECT_FALSE(uct_iface_is_reachable(iface, (uct_device_addr_t*)&bad,
                                        (uct_iface_addr_t*)&if_addr));

    /* Same address seen from another host or network namespace */
    bad        = dev_addr;
    bad.ns_id ^= 1;
    bool loopback = (ntohl(dev_addr.in_addr) >> 24) == IN_LOOPBACKNET;
    EXPECT_EQ(!loopback,
              uct_iface_is_reachable(iface, (uct_device_addr_t*)&bad,
                                     (uct_iface_addr_t*)&if_addr));

    /* A port of zero is no iface */
    uct_usnic_iface_addr_t bad_if = if_addr;
    bad_if.ports[UCT_USNIC_CHANNEL_PRIO] = 0;
    EXPECT_FALSE(uct_iface_is_reachable(iface, (uct_device_addr_t*)&dev_addr,
                                        (uct_iface_addr_t*)&bad_if));

    /* Another subnet */
    if (!loopback && (dev_addr.prefix_len > 0)) {
        bad          = dev_addr;
        bad.in_addr ^= htonl(UCS_BIT(32 - dev_addr.prefix_len));
        EXPECT_FALSE(uct_iface_is_reachable(iface, (uct_device_addr_t*)&bad,
                                            (uct_iface_addr_t*)&if_addr));
    }
}

UCS_TEST_P(test_usnic_iface, bad_config_values) {
    static const char *cases[][2] = {
        {"RX_QUEUE_LEN", "0"},
        {"RX_QUEUE_LEN", "100000000"},
        {"PRIO_RX_QUEUE_LEN", "0"},
        {"TX_QUEUE_LEN", "0"},
        {"RX_POST_BATCH", "0"},
        {"MAX_POLL", "0"},
        {"MTU", "16"},
        {"MTU", "1g"},
        {"WINDOW", "8"},
        {"WINDOW", "1000"},
        {"ACK_FREQ", "100000"},
        {"CWND_INIT", "0"},
        {"CWND_INIT", "5000"},
        {"MAX_BCOPY", "8m"},
        {"PUT_MAX_BCOPY", "8m"},
        {"ASYNC_TICK", "0"},
        {"BUNDLE_DELAY", "1s"},
        {"TIMEOUT", "0"},
        {"PORT_RANGE", "9000-8000"},
        {"PORT_RANGE", "70000-70001"},
        {"PORT_RANGE", "45678"}, /* one port for two channels */
        {"FAULT_DROP", "1.5"},
        {"FAULT_CORRUPT", "-0.1"},
        {"AUTH_KEY", "/nonexistent/usnic.key"},
        {"AUTH_KEY", "/dev/null"}
    };

    for (size_t i = 0; i < ucs_static_array_size(cases); ++i) {
        std::string error = open_iface_error(cases[i][0], cases[i][1]);
        std::string var   = std::string("UCX_USNIC_") + cases[i][0];
        EXPECT_NE(std::string::npos, error.find(var))
                << var << "=" << cases[i][1] << " logged: '" << error << "'";
    }
}

UCS_TEST_P(test_usnic_iface, unparsable_config_value) {
    uct_iface_h iface;

    scoped_log_handler slh(hide_errors_logger);
    EXPECT_EQ(UCS_ERR_INVALID_PARAM,
              open_iface("RX_QUEUE_LEN", "many", &iface));
    EXPECT_EQ(UCS_ERR_NO_ELEM, open_iface("NO_SUCH_VARIABLE", "1", &iface));
}

UCS_TEST_P(test_usnic_iface, good_config_values) {
    uct_iface_h iface;

    ASSERT_UCS_OK(open_iface("MTU", "512", &iface));
    uct_usnic_iface_t *usnic = ucs_derived_of(iface, uct_usnic_iface_t);
    /* The protocol's room leaves out the seal */
    EXPECT_EQ(512u - usnic->channels[UCT_USNIC_CHANNEL_DATA].seal.length,
              usnic->config.mtu);
    uct_iface_close(iface);

    ASSERT_UCS_OK(open_iface("RX_QUEUE_LEN", "64", &iface));
    EXPECT_EQ(64u, ucs_derived_of(iface, uct_usnic_iface_t)
                           ->channels[UCT_USNIC_CHANNEL_DATA].rx_posted);
    uct_iface_close(iface);

    /* Never below one largest message */
    ASSERT_UCS_OK(open_iface("CWND_INIT", "1", &iface));
    usnic = ucs_derived_of(iface, uct_usnic_iface_t);
    EXPECT_EQ(usnic->config.max_bcopy_packets, usnic->config.cwnd_init);
    uct_iface_close(iface);
}

/* A libfabric udp receiver keeps the kernel's default socket buffer: a
 * burst of 256 datagrams would overflow it */
UCS_TEST_P(test_usnic_iface, cwnd_init_auto) {
    uct_iface_h iface;

    ASSERT_UCS_OK(open_iface("CWND_INIT", "auto", &iface));
    EXPECT_EQ(usnic_test::on_kernel_provider(GetParam()->md_name) ? 256u :
                                                                    64u,
              ucs_derived_of(iface, uct_usnic_iface_t)->config.cwnd_init);
    uct_iface_close(iface);
}

UCS_TEST_P(test_usnic_iface, unknown_provider) {
    uct_component_h component = GetParam()->component;

    ucs::scoped_setenv env("UCX_USNIC_PROVIDER", "no_such_provider");
    uct_component_attr_t attr;
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    m_errors.clear();
    {
        scoped_log_handler slh(wrap_errors_logger);
        ASSERT_UCS_OK(uct_component_query(component, &attr));
    }

    EXPECT_EQ(0u, attr.md_resource_count);
    ASSERT_FALSE(m_errors.empty());
    EXPECT_NE(std::string::npos,
              m_errors.back().find("UCX_USNIC_PROVIDER=no_such_provider"))
            << m_errors.back();
}

UCS_TEST_P(test_usnic_iface, open_close_no_leaks) {
    uct_iface_h iface;

    /* Warm up what libfabric keeps for the process lifetime */
    ASSERT_UCS_OK(open_iface(NULL, NULL, &iface));
    uct_iface_close(iface);

    unsigned fds = num_open_fds();
    for (int i = 0; i < 100 / ucs::test_time_multiplier(); ++i) {
        ASSERT_UCS_OK(open_iface(NULL, NULL, &iface));
        uct_iface_progress(iface);
        uct_iface_close(iface);
    }
    EXPECT_EQ(fds, num_open_fds());
}

UCS_TEST_P(test_usnic_iface, foreign_datagrams_dropped) {
    uct_usnic_iface_t *iface = usnic_iface(m_entity);
    char garbage[64];

    memset(garbage, 0xa5, sizeof(garbage));
    usnic_test::send_datagram(iface, UCT_USNIC_CHANNEL_DATA, garbage,
                              sizeof(garbage));
    EXPECT_EQ(1u, wait_for_drops(iface, 1));

    usnic_test::send_datagram(iface, UCT_USNIC_CHANNEL_PRIO, garbage, 1);
    EXPECT_EQ(2u, wait_for_drops(iface, 2));

    /* Receive buffers are reposted: many times the receive queue length
     * gets through, in bursts the kernel socket buffer can hold */
    uint64_t expected = 2;
    unsigned total    = 3 * iface->channels[UCT_USNIC_CHANNEL_DATA]
                                    .rx_queue_len;
    for (unsigned i = 0; i < total; ++i) {
        usnic_test::send_datagram(iface, UCT_USNIC_CHANNEL_DATA, garbage,
                                  sizeof(garbage));
        ++expected;
        if ((i % 32) == 31) {
            ASSERT_EQ(expected, wait_for_drops(iface, expected));
        }
    }
    EXPECT_EQ(expected, wait_for_drops(iface, expected));
}

/*
 * Well-formed datagrams, and the same with one field wrong: each wrong one is
 * dropped as invalid before it can create a stream, send an ACK or reach the
 * AM handler.
 */
class test_usnic_iface_malformed : public test_usnic_iface {
protected:
    static const uint8_t AM_ID = 5;

    struct am_datagram {
        uct_usnic_hdr_t      hdr;
        uint64_t             payload;
        uct_usnic_open_ext_t open;
    } UCS_S_PACKED;

    typedef usnic_test::ack_datagram ack_datagram;

    void init()
    {
        test_usnic_iface::init();
        ASSERT_UCS_OK(uct_iface_set_am_handler(m_entity->iface(), AM_ID,
                                               am_handler, this, 0));
    }

    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        test_usnic_iface_malformed *self = (test_usnic_iface_malformed*)arg;

        ++self->m_delivered;
        self->m_last.assign((const uint8_t*)data,
                            (const uint8_t*)data + length);
        return UCS_OK;
    }

    /* The first datagram of a new sender's stream: a one-datagram AM */
    am_datagram am()
    {
        uct_usnic_iface_t *iface = usnic_iface(m_entity);
        am_datagram dgram        = {};

        dgram.hdr.version          = UCT_USNIC_PROTO_VERSION;
        dgram.hdr.type             = UCT_USNIC_PKT_AM;
        dgram.hdr.flags            = UCT_USNIC_PKT_FLAG_FIRST |
                                     UCT_USNIC_PKT_FLAG_LAST |
                                     UCT_USNIC_PKT_FLAG_OPEN;
        dgram.hdr.am_id            = AM_ID;
        dgram.hdr.incarnation      = iface->incarnation;
        dgram.hdr.stream_id        = UCT_USNIC_STREAM_ID_NONE;
        dgram.hdr.psn              = 1;
        dgram.hdr.token            = 0x70ce;
        dgram.open.src_incarnation = 0x5eed;
        dgram.open.src_ep_serial   = m_next_serial++;
        dgram.open.src_in_addr     = htonl(INADDR_LOOPBACK);
        dgram.open.src_prio_port   = htons(9);
        dgram.open.src_data_port   = htons(9);
        dgram.open.first_psn       = 1;
        dgram.open.dst_open_key    = iface->open_key;
        return dgram;
    }

    ack_datagram ack()
    {
        ack_datagram dgram = {};

        dgram.hdr.version     = UCT_USNIC_PROTO_VERSION;
        dgram.hdr.type        = UCT_USNIC_PKT_ACK;
        dgram.hdr.incarnation = usnic_iface(m_entity)->incarnation;
        dgram.rec.ack.psn     = 1;
        return dgram;
    }

    uint64_t drops(uct_usnic_rx_drop_t reason)
    {
        return USNIC_DROPS_BY(usnic_iface(m_entity), reason);
    }

    /* Send and wait until the iface has dropped or taken it */
    void send_and_wait(uct_usnic_channel_id_t id, const void *data,
                       size_t length)
    {
        uct_usnic_iface_t *iface = usnic_iface(m_entity);
        uint64_t seen            = usnic_test::rx_seen(iface);

        usnic_test::send_datagram(iface, id, data, length);
        progress_until([&]() { return usnic_test::rx_seen(iface) != seen; },
                       10);
    }

    /* One wrong datagram: counted as invalid, and nothing else happens */
    void expect_invalid(uct_usnic_channel_id_t id, const void *data,
                        size_t length, const char *what)
    {
        uct_usnic_iface_t *iface = usnic_iface(m_entity);
        uint64_t invalid         = drops(UCT_USNIC_RX_DROP_INVALID);
        size_t streams           = kh_size(&iface->stream_hash);
        unsigned delivered       = m_delivered;

        send_and_wait(id, data, length);
        EXPECT_EQ(invalid + 1, drops(UCT_USNIC_RX_DROP_INVALID)) << what;
        EXPECT_EQ(streams, kh_size(&iface->stream_hash)) << what;
        EXPECT_EQ(delivered, m_delivered) << what;
    }

    unsigned m_delivered   = 0;
    uint32_t m_next_serial = 1;
    std::vector<uint8_t> m_last; /* The last message delivered */
};

UCS_TEST_P(test_usnic_iface_malformed, fields_checked) {
    const uct_usnic_channel_id_t data = UCT_USNIC_CHANNEL_DATA;
    const uct_usnic_channel_id_t prio = UCT_USNIC_CHANNEL_PRIO;
    uct_usnic_iface_t *iface          = usnic_iface(m_entity);
    am_datagram dgram;
    ack_datagram ack_dgram;
    uint8_t bytes[ucs_max(sizeof(dgram) + 8, sizeof(ack_datagram) + 16)];

    /* The well-formed ones: an AM opens a stream and is delivered; an ACK
     * for no ep of ours is counted as such */
    dgram = am();
    send_and_wait(data, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, m_delivered);
    EXPECT_EQ(1u, kh_size(&iface->stream_hash));
    ack_dgram = ack();
    send_and_wait(prio, &ack_dgram, sizeof(ack_dgram));
    EXPECT_EQ(1u, drops(UCT_USNIC_RX_DROP_NO_STREAM));
    EXPECT_EQ(0u, drops(UCT_USNIC_RX_DROP_INVALID));

    dgram             = am();
    dgram.hdr.version = UCT_USNIC_PROTO_VERSION + 1;
    expect_invalid(data, &dgram, sizeof(dgram), "version");

    dgram          = am();
    dgram.hdr.type = UCT_USNIC_PKT_LAST;
    expect_invalid(data, &dgram, sizeof(dgram), "type");

    dgram          = am();
    dgram.hdr.type = UCT_USNIC_PKT_ACK;
    expect_invalid(data, &dgram, sizeof(dgram), "ACK on the data channel");

    dgram           = am();
    dgram.hdr.flags |= UCS_BIT(7);
    expect_invalid(data, &dgram, sizeof(dgram), "unknown flag");

    dgram           = am();
    dgram.hdr.am_id = UCT_AM_ID_MAX;
    expect_invalid(data, &dgram, sizeof(dgram), "AM id");

    dgram           = am();
    dgram.hdr.flags |= UCT_USNIC_PKT_FLAG_ACK;
    expect_invalid(data, &dgram, sizeof(uct_usnic_hdr_t) +
                   sizeof(uct_usnic_open_ext_t) + 4,
                   "shorter than its trailers");

    dgram          = am();
    dgram.hdr.type = UCT_USNIC_PKT_PROBE;
    dgram.hdr.am_id = 0;
    expect_invalid(data, &dgram, sizeof(dgram), "probe with a body");

    dgram          = am();
    dgram.hdr.type = UCT_USNIC_PKT_PUT;
    memset(bytes, 0, sizeof(bytes));
    memcpy(bytes, &dgram.hdr, sizeof(dgram.hdr));
    memcpy(bytes + sizeof(bytes) - sizeof(dgram.open), &dgram.open,
           sizeof(dgram.open));
    expect_invalid(data, bytes, sizeof(bytes), "put with an AM id");

    dgram                  = am();
    dgram.open.src_in_addr = inet_addr("198.18.5.5");
    expect_invalid(data, &dgram, sizeof(dgram),
                   "open trailer from another network");

    dgram                    = am();
    dgram.open.src_prio_port = 0;
    expect_invalid(data, &dgram, sizeof(dgram), "open trailer, no ACK port");

    ack_dgram         = ack();
    ack_dgram.hdr.psn = 1;
    expect_invalid(prio, &ack_dgram, sizeof(ack_dgram), "ACK with a psn");

    ack_dgram           = ack();
    ack_dgram.hdr.token = 1;
    expect_invalid(prio, &ack_dgram, sizeof(ack_dgram), "ACK with a token");

    ack_dgram           = ack();
    ack_dgram.hdr.flags = UCT_USNIC_ACK_FLAG_CLOSED;
    expect_invalid(prio, &ack_dgram, sizeof(ack_dgram),
                   "ACK with a flag in its header");

    ack_dgram           = ack();
    ack_dgram.rec.flags = UCS_BIT(7);
    expect_invalid(prio, &ack_dgram, sizeof(ack_dgram),
                   "ACK record with an unknown flag");

    ack_dgram = ack();
    memset(bytes, 0, sizeof(bytes));
    memcpy(bytes, &ack_dgram, sizeof(ack_dgram));
    expect_invalid(prio, bytes, sizeof(ack_dgram) + 1, "ACK too long");
    expect_invalid(prio, bytes, sizeof(ack_dgram) + 16,
                   "ACK with half a second record");
    expect_invalid(prio, bytes, sizeof(ack_dgram) - 1, "ACK too short");
    expect_invalid(prio, bytes, sizeof(ack_dgram) - sizeof(ack_dgram.rec),
                   "ACK without a record");

    /* Still the one stream and the one delivery */
    EXPECT_EQ(1u, kh_size(&iface->stream_hash));
    EXPECT_EQ(1u, m_delivered);
}

/* Padding is taken off the last datagram of a message, and only there; it
 * never eats into the message */
UCS_TEST_P(test_usnic_iface_malformed, padding_checked) {
    const uct_usnic_channel_id_t data = UCT_USNIC_CHANNEL_DATA;
    const uint8_t payload[]           = {1, 2, 3, 4, 5, 0, 0, 3};
    am_datagram dgram;

    /* A padded one-datagram message: 5 bytes and 3 of padding */
    auto padded = [&]() {
        am_datagram d = am();
        d.hdr.flags  |= UCT_USNIC_PKT_FLAG_PADDED;
        memcpy(&d.payload, payload, sizeof(payload));
        return d;
    };

    dgram = padded();
    send_and_wait(data, &dgram, sizeof(dgram));
    EXPECT_EQ(1u, m_delivered);
    EXPECT_EQ(std::vector<uint8_t>(payload, payload + 5), m_last);
    EXPECT_EQ(0u, drops(UCT_USNIC_RX_DROP_INVALID));

    dgram = padded();
    reinterpret_cast<uint8_t*>(&dgram.payload)[7] = 0;
    expect_invalid(data, &dgram, sizeof(dgram), "padding of length 0");

    dgram = padded();
    reinterpret_cast<uint8_t*>(&dgram.payload)[7] = 8;
    expect_invalid(data, &dgram, sizeof(dgram), "padding, no message");

    dgram = padded();
    reinterpret_cast<uint8_t*>(&dgram.payload)[7] = 9;
    expect_invalid(data, &dgram, sizeof(dgram), "padding past the body");

    dgram            = padded();
    dgram.hdr.flags &= ~UCT_USNIC_PKT_FLAG_LAST;
    expect_invalid(data, &dgram, sizeof(dgram), "padding, not the last");

    dgram           = padded();
    dgram.hdr.type  = UCT_USNIC_PKT_BUNDLE;
    dgram.hdr.am_id = 0;
    expect_invalid(data, &dgram, sizeof(dgram), "padded bundle");

    EXPECT_EQ(1u, m_delivered);
}

/* A bundle is delivered record by record only if every record fits */
UCS_TEST_P(test_usnic_iface_malformed, bundles_checked) {
    const uct_usnic_channel_id_t data = UCT_USNIC_CHANNEL_DATA;
    const size_t lengths[]            = {0, 5, 8};

    /* Header, records of the given lengths, open trailer */
    auto bundle = [this](const std::vector<size_t> &rec_lengths) {
        am_datagram dgram = am();
        std::vector<uint8_t> bytes(sizeof(dgram.hdr));

        dgram.hdr.type  = UCT_USNIC_PKT_BUNDLE;
        dgram.hdr.am_id = 0;
        memcpy(&bytes[0], &dgram.hdr, sizeof(dgram.hdr));
        for (size_t length : rec_lengths) {
            uct_usnic_bundle_rec_t rec = {AM_ID, 0, (uint16_t)length};
            const uint8_t *p           = (const uint8_t*)&rec;
            bytes.insert(bytes.end(), p, p + sizeof(rec));
            bytes.insert(bytes.end(), length, 0x5a);
        }
        const uint8_t *p = (const uint8_t*)&dgram.open;
        bytes.insert(bytes.end(), p, p + sizeof(dgram.open));
        return bytes;
    };
    size_t rec_offset = sizeof(uct_usnic_hdr_t);
    std::vector<uint8_t> bytes;

    bytes = bundle({lengths, lengths + 3});
    send_and_wait(data, &bytes[0], bytes.size());
    EXPECT_EQ(3u, m_delivered);
    EXPECT_EQ(0u, drops(UCT_USNIC_RX_DROP_INVALID));

    bytes = bundle({4});
    bytes[rec_offset + offsetof(uct_usnic_bundle_rec_t, length)] = 5;
    expect_invalid(data, &bytes[0], bytes.size(), "record past the body");

    bytes = bundle({4});
    bytes[rec_offset + offsetof(uct_usnic_bundle_rec_t, length)] = 3;
    expect_invalid(data, &bytes[0], bytes.size(), "bytes after the records");

    bytes = bundle({4});
    bytes[rec_offset + offsetof(uct_usnic_bundle_rec_t, am_id)] =
            UCT_AM_ID_MAX;
    expect_invalid(data, &bytes[0], bytes.size(), "record AM id");

    bytes = bundle({4});
    bytes[rec_offset + offsetof(uct_usnic_bundle_rec_t, reserved)] = 1;
    expect_invalid(data, &bytes[0], bytes.size(), "reserved byte");

    bytes = bundle({4});
    bytes[offsetof(uct_usnic_hdr_t, flags)] &= ~UCT_USNIC_PKT_FLAG_LAST;
    expect_invalid(data, &bytes[0], bytes.size(), "part of a message");

    bytes = bundle({4});
    bytes[offsetof(uct_usnic_hdr_t, am_id)] = AM_ID;
    expect_invalid(data, &bytes[0], bytes.size(), "bundle with an AM id");

    bytes = bundle({});
    expect_invalid(data, &bytes[0], bytes.size(), "no record");

    EXPECT_EQ(3u, m_delivered);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_iface_malformed, usnic)

_UCT_INSTANTIATE_TEST_CASE(test_usnic_iface, usnic)
