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
#include <uct/usnic/usnic_iface.h>
}

#include <string>
#include <vector>


/*
 * What the usnic provider of a Cisco VIC demands of its user, forced on the
 * libfabric provider in use (FORCE_MSG_PREFIX, FORCE_MR_LOCAL, FORCE_AV_MAP)
 * so that those code paths run without the hardware; and peers that do not
 * agree on the datagram size.
 */
class test_usnic_vic : public test_usnic_base {
protected:
    static const uint8_t AM_ID   = 9;
    static const size_t  PREFIX  = 64;

    void init()
    {
        uct_test::init();
    }




    static uct_usnic_md_t *usnic_md(entity *e)
    {
        return ucs_derived_of(e->md(), uct_usnic_md_t);
    }

    entity *add_entity()
    {
        entity *e = create_entity(0);

        m_entities.push_back(e);
        ASSERT_UCS_OK(uct_iface_set_am_handler(e->iface(), AM_ID, am_handler,
                                               this, 0));
        return e;
    }

    void connect_pair()
    {
        m_a = add_entity();
        m_b = add_entity();
        m_a->connect(0, *m_b, 0);
        m_b->connect(0, *m_a, 0);
    }

    static uint8_t pattern(uint32_t seq, size_t offset)
    {
        return (uint8_t)((seq * 13) + offset);
    }

    static void fill(uint8_t *buffer, uint32_t seq, size_t length)
    {
        memcpy(buffer, &seq, sizeof(seq));
        for (size_t i = sizeof(seq); i < length; ++i) {
            buffer[i] = pattern(seq, i);
        }
    }

    static ucs_status_t am_handler(void *arg, void *data, size_t length,
                                   unsigned flags)
    {
        test_usnic_vic *self = (test_usnic_vic*)arg;
        const uint8_t *bytes = (const uint8_t*)data;
        uint32_t seq;

        memcpy(&seq, data, sizeof(seq));
        EXPECT_EQ(self->m_received, seq) << "out of order or duplicate";
        for (size_t i = sizeof(seq); i < length; ++i) {
            if (bytes[i] != pattern(seq, i)) {
                ADD_FAILURE() << "message " << seq << ": byte " << i
                              << " of " << length << " corrupt";
                break;
            }
        }
        ++self->m_received;
        return UCS_OK;
    }

    static size_t pack_cb(void *dest, void *arg)
    {
        const std::vector<uint8_t> *data = (const std::vector<uint8_t>*)arg;

        memcpy(dest, &(*data)[0], data->size());
        return data->size();
    }

    void wait_received(unsigned received)
    {
        progress_until([&]() { return m_received >= received; }, 30);
        ASSERT_EQ(received, m_received);
    }

    enum send_mode {
        SEND_SHORT,
        SEND_BCOPY,
        SEND_ZCOPY
    };

    /* One message of length bytes, the way given, from one entity to the
     * other; waits until it is delivered */
    void send(entity *from, size_t length, send_mode how)
    {
        std::vector<uint8_t> data(length);
        uint32_t seq        = m_sent++;
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(30);
        uct_completion_t comp;
        ucs_status_t status;
        uint64_t header;
        uct_mem_h memh;
        ssize_t packed;

        fill(&data[0], seq, length);
        comp.func   = (uct_completion_callback_t)ucs_empty_function;
        comp.count  = 1;
        comp.status = UCS_OK;
        if (how == SEND_ZCOPY) {
            ASSERT_UCS_OK(uct_md_mem_reg(from->md(), &data[0], length,
                                         UCT_MD_MEM_ACCESS_ALL, &memh));
            /* Registered with the provider where it wants that */
            EXPECT_EQ(usnic_md(from)->mr_local,
                      ((uct_usnic_memh_t*)memh)->mr != NULL);
        }

        do {
            if (how == SEND_SHORT) {
                memcpy(&header, &data[0], sizeof(header));
                status = uct_ep_am_short(from->ep(0), AM_ID, header,
                                         &data[sizeof(header)],
                                         length - sizeof(header));
            } else if (how == SEND_BCOPY) {
                packed = uct_ep_am_bcopy(from->ep(0), AM_ID, pack_cb, &data,
                                         0);
                status = (packed < 0) ? (ucs_status_t)packed : UCS_OK;
            } else {
                uct_iov_t iov = {&data[0], length, memh, 0, 1};
                status = uct_ep_am_zcopy(from->ep(0), AM_ID, NULL, 0, &iov, 1,
                                         0, &comp);
            }
            if (status == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while ((status == UCS_ERR_NO_RESOURCE) &&
                 (ucs_get_time() < deadline));
        ASSERT_UCS_OK_OR_INPROGRESS(status);
        if (status == UCS_OK) {
            comp.count = 0;
        }

        wait_received(m_sent);
        if (how == SEND_ZCOPY) {
            while ((comp.count > 0) && (ucs_get_time() < deadline)) {
                progress();
            }
            EXPECT_EQ(0, comp.count);
            uct_md_mem_dereg(from->md(), memh);
        }
    }

    /* Every way of sending, one and several datagrams, both ways */
    void send_all_kinds()
    {
        size_t max_payload = usnic_iface(m_a)->config.max_payload;
        size_t sizes[]     = {8, 100, max_payload, 3 * max_payload + 7};

        for (entity *from : {m_a, m_b}) {
            for (size_t size : sizes) {
                if (size <= from->iface_attr().cap.am.max_short) {
                    send(from, size, SEND_SHORT);
                }
                send(from, size, SEND_BCOPY);
                send(from, size, SEND_ZCOPY);
            }
        }
        flush();
    }

    /* Connect from one entity to the other's addresses, as UCP would */
    ucs_status_t try_connect(entity *from, entity *to, uct_ep_h *ep_p)
    {
        std::vector<char> dev_addr(to->iface_attr().device_addr_len);
        std::vector<char> iface_addr(to->iface_attr().iface_addr_len);
        uct_ep_params_t params;

        EXPECT_UCS_OK(uct_iface_get_device_address(
                to->iface(), (uct_device_addr_t*)&dev_addr[0]));
        EXPECT_UCS_OK(uct_iface_get_address(
                to->iface(), (uct_iface_addr_t*)&iface_addr[0]));
        params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                            UCT_EP_PARAM_FIELD_DEV_ADDR |
                            UCT_EP_PARAM_FIELD_IFACE_ADDR;
        params.iface      = from->iface();
        params.dev_addr   = (uct_device_addr_t*)&dev_addr[0];
        params.iface_addr = (uct_iface_addr_t*)&iface_addr[0];
        return uct_ep_create(&params, ep_p);
    }

    /* The error logged by a connection that must be refused */
    std::string refused_connect(entity *from, entity *to)
    {
        ucs_status_t status;
        uct_ep_h ep;

        m_errors.clear();
        {
            scoped_log_handler slh(wrap_errors_logger);
            status = try_connect(from, to, &ep);
        }
        EXPECT_EQ(UCS_ERR_UNREACHABLE, status);
        if (status == UCS_OK) {
            uct_ep_destroy(ep);
        }
        EXPECT_EQ(1u, m_errors.size());
        return m_errors.empty() ? "" : m_errors.back();
    }

    /* Open an MD, or with an iface variable an iface, with a forced mode:
     * on the kernel provider it fails naming the variable */
    void expect_kernel_refuses(const std::string &var, const char *value,
                               bool md_var)
    {
        uct_component_h component = GetParam()->component;
        uct_iface_params_t params = {};
        uct_iface_config_t *iface_config;
        uct_md_config_t *md_config;
        ucs_status_t status;
        uct_iface_h iface;
        uct_md_h md;

        m_errors.clear();
        if (md_var) {
            ASSERT_UCS_OK(uct_md_config_read(component, NULL, NULL,
                                             &md_config));
            ASSERT_UCS_OK(usnic_test::config_modify(md_config, var, value));
            {
                scoped_log_handler slh(wrap_errors_logger);
                status = uct_md_open(component, GetParam()->md_name.c_str(),
                                     md_config, &md);
            }
            uct_config_release(md_config);
            if (status == UCS_OK) {
                uct_md_close(md);
            }
        } else {
            entity *e = add_entity();
            ASSERT_UCS_OK(uct_md_iface_config_read(e->md(), "usnic", NULL,
                                                   NULL, &iface_config));
            ASSERT_UCS_OK(usnic_test::config_modify(iface_config, var, value));
            params.field_mask           = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                                          UCT_IFACE_PARAM_FIELD_DEVICE;
            params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
            params.mode.device.tl_name  = GetParam()->tl_name.c_str();
            params.mode.device.dev_name = GetParam()->dev_name.c_str();
            {
                scoped_log_handler slh(wrap_errors_logger);
                status = uct_iface_open(e->md(), e->worker(), &params,
                                        iface_config, &iface);
            }
            uct_config_release(iface_config);
            if (status == UCS_OK) {
                uct_iface_close(iface);
            }
        }

        EXPECT_EQ(UCS_ERR_INVALID_PARAM, status);
        ASSERT_FALSE(m_errors.empty());
        EXPECT_NE(std::string::npos, m_errors.front().find("USNIC_" + var))
                << m_errors.front();
    }

    entity   *m_a        = NULL;
    entity   *m_b        = NULL;
    unsigned m_sent      = 0;
    unsigned m_received  = 0;
};

const size_t test_usnic_vic::PREFIX;

UCS_TEST_P(test_usnic_vic, forced_prefix_honoured) {
    if (on_kernel_provider()) {
        expect_kernel_refuses("FORCE_MSG_PREFIX", "64", false);
        return;
    }

    set_usnic_config("FORCE_MSG_PREFIX", ucs::to_string(PREFIX));
    connect_pair();
    for (entity *e : {m_a, m_b}) {
        for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
            const uct_usnic_channel_t *ch = &usnic_iface(e)->channels[id];
            EXPECT_EQ(PREFIX, ch->prefix_size);
            EXPECT_EQ(PREFIX, ch->fake_prefix);
        }
    }

    send_all_kinds();
    for (entity *e : {m_a, m_b}) {
        for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
            EXPECT_EQ(0u, usnic_iface(e)->channels[id].posts.bad_prefix);
        }
    }
}

/* A datagram landing in the prefix of its buffer, where the provider writes
 * its headers, is caught and dropped; the sender's resend then gets it
 * through */
UCS_TEST_SKIP_COND_P(test_usnic_vic, payload_in_prefix_caught,
                     on_kernel_provider()) {
    set_usnic_config("FORCE_MSG_PREFIX", ucs::to_string(PREFIX));
    connect_pair();
    send(m_a, 8, SEND_SHORT);
    flush();

    /* The provider fills posted buffers in order: the next datagram goes
     * into the oldest */
    uct_usnic_channel_t *data = &usnic_iface(m_b)->channels[
            UCT_USNIC_CHANNEL_DATA];
    ASSERT_FALSE(ucs_list_is_empty(&data->rx_posted_list));
    uct_usnic_rx_desc_t *desc = ucs_list_head(&data->rx_posted_list,
                                              uct_usnic_rx_desc_t, list);
    memset(UCS_PTR_BYTE_OFFSET(uct_usnic_rx_desc_data(data, desc),
                               -data->prefix_size),
           0, sizeof(uint32_t));

    m_errors.clear();
    {
        scoped_log_handler slh(wrap_errors_logger);
        send(m_a, 100, SEND_SHORT);
        flush();
    }
    EXPECT_EQ(1u, data->posts.bad_prefix);
    ASSERT_EQ(1u, m_errors.size());
    EXPECT_NE(std::string::npos, m_errors[0].find("message prefix"))
            << m_errors[0];
}

/* Under FI_MR_LOCAL every buffer handed to the provider is registered and
 * comes with its descriptor, and nothing goes out with fi_inject */
UCS_TEST_P(test_usnic_vic, forced_mr_local_registers_every_buffer) {
    if (on_kernel_provider()) {
        expect_kernel_refuses("FORCE_MR_LOCAL", "y", true);
        return;
    }

    set_usnic_config("FORCE_MR_LOCAL", "y");
    connect_pair();
    send_all_kinds();
    for (entity *e : {m_a, m_b}) {
        EXPECT_TRUE(usnic_md(e)->mr_local);
        for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
            const uct_usnic_channel_posts_t *posts =
                    &usnic_iface(e)->channels[id].posts;
            UCS_TEST_MESSAGE << "channel " << id << ": " << posts->sends
                             << " sends, " << posts->recvs << " receives";
            EXPECT_EQ(0u, posts->injects);
            EXPECT_GT(posts->sends, 0u);
            EXPECT_EQ(posts->sends, posts->sends_mr);
            EXPECT_GT(posts->recvs, 0u);
            EXPECT_EQ(posts->recvs, posts->recvs_mr);
        }
    }
}

UCS_TEST_P(test_usnic_vic, forced_av_map) {
    if (on_kernel_provider()) {
        expect_kernel_refuses("FORCE_AV_MAP", "y", true);
        return;
    }

    set_usnic_config("FORCE_AV_MAP", "y");
    connect_pair();
    EXPECT_EQ(FI_AV_MAP, usnic_md(m_a)->info->domain_attr->av_type);
    send_all_kinds();
}

/* The prefix never travels: peers with and without one talk */
UCS_TEST_SKIP_COND_P(test_usnic_vic, prefix_modes_interoperate,
                     on_kernel_provider()) {
    set_usnic_config("FORCE_MSG_PREFIX", "0");
    m_a = add_entity();
    set_usnic_config("FORCE_MSG_PREFIX", ucs::to_string(PREFIX));
    m_b = add_entity();
    EXPECT_EQ(0u, usnic_iface(m_a)->config.prefix);
    EXPECT_EQ(PREFIX, usnic_iface(m_b)->config.prefix);
    m_a->connect(0, *m_b, 0);
    m_b->connect(0, *m_a, 0);
    send_all_kinds();
}

/* Datagrams of different sizes: refused on both sides when they connect,
 * naming both sizes, rather than lost to truncation until the timeout */
UCS_TEST_P(test_usnic_vic, mtu_mismatch_refused) {
    m_a = add_entity();
    set_usnic_config("MTU", "1000");
    m_b = add_entity();

    std::string a_size = ucs::to_string(
            uct_usnic_iface_dgram_size(usnic_iface(m_a)));
    ASSERT_NE("1000", a_size);
    for (entity *from : {m_a, m_b}) {
        std::string error = refused_connect(from, (from == m_a) ? m_b : m_a);
        EXPECT_NE(std::string::npos, error.find(" 1000 ")) << error;
        EXPECT_NE(std::string::npos, error.find(" " + a_size + " ")) << error;
        EXPECT_NE(std::string::npos, error.find("USNIC_MTU")) << error;
    }
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_vic, usnic)
